"""A Kiln model fed from PyTorch tensors without copies (DLPack), its output read back by
PyTorch and NumPy without copies either.

    python3 examples/python/interop.py     (needs Debian's python3-torch)
"""
import numpy as np
import torch

import kiln

gen = kiln.Generator(0)
model = kiln.nn.Linear(8, 4, generator=gen)

batch = torch.randn(16, 8)                 # made by PyTorch
x = kiln.from_dlpack(batch)                # the same memory, now a Kiln tensor
assert x.data_ptr() == batch.data_ptr()

with kiln.no_grad():
    y = kiln.relu(model(x))                # Kiln computes
out = torch.from_dlpack(y)                 # PyTorch reads Kiln's result in place
assert out.data_ptr() == y.data_ptr()
view = y.numpy()                           # and so does NumPy
assert view.ctypes.data == y.data_ptr()

batch.mul_(0)                              # PyTorch writes: Kiln sees it
assert x.abs().sum().item() == 0.0
ref = torch.relu(torch.nn.functional.linear(torch.randn(16, 8).mul_(0), torch.from_dlpack(model.weight),
                                            torch.from_dlpack(model.bias)))
print("shared buffers both ways; Kiln's output equals PyTorch's:",
      np.allclose(kiln.relu(model(x)).numpy(force=True), ref.numpy()))

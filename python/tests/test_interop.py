"""DLPack exchange with PyTorch (Debian's python3-torch 1.13, legacy capsules, where installed)
and NumPy, sharing memory both ways; and a few results compared with PyTorch's."""
import numpy as np
import pytest

import kiln
from conftest import close


def test_capsules_round_trip_and_share_memory():
    t = kiln.arange(6, dtype=kiln.float32).view(2, 3)
    for max_version in (None, (1, 0)):
        u = kiln.from_dlpack(t.__dlpack__(max_version=max_version))
        assert u.shape == (2, 3) and u.dtype == kiln.float32
        u[0, 0] = 100.0
        assert t[0, 0].item() == 100.0
    assert t.__dlpack_device__() == (1, 0)
    cap = t.__dlpack__()
    kiln.from_dlpack(cap)
    with pytest.raises(ValueError, match=r"\[from_dlpack\] the capsule is not an unused DLPack"):
        kiln.from_dlpack(cap)
    c = kiln.from_dlpack(t.__dlpack__(copy=True))
    c[0, 1] = -5.0
    assert t[0, 1].item() == 1.0


def test_unconsumed_capsules_free_their_tensor():
    for _ in range(100):  # each holds a 4 MB tensor until the capsule dies
        kiln.zeros(1 << 20).__dlpack__()


def test_numpy_consumes_and_produces_dlpack():
    a = np.arange(12, dtype=np.int64).reshape(3, 4)
    t = kiln.from_dlpack(a)
    t[1, 1] = -1
    assert a[1, 1] == -1
    b = np.from_dlpack(kiln.ones(3, dtype=kiln.float64))
    assert b.tolist() == [1.0, 1.0, 1.0]


def test_bad_dlpack_requests_are_clear():
    with pytest.raises(ValueError, match=r"\[__dlpack__\] stream must be None for a cpu tensor"):
        kiln.ones(2).__dlpack__(stream=3)
    with pytest.raises(TypeError, match=r"\[from_dlpack\] expected an object with __dlpack__"):
        kiln.from_dlpack([1, 2])


torch = pytest.importorskip("torch")


def test_torch_and_kiln_share_buffers_both_ways():
    k = kiln.randn(4, 5)
    t = torch.from_dlpack(k)
    t[2, 3] = 9.0
    assert k[2, 3].item() == 9.0
    x = torch.randn(3, 4).t()  # strided
    y = kiln.from_dlpack(x)
    assert y.stride() == (1, 4)
    y[0, 0] = -3.0
    assert x[0, 0].item() == -3.0
    assert kiln.from_dlpack(torch.tensor([7, 8], dtype=torch.int32)).tolist() == [7, 8]
    assert kiln.from_dlpack(torch.ones(2, dtype=torch.bfloat16)).dtype == kiln.bfloat16


def test_results_and_gradients_match_pytorch(rng):
    x = rng.standard_normal((6, 5))
    w = rng.standard_normal((3, 5))
    tx, tw = torch.tensor(x), torch.tensor(w, requires_grad=True)
    kx, kw = kiln.from_numpy(x), kiln.from_numpy(w.copy()).requires_grad_()
    for f_t, f_k in [
        (lambda a, b: torch.nn.functional.gelu(a @ b.T).logsumexp(1).sum(),
         lambda a, b: kiln.log(kiln.exp(kiln.gelu(a @ b.t())).sum([1])).sum()),
        (lambda a, b: torch.softmax(a @ b.T, -1).pow(2).mean(),
         lambda a, b: (kiln.softmax(a @ b.t(), -1) ** 2).mean()),
    ]:
        tw.grad, kw.grad = None, None
        lt, lk = f_t(tx, tw), f_k(kx, kw)
        lt.backward()
        lk.backward()
        close(lk, lt.detach().numpy(), rtol=1e-10)
        close(kw.grad, tw.grad.numpy(), rtol=1e-9, atol=1e-12)

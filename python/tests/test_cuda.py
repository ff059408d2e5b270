"""Kiln's CUDA backend from Python: ops, autograd and compile (device graphs) against NumPy and
eager, and DLPack sharing with PyTorch's CUDA tensors, streams included. Skipped where the
CUDA plugin is not built or no GPU is present (CI); run on the GPU machine (scripts/gpu.sh)."""
import numpy as np
import pytest

import kiln
from conftest import close


@pytest.fixture(scope="module")
def cuda():
    try:
        kiln.load_backend("cuda")
    except Exception as e:  # noqa: BLE001 (any reason the plugin cannot load is a skip)
        pytest.skip(f"no CUDA backend: {e}")
    if kiln.device_count("cuda") == 0:
        pytest.skip("no GPU")
    return kiln.device("cuda")


def test_ops_and_gradients_on_cuda_match_numpy(cuda, rng):
    a, b = rng.standard_normal((5, 7)), rng.standard_normal((7, 3))
    x = kiln.from_numpy(a).to(cuda).requires_grad_(True)
    w = kiln.from_numpy(b).to(cuda)
    y = kiln.tanh(x @ w)
    assert y.device == cuda
    close(y.cpu(), np.tanh(a @ b))
    y.sum().backward()
    close(x.grad.cpu(), (1 - np.tanh(a @ b) ** 2) @ b.T)
    z = kiln.zeros(3, device="cuda")
    z[1] = 5.0
    assert z.tolist() == [0.0, 5.0, 0.0]


def test_compiled_step_on_cuda_replays_a_device_graph_equal_to_eager(cuda, rng):
    w = kiln.from_numpy(rng.standard_normal((8, 8)).astype(np.float32)).to(cuda)
    f = kiln.compile(lambda x: kiln.relu(x @ w).sum(1))
    x = kiln.from_numpy(rng.standard_normal((4, 8)).astype(np.float32)).to(cuda)
    want = kiln.relu(x @ w).sum(1).cpu().numpy()
    for _ in range(3):
        np.testing.assert_allclose(f(x).cpu().numpy(), want, rtol=1e-5)


def test_dlpack_device_and_bad_requests(cuda):
    t = kiln.ones(4, device="cuda")
    assert t.__dlpack_device__() == (2, cuda.index if cuda.index >= 0 else 0)
    with pytest.raises(ValueError, match=r"\[__dlpack__\] stream 0 is ambiguous"):
        t.__dlpack__(stream=0)
    with pytest.raises(BufferError, match=r"\[__dlpack__\] dl_device \(1, 0\) differs"):
        t.__dlpack__(dl_device=(1, 0))
    host = kiln.from_dlpack(t.__dlpack__(dl_device=(1, 0), copy=True))
    assert host.device == kiln.device("cpu") and host.tolist() == [1.0] * 4
    u = kiln.from_dlpack(t.__dlpack__(max_version=(1, 0), stream=-1))  # no synchronisation
    u[0] = 3.0
    assert t[0].item() == 3.0


def test_torch_cuda_tensors_are_shared_both_ways_in_stream_order(cuda):
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("this PyTorch has no CUDA")
    k = kiln.arange(1 << 20, dtype=kiln.float32, device="cuda") * 2  # queued on Kiln's stream
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):  # PyTorch asks for order after Kiln's work on `side`
        t = torch.from_dlpack(k)
        assert t.device.type == "cuda" and t.data_ptr() == k.data_ptr()
        total = t.sum()
    side.synchronize()
    assert total.item() == float(np.arange(1 << 20, dtype=np.float64).sum() * 2)
    t[5] = -1.0
    torch.cuda.synchronize()
    assert k[5].item() == -1.0

    x = torch.randn(64, 32, device="cuda").t()  # strided, written on PyTorch's stream
    y = kiln.from_dlpack(x)
    assert y.device == cuda and y.stride() == (1, 32)
    close((y * 3).cpu(), (x * 3).cpu().numpy(), rtol=1e-6)
    y[0, 0] = 42.0
    kiln.synchronize()
    assert x[0, 0].item() == 42.0


def test_work_on_a_kiln_side_stream_is_ordered_before_pytorch_reads_it(cuda):
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("this PyTorch has no CUDA")
    side = kiln.Stream(cuda)
    assert side.handle != kiln.Stream.default(cuda).handle
    n = 1 << 22
    with kiln.stream(side):
        k = (kiln.arange(n, dtype=kiln.float64, device="cuda") * 2).sqrt()
        t = torch.from_dlpack(k)  # PyTorch's current stream waits for `side` (an event)
    assert t.sum().item() == pytest.approx(float((np.arange(n) * 2.0) ** 0.5 @ np.ones(n)))

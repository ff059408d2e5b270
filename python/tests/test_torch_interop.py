"""With PyTorch (Debian's python3-torch 1.13, legacy capsules), where installed: DLPack sharing
both ways, and results and gradients compared with PyTorch's."""
import pytest

import kiln
from conftest import close

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


def test_torch_imports_after_kiln_and_its_backends():
    # Note [Exported symbols] (cmake/kiln.map): a Kiln library that exported libstdc++'s facet
    # ids made `import torch` after `import kiln` abort in free() (PyTorch 2.11, g++ 13 build).
    import subprocess
    import sys
    code = ("import kiln\n"
            "for b in ('sim', 'cuda'):\n"
            "    try:\n"
            "        kiln.load_backend(b)\n"
            "    except (kiln.Error, ValueError):  # no GPU here\n"
            "        pass\n"
            "import torch\n"
            "print(float(torch.ones(3).sum()), kiln.ones(3).sum().item())\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.split() == ["3.0", "3.0"]

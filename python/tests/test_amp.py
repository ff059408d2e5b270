"""kiln.amp from Python: autocast's per-op policy and the loss scaler's skipped steps."""
import math

import pytest

import kiln


def test_autocast_runs_products_in_16_bit_and_losses_in_float32():
    a, b = kiln.randn(4, 8), kiln.randn(8, 3)
    with kiln.amp.autocast("cpu", kiln.bfloat16):
        y = a @ b
        loss = kiln.cross_entropy(y, kiln.tensor([0, 1, 2, 0]))
        assert y.dtype == kiln.bfloat16
        assert loss.dtype == kiln.float32
    assert (a @ b).dtype == kiln.float32  # off again after the block


def test_autocast_is_guarded_by_compiled_functions():
    a, b = kiln.randn(4, 8), kiln.randn(8, 3)
    f = kiln.compile(lambda x, y: x @ y)
    assert f(a, b).dtype == kiln.float32
    with kiln.amp.autocast("cpu", kiln.bfloat16):
        assert f(a, b).dtype == kiln.bfloat16  # a recompile, not a stale replay
    assert len(f.miss_reasons()) >= 1


def test_grad_scaler_skips_a_step_with_an_overflow_and_backs_off():
    w = kiln.ones(2, dtype=kiln.float64, requires_grad=True)
    opt = kiln.optim.SGD([w], lr=0.1)
    scaler = kiln.amp.GradScaler("cpu", init_scale=1024.0)
    scaler.scale((w * w).sum()).backward()
    scaler.step(opt)
    scaler.update()
    assert w.tolist() == [0.8, 0.8]  # unscaled gradient 2, lr 0.1
    opt.zero_grad()
    scaler.scale((w * float("inf")).sum()).backward()
    scaler.step(opt)
    scaler.update()
    assert w.tolist() == [0.8, 0.8]  # skipped
    assert math.isclose(scaler.get_scale(), 512.0)
    state = scaler.state_dict()
    assert state["scale"].item() == 512.0
    with pytest.raises(ValueError):
        kiln.amp.GradScaler("cpu", init_scale=-1.0)

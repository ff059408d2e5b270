"""Backends, device aliasing and the profiler from Python."""
import json

import pytest

import kiln
from conftest import close


def test_sim_backend_runs_ops_and_aliases_keep_one_identity(rng):
    assert kiln.load_backend("sim") == "sim"
    a = rng.standard_normal((3, 4))
    s = kiln.from_numpy(a).to("sim")
    assert s.device == kiln.device("sim")
    close((s * 2 + 1).cpu(), a * 2 + 1)
    with pytest.raises(TypeError, match=r"\[numpy\] the tensor is on sim"):
        s.numpy()
    close(s.numpy(force=True), a)


def test_compiled_step_on_sim_matches_eager(rng):
    kiln.load_backend("sim")
    w = kiln.from_numpy(rng.standard_normal((4, 4))).to("sim")
    f = kiln.compile(lambda x: kiln.tanh(x @ w))
    x = kiln.from_numpy(rng.standard_normal((2, 4))).to("sim")
    want = kiln.tanh(x @ w).cpu().tolist()
    for _ in range(3):
        assert f(x).cpu().tolist() == want


def test_unknown_backend_is_a_clear_error():
    with pytest.raises(ValueError, match=r"\[load_backend\] no plugin named 'nosuchbackend'"):
        kiln.load_backend("nosuchbackend")


def test_profiler_records_ops_as_a_chrome_trace(tmp_path):
    a = kiln.ones(4)
    with kiln.profiler.profile() as p:
        kiln.relu(a + 1)
    assert "add" in p.event_names() and "relu" in p.event_names()
    path = tmp_path / "trace.json"
    p.save_chrome_trace(str(path))
    events = json.loads(path.read_text())["traceEvents"]
    assert any(e["name"] == "relu" for e in events)
    kiln.exp(a)  # after the block: not recorded
    assert "exp" not in p.event_names()

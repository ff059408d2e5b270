"""kiln.Stream, kiln.Event and `with kiln.stream(s):` on the cpu (everything has already
happened) and on sim, whose streams run their work in order on host threads."""
import pytest

import kiln


def test_cpu_streams_and_events_are_trivially_ready():
    s = kiln.Stream.current("cpu")
    assert s == kiln.Stream.default("cpu") and s.device == kiln.device("cpu")
    s.synchronize()
    e = kiln.Event("cpu")
    e.record()
    e.synchronize()
    assert e.query()


def test_sim_stream_scope_events_and_ordering():
    kiln.load_backend("sim")
    default = kiln.Stream.current("sim")
    side = kiln.Stream("sim")
    assert side != default and "Stream(device=sim" in repr(side)
    x = kiln.ones(1 << 16, device="sim")  # filled on the default stream
    filled = kiln.Event("sim")
    filled.record()
    filled.wait(side)  # as in PyTorch, `side` reads x only after waiting for its producer
    scope = kiln.stream(side)
    with scope as s:
        assert s == side and kiln.Stream.current("sim") == side
        y = x * 3  # queued on `side`
        done = kiln.Event("sim")
        done.record()
        with pytest.raises(ValueError, match=r"\[stream\] this kiln.stream scope is already entered"):
            scope.__enter__()
    assert kiln.Stream.current("sim") == default
    done.wait(default)  # the default stream waits for `side`'s work before reading y
    assert (y + 1).sum().item() == 4.0 * (1 << 16)
    done.synchronize()
    assert done.query()
    side.synchronize()

"""DLPack exchange between Kiln tensors and with NumPy, sharing memory both ways."""
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
    with pytest.raises(BufferError, match=r"\[__dlpack__\] dl_device \(2, 0\) differs from the "
                       r"tensor's \(1, 0\)"):
        kiln.ones(2).__dlpack__(dl_device=(2, 0))
    assert kiln.from_dlpack(kiln.ones(2).__dlpack__(dl_device=(1, 0))).tolist() == [1.0, 1.0]
    kiln.load_backend("sim")
    with pytest.raises(NotImplementedError, match=r"\[__dlpack_device__\] DLPack exchange of sim "
                       r"tensors: only cpu and cuda"):
        kiln.ones(2, device="sim").__dlpack_device__()

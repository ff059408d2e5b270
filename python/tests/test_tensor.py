"""kiln.Tensor from Python: creation, properties, printing, conversions, NumPy sharing."""
import numpy as np
import pytest

import kiln
from conftest import close


def test_tensor_from_nested_lists_infers_dtype_as_pytorch():
    assert kiln.tensor([[1, 2], [3, 4]]).dtype == kiln.int64
    assert kiln.tensor([1.0, 2]).dtype == kiln.float32
    assert kiln.tensor([True, False]).dtype == kiln.bool
    t = kiln.tensor(3.5)
    assert t.shape == () and t.item() == 3.5
    assert kiln.tensor([[1, 2]], dtype=kiln.float64).tolist() == [[1.0, 2.0]]
    assert kiln.tensor([]).shape == (0,)


def test_ragged_and_bad_data_raise_clear_errors():
    with pytest.raises(ValueError, match=r"\[tensor\] ragged"):
        kiln.tensor([[1, 2], [3]])
    with pytest.raises(TypeError, match=r"\[tensor\] expected a number, got str"):
        kiln.tensor(["a"])


def test_properties_and_repr_match_the_cpp_printer():
    t = kiln.arange(6, dtype=kiln.float32).view(2, 3)
    assert t.shape == (2, 3) and t.size() == (2, 3) and t.size(1) == 3 and t.size(-1) == 3
    assert t.dim() == 2 and t.ndim == 2 and t.numel() == 6 and len(t) == 2
    assert t.stride() == (3, 1) and t.is_contiguous()
    assert t.dtype == kiln.float32 and t.device == kiln.device("cpu") and t.device == "cpu"
    assert repr(t) == "tensor([[0., 1., 2.],\n        [3., 4., 5.]])"
    assert repr(kiln.float32) == "kiln.float32"
    assert [row.tolist() for row in t] == [[0.0, 1.0, 2.0], [3.0, 4.0, 5.0]]
    with pytest.raises(TypeError, match=r"\[len\] len\(\) of a 0-d tensor"):
        len(kiln.tensor(1.0))


def test_item_tolist_and_python_numbers():
    t = kiln.tensor([[1, 2], [3, 4]])
    assert t.tolist() == [[1, 2], [3, 4]]
    assert t[1, 0].item() == 3 and isinstance(t[1, 0].item(), int)
    assert float(kiln.tensor(2.5)) == 2.5 and int(kiln.tensor(7)) == 7
    assert bool(kiln.tensor([True]))
    with pytest.raises(ValueError, match=r"\[bool\] the truth value of a tensor with 4 elements"):
        bool(t)
    with pytest.raises(ValueError, match="item"):
        t.item()


def test_numpy_shares_memory_both_ways(rng):
    a = rng.standard_normal((3, 4)).astype(np.float32)
    t = kiln.from_numpy(a)
    a[0, 0] = 42.0
    assert t[0, 0].item() == 42.0  # a write through NumPy is seen by Kiln
    t[1, 2] = -1.0
    assert a[1, 2] == -1.0  # and a write through Kiln is seen by NumPy
    n = t.numpy()
    n[2, 3] = 7.0
    assert a[2, 3] == 7.0
    assert n.ctypes.data == a.ctypes.data


def test_from_numpy_keeps_the_array_alive_and_reads_strides(rng):
    a = rng.standard_normal((4, 6))
    t = kiln.from_numpy(a[:, ::2])  # a strided view: shared, not copied
    assert t.stride() == (6, 2)
    del a
    close(t * 1, t.numpy())
    for dt, want in [(np.float32, kiln.float32), (np.int64, kiln.int64), (np.bool_, kiln.bool),
                     (np.uint8, kiln.uint8), (np.int32, kiln.int32), (np.float16, kiln.float16)]:
        assert kiln.from_numpy(np.zeros(2, dtype=dt)).dtype == want
    assert kiln.from_numpy(np.zeros((0, 3), np.float32)).shape == (0, 3)


def test_from_numpy_rejects_what_it_cannot_view():
    with pytest.raises(TypeError, match=r"\[from_numpy\] NumPy dtype complex128 has no Kiln dtype"):
        kiln.from_numpy(np.zeros(2, np.complex128))
    with pytest.raises(ValueError, match=r"\[from_numpy\] stride -8 of dim 0 is negative"):
        kiln.from_numpy(np.arange(4.0)[::-1])


def test_numpy_refuses_grad_and_bfloat16_clearly():
    w = kiln.ones(2, requires_grad=True)
    with pytest.raises(kiln.Error, match=r"\[numpy\] the tensor requires grad"):
        w.numpy()
    assert w.numpy(force=True).tolist() == [1.0, 1.0]
    with pytest.raises(TypeError, match=r"\[numpy\] NumPy has no bfloat16"):
        kiln.ones(2, dtype=kiln.bfloat16).numpy()
    assert np.asarray(kiln.ones(2)).tolist() == [1.0, 1.0]


def test_to_and_dtype_conversions():
    t = kiln.tensor([1.5, -2.5])
    assert t.to(kiln.int64).tolist() == [1, -2]
    assert t.to("cpu").is_same(t)
    c = t.to("cpu", copy=True)
    assert not c.is_same(t) and c.tolist() == t.tolist()
    assert t.double().dtype == kiln.float64 and t.long().dtype == kiln.int64
    assert t.to(dtype=kiln.float16).dtype == kiln.float16
    with pytest.raises(TypeError, match=r"\[to\] expected a dtype, a device or a Tensor, got int"):
        t.to(3)


def test_meta_device_runs_shapes_only():
    m = kiln.empty(4096, 4096, device="meta")
    y = m @ m
    assert y.shape == (4096, 4096) and y.device == kiln.device("meta")


def test_devices_compare_and_hash_as_one_identity():
    assert kiln.device("cpu") == kiln.device("cpu:0")
    assert hash(kiln.device("cpu")) == hash(kiln.device("cpu:0"))
    assert str(kiln.device("cpu")) == "cpu"
    with pytest.raises(Exception, match="nosuch"):
        kiln.device("nosuch")


def test_default_dtype_applies_to_factories():
    prev = kiln.get_default_dtype()
    try:
        kiln.set_default_dtype(kiln.float64)
        assert kiln.zeros(2).dtype == kiln.float64
        assert kiln.tensor([1.0]).dtype == kiln.float64
    finally:
        kiln.set_default_dtype(prev)

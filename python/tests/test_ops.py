"""Ops from Python against NumPy on random inputs: the generated bindings (every op of the op
list, from its schema), the operators, indexing, and the errors of bad calls."""
import numpy as np
import pytest

import kiln
from conftest import close

UNARY = {
    "neg": np.negative, "abs": np.abs, "exp": np.exp, "tanh": np.tanh, "sin": np.sin,
    "cos": np.cos, "floor": np.floor, "ceil": np.ceil, "sign": np.sign, "expm1": np.expm1,
    "relu": lambda x: np.maximum(x, 0), "sigmoid": lambda x: 1 / (1 + np.exp(-x)),
    "trunc": np.trunc, "atan": np.arctan, "sinh": np.sinh,
}


@pytest.mark.parametrize("name", sorted(UNARY))
def test_unary_ops_as_functions_and_methods(name, rng):
    a = rng.standard_normal((3, 5)).astype(np.float32)
    t = kiln.from_numpy(a)
    close(getattr(kiln, name)(t), UNARY[name](a), rtol=1e-5, atol=1e-5)
    close(getattr(t, name)(), UNARY[name](a), rtol=1e-5, atol=1e-5)


def test_positive_domain_ops(rng):
    a = rng.uniform(0.5, 2.0, (4, 3))
    t = kiln.from_numpy(a)
    for name, ref in [("log", np.log), ("sqrt", np.sqrt), ("rsqrt", lambda x: 1 / np.sqrt(x)),
                      ("log1p", np.log1p), ("log2", np.log2), ("reciprocal", np.reciprocal)]:
        close(getattr(kiln, name)(t), ref(a))


OPERATORS = [
    ("+", np.add), ("-", np.subtract), ("*", np.multiply), ("/", np.divide),
    ("**", np.power), ("@", np.matmul),
]


@pytest.mark.parametrize("sym,ref", OPERATORS)
def test_binary_operators_with_tensors_and_numbers(sym, ref, rng):
    a = rng.uniform(0.5, 2.0, (4, 4))
    b = rng.uniform(0.5, 2.0, (4, 4))
    ta, tb = kiln.from_numpy(a), kiln.from_numpy(b)
    close(eval(f"ta {sym} tb"), ref(a, b), rtol=1e-10)
    if sym != "@":
        close(eval(f"ta {sym} 1.5"), ref(a, 1.5), rtol=1e-10)
        close(eval(f"2 {sym} ta"), ref(2.0, a), rtol=1e-10)


def test_comparisons_floordiv_mod_and_bitwise(rng):
    a = rng.integers(-5, 5, (6,))
    b = rng.integers(1, 4, (6,))
    ta, tb = kiln.from_numpy(a), kiln.from_numpy(b)
    for got, want in [(ta < tb, a < b), (ta <= 1, a <= 1), (ta == tb, a == b), (ta != 2, a != 2),
                      (ta > tb, a > b), (ta >= 0, a >= 0), (ta // tb, a // b), (ta % tb, a % b),
                      (ta & tb, a & b), (ta | tb, a | b), (ta ^ tb, a ^ b), (~ta, ~a),
                      (-ta, -a), (abs(ta), abs(a))]:
        close(got, want)


def test_wrapped_numbers_promote_as_in_pytorch():
    i32 = kiln.tensor([1, 2], dtype=kiln.int32)
    assert (i32 + 1).dtype == kiln.int32  # an int does not widen an int tensor
    assert (i32 + 1.5).dtype == kiln.float32  # a float makes it the default float dtype
    assert (kiln.tensor([1.0], dtype=kiln.float16) * 2.0).dtype == kiln.float16
    assert (kiln.arange(4) / 2).dtype == kiln.float32


def test_in_place_operators_keep_the_object_and_its_memory():
    t = kiln.zeros(3)
    same = t
    t += 1
    t *= 3
    t -= kiln.tensor([1.0, 0.0, 0.0])
    t /= 2
    assert t is same and t.tolist() == [1.0, 1.5, 1.5]


def test_reductions_with_dims_keepdim_and_dtype(rng):
    a = rng.standard_normal((3, 4, 5))
    t = kiln.from_numpy(a)
    close(t.sum(), a.sum())
    close(kiln.sum(t, dim=[0, 2]), a.sum(axis=(0, 2)))
    close(t.sum(1, True), a.sum(axis=1, keepdims=True))
    close(t.mean(dim=[1]), a.mean(axis=1))
    close(t.amax(dim=[2]), a.max(axis=2))
    close(t.var(dim=[0]), a.var(axis=0, ddof=1))
    close(t.argmax(dim=1), a.argmax(axis=1))
    close(kiln.softmax(t, -1), np.exp(a) / np.exp(a).sum(-1, keepdims=True))
    close(t.cumsum(0), a.cumsum(0))
    assert kiln.sum(kiln.tensor([1, 2]), dtype=kiln.float64).dtype == kiln.float64
    values, indices = t.max(1)
    close(values, a.max(axis=1))
    close(indices, a.argmax(axis=1))
    close(t.max(), a.max())
    close(kiln.max(t, kiln.zeros(5, dtype=kiln.float64)), np.maximum(a, 0))


def test_views_and_shape_ops(rng):
    a = rng.standard_normal((2, 3, 4))
    t = kiln.from_numpy(a)
    close(t.view(6, 4), a.reshape(6, 4))
    close(t.view([4, 6]), a.reshape(4, 6))
    close(t.permute(2, 0, 1), a.transpose(2, 0, 1))
    close(t.transpose(0, 2), a.swapaxes(0, 2))
    close(t.reshape(3, 8), a.reshape(3, 8))
    close(t.flatten(), a.reshape(-1))
    close(t.unsqueeze(1), a[:, None])
    close(t[:, :1].squeeze(1), a[:, 0])
    close(t.expand(2, 2, 3, 4), np.broadcast_to(a, (2, 2, 3, 4)))
    close(kiln.cat([t, t], dim=1), np.concatenate([a, a], 1))
    close(kiln.stack([t, t]), np.stack([a, a]))
    close(t.flip([0, 2]), a[::-1, :, ::-1])
    parts = t.split(2, dim=2)
    assert len(parts) == 2
    close(parts[1], a[:, :, 2:])
    assert t.transpose(0, 1).is_contiguous() is False


def test_products_and_nn_functions(rng):
    x = rng.standard_normal((5, 4)).astype(np.float32)
    w = rng.standard_normal((3, 4)).astype(np.float32)
    b = rng.standard_normal(3).astype(np.float32)
    tx, tw, tb = map(kiln.from_numpy, (x, w, b))
    close(kiln.linear(tx, tw, tb), x @ w.T + b, rtol=1e-5, atol=1e-5)
    close(kiln.mm(tx, tw.t()), x @ w.T, rtol=1e-5, atol=1e-5)
    close(kiln.matmul(tx, tw.t()), x @ w.T, rtol=1e-5, atol=1e-5)
    target = kiln.tensor([0, 2, 1, 1, 0])
    logp = x[:, :3] - np.log(np.exp(x[:, :3]).sum(1, keepdims=True))
    close(kiln.cross_entropy(tx[:, :3], target), -logp[np.arange(5), [0, 2, 1, 1, 0]].mean(),
          rtol=1e-5)
    close(kiln.where(tx > 0, tx, 0.0), np.where(x > 0, x, 0))
    close(kiln.clamp(tx, -0.5, 0.5), np.clip(x, -0.5, 0.5))
    close(tx.clamp(min=0), np.maximum(x, 0))
    close(kiln.div(kiln.tensor([7, -7]), 2, rounding_mode="floor"), [3, -4])
    close(kiln.div(kiln.tensor([7, -7]), 2, rounding_mode="trunc"), [3, -3])


def test_out_keyword_writes_into_the_given_tensor():
    a, b = kiln.ones(3), kiln.full([3], 2.0)
    out = kiln.empty(3)
    r = kiln.add(a, b, out=out)
    assert r.is_same(out) and out.tolist() == [3.0, 3.0, 3.0]
    with pytest.raises(ValueError):
        kiln.add(a, b, out=kiln.empty(4))  # out= never resizes: nothing written
    with pytest.raises(TypeError, match=r"\[add\] out= must be a Tensor, got int"):
        kiln.add(a, b, out=3)


def test_in_place_ops_return_self():
    t = kiln.tensor([-1.0, 2.0])
    r = t.relu_()
    assert r.is_same(t) and t.tolist() == [0.0, 2.0]
    t.add_(kiln.ones(2), alpha=2)
    assert t.tolist() == [2.0, 4.0]
    t.fill_(5)
    assert t.tolist() == [5.0, 5.0]


def test_bad_calls_name_the_op_and_the_values():
    a = kiln.ones(4, 3)
    with pytest.raises(ValueError, match=r"\[mm\] size mismatch: a is \[4, 3\], b is \[5, 2\]"):
        kiln.mm(a, kiln.ones(5, 2))
    with pytest.raises(TypeError, match=r"\[mm\] missing required argument 'mat2'"):
        kiln.mm(a)
    with pytest.raises(TypeError, match=r"\[sum\] got an unexpected keyword argument 'axis'"):
        kiln.sum(a, axis=0)
    with pytest.raises(TypeError, match=r"\[transpose\] argument 'dim0' must be an int, got str"):
        a.transpose("x", 1)
    with pytest.raises(TypeError, match=r"\[sum\] got multiple values for argument 'dim'"):
        a.sum([0], dim=[1])
    with pytest.raises(TypeError, match=r"\[transpose\] takes 3 arguments, got 4"):
        kiln.transpose(a, 0, 1, 2)
    with pytest.raises(IndexError):
        a.select(0, 9)


def test_indexing_gets_and_sets_like_numpy(rng):
    a = rng.standard_normal((4, 5, 6))
    t = kiln.from_numpy(a.copy())
    close(t[1], a[1])
    close(t[-1, 2:4], a[-1, 2:4])
    close(t[:, ::2, 1], a[:, ::2, 1])
    close(t[None, ..., 0], a[None, ..., 0])
    close(t[kiln.tensor([0, 2])], a[[0, 2]])
    close(t[[3, 1]], a[[3, 1]])
    mask = a[:, 0, 0] > 0
    close(t[kiln.from_numpy(mask)], a[mask])
    t[0, 0] = 0.0
    a[0, 0] = 0.0
    t[1:3, :, 2] = kiln.ones(2, 5)
    a[1:3, :, 2] = 1.0
    t[kiln.tensor([3])] = 2.5
    a[[3]] = 2.5
    close(t, a)
    with pytest.raises(IndexError, match=r"\[index\] only integers, slices"):
        t["x"]


def test_generators_make_random_draws_repeatable():
    g = kiln.Generator(7)
    a = kiln.randn(3, 4, generator=g)
    g.manual_seed(7)
    b = kiln.randn(3, 4, generator=g)
    assert a.tolist() == b.tolist()
    kiln.manual_seed(1)
    c = kiln.rand(5)
    kiln.manual_seed(1)
    assert kiln.rand(5).tolist() == c.tolist()
    assert kiln.randint(0, 10, (100,)).dtype == kiln.int64
    assert sorted(kiln.randperm(6).tolist()) == list(range(6))


def test_factories_take_sizes_and_options():
    assert kiln.zeros(2, 3).shape == (2, 3)
    assert kiln.ones((2, 3)).shape == (2, 3)
    assert kiln.full((2,), 7).dtype == kiln.int64
    assert kiln.full((2,), 7.0).tolist() == [7.0, 7.0]
    assert kiln.arange(5).tolist() == [0, 1, 2, 3, 4]
    assert kiln.arange(1, 2, 0.25).tolist() == [1.0, 1.25, 1.5, 1.75]
    assert kiln.linspace(0, 1, 5).tolist() == [0.0, 0.25, 0.5, 0.75, 1.0]
    assert kiln.zeros_like(kiln.ones(2, dtype=kiln.int32)).dtype == kiln.int32
    with pytest.raises(TypeError, match=r"\[zeros\] expected an int or a sequence of ints, got str"):
        kiln.zeros("a")


def test_every_exposed_op_is_bound_with_its_schema_as_doc():
    sigs = kiln._kiln._op_signatures(False)
    assert len(sigs) > 150
    for entry in sigs:
        name, _, schema = entry.split("|")
        fn = getattr(kiln, name)
        assert callable(fn)
    assert "mm(Tensor self, Tensor mat2) -> Tensor" in kiln.mm.__doc__
    methods = {e.split("|")[0] for e in kiln._kiln._op_signatures(True)}
    for name in methods:
        assert hasattr(kiln.Tensor, name), name
    assert "all_reduce" not in methods and not hasattr(kiln, "layer_norm_backward")


def test_the_package_ships_a_stub_generated_from_the_op_record():
    import ast
    import os

    path = os.path.join(os.path.dirname(kiln.__file__), "__init__.pyi")
    text = open(path).read()
    ast.parse(text)
    assert "def mm(self: Tensor, mat2: Tensor) -> Tensor: ..." in text
    assert "    def sort(self, dim: int = ..., descending: bool = False) -> tuple[Tensor, Tensor]: ..." in text
    assert "def zeros(*args: Any, **kwargs: Any) -> Any: ..." in text


def test_set_flush_denormal():
    denormal = kiln.tensor([1e-40])  # made while the mode is off: a denormal float32
    assert 0.0 < denormal.item() < 1.2e-38
    try:
        if not kiln.set_flush_denormal(True):
            pytest.skip("this CPU has no flush-to-zero mode (x86-64 only)")
        assert (denormal * 1e30).item() == 0.0  # a denormal input counts as 0
        assert (kiln.tensor([1e-30]) * 1e-10).item() == 0.0  # a denormal result becomes 0
    finally:
        kiln.set_flush_denormal(False)
    assert (denormal * 1e30).item() == pytest.approx(1e-10, rel=1e-3)
    assert (kiln.tensor([1e-30]) * 1e-10).item() > 0.0


def test_operator_protocol_errors_and_large_operands():
    # Note [Operators without pybind11's dispatcher]: CPython's own binary-operator protocol.
    t = kiln.ones(3)

    class Other:
        def __radd__(self, left):
            return ("radd", left.tolist())

        def __rmatmul__(self, left):
            return "rmatmul"

    assert t + Other() == ("radd", [1.0, 1.0, 1.0])  # NotImplemented, then the reflected one
    assert t @ Other() == "rmatmul"
    assert t.__add__("x") is NotImplemented and t.__radd__(None) is NotImplemented
    with pytest.raises(TypeError, match="unsupported operand"):
        t - "x"
    with pytest.raises(TypeError, match="unsupported operand"):
        {} * t
    with pytest.raises(TypeError, match="expected 1 argument, got 2"):
        t.__add__(1, 2)
    with pytest.raises(TypeError, match="expected 1 argument, got 0"):
        t.__mul__()
    with pytest.raises(ValueError, match=r"\[add\].*"):  # Kiln's error, as Python's ValueError
        t + kiln.ones(4)
    with pytest.raises(ValueError):
        t.__iadd__(kiln.ones(2, 3))
    assert t.tolist() == [1.0, 1.0, 1.0]  # nothing written by the failed in-place op
    assert (True + t).tolist() == [2.0, 2.0, 2.0]
    big = kiln.ones(5000)  # past the size from which operators release the GIL
    assert (big * 2 + big).sum().item() == 15000.0
    big += big
    assert big.sum().item() == 10000.0

"""The `python_op` and `compile_call` workloads (../shared/BENCHMARKS.md) from Python.

python_op: `a + b` on 1-element CPU tensors, Kiln beside PyTorch (Debian's python3-torch where
installed) in the same run; compile_call: a compiled function of 10 small inputs returning
x0 + x1, its per-call cost beyond the eager op. Results are checked before timing; prints JSON.
Run: PYTHONPATH=build/release/python /usr/bin/python3 bench/python_op_bench.py [--smoke]
"""
import json
import sys
import timeit


def per_call_ns(fn, number):
    best = min(timeit.repeat(fn, number=number, repeat=5))
    return best / number * 1e9


def main():
    smoke = "--smoke" in sys.argv
    number = 1000 if smoke else 200000
    try:
        import torch
    except ImportError:
        torch = None
    import kiln

    kiln.set_num_threads(1)
    a, b = kiln.ones(1), kiln.full([1], 2.0)
    assert (a + b).item() == 3.0
    out = {"kiln_add_ns": per_call_ns(lambda: a + b, number)}
    out["kiln_method_add_ns"] = per_call_ns(lambda: a.add(b), number)

    xs = [kiln.ones(4) for _ in range(10)]
    step = kiln.compile(lambda *x: x[0] + x[1], name="compile_call")
    assert step(*xs).tolist() == [2.0] * 4
    x0, x1 = xs[0], xs[1]
    eager_ns = per_call_ns(lambda: x0 + x1, number)
    out["kiln_compile_call_ns"] = per_call_ns(lambda: step(*xs), number)
    out["kiln_compile_call_beyond_eager_ns"] = out["kiln_compile_call_ns"] - eager_ns
    if torch is not None:
        torch.set_num_threads(1)
        ta, tb = torch.ones(1), torch.full([1], 2.0)
        assert (ta + tb).item() == 3.0
        out["torch_version"] = torch.__version__
        out["torch_add_ns"] = per_call_ns(lambda: ta + tb, number)
        out["kiln_over_torch_add"] = out["kiln_add_ns"] / out["torch_add_ns"]
    else:
        out["torch_add_ns"] = None
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()

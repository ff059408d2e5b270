"""Kiln from Python: tensors, autograd, compile (see docs/python.md).

The extension module kiln._kiln holds the C++ bindings; every op of Kiln's op list is a
function here and, where it has a tensor to act on, a Tensor method. This file adds what is
Python-shaped: grad-mode context managers, iteration, and kiln.compile's decorator form.
"""
import builtins as _builtins
import contextlib as _contextlib
import sys as _sys

from . import _kiln
from ._kiln import *  # noqa: F401,F403 (the public API)
from ._kiln import Tensor, autograd, dtype, device, Generator  # noqa: F401
from ._kiln import Error, DeviceError, CompileError, DistributedError, InternalError  # noqa: F401

# The extension's kiln._kiln.nn and kiln._kiln.parallel: kiln.nn and kiln.parallel (nn.py and
# parallel.py, imported below) re-export them with the parts written in Python.
del nn, parallel

# `from ._kiln import *` binds the dtypes, among them kiln.bool, kiln.float and kiln.int (as
# torch.bool, torch.float and torch.int): inside this file the builtins are _builtins.bool etc.


class _GradMode(_contextlib.ContextDecorator):
    """Sets grad mode for a `with` block or a decorated function, then restores it."""

    def __init__(self, enabled):
        self._enabled = enabled

    def __enter__(self):
        self._prev = _kiln.is_grad_enabled()
        _kiln._set_grad_enabled(self._enabled)
        return self

    def __exit__(self, *exc):
        _kiln._set_grad_enabled(self._prev)
        return False


def no_grad():
    """`with kiln.no_grad():` records no autograd history (also a decorator)."""
    return _GradMode(False)


def enable_grad():
    """`with kiln.enable_grad():` records history again inside a no_grad region."""
    return _GradMode(True)


class set_grad_enabled(_GradMode):
    """`kiln.set_grad_enabled(False)` as a call, or `with kiln.set_grad_enabled(mode):`."""

    def __init__(self, mode):
        super().__init__(_builtins.bool(mode))
        self._prev = _kiln.is_grad_enabled()
        _kiln._set_grad_enabled(_builtins.bool(mode))

    def __enter__(self):
        return self


class inference_mode(_contextlib.ContextDecorator):
    """`with kiln.inference_mode():` no autograd and no version counting (also a decorator)."""

    def __enter__(self):
        self._guard = _kiln._InferenceModeGuard()
        self._guard.__enter__()
        return self

    def __exit__(self, *exc):
        self._guard.__exit__(*exc)
        return False


def _tensor_iter(self):
    if self.dim() == 0:
        raise TypeError("[iter] iteration over a 0-d tensor")
    for i in range(len(self)):
        yield self[i]


Tensor.__iter__ = _tensor_iter


def compile(fn=None, *, name=None, recompile_limit=8, piecewise=False, capture=True):
    """Compiles a function of tensors into a replayed step (docs/python.md#compile).

    The first call traces at the dispatcher (running the real ops; on a device with graphs
    after one warm-up run), later calls replay with no Python and no dispatch. Python control flow and Python values are frozen
    at trace time; only the tensors passed in are guarded. Use as `kiln.compile(fn)` or as a
    decorator, `@kiln.compile(name="step")`.
    """
    if fn is None:
        return lambda f: compile(f, name=name, recompile_limit=recompile_limit,
                                 piecewise=piecewise, capture=capture)
    compiled = _kiln._compile(fn, name or getattr(fn, "__name__", "compiled"), recompile_limit,
                              piecewise, capture)
    return compiled


from . import nn  # noqa: E402 (kiln.nn uses the names above)
from . import parallel  # noqa: E402
from ._kiln import optim, distributed, dtensor, profiler, amp  # noqa: E402,F401

# The extension's submodules, importable by name (`import kiln.distributed as dist`).
for _name in ("autograd", "optim", "distributed", "dtensor", "profiler", "amp"):
    _sys.modules[f"{__name__}.{_name}"] = getattr(_kiln, _name)
del _name

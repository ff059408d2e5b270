"""kiln.nn: Module for models written in Python, and the built-in modules (kiln/nn, in C++).

A Python module subclasses kiln.nn.Module: tensors that require grad and are leaves become
parameters when assigned as attributes, modules (Python or built-in) become submodules, and
register_buffer names the rest. parameters(), state_dict(), train()/eval(), to() and
zero_grad() walk them all, built-in submodules included.
"""
import abc
from collections import OrderedDict

from . import _kiln

# The built-in modules, implemented in C++.
from ._kiln.nn import (  # noqa: F401
    AdaptiveAvgPool2d, AvgPool2d, BatchNorm1d, BatchNorm2d, BatchNorm3d, Block,
    CausalSelfAttention, CNN, Conv1d, Conv2d, Conv3d, ConvTranspose1d, ConvTranspose2d,
    ConvTranspose3d, Dropout, ELU, Embedding, EmbeddingBag, Flatten, GELU, GPT, GroupNorm,
    Hardtanh, LayerNorm, LeakyReLU, Linear, MaxPool2d, MLP, ReLU, RMSNorm, SiLU, Upsample,
    checkpoint,
)
from ._kiln.nn import _CppModule


def Parameter(tensor):
    """A leaf that requires grad, sharing `tensor`'s memory: what Module registers."""
    return tensor.detach().requires_grad_(True)


class Module(metaclass=abc.ABCMeta):
    """Base class of models written in Python (see the module docstring)."""

    def __init__(self):
        object.__setattr__(self, "_parameters", OrderedDict())
        object.__setattr__(self, "_buffers", OrderedDict())
        object.__setattr__(self, "_modules", OrderedDict())
        object.__setattr__(self, "training", True)

    def _check_init(self):
        if "_parameters" not in self.__dict__:
            raise AttributeError(
                f"[Module] {type(self).__name__}.__init__ must call super().__init__() before "
                "assigning attributes")

    def __setattr__(self, name, value):
        if isinstance(value, _kiln.Tensor):
            self._check_init()
            if value.requires_grad and value.is_leaf:
                self._parameters[name] = value
                self._buffers.pop(name, None)
            elif name in self._buffers:
                self._buffers[name] = value
            else:
                self._parameters.pop(name, None)
                object.__setattr__(self, name, value)
            return
        if isinstance(value, Module):
            self._check_init()
            self._modules[name] = value
            return
        if name in getattr(self, "_parameters", {}) and value is None:
            self._parameters[name] = None
            return
        object.__setattr__(self, name, value)

    def __getattr__(self, name):
        d = self.__dict__
        for table in ("_parameters", "_buffers", "_modules"):
            if table in d and name in d[table]:
                return d[table][name]
        raise AttributeError(f"'{type(self).__name__}' object has no attribute '{name}'")

    def __delattr__(self, name):
        for table in (self._parameters, self._buffers, self._modules):
            if name in table:
                del table[name]
                return
        object.__delattr__(self, name)

    def register_buffer(self, name, tensor):
        """Registers a tensor that is state but not a parameter (running statistics)."""
        self._check_init()
        self._parameters.pop(name, None)
        self._buffers[name] = tensor

    def register_parameter(self, name, tensor):
        self._check_init()
        self._parameters[name] = None if tensor is None else Parameter(tensor) if not (
            tensor.requires_grad and tensor.is_leaf) else tensor

    def add_module(self, name, module):
        self._check_init()
        self._modules[name] = module

    def forward(self, *args, **kwargs):
        raise NotImplementedError(f"[Module] {type(self).__name__} does not define forward")

    def __call__(self, *args, **kwargs):
        return self.forward(*args, **kwargs)

    # ---- walking the tree
    def named_children(self):
        return iter(self._modules.items())

    def children(self):
        return (m for _, m in self.named_children())

    def named_modules(self, prefix=""):
        yield prefix, self
        for name, m in self._modules.items():
            path = f"{prefix}.{name}" if prefix else name
            if isinstance(m, _CppModule):
                yield path, m
            else:
                yield from m.named_modules(path)

    def named_parameters(self, prefix=""):
        for name, p in self._parameters.items():
            if p is not None:
                yield (f"{prefix}.{name}" if prefix else name), p
        for name, m in self._modules.items():
            path = f"{prefix}.{name}" if prefix else name
            if isinstance(m, _CppModule):
                for sub, p in m.named_parameters():
                    yield f"{path}.{sub}", p
            else:
                yield from m.named_parameters(path)

    def parameters(self):
        return [p for _, p in self.named_parameters()]

    def named_buffers(self, prefix=""):
        for name, b in self._buffers.items():
            if b is not None:
                yield (f"{prefix}.{name}" if prefix else name), b
        for name, m in self._modules.items():
            path = f"{prefix}.{name}" if prefix else name
            if isinstance(m, _CppModule):
                for sub, b in m.named_buffers():
                    yield f"{path}.{sub}", b
            else:
                yield from m.named_buffers(path)

    def num_parameters(self):
        return sum(p.numel() for p in self.parameters())

    def state_dict(self):
        """Parameters and buffers by dotted name, detached (sharing memory with the module)."""
        out = OrderedDict()
        for name, t in list(self.named_parameters()) + list(self.named_buffers()):
            out[name] = t.detach()
        return out

    def load_state_dict(self, state_dict, strict=True):
        """Copies `state_dict` into the module in place; with strict, missing or unexpected
        names and shape mismatches raise (listing them) before anything is copied."""
        own = dict(list(self.named_parameters()) + list(self.named_buffers()))
        missing = sorted(set(own) - set(state_dict))
        unexpected = sorted(set(state_dict) - set(own))
        shapes = [f"{k}: module {own[k].shape}, state {state_dict[k].shape}"
                  for k in own if k in state_dict and own[k].shape != state_dict[k].shape]
        if shapes or (strict and (missing or unexpected)):
            raise ValueError(f"[load_state_dict] missing {missing}, unexpected {unexpected}, "
                             f"shape mismatches {shapes}")
        with _kiln_no_grad():
            for k, t in own.items():
                if k in state_dict:
                    t.copy_(state_dict[k])

    # ---- modes and moves
    def train(self, mode=True):
        object.__setattr__(self, "training", mode)
        for m in self._modules.values():
            m.train(mode)
        return self

    def eval(self):
        return self.train(False)

    def zero_grad(self, set_to_none=False):
        for p in self.parameters():
            if p.grad is not None:
                if set_to_none:
                    p.grad = None
                else:
                    p.grad.zero_()

    def to(self, device_or_dtype):
        """Moves or casts every parameter and buffer (parameters stay leaves requiring grad)."""
        with _kiln_no_grad():
            for name, p in list(self._parameters.items()):
                if p is not None:
                    self._parameters[name] = p.to(device_or_dtype).detach().requires_grad_(True)
            for name, b in list(self._buffers.items()):
                if b is not None:
                    self._buffers[name] = b.to(device_or_dtype)
        for m in self._modules.values():
            m.to(device_or_dtype)
        return self

    def __repr__(self):
        lines = [f"{type(self).__name__}("]
        for name, m in self._modules.items():
            lines.append(f"  ({name}): {m!r}".replace("\n", "\n  "))
        return "\n".join(lines) + ")" if len(lines) > 1 else lines[0] + ")"


Module.register(_CppModule)  # isinstance(kiln.nn.Linear(2, 3), kiln.nn.Module) holds


class Sequential(Module):
    """Applies its modules in order."""

    def __init__(self, *modules):
        super().__init__()
        for i, m in enumerate(modules):
            self.add_module(str(i), m)

    def forward(self, x):
        for m in self._modules.values():
            x = m(x)
        return x

    def __getitem__(self, i):
        return list(self._modules.values())[i]

    def __len__(self):
        return len(self._modules)


class ModuleList(Module):
    """A list of submodules, registered under their indices."""

    def __init__(self, modules=()):
        super().__init__()
        for m in modules:
            self.append(m)

    def append(self, m):
        self.add_module(str(len(self._modules)), m)
        return self

    def __getitem__(self, i):
        return list(self._modules.values())[i]

    def __iter__(self):
        return iter(self._modules.values())

    def __len__(self):
        return len(self._modules)


def _kiln_no_grad():
    from . import no_grad
    return no_grad()

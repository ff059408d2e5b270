"""kiln.parallel: data parallel (DDP), tensor parallel and FSDP (docs/python.md#parallel).

The machinery is C++ (kiln/parallel); this module applies it to models written in Python too:

    ddp = kiln.parallel.DistributedDataParallel(model)  # model: any kiln.nn.Module
    loss = loss_fn(ddp(x_share), y_share); loss.backward()  # .grad: the ranks' average
    with ddp.no_sync(): ...                             # accumulate without communicating

    mesh = kiln.dtensor.init_device_mesh("cpu", [world], mesh_dim_names=["tp"])
    kiln.parallel.parallelize_module(model, mesh, {"mlp.c_fc": ColwiseParallel(),
                                                   "mlp.c_proj": RowwiseParallel()})

Tensor-parallel styles and FSDP act on built-in modules (kiln.nn.Linear, Embedding, LayerNorm,
Block, GPT, ...): they replace parameters by DTensors and convert inputs and outputs around the
module's C++ forward. A plan over a Python model finds them by path through the Python
submodules; a style aimed at a module written in Python raises TypeError.
"""
import fnmatch

from . import _kiln
from ._kiln import nn as _cpp_nn
from ._kiln.parallel import (  # noqa: F401
    ColwiseParallel, MixedPrecisionPolicy, ParallelStyle, PrepareModuleInput,
    PrepareModuleOutput, RowwiseParallel, SequenceParallel, fully_sharded_parameters,
    gpt_tensor_parallel_plan, is_fully_sharded, loss_parallel, loss_parallel_cross_entropy,
)

_p = _kiln.parallel
_CppModule = _cpp_nn._CppModule


class DistributedDataParallel:
    """Data parallel over a process group (PyTorch's DistributedDataParallel).

    Collective: every rank wraps the same model. Rank 0's parameters (and buffers, unless
    broadcast_buffers=False) are copied to every rank; after each backward every parameter's
    .grad holds the group's average gradient, reduced in buckets while backward runs. Wrap the
    model after moving it to its device: DDP keeps the parameter tensors it found.
    """

    def __init__(self, module, *, process_group=None, bucket_cap_mb=25, first_bucket_cap_mb=1,
                 broadcast_buffers=True):
        if isinstance(module, _CppModule):
            target = module
        elif hasattr(module, "named_parameters") and hasattr(module, "named_buffers"):
            target = _p.ModuleTensors(list(module.named_parameters()),
                                      list(module.named_buffers()))
        else:
            raise TypeError(f"[DistributedDataParallel] expected a kiln.nn.Module, got "
                            f"{type(module).__name__}")
        mb = 1 << 20
        self.module = module
        self._ddp = _p._DDP(target, process_group, int(bucket_cap_mb * mb),
                            int(first_bucket_cap_mb * mb), broadcast_buffers)

    def __call__(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    forward = __call__

    def no_sync(self):
        """`with ddp.no_sync():` backward passes accumulate into .grad without communicating;
        the next synchronised backward averages the sums."""
        return self._ddp.no_sync()

    @property
    def sync_enabled(self):
        return self._ddp.sync_enabled

    def zero_grad(self):
        """Zeroes every gradient in place (one fill per bucket)."""
        self._ddp.zero_grad()

    @property
    def buckets(self):
        """The buckets, first reduced first: dtype, device, numel (of the gradients),
        reduced_numel (what is all-reduced: padded to 512 bytes, the flags in the last) and
        parameter names."""
        return self._ddp.buckets

    @property
    def stats(self):
        """What the last synchronised backward did: syncs, bytes, overlap/wait/comm ms."""
        return self._ddp.stats

    def parameters(self):
        return self.module.parameters()

    def named_parameters(self):
        return self.module.named_parameters()

    def state_dict(self):
        return self.module.state_dict()

    def train(self, mode=True):
        self.module.train(mode)
        return self

    def eval(self):
        return self.train(False)


def _all_modules(module):
    """(path, module) over a whole model, depth first: Python submodules, and built-in ones with
    their own (C++) submodules."""
    out = []
    for path, m in module.named_modules():
        if isinstance(m, _CppModule):
            out += [(f"{path}.{sub}" if path and sub else path or sub, c)
                    for sub, c in _p._named_modules(m)]
        else:
            out.append((path, m))
    return out


def _atoms_match(pattern, path):
    want, have = pattern.split("."), path.split(".")
    return len(want) == len(have) and all(map(fnmatch.fnmatchcase, have, want))


def parallelize_module(module, device_mesh, parallelize_plan):
    """Applies a tensor-parallel plan ({path pattern: style} or (pattern, style) pairs; "*"
    matches within one path atom, "" is `module` itself) to `module`, a built-in module or a
    Python model holding them. Every pattern must match and every style must apply: all of it
    is checked before any module changes. Collective: every rank calls it with the same plan.
    Returns `module`."""
    if isinstance(parallelize_plan, ParallelStyle):
        parallelize_plan = {"": parallelize_plan}
    plan = list(parallelize_plan.items() if isinstance(parallelize_plan, dict)
                else parallelize_plan)
    for pattern, style in plan:
        if not isinstance(pattern, str) or not isinstance(style, ParallelStyle):
            raise TypeError(f"[parallelize_module] a plan maps path patterns to styles, got "
                            f"({pattern!r}, {type(style).__name__})")
    if isinstance(module, _CppModule):
        _p._parallelize(module, device_mesh, plan)
        return module
    modules = _all_modules(module)
    targets = []
    for pattern, style in plan:
        hits = [(path, m) for path, m in modules if _atoms_match(pattern, path)]
        if not hits:
            paths = [p for p, _ in modules if p][:12]
            raise ValueError(f"[parallelize_module] plan path '{pattern}' matches no submodule "
                             f"of {type(module).__name__} (its submodules: {', '.join(paths)}"
                             f"{', ...' if len(modules) > len(paths) + 1 else ''})")
        for path, m in hits:
            if not isinstance(m, _CppModule):
                raise TypeError(f"[parallelize_module] plan path '{pattern}' matches '{path}', "
                                f"a {type(m).__name__} written in Python: styles apply to "
                                "built-in modules (kiln.nn.Linear, Embedding, LayerNorm, ...)")
            targets.append((path, pattern, m, style))
    _p._apply_styles(targets, device_mesh)
    return module


def fully_shard(module, mesh, *, reshard_after_forward=True, prefetch=True, mp_policy=None):
    """Shards a built-in module's parameters over `mesh` (PyTorch's FSDP2 fully_shard): they
    are gathered around each forward and their gradients reduce-scattered in backward. Shard
    submodules (each kiln.nn.Block) before their parent. A model written in Python: shard its
    built-in submodules. Collective. Returns `module`."""
    if not isinstance(module, _CppModule):
        raise TypeError(f"[fully_shard] {type(module).__name__} is written in Python: FSDP "
                        "gathers parameters around a built-in module's forward; shard its "
                        "built-in submodules (kiln.nn.Block, Linear, GPT, ...) instead")
    _p._fully_shard(module, mesh, reshard_after_forward, prefetch,
                    mp_policy if mp_policy is not None else MixedPrecisionPolicy())
    return module

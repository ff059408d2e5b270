"""Run by test_distributed.py under `scripts/mpirun.sh 2`: kiln.parallel from Python on 2 CPU
ranks (DDP of a Python model and of a built-in one, tensor parallel over a Python model that
holds built-in layers, the GPT plan with loss parallel, FSDP), each checked against the same
model run whole on one rank in float64; prints 'ok RANK'."""
import sys

import numpy as np

import kiln
import kiln.distributed as dist
import kiln.dtensor as dt
import kiln.nn as nn
import kiln.parallel as par

dist.init()
rank, world = dist.get_rank(), dist.get_world_size()
assert world == 2, world
f64 = kiln.float64


def close(a, b, what):
    a, b = (t.detach().numpy() if isinstance(t, kiln.Tensor) else np.asarray(t) for t in (a, b))
    np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-12, err_msg=what)


class MLP(nn.Module):
    def __init__(self, seed):
        super().__init__()
        g = kiln.Generator(seed)
        self.c_fc = nn.Linear(6, 8, generator=g, dtype=f64)
        self.c_proj = nn.Linear(8, 4, generator=g, dtype=f64)
        self.scale = nn.Parameter(kiln.ones(4, dtype=f64))  # a parameter of the Python module

    def forward(self, x):
        return self.c_proj(kiln.relu(self.c_fc(x))) * self.scale


rng = np.random.default_rng(0)  # the same on both ranks
x_all = kiln.from_numpy(rng.standard_normal((4, 6)))
x_share = x_all[2 * rank:2 * rank + 2]


def grads(model):
    return {n: p.grad.numpy().copy() for n, p in model.named_parameters()}


# ---- DDP of a Python model: rank 0's parameters everywhere, .grad the average over the ranks
ref = MLP(seed=1)
(ref(x_all) ** 2).sum().backward()  # the whole batch on one model: the sum of both shares
model = MLP(seed=1 + rank)  # different on each rank: DDP broadcasts rank 0's
ddp = par.DistributedDataParallel(model, bucket_cap_mb=0.0001, first_bucket_cap_mb=0.0001)
for (n, p), (_, q) in zip(model.named_parameters(), ref.named_parameters()):
    close(p.detach().numpy(), q.detach().numpy(), f"broadcast {n}")
assert sum(len(b["params"]) for b in ddp.buckets) == 5 and len(ddp.buckets) > 1, ddp.buckets
assert all(b["reduced_numel"] % 64 == 0 and b["reduced_numel"] >= b["numel"] for b in ddp.buckets), ddp.buckets  # 512 B
(ddp(x_share) ** 2).sum().backward()
assert ddp.stats["syncs"] == 1 and ddp.stats["bytes"] > 0, ddp.stats
for n, g in grads(model).items():
    close(g * world, grads(ref)[n], f"DDP grad {n}")  # the average is half the batch's sum

# no_sync: the first backward accumulates locally, the next synchronised one averages both
ddp.zero_grad()
with ddp.no_sync():
    assert not ddp.sync_enabled
    (ddp(x_share) ** 2).sum().backward()
assert ddp.sync_enabled
(ddp(x_share) ** 2).sum().backward()
for n, g in grads(model).items():
    close(g * world, 2 * grads(ref)[n], f"no_sync grad {n}")

# DDP of a built-in module
lin = nn.Linear(6, 3, generator=kiln.Generator(7 + rank), dtype=f64)
ddp_lin = par.DistributedDataParallel(lin)
ref_lin = nn.Linear(6, 3, generator=kiln.Generator(7), dtype=f64)
ref_lin(x_all).sum().backward()
ddp_lin(x_share).sum().backward()
close(lin.weight.grad.numpy() * world, ref_lin.weight.grad.numpy(), "DDP Linear")

# ---- tensor parallel over a Python model holding built-in layers
mesh = dt.init_device_mesh("cpu", [world], mesh_dim_names=["tp"])
tp = MLP(seed=1)
par.parallelize_module(tp, mesh, {"c_fc": par.ColwiseParallel(),
                                  "c_proj": par.RowwiseParallel()})
assert dt.is_dtensor(tp.c_fc.weight) and dt.placements(tp.c_fc.weight)[0] == dt.Shard(0)
assert dt.placements(tp.c_proj.weight)[0] == dt.Shard(1)
assert dt.to_local(tp.c_fc.weight).shape == (4, 6)
ref = MLP(seed=1)
y = tp(x_all)  # plain in, plain out (replicated): one all-reduce inside
assert not dt.is_dtensor(y)
close(y, ref(x_all), "TP forward")
(y ** 2).sum().backward()
(ref(x_all) ** 2).sum().backward()
close(dt.full_tensor(tp.c_fc.weight.grad).numpy(), ref.c_fc.weight.grad.numpy(), "TP grad")
close(tp.scale.grad.numpy(), ref.scale.grad.numpy(), "TP grad of a Python parameter")

# The GPT plan reaches inside a built-in module held by a Python one; loss parallel.
class Holder(nn.Module):
    def __init__(self):
        super().__init__()
        self.gpt = nn.GPT(vocab_size=32, context=8, width=16, layers=2, heads=2,
                          generator=kiln.Generator(3), dtype=f64)


holder, ref_gpt = Holder(), nn.GPT(vocab_size=32, context=8, width=16, layers=2, heads=2,
                                   generator=kiln.Generator(3), dtype=f64)
plan = [(f"gpt.{path}", style) for path, style in par.gpt_tensor_parallel_plan(holder.gpt, mesh)]
par.parallelize_module(holder, mesh, plan)
idx = kiln.from_numpy(rng.integers(0, 32, (2, 8)))
with par.loss_parallel():
    loss = holder.gpt.loss(idx, idx)
    loss.backward()
close(dt.full_tensor(loss).item(), ref_gpt.loss(idx, idx).item(), "GPT tensor-parallel loss")

# ---- FSDP of built-in modules: Shard(0) parameters, gradients averaged over the ranks
seq_ref = nn.Linear(6, 4, generator=kiln.Generator(5), dtype=f64)
fs = nn.Linear(6, 4, generator=kiln.Generator(5), dtype=f64)
par.fully_shard(fs, mesh)
assert par.is_fully_sharded(fs) and sorted(par.fully_sharded_parameters(fs)) == ["bias", "weight"]
assert dt.to_local(fs.weight).shape == (2, 6)
(fs(x_share) ** 2).sum().backward()
(seq_ref(x_all) ** 2).sum().backward()
close(dt.full_tensor(fs.weight.grad).numpy() * world, seq_ref.weight.grad.numpy(), "FSDP grad")

dist.barrier()
sys.stdout.write(f"ok {rank}\n")
sys.stdout.flush()

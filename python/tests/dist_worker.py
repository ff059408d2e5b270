"""Run by test_distributed.py under `scripts/mpirun.sh 2`: collectives and DTensors from
Python on 2 CPU ranks, each checked against what the ranks' inputs give; prints 'ok RANK'."""
import sys

import numpy as np

import kiln
import kiln.distributed as dist
import kiln.dtensor as dt

dist.init()
rank, world = dist.get_rank(), dist.get_world_size()
assert world == 2, world

t = kiln.full([3], float(rank + 1))
assert dist.all_reduce(t).tolist() == [3.0] * 3
assert dist.all_reduce(t, dist.ReduceOp.MAX).tolist() == [2.0] * 3
g = dist.all_gather_into_tensor(kiln.full([2], float(rank)))
assert g.tolist() == [0.0, 0.0, 1.0, 1.0]
b = dist.broadcast(kiln.full([2], float(rank + 5)), 1)
assert b.tolist() == [6.0, 6.0]
x = kiln.ones(4, requires_grad=True)
# all_reduce's gradient is the all_reduce of the incoming gradients (ones on each rank: 2),
# then times this rank's factor.
dist.all_reduce(x * (rank + 1)).sum().backward()
assert x.grad.tolist() == [2.0 * (rank + 1)] * 4, x.grad.tolist()

mesh = dt.init_device_mesh("cpu", [2])
rng = np.random.default_rng(0)  # the same on both ranks
a = kiln.from_numpy(rng.standard_normal((4, 6)))
w = kiln.from_numpy(rng.standard_normal((6, 5)))
da = dt.distribute_tensor(a, mesh, [dt.Shard(0)])
dw = dt.distribute_tensor(w, mesh, [dt.Replicate()])
assert dt.to_local(da).shape == (2, 6)
y = kiln.relu(da @ dw)
assert dt.placements(y)[0] == dt.Shard(0)
np.testing.assert_allclose(dt.full_tensor(y).numpy(), np.maximum(a.numpy() @ w.numpy(), 0),
                           rtol=1e-12)
r = dt.redistribute(da, [dt.Replicate()])
assert dt.to_local(r).shape == (4, 6)
dist.barrier()
sys.stdout.write(f"ok {rank}\n")
sys.stdout.flush()

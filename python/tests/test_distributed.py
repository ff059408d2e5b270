"""kiln.distributed and kiln.dtensor: a world of one in this process, and two ranks under
mpirun running dist_worker.py."""
import os
import re
import shutil
import subprocess
import sys

import pytest

import kiln
import kiln.distributed as dist
import kiln.dtensor as dt
from kiln.parallel import ColwiseParallel, RowwiseParallel

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_a_world_of_one_without_a_launcher():
    dist.init()
    assert dist.get_world_size() == 1 and dist.get_rank() == 0
    assert dist.all_reduce(kiln.ones(2)).tolist() == [1.0, 1.0]
    mesh = dt.init_device_mesh("cpu", [1])
    d = dt.distribute_tensor(kiln.arange(4.0), mesh, [dt.Shard(0)])
    assert dt.is_dtensor(d) and not dt.is_dtensor(kiln.ones(1))
    assert dt.full_tensor((d + 1).sum()).item() == 10.0
    assert repr(d).startswith("DTensor(")
    with pytest.raises(ValueError, match=r"\[item\] a DTensor has no data of its own"):
        d.sum().item()
    with pytest.raises(ValueError, match=r"\[data_ptr\] .*use kiln.dtensor.to_local\(t\) for this rank's shard$"):
        d.data_ptr()
    with pytest.raises(TypeError, match=r"\[placements\] not a DTensor"):
        dt.placements(kiln.ones(1))


class TwoLayers(kiln.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = kiln.nn.Linear(4, 4)
        self.inner = kiln.nn.Sequential(kiln.nn.Linear(4, 4))

    def forward(self, x):
        return self.inner(self.fc(x))


def test_parallel_bad_input_raises_before_anything_changes():
    dist.init()
    mesh = dt.init_device_mesh("cpu", [1])
    m = TwoLayers()
    with pytest.raises(ValueError, match=r"\[parallelize_module\] plan path 'nope' matches no "
                       r"submodule of TwoLayers \(its submodules: fc, inner, inner.0\)"):
        kiln.parallel.parallelize_module(m, mesh, {"fc": ColwiseParallel(), "nope": RowwiseParallel()})
    with pytest.raises(TypeError, match=r"matches 'inner', a Sequential written in Python"):
        kiln.parallel.parallelize_module(m, mesh, {"fc": ColwiseParallel(), "inner": RowwiseParallel()})
    with pytest.raises(ValueError, match=r"matched by more than one style that shards"):
        kiln.parallel.parallelize_module(m, mesh, {"fc": ColwiseParallel(), "f*": RowwiseParallel()})
    with pytest.raises(TypeError, match=r"a plan maps path patterns to styles"):
        kiln.parallel.parallelize_module(m, mesh, {"fc": "colwise"})
    with pytest.raises(ValueError, match=r"\[ColwiseParallel\] layouts of 2 inputs"):
        ColwiseParallel(input_layouts=(dt.Replicate(), dt.Replicate()))
    assert not dt.is_dtensor(m.fc.weight)  # every failed plan left the model as it was
    with pytest.raises(TypeError, match=r"\[fully_shard\] TwoLayers is written in Python"):
        kiln.parallel.fully_shard(m, mesh)
    with pytest.raises(TypeError, match=r"\[DistributedDataParallel\] expected a kiln.nn.Module"):
        kiln.parallel.DistributedDataParallel(object())
    # A world of one: DDP changes nothing, and the plan applies (shards of the whole).
    ddp = kiln.parallel.DistributedDataParallel(m)
    m(kiln.ones(2, 4)).sum().backward()
    assert ddp.stats["syncs"] == 1 and m.fc.weight.grad is not None
    kiln.parallel.parallelize_module(m, mesh, {"fc": ColwiseParallel(),
                                               "inner.0": RowwiseParallel()})
    assert dt.is_dtensor(m.fc.weight) and dt.is_dtensor(m.inner[0].weight)


@pytest.mark.skipif(shutil.which("mpirun") is None, reason="Open MPI's mpirun is not installed")
@pytest.mark.parametrize("worker", ["dist_worker.py", "parallel_worker.py"])
def test_two_ranks_under_mpirun(worker):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    cmd = ["bash", os.path.join(ROOT, "scripts", "mpirun.sh"), "2", sys.executable,
           os.path.join(os.path.dirname(__file__), worker)]
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    assert sorted(re.findall(r"ok (\d)", r.stdout)) == ["0", "1"], r.stdout

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
    with pytest.raises(TypeError, match=r"\[placements\] not a DTensor"):
        dt.placements(kiln.ones(1))


@pytest.mark.skipif(shutil.which("mpirun") is None, reason="Open MPI's mpirun is not installed")
def test_two_ranks_under_mpirun():
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    cmd = ["bash", os.path.join(ROOT, "scripts", "mpirun.sh"), "2", sys.executable,
           os.path.join(os.path.dirname(__file__), "dist_worker.py")]
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    assert sorted(re.findall(r"ok (\d)", r.stdout)) == ["0", "1"], r.stdout

# PyTorch's side of bench/collectives_bench.cpp (issue 18): all_reduce, all_gather_into_tensor
# and reduce_scatter_tensor of float32 tensors from 8 B to 1 GiB (every fourfold size) over NCCL,
# one process per GPU, with the same sizes, keys and bus bandwidth (nccl-tests' definitions):
#   torchrun --standalone --nproc_per_node=N bench/torch_collectives.py [--max-bytes B] [--json F]
# Every result is checked before it is timed; each timed call ends with a synchronize and each
# repeat starts from a barrier, as Kiln's bench times. Rank 0 prints JSON (with NCCL's version).
# --device cpu (gloo, to check the script without a GPU) times the all_reduce alone: gloo has no
# all_gather_into_tensor or reduce_scatter_tensor.
import argparse, json, os, statistics, time

import torch
import torch.distributed as dist


def size_key(b):
    for shift, unit in ((30, "g"), (20, "m"), (10, "k")):
        if b >= 1 << shift:
            return f"{b >> shift}{unit}"
    return f"{b}b"


def sizes_up_to(m):  # 8 B, then 16 B times powers of 4 (1 GiB is one), as Kiln's bench
    v = [8] if m >= 8 else []
    b = 16
    while b <= m:
        v.append(b)
        b *= 4
    if v and v[-1] < m:
        v.append(m)
    return v


def iters_at(b):
    return 50 if b <= 1 << 20 else (10 if b <= 64 << 20 else 3)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--max-bytes", type=int, default=1 << 30)
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    p.add_argument("--json")
    a = p.parse_args()
    cuda = a.device == "cuda"
    dist.init_process_group("nccl" if cuda else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    dev = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0))) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(dev)
    ring = (world - 1) / world if world > 1 else 1.0  # nccl-tests' factors (1 on one rank)
    ring2 = 2 * ring if world > 1 else 1.0
    avg = dist.ReduceOp.AVG if cuda else dist.ReduceOp.SUM  # gloo has no AVG

    def values(n, r):
        return (torch.arange(n, dtype=torch.float32) % 7 + (r + 1)).to(dev)

    def timed(iters, fn):  # as Kiln's: warm-up, then a barrier before each repeat
        for _ in range(min(iters, 5)):
            fn()
            if cuda:
                torch.cuda.synchronize()
        ts = []
        for _ in range(5):
            dist.barrier()
            t0 = time.perf_counter()
            for _ in range(iters):
                fn()
                if cuda:
                    torch.cuda.synchronize()
            ts.append((time.perf_counter() - t0) / iters)
        return statistics.median(ts)

    res = {"world": world, "torch": torch.__version__}
    if cuda:
        res["gpu"], res["nccl"] = torch.cuda.get_device_name(), ".".join(map(str, torch.cuda.nccl.version()))
    sum_ranks = world * (world + 1) / 2
    for b in sizes_up_to(a.max_bytes):
        n, k, it = b // 4, size_key(b), iters_at(b)
        x = values(n, rank)
        dist.all_reduce(x)
        want = (torch.arange(n, dtype=torch.float32) % 7 * world + sum_ranks).to(dev)
        assert torch.equal(x, want), f"all_reduce of {k}"
        y = values(n, rank)  # timed as an average, whose values stay bounded (Kiln's times the same)
        s = timed(it, lambda: dist.all_reduce(y, op=avg))
        res[f"all_reduce_{k}_us"], res[f"all_reduce_{k}_busbw_GBs"] = s * 1e6, b / s / 1e9 * ring2
        if not cuda:  # gloo has neither all_gather_into_tensor nor reduce_scatter_tensor
            continue
        part = max(1, n // world)
        piece, out = values(part, rank), torch.empty(part * world, dtype=torch.float32, device=dev)
        dist.all_gather_into_tensor(out, piece)
        every = torch.cat([values(part, r) for r in range(world)])
        assert torch.equal(out, every), f"all_gather of {k}"
        s = timed(it, lambda: dist.all_gather_into_tensor(out, piece))
        res[f"all_gather_{k}_us"], res[f"all_gather_{k}_busbw_GBs"] = s * 1e6, part * world * 4 / s / 1e9 * ring
        whole, mine = values(part * world, rank), torch.empty(part, dtype=torch.float32, device=dev)
        dist.reduce_scatter_tensor(mine, whole)
        cols = torch.arange(rank * part, (rank + 1) * part, dtype=torch.float32)
        assert torch.equal(mine, (cols % 7 * world + sum_ranks).to(dev)), f"reduce_scatter of {k}"
        s = timed(it, lambda: dist.reduce_scatter_tensor(mine, whole))
        res[f"reduce_scatter_{k}_us"] = s * 1e6
        res[f"reduce_scatter_{k}_busbw_GBs"] = part * world * 4 / s / 1e9 * ring
    if rank == 0:
        print(json.dumps(res, indent=1))
        if a.json:
            open(a.json, "w").write(json.dumps(res, indent=1))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

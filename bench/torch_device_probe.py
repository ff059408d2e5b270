# PyTorch's side of `kiln bench gpt_ddp --probe --probe-allreduces N` (Note [The device probe] in
# tools/kiln/device_probe.cpp): two CUDA graphs made before any collective, `small` (150 steps of
# y * 0.999 + 0.001 on 1024 floats: 300 kernels, the device's cost a kernel) and `big` (10 on 16M
# floats: bandwidth), timed (the fastest of 3 batches of 50 replays, a synchronize ending each)
# at the start and after each of N all-reduces of 12 MiB, one process per GPU:
#   torchrun --standalone --nproc_per_node=2 bench/torch_device_probe.py [--allreduces N]
# It tells whether a PyTorch process slows after its collectives as a Kiln process does
# (bench/gpu_runs.md, V10 and V12: it does, by the same 0.18 us a kernel, from the first all-reduce).
import argparse, time

import torch
import torch.distributed as dist


def chain(t, steps):
    y = t
    for _ in range(steps):
        y = y * 0.999 + 0.001
    return y


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--allreduces", type=int, default=4)
    args = ap.parse_args()
    dist.init_process_group("nccl")
    rank = dist.get_rank()
    torch.cuda.set_device(rank % torch.cuda.device_count())
    small, big = torch.zeros(1024, device="cuda"), torch.zeros(1 << 24, device="cuda")
    side = torch.cuda.Stream()  # capture needs a stream other than the legacy default
    with torch.cuda.stream(side):
        for _ in range(3):
            chain(small, 150), chain(big, 10)
    torch.cuda.synchronize()
    graphs = [torch.cuda.CUDAGraph(), torch.cuda.CUDAGraph()]
    with torch.cuda.graph(graphs[0]):
        chain(small, 150)
    with torch.cuda.graph(graphs[1]):
        chain(big, 10)

    def report(phase):
        times = []
        for g in graphs:
            best = float("inf")
            for _ in range(3):
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                for _ in range(50):
                    g.replay()
                torch.cuda.synchronize()
                best = min(best, (time.perf_counter() - t0) / 50 * 1e6)
            times.append(best)
        print(f"torch probe rank {rank} {phase:<28} small {times[0]:8.1f} us (300 kernels), "
              f"big {times[1]:8.1f} us", flush=True)

    report("start")
    t = torch.ones(3 << 20, device="cuda")  # 12 MiB, DDP gpt's last bucket
    for i in range(args.allreduces):
        dist.all_reduce(t)
        torch.cuda.synchronize()
        report(f"{i + 1} all-reduce(s) of 12288 KiB")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

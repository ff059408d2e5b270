# PyTorch's side of issue 18's distributed GPT steps: the model of bench/torch_gpt_large.py
# (../shared/anchors/torch_anchor.py's GPT) trained under DDP, tensor parallelism or FSDP2,
# pinned to PyTorch's best practice, one process per GPU:
#   torchrun --standalone --nproc_per_node=N bench/torch_gpt_dist.py --mode ddp --model gpt_large
#   (--mode tp | fsdp; --amp bf16 for bfloat16 autocast over float32 master weights; --json F)
# - ddp: DistributedDataParallel(gradient_as_bucket_view, static_graph), fused AdamW, each rank
#   its own batch; timed eager and under torch.compile, the better reported as best.
# - tp: parallelize_module with Kiln's plan (parallel::gpt_tensor_parallel_plan): the embedding
#   row-wise, q, k and v column-wise (Kiln's fused c_attn in three chunks), the attention and MLP
#   output projections row-wise, the MLP's first product column-wise, the head column-wise
#   under loss_parallel; every rank the same batch.
# - fsdp: fully_shard on every block and on the root (resharding after forward), each rank its
#   own batch; --fsdp-mp policy gathers bfloat16 parameters and reduces float32 gradients
#   (MixedPrecisionPolicy) instead of autocast over float32 parameters (the default, as Kiln's).
# Rank 0 prints JSON: tokens/s over all ranks and per GPU, peak memory per GPU, the versions (and
# NCCL's). --device cpu runs on gloo for checking the script (ddp only with PyTorch < 2.4).
# One difference from Kiln's model stays: this head is its own Linear (the anchors' model), where
# Kiln's GPT ties it to the token embedding (512 x width more parameters here, 0.5% at
# gpt_large), since tying under parallelize_module and fully_shard has not been tried.
import argparse, importlib, json, os, statistics, sys, time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

CONFIGS = {  # vocab, context, width, layers, heads, batch per rank
    "gpt": (512, 128, 256, 4, 4, 8),
    "gpt_large": (512, 1024, 768, 12, 12, 8),
}


def causal_attention(q, k, v):
    if hasattr(F, "scaled_dot_product_attention"):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)
    # PyTorch < 2.0 (Debian's 1.13, where this script is checked on CPU ranks): the math.
    t = q.shape[-2]
    s = (q @ k.transpose(-2, -1)) / q.shape[-1] ** 0.5
    s = s.masked_fill(torch.ones(t, t, dtype=torch.bool, device=q.device).triu(1), float("-inf"))
    return s.softmax(-1) @ v


class Block(nn.Module):
    def __init__(s, d, h, split_qkv):
        super().__init__()
        s.ln1, s.proj = nn.LayerNorm(d), nn.Linear(d, d)
        s.ln2, s.fc, s.fc2, s.h, s.hd = nn.LayerNorm(d), nn.Linear(d, 4 * d), nn.Linear(4 * d, d), h, d // h
        s.split_qkv = split_qkv
        if split_qkv:  # tensor parallel: each projection sharded by heads
            s.q, s.k, s.v = nn.Linear(d, d), nn.Linear(d, d), nn.Linear(d, d)
        else:
            s.attn = nn.Linear(d, 3 * d)

    def forward(s, x):
        b, t, _ = x.shape
        h = s.ln1(x)
        q, k, v = (s.q(h), s.k(h), s.v(h)) if s.split_qkv else s.attn(h).chunk(3, dim=2)
        # -1 heads: under tensor parallelism each rank holds its share of them.
        q, k, v = [z.view(b, t, -1, s.hd).transpose(1, 2) for z in (q, k, v)]
        y = causal_attention(q, k, v).transpose(1, 2).reshape(b, t, -1)
        x = x + s.proj(y)
        return x + s.fc2(F.gelu(s.fc(s.ln2(x))))


class GPT(nn.Module):
    def __init__(s, vocab, context, width, layers, heads, split_qkv=False):
        super().__init__()
        s.wte, s.wpe = nn.Embedding(vocab, width), nn.Embedding(context, width)
        s.blocks = nn.ModuleList([Block(width, heads, split_qkv) for _ in range(layers)])
        s.lnf, s.head = nn.LayerNorm(width), nn.Linear(width, vocab, bias=False)

    def forward(s, idx):
        x = s.wte(idx) + s.wpe(torch.arange(idx.shape[1], device=idx.device))
        for b in s.blocks:
            x = b(x)
        return s.head(s.lnf(x))


def parse():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--mode", choices=("ddp", "tp", "fsdp"), required=True)
    p.add_argument("--model", choices=tuple(CONFIGS), default="gpt_large")
    p.add_argument("--amp", choices=("bf16", "none"), default="bf16")
    p.add_argument("--fsdp-mp", choices=("autocast", "policy"), default="autocast")
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    p.add_argument("--iters", type=int, default=0, help="timed steps a repeat (default: 20 gpt, 5 gpt_large)")
    p.add_argument("--no-compile", action="store_true", help="ddp: skip torch.compile")
    p.add_argument("--pipelined", action="store_true",
                   help="steps back to back, one synchronize a repeat (keys gain _pipelined)")
    p.add_argument("--json")
    return p.parse_args()


def main():
    a = parse()
    if a.mode != "ddp":
        try:  # parallelize_module, DTensor and fully_shard are public from PyTorch 2.4 on
            importlib.import_module("torch.distributed.tensor.parallel")
            getattr(importlib.import_module("torch.distributed.fsdp"), "fully_shard")
        except (ImportError, AttributeError) as e:
            sys.exit(f"[torch_gpt_dist] --mode {a.mode} needs PyTorch 2.4 or later "
                     f"(this is {torch.__version__}): {e}")
    cuda = a.device == "cuda"
    dist.init_process_group("nccl" if cuda else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    local = int(os.environ.get("LOCAL_RANK", 0))
    dev = torch.device("cuda", local) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(dev)
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    vocab, context, width, layers, heads, batch = CONFIGS[a.model]
    iters = a.iters or (20 if a.model == "gpt" else 5)
    torch.manual_seed(0)  # the same weights on every rank, as Kiln's ranks start
    model = GPT(vocab, context, width, layers, heads, split_qkv=a.mode == "tp").to(dev)
    params = sum(p.numel() for p in model.parameters())
    # ddp and fsdp: each rank its own batch; tp: every rank the same one.
    g = torch.Generator().manual_seed(1 + (0 if a.mode == "tp" else rank))
    idx = torch.randint(0, vocab, (batch, context), generator=g).to(dev)
    tgt = torch.randint(0, vocab, (batch, context), generator=g).to(dev)
    use_autocast = a.amp == "bf16" and not (a.mode == "fsdp" and a.fsdp_mp == "policy")
    loss_ctx = None

    if a.mode == "ddp":
        from torch.nn.parallel import DistributedDataParallel as DDP
        wrapped = DDP(model, device_ids=[local] if cuda else None, gradient_as_bucket_view=True,
                      static_graph=True)
    elif a.mode == "tp":
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.tensor import Replicate, Shard
        from torch.distributed.tensor.parallel import (ColwiseParallel, RowwiseParallel,
                                                       loss_parallel, parallelize_module)
        assert heads % world == 0, f"{heads} heads do not divide over {world} ranks"
        mesh = init_device_mesh(a.device, (world,))
        plan = {"wte": RowwiseParallel(input_layouts=Replicate(), output_layouts=Replicate())}
        for i in range(layers):
            plan.update({f"blocks.{i}.q": ColwiseParallel(), f"blocks.{i}.k": ColwiseParallel(),
                         f"blocks.{i}.v": ColwiseParallel(), f"blocks.{i}.proj": RowwiseParallel(),
                         f"blocks.{i}.fc": ColwiseParallel(), f"blocks.{i}.fc2": RowwiseParallel()})
        plan["head"] = ColwiseParallel(output_layouts=Shard(-1), use_local_output=False)
        wrapped = parallelize_module(model, mesh, plan)
        loss_ctx = loss_parallel
    else:
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
        mp = MixedPrecisionPolicy()
        if a.amp == "bf16" and a.fsdp_mp == "policy":
            mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        for b in model.blocks:
            fully_shard(b, mp_policy=mp, reshard_after_forward=True)
        fully_shard(model, mp_policy=mp, reshard_after_forward=True)
        wrapped = model

    opt_kw = {"lr": 3e-4}
    if cuda:
        opt_kw["fused"] = True
    groups = list(wrapped.parameters())
    if a.mode == "tp":  # fused AdamW takes DTensors and plain tensors in separate groups
        from torch.distributed.tensor import DTensor
        groups = [{"params": [p for p in groups if isinstance(p, DTensor) == d]} for d in (True, False)]
        groups = [g for g in groups if g["params"]]
    opt = torch.optim.AdamW(groups, **opt_kw)

    def step(m):
        opt.zero_grad(set_to_none=True)  # PyTorch's default; no graph capture here
        with torch.autocast(a.device, dtype=torch.bfloat16, enabled=use_autocast):
            logits = m(idx)
        if loss_ctx is not None:
            with loss_ctx():
                loss = F.cross_entropy(logits.float().flatten(0, 1), tgt.flatten())
                loss.backward()
        else:
            loss = F.cross_entropy(logits.float().view(-1, vocab), tgt.view(-1))
            loss.backward()
        opt.step()
        return loss

    def sync():
        if cuda:
            torch.cuda.synchronize()

    def timeit(m):
        # As Kiln's workloads time (Note [Timing the distributed GPT steps]): the loss must fall
        # over 3 steps, then min(iters, 5) warm-up steps, then 3 repeats of `iters` steps, each
        # repeat from a barrier and each step ending with a synchronize; the median.
        first = float(step(m))
        for _ in range(2):
            last = float(step(m))
        assert last < first, f"loss did not fall: {first} -> {last}"
        for _ in range(min(iters, 5)):
            step(m)
            sync()
        ts = []
        for _ in range(3):
            dist.barrier()
            t0 = time.perf_counter()
            for _ in range(iters):
                step(m)
                if not a.pipelined:
                    sync()
            sync()
            ts.append((time.perf_counter() - t0) / iters)
        return statistics.median(ts)

    if cuda:
        torch.cuda.reset_peak_memory_stats(dev)
    key = f"{a.model}_{a.mode}" + ("_bf16" if a.amp == "bf16" else "") + ("_pipelined" if a.pipelined else "")
    tokens = batch * context * (1 if a.mode == "tp" else world)  # tokens a step over all ranks
    res = {"mode": a.mode, "model": a.model, "world": world, "params": params, "amp": a.amp}
    t = timeit(wrapped)
    res[key + "_eager_tokens_per_s"] = tokens / t
    best = tokens / t
    if cuda:
        res[key + "_peak_mem_mb"] = torch.cuda.max_memory_allocated(dev) / 2**20
    if a.mode == "ddp" and not a.no_compile and hasattr(torch, "compile"):
        try:
            tc = tokens / timeit(torch.compile(wrapped))
            res[key + "_compile_tokens_per_s"] = tc
            best = max(best, tc)
        except Exception as e:  # noqa: BLE001 - report, do not fail the run
            res[key + "_compile_err"] = repr(e)[:300]
    res[key + "_best_tokens_per_s"] = best
    res[key + "_best_tokens_per_s_per_gpu"] = best / world
    res["torch"] = torch.__version__
    if cuda:
        res["gpu"] = torch.cuda.get_device_name()
        res["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
    if a.mode == "fsdp":
        res["fsdp_mp"] = a.fsdp_mp
    if rank == 0:
        print(json.dumps(res, indent=1))
        if a.json:
            open(a.json, "w").write(json.dumps(res, indent=1))
    dist.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main())

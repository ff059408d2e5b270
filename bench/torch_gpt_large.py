# PyTorch's side of `kiln bench gpt_large` (issue 6: the compute-bound GPT): the model of
# ../shared/anchors/torch_anchor.py at width 768, 12 layers, 12 heads, context 1024, batch 8,
# timed eager, as a captured CUDA graph, and under torch.compile; prints JSON in tokens/s.
# Run on a GPU machine: python3 bench/torch_gpt_large.py [out.json]
import json, statistics, sys, time
import torch, torch.nn as nn, torch.nn.functional as F

torch.backends.cuda.matmul.allow_tf32 = True
dev, V, T, D, L, H, B = "cuda", 512, 1024, 768, 12, 12, 8


class Block(nn.Module):
    def __init__(s, d, h):
        super().__init__()
        s.ln1, s.attn, s.proj = nn.LayerNorm(d), nn.Linear(d, 3 * d), nn.Linear(d, d)
        s.ln2, s.fc, s.fc2, s.h = nn.LayerNorm(d), nn.Linear(d, 4 * d), nn.Linear(4 * d, d), h

    def forward(s, x):
        b, t, c = x.shape
        q, k, v = s.attn(s.ln1(x)).split(c, dim=2)
        q, k, v = [z.view(b, t, s.h, c // s.h).transpose(1, 2) for z in (q, k, v)]
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, t, c)
        x = x + s.proj(y)
        return x + s.fc2(F.gelu(s.fc(s.ln2(x))))


class GPT(nn.Module):
    def __init__(s):
        super().__init__()
        s.wte, s.wpe = nn.Embedding(V, D), nn.Embedding(T, D)
        s.blocks = nn.ModuleList([Block(D, H) for _ in range(L)])
        s.lnf, s.head = nn.LayerNorm(D), nn.Linear(D, V, bias=False)

    def forward(s, idx):
        x = s.wte(idx) + s.wpe(torch.arange(idx.shape[1], device=idx.device))
        for b in s.blocks:
            x = b(x)
        return s.head(s.lnf(x))


def timeit(fn, iters=5, repeats=3):
    for _ in range(2):
        fn()
    torch.cuda.synchronize()
    ts = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(iters):
            fn()
        torch.cuda.synchronize()
        ts.append((time.perf_counter() - t0) / iters)
    return statistics.median(ts)


torch.manual_seed(0)
model = GPT().to(dev)
opt = torch.optim.AdamW(model.parameters(), lr=3e-4, capturable=True, foreach=True)
idx = torch.randint(0, V, (B, T), device=dev)
tgt = torch.randint(0, V, (B, T), device=dev)


def step(m):
    opt.zero_grad(set_to_none=False)
    loss = F.cross_entropy(m(idx).view(-1, V), tgt.view(-1))
    loss.backward()
    opt.step()
    return loss


res, tokens = {}, B * T
res["gpt_large_eager_tokens_per_s"] = tokens / timeit(lambda: step(model))
s = torch.cuda.Stream()
s.wait_stream(torch.cuda.current_stream())
with torch.cuda.stream(s):
    for _ in range(3):
        step(model)
torch.cuda.current_stream().wait_stream(s)
g = torch.cuda.CUDAGraph()
with torch.cuda.graph(g):
    step(model)
res["gpt_large_graph_tokens_per_s"] = tokens / timeit(g.replay)
try:
    cm = torch.compile(model)
    res["gpt_large_compile_tokens_per_s"] = tokens / timeit(lambda: step(cm))
except Exception as e:  # noqa: BLE001 - report, do not fail the run
    res["gpt_large_compile_err"] = repr(e)[:300]
res["torch"], res["gpu"] = torch.__version__, torch.cuda.get_device_name()
print(json.dumps(res, indent=1))
if len(sys.argv) > 1:
    open(sys.argv[1], "w").write(json.dumps(res, indent=1))

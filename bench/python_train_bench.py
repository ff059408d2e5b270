"""The `mlp` and `gpt` training steps with the model written in Python (kiln.nn.Module
subclasses over the built-in layers), eager and compiled, beside the same steps in C++
(`kiln bench mlp|gpt --json`, run as a subprocess in the same run on the same device and thread
count). Checks that the loss falls before timing; prints JSON with ratios Python / C++.

Run: build/venv/bin/python bench/python_train_bench.py [--device cpu|sim] [--threads N] [--smoke]
"""
import argparse
import json
import os
import statistics
import subprocess
import time

import kiln

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class MLP(kiln.nn.Module):
    """4 x (Linear 512 -> 512, GELU) + Linear 512 -> 10, as kiln bench mlp."""

    def __init__(self, gen):
        super().__init__()
        self.layers = kiln.nn.ModuleList(
            [kiln.nn.Linear(512, 512, generator=gen) for _ in range(4)])
        self.act = kiln.nn.GELU()
        self.head = kiln.nn.Linear(512, 10, generator=gen)

    def forward(self, x):
        for layer in self.layers:
            x = self.act(layer(x))
        return self.head(x)


class GPT(kiln.nn.Module):
    """kiln bench gpt's model (vocab 512, context 128, width 256, 4 layers, 4 heads), its
    forward written in Python over the built-in transformer blocks, the head tied to wte."""

    def __init__(self, gen, vocab=512, context=128, width=256, layers=4, heads=4):
        super().__init__()
        self.wte = kiln.nn.Embedding(vocab, width, generator=gen)
        self.wpe = kiln.nn.Embedding(context, width, generator=gen)
        self.h = kiln.nn.ModuleList([kiln.nn.Block(width, heads, generator=gen) for _ in range(layers)])
        self.ln_f = kiln.nn.LayerNorm(width)
        self.vocab = vocab
        # GPT-2's N(0, 0.02) embeddings, as nn::GPT's: with Embedding's N(0, 1) the tied head's
        # logits are so large that softmax's gradient is mostly denormals, and every product
        # that reads it runs ten times slower.
        with kiln.no_grad():
            for emb in (self.wte, self.wpe):
                emb.weight.copy_(kiln.randn(*emb.weight.shape, generator=gen) * 0.02)

    def loss(self, idx, targets):
        t = idx.shape[1]
        x = self.wte(idx) + self.wpe(kiln.arange(t, device=idx.device))
        for block in self.h:
            x = block(x)
        logits = kiln.linear(self.ln_f(x), self.wte.weight)
        return kiln.cross_entropy(logits.view(-1, self.vocab), targets.view(-1))


def seconds_per_call(fn, iters, repeats=3):
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(iters):
            fn()
        kiln.synchronize()
        times.append((time.perf_counter() - start) / iters)
    return statistics.median(times)


def python_steps(workload, device, iters):
    gen = kiln.Generator(0)
    if workload == "mlp":
        model = MLP(gen).to(device)
        x, y = kiln.randn(64, 512, generator=gen).to(device), kiln.randint(0, 10, (64,), generator=gen).to(device)
        loss_of = lambda: kiln.cross_entropy(model(x), y)  # noqa: E731
    else:
        model = GPT(gen).to(device)
        x = kiln.randint(0, 512, (8, 128), generator=gen).to(device)
        y = kiln.randint(0, 512, (8, 128), generator=gen).to(device)
        loss_of = lambda: model.loss(x, y)  # noqa: E731
    opt = kiln.optim.AdamW(model.parameters(), lr=1e-3 if workload == "mlp" else 3e-4)

    def step():
        opt.zero_grad()
        loss = loss_of()
        loss.backward()
        opt.step()
        return loss.detach()

    first = step().item()
    for _ in range(3):
        last = step().item()
    assert last < first, f"{workload}: the loss did not fall ({first} -> {last})"
    out = {f"python_{workload}_eager_us": seconds_per_call(step, iters) * 1e6}
    compiled = kiln.compile(step, name=f"python_{workload}")
    compiled()
    out[f"python_{workload}_compiled_us"] = seconds_per_call(compiled, iters) * 1e6
    return out


def cpp_steps(workload, device, threads, iters):
    cmd = [os.path.join(ROOT, "build", "release", "kiln"), "bench", workload, "--json",
           "--device", device, "--threads", str(threads), "--iters", str(iters)]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({r.returncode}):\n{r.stderr[-2000:]}")
    return json.loads(r.stdout)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--smoke", action="store_true")
    args = ap.parse_args()
    kiln.set_num_threads(args.threads)
    if args.device != "cpu":
        kiln.load_backend(args.device.split(":")[0])
        kiln.set_allow_tf32(True)  # as `kiln bench` (the C++ side) sets it on a device
    out = {"device": args.device, "threads": args.threads}
    # A GPU step takes microseconds to milliseconds: more of them per timing.
    scale = 1 if args.device == "cpu" or args.smoke else 20
    for workload, iters in (("mlp", 2 if args.smoke else 20 * scale),
                            ("gpt", 1 if args.smoke else 3 * scale)):
        py = python_steps(workload, args.device, iters)
        out.update(py)
        if args.smoke:
            continue
        cpp = cpp_steps(workload, args.device, args.threads, iters)
        c_eager = cpp[f"{workload}_eager_us"]
        out[f"cpp_{workload}_eager_us"] = c_eager
        out[f"python_over_cpp_{workload}_eager"] = py[f"python_{workload}_eager_us"] / c_eager
        if f"{workload}_graph_us" in cpp:
            out[f"cpp_{workload}_graph_us"] = cpp[f"{workload}_graph_us"]
            out[f"python_compiled_over_cpp_{workload}_graph"] = (
                py[f"python_{workload}_compiled_us"] / cpp[f"{workload}_graph_us"])
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()

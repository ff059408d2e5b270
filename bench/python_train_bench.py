"""The `mlp` and `gpt` training steps with the model written in Python (kiln.nn.Module
subclasses over the built-in layers), eager and compiled, beside the same steps in C++
(`kiln bench mlp|gpt --json`, run as a subprocess in the same run on the same device and thread
count). Checks that the loss falls before timing; prints JSON with ratios Python / C++.

Run: build/venv/bin/python bench/python_train_bench.py [--device cpu|sim|cuda] [--threads N]
     [--rounds R] [--smoke]
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
        # nn::GPT's initialisation (GPT-2's): weights N(0, 0.02), residual projections
        # N(0, 0.02 / sqrt(2 layers)), biases zero, LayerNorms as made. The same values make the
        # same work: with Embedding's N(0, 1) the tied head's logits are so large that softmax's
        # gradient is mostly denormals, and every product that reads it runs ten times slower on
        # the cpu.
        with kiln.no_grad():
            for name, p in self.named_parameters():
                if name.startswith("ln_") or ".ln_" in name:
                    continue
                if not name.endswith("weight"):
                    p.zero_()
                else:
                    std = 0.02 / (2 * layers) ** 0.5 if name.endswith("c_proj.weight") else 0.02
                    p.copy_(kiln.randn(*p.shape, generator=gen) * std)

    def loss(self, idx, targets):
        t = idx.shape[1]
        x = self.wte(idx) + self.wpe(kiln.arange(t, device=idx.device))
        for block in self.h:
            x = block(x)
        logits = kiln.linear(self.ln_f(x), self.wte.weight)
        return kiln.cross_entropy(logits.view(-1, self.vocab), targets.view(-1))


def seconds_per_call(fn, iters, repeats=3, warm=1):
    for _ in range(warm):
        fn()
    kiln.synchronize()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(iters):
            fn()
        kiln.synchronize()
        times.append((time.perf_counter() - start) / iters)
    return statistics.median(times)


# `kiln bench mlp|gpt`'s schedule (tools/kiln/workloads.cpp): steps checked, eager repeats. Each
# timed step trains the model further, and on the cpu the step's cost depends on where training
# is: the mlp fits its 64 samples within a few dozen steps, its gradients turn denormal and a step
# costs 5-8 times as much. So the Python side runs exactly the C++ side's steps, in its order.
SCHEDULE = {"mlp": {"checked": 5, "eager_repeats": 3}, "gpt": {"checked": 3, "eager_repeats": 1}}


def check_loss_falls(name, steps, step):
    first = last = step().item()
    for _ in range(steps - 1):
        last = step().item()
    assert last < first, f"{name}: the loss did not fall ({first} -> {last})"


def python_steps(workload, device):
    """The step with the model written in Python, checked to learn as the C++ side checks it;
    returns (eager, compiled)."""
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

    checked = SCHEDULE[workload]["checked"]
    check_loss_falls(workload, checked, step)
    compiled = kiln.compile(step, name=f"python_{workload}")
    if device != "cpu":  # the C++ side compiles only where there are device graphs
        check_loss_falls(f"{workload} compiled", checked, compiled)
    return step, compiled


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
    ap.add_argument("--rounds", type=int, default=None,
                    help="Python and C++ timings alternate this many times (default 1 on the "
                         "cpu, 5 on a device); medians are reported")
    ap.add_argument("--smoke", action="store_true")
    args = ap.parse_args()
    kiln.set_num_threads(args.threads)
    if args.device != "cpu":
        kiln.load_backend(args.device.split(":")[0])
        kiln.set_allow_tf32(True)  # as `kiln bench` (the C++ side) sets it on a device
    rounds = args.rounds or (1 if args.device == "cpu" or args.smoke else 5)
    out = {"device": args.device, "threads": args.threads, "rounds": rounds}
    # A GPU step takes microseconds to milliseconds: more of them per timing.
    scale = 1 if args.device == "cpu" or args.smoke else 20
    for workload, iters in (("mlp", 2 if args.smoke else 20 * scale),
                            ("gpt", 1 if args.smoke else 3 * scale)):
        eager, compiled = python_steps(workload, args.device)
        if args.smoke:
            out[f"python_{workload}_eager_us"] = seconds_per_call(eager, iters) * 1e6
            out[f"python_{workload}_compiled_us"] = seconds_per_call(compiled, iters) * 1e6
            continue
        # A host-bound GPU step's time drifts by tens of percent between runs on the GPU
        # machine's host; alternating the two sides and taking medians keeps the drift out of
        # the ratio.
        series = {"python_eager": [], "python_compiled": [], "cpp_eager": [], "cpp_graph": []}
        for _ in range(rounds):
            series["python_eager"].append(
                seconds_per_call(eager, iters, SCHEDULE[workload]["eager_repeats"], warm=0) * 1e6)
            series["python_compiled"].append(seconds_per_call(compiled, iters, 3, warm=3) * 1e6)
            cpp = cpp_steps(workload, args.device, args.threads, iters)
            series["cpp_eager"].append(cpp[f"{workload}_eager_us"])
            if f"{workload}_graph_us" in cpp:
                series["cpp_graph"].append(cpp[f"{workload}_graph_us"])
        med = {k: statistics.median(v) for k, v in series.items() if v}
        for k, v in med.items():
            out[f"{k.split('_')[0]}_{workload}_{k.split('_')[1]}_us"] = v
            if rounds > 1:
                out[f"{k.split('_')[0]}_{workload}_{k.split('_')[1]}_us_rounds"] = [round(t, 1) for t in series[k]]
        out[f"python_over_cpp_{workload}_eager"] = med["python_eager"] / med["cpp_eager"]
        if "cpp_graph" in med:
            out[f"python_compiled_over_cpp_{workload}_graph"] = med["python_compiled"] / med["cpp_graph"]
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()

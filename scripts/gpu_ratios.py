#!/usr/bin/env python3
"""Prints the ratio table of one GPU run: Kiln's `kiln bench --json` results against PyTorch's
(torch_anchor.py and bench/torch_gpt_large.py) from the same run, with the issue's targets.

    python3 scripts/gpu_ratios.py OUT_DIR

OUT_DIR is what scripts/gpu.sh wrote: kiln_<workload>.json, torch_anchor.json and
torch_gpt_large.json. Exits 1, saying what is missing, when a file or a result in it is missing
or unreadable; a missed target is printed, not an error (benchmarks never gate anything).
"""
import json
import os
import sys

ADAMW_FLOOR_US = 27.0  # the step's memory traffic at the H100's bandwidth (BENCHMARKS.md)


def load(out, name):
    path = os.path.join(out, name)
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError) as e:
        sys.exit(f"gpu_ratios: cannot read {path}: {e}")


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    try:
        table(sys.argv[1])
    except KeyError as e:
        sys.exit(f"gpu_ratios: result {e} is missing from {sys.argv[1]}")


def table(out):
    kiln = {}
    for w in ("chain", "adamw", "mlp", "gpt", "gpt_large"):
        kiln.update(load(out, f"kiln_{w}.json"))
    torch = load(out, "torch_anchor.json")
    torch.update(load(out, "torch_gpt_large.json"))

    rows = []  # (what, kiln, torch, ratio, target text, met)

    def lower_is_better(what, kkey, tkey, bound, target):
        k, t = kiln[kkey], torch[tkey]
        r = k / t
        rows.append((what, k, t, r, target, r <= bound))

    lower_is_better("chain eager, us/op", "chain_eager_us_per_op", "chain_eager_us_per_op",
                    1 / 3, "<= 1/3")
    lower_is_better("chain graph, us/op", "chain_graph_us_per_op", "chain_graph_us_per_op",
                    1.0, "<= 1.0")
    lower_is_better("adamw compiled vs fused, us", "adamw_fused_graph_us", "adamw_fused_us",
                    1 / 3, "<= 1/3")
    k = kiln["adamw_fused_graph_us"]
    rows.append(("adamw compiled vs 27 us floor", k, ADAMW_FLOOR_US, k / ADAMW_FLOOR_US, "<= 4.0",
                 k <= 4 * ADAMW_FLOOR_US))
    for w in ("mlp", "gpt"):
        lower_is_better(f"{w} eager, us/step", f"{w}_eager_us", f"{w}_eager_us", 0.5, "<= 0.5")
        lower_is_better(f"{w} graph, us/step", f"{w}_graph_us", f"{w}_graph_us", 0.8, "<= 0.8")
    kb = max(kiln["gpt_large_eager_tokens_per_s"], kiln["gpt_large_graph_tokens_per_s"])
    best_keys = [k for k in ("gpt_large_eager_tokens_per_s", "gpt_large_graph_tokens_per_s",
                             "gpt_large_compile_tokens_per_s") if k in torch]
    if not best_keys:
        raise KeyError("gpt_large_*_tokens_per_s (PyTorch)")
    tb = max(torch[k] for k in best_keys)
    rows.append(("gpt_large best, tokens/s", kb, tb, kb / tb, ">= 0.85", kb / tb >= 0.85))

    print(f"{'workload':<32} {'Kiln':>12} {'PyTorch':>12} {'ratio':>7}  target")
    for what, k, t, r, target, met in rows:
        print(f"{what:<32} {k:12.2f} {t:12.2f} {r:7.3f}  {target} {'met' if met else 'MISSED'}")
    print(f"GPU: {torch.get('gpu', '?')}, PyTorch {torch.get('torch', '?')}")


if __name__ == "__main__":
    main()

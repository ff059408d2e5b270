#!/usr/bin/env python3
"""scripts/gpu_ratios.py on made-up results: each ratio, met and missed targets, PyTorch's best
gpt_large number, and a clear exit 1 when a result, or a result file, is missing."""
import json
import os
import subprocess
import sys
import tempfile

SCRIPT = sys.argv[1]

KILN = {
    "chain": {"chain_eager_us_per_op": 5.0, "chain_graph_us_per_op": 1.0},
    "adamw": {"adamw_fused_graph_us": 120.0},
    "mlp": {"mlp_eager_us": 400.0, "mlp_graph_us": 100.0},
    "gpt": {"gpt_eager_us": 2000.0, "gpt_graph_us": 900.0},
    "gpt_large": {"gpt_large_eager_tokens_per_s": 90.0, "gpt_large_graph_tokens_per_s": 95.0},
}
TORCH = {"chain_eager_us_per_op": 10.0, "chain_graph_us_per_op": 1.25, "adamw_fused_us": 300.0,
         "mlp_eager_us": 1000.0, "mlp_graph_us": 200.0, "gpt_eager_us": 5000.0,
         "gpt_graph_us": 1000.0, "gpu": "Test GPU", "torch": "9.9"}
TORCH_LARGE = {"gpt_large_eager_tokens_per_s": 80.0, "gpt_large_graph_tokens_per_s": 100.0,
               "gpt_large_compile_tokens_per_s": 120.0}


def run(out):
    return subprocess.run([sys.executable, SCRIPT, out], capture_output=True, text=True)


def line(text, start):
    hits = [l for l in text.splitlines() if l.startswith(start)]
    assert len(hits) == 1, f"no single line starting {start!r} in:\n{text}"
    return hits[0].split()


with tempfile.TemporaryDirectory() as out:
    for w, d in KILN.items():
        with open(os.path.join(out, f"kiln_{w}.json"), "w") as f:
            json.dump(d, f)
    with open(os.path.join(out, "torch_anchor.json"), "w") as f:
        json.dump(TORCH, f)
    with open(os.path.join(out, "torch_gpt_large.json"), "w") as f:
        json.dump(TORCH_LARGE, f)
    r = run(out)
    assert r.returncode == 0, r.stderr
    t = r.stdout
    assert line(t, "chain eager")[-4:] == ["0.500", "<=", "1/3", "MISSED"], t
    assert line(t, "chain graph")[-4:] == ["0.800", "<=", "1.0", "met"], t
    assert line(t, "adamw compiled vs fused")[-4:] == ["0.400", "<=", "1/3", "MISSED"], t
    assert line(t, "adamw compiled vs 27")[-4:] == ["4.444", "<=", "4.0", "MISSED"], t
    assert line(t, "mlp eager")[-4:] == ["0.400", "<=", "0.5", "met"], t
    assert line(t, "mlp graph")[-4:] == ["0.500", "<=", "0.8", "met"], t
    assert line(t, "gpt eager")[-4:] == ["0.400", "<=", "0.5", "met"], t
    assert line(t, "gpt graph")[-4:] == ["0.900", "<=", "0.8", "MISSED"], t
    # Kiln's best (95) against PyTorch's best of eager, graph and torch.compile (120).
    assert line(t, "gpt_large best")[-4:] == ["0.792", ">=", "0.85", "MISSED"], t
    assert "Test GPU, PyTorch 9.9" in t, t

    with open(os.path.join(out, "kiln_gpt.json"), "w") as f:
        json.dump({"gpt_eager_us": 2000.0}, f)
    r = run(out)
    assert r.returncode == 1 and "'gpt_graph_us' is missing" in r.stderr, r
    with open(os.path.join(out, "kiln_gpt.json"), "w") as f:
        json.dump(KILN["gpt"], f)
    with open(os.path.join(out, "torch_gpt_large.json"), "w") as f:
        json.dump({}, f)
    r = run(out)
    assert r.returncode == 1 and "gpt_large_*_tokens_per_s" in r.stderr, r

    os.remove(os.path.join(out, "kiln_mlp.json"))
    r = run(out)
    assert r.returncode == 1, r
    assert "kiln_mlp.json" in r.stderr, r.stderr
print("gpu_ratios_test: ok")

#!/usr/bin/env python3
"""Two `kiln train` checkpoints hold the same tensors (names, dtypes, shapes) and metadata, and
their values agree within a tolerance: a sharded run's checkpoint (--tp, --fsdp) against a
single-process run's with the same batch. Stdlib only.

    compare_checkpoints.py A B [ATOL] [RTOL]

Every value must satisfy |a - b| <= ATOL + RTOL * |b| (default 2e-3 and 2e-2: AdamW divides
by the square root of the second moment, so gradients that differ in their last bits move
weights by up to ~1e-3 after a few steps; a row in the wrong order moves them by ~1e-1).
"""
import array
import json
import struct
import sys

CODES = {"F32": "f", "F64": "d", "I64": "q"}


def load(path):
    with open(path, "rb") as f:
        data = f.read()
    n = struct.unpack("<Q", data[:8])[0]
    header = json.loads(data[8:8 + n])
    body = data[8 + n:]
    meta = header.pop("__metadata__", {})
    tensors = {}
    for name, info in header.items():
        begin, end = info["data_offsets"]
        tensors[name] = (info["dtype"], info["shape"],
                         array.array(CODES[info["dtype"]], body[begin:end]))
    return meta, tensors


def main():
    a_path, b_path = sys.argv[1], sys.argv[2]
    atol = float(sys.argv[3]) if len(sys.argv) > 3 else 2e-3
    rtol = float(sys.argv[4]) if len(sys.argv) > 4 else 2e-2
    meta_a, a = load(a_path)
    meta_b, b = load(b_path)
    errors = []
    if meta_a != meta_b:
        keys = sorted(k for k in set(meta_a) | set(meta_b) if meta_a.get(k) != meta_b.get(k))
        errors.append("metadata differs: " + ", ".join(
            f"{k}: {meta_a.get(k)!r} vs {meta_b.get(k)!r}" for k in keys))
    if a.keys() != b.keys():
        errors.append(f"tensor names differ: {sorted(set(a) ^ set(b))}")
    worst, worst_name = 0.0, ""
    for name in sorted(set(a) & set(b)):
        (da, sa, va), (db, sb, vb) = a[name], b[name]
        if (da, sa) != (db, sb):
            errors.append(f"{name}: {da} {sa} vs {db} {sb}")
            continue
        for x, y in zip(va, vb):
            if abs(x - y) > atol + rtol * abs(y):
                errors.append(f"{name}: {x} vs {y}")
                break
            if abs(x - y) > worst:
                worst, worst_name = abs(x - y), name
    print(f"{len(a)} tensors; largest difference within tolerance {worst:.3g} ({worst_name})")
    if errors:
        print("\n".join(errors[:20]))
        sys.exit(1)


if __name__ == "__main__":
    main()

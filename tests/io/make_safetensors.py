#!/usr/bin/env python3
"""An encoder and checker of safetensors files independent of Kiln (stdlib only).

    make_safetensors.py OUT      writes KNOWN (below) and METADATA to OUT
    make_safetensors.py --check FILE
                                 checks that FILE follows the spec and holds exactly KNOWN and
                                 METADATA; prints the first problem and exits 1 otherwise

tests/io/safetensors_test.cpp builds the same tensors in Kiln ("KnownTensors") and drives
both directions.
"""
import json
import struct
import sys

# name -> (safetensors dtype, shape, values in row-major order)
KNOWN = {
    "f32": ("F32", [3, 4], [float(i) - 5.5 for i in range(12)]),
    "i64": ("I64", [4], [-3, 0, 2**40, -(2**62)]),
    "mask": ("BOOL", [3], [True, False, True]),
    "f16": ("F16", [2, 2], [0.5, -1.25, 65504.0, 2.0**-24]),
    "f64": ("F64", [3], [3.141592653589793, -2.718281828459045, 1e300]),
    "u8": ("U8", [3], [0, 255, 7]),
    "i32": ("I32", [2], [-(2**31), 2**31 - 1]),
    "bf16": ("BF16", [3], [1.0, -2.5, 3.0]),
    "scalar": ("F32", [], [42.0]),
    "empty": ("F32", [0, 3], []),
}
METADATA = {"format": "pt", "source": "make_safetensors.py"}

FORMATS = {"BOOL": "?", "U8": "B", "I32": "i", "I64": "q", "F16": "e", "F32": "f", "F64": "d"}
ITEMSIZE = {"BOOL": 1, "U8": 1, "I32": 4, "I64": 8, "F16": 2, "BF16": 2, "F32": 4, "F64": 8}


def encode(dtype, values):
    if dtype == "BF16":  # the top half of each float32
        return b"".join(struct.pack("<f", v)[2:] for v in values)
    return struct.pack("<%d%s" % (len(values), FORMATS[dtype]), *values)


def write(path):
    # Data in reverse name order and header keys in another order still, so that a reader
    # that assumes either order (or Kiln's own layout) fails.
    header, data = {}, b""
    for name in sorted(KNOWN, reverse=True):
        dtype, shape, values = KNOWN[name]
        raw = encode(dtype, values)
        offsets = [len(data), len(data) + len(raw)]
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": offsets}
        data += raw
    header = dict(sorted(header.items(), key=lambda kv: len(kv[0])))
    header["__metadata__"] = METADATA
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + data)


def check(path):
    with open(path, "rb") as f:
        blob = f.read()
    if len(blob) < 8:
        return "file is shorter than 8 bytes"
    (n,) = struct.unpack("<Q", blob[:8])
    if n % 8:
        return "header length %d is not a multiple of 8" % n
    raw = blob[8 : 8 + n]
    if len(raw) != n:
        return "header length %d runs past the end of the file" % n
    text = raw.decode("utf-8")
    if not text.startswith("{") or text.rstrip(" ") != text.rstrip():
        return "header must start with '{' and be padded with spaces only"

    def no_duplicates(pairs):
        keys = [k for k, _ in pairs]
        if len(keys) != len(set(keys)):
            raise ValueError("duplicate keys %r" % keys)
        return dict(pairs)

    header = json.loads(text, object_pairs_hook=no_duplicates)
    data = blob[8 + n :]
    if header.pop("__metadata__", None) != METADATA:
        return "metadata differs from %r" % METADATA
    if sorted(header) != sorted(KNOWN):
        return "tensor names %r differ from %r" % (sorted(header), sorted(KNOWN))
    cursor = 0
    for name, entry in sorted(header.items(), key=lambda kv: kv[1]["data_offsets"]):
        dtype, shape, values = KNOWN[name]
        if set(entry) != {"dtype", "shape", "data_offsets"}:
            return "%s: keys %r" % (name, sorted(entry))
        if entry["dtype"] != dtype or entry["shape"] != shape:
            got = (entry["dtype"], entry["shape"])
            return "%s: %s %r, expected %s %r" % ((name,) + got + (dtype, shape))
        begin, end = entry["data_offsets"]
        if begin != cursor:
            return "%s: begins at %d, expected %d (a hole or an overlap)" % (name, begin, cursor)
        if begin % ITEMSIZE[dtype]:
            return "%s: offset %d is not aligned to its element size" % (name, begin)
        if data[begin:end] != encode(dtype, values):
            return "%s: bytes [%d, %d) differ from the expected values" % (name, begin, end)
        cursor = end
    if cursor != len(data):
        return "data section has %d bytes, tensors cover %d" % (len(data), cursor)
    return None


def main(argv):
    if len(argv) == 3 and argv[1] == "--check":
        problem = check(argv[2])
        if problem:
            print("make_safetensors.py --check: " + problem)
            return 1
        return 0
    if len(argv) == 2:
        write(argv[1])
        return 0
    print(__doc__)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))

#!/usr/bin/env bash
# Fuzzes the safetensors reader for a bounded time: scripts/fuzz.sh [seconds] (default 60).
# Builds build/fuzz with clang++ (libFuzzer, AddressSanitizer, UndefinedBehaviorSanitizer on the
# code the target reaches, the rest of the library unoptimised: See Note [What the fuzz build
# instruments] in fuzz/CMakeLists.txt), seeds a corpus with valid files, and runs
# kiln_safetensors_fuzz. Exits non-zero on a finding; the input that caused it is left in
# build/fuzz/artifacts/.
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-60}
jobs=${KILN_FUZZ_JOBS:-$(nproc)}

cmake -S . -B build/fuzz -G Ninja -DCMAKE_CXX_COMPILER=clang++ -DCMAKE_BUILD_TYPE=Debug \
  -DCMAKE_CXX_FLAGS_DEBUG="-O0 -DNDEBUG" -DKILN_FUZZ=ON -DKILN_BUILD_TESTS=OFF -DKILN_BUILD_BENCH=OFF \
  -DKILN_CUDA=OFF >/dev/null
cmake --build build/fuzz -j "$jobs" --target kiln_safetensors_fuzz

# Seeds: the independent encoder's file (every dtype, metadata, a 0-d and an empty tensor) and
# a few minimal files. The fuzzer's own finds go to corpus/ too and are kept between runs.
corpus=build/fuzz/corpus
mkdir -p "$corpus" build/fuzz/artifacts
python3 tests/io/make_safetensors.py "$corpus/seed_known.safetensors"
python3 - "$corpus" <<'EOF'
import json, struct, sys

def write(name, header, data=b""):
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open("%s/seed_%s.safetensors" % (sys.argv[1], name), "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + data)

write("empty", {})
write("metadata", {"__metadata__": {"format": "pt"}})
write("f32", {"x": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}},
      struct.pack("<2f", 1, 2))
write("bool", {"m": {"dtype": "BOOL", "shape": [1, 2], "data_offsets": [0, 2]}}, b"\x01\x00")
write("two", {"a": {"dtype": "I64", "shape": [], "data_offsets": [0, 8]},
              "b": {"dtype": "U8", "shape": [0, 4], "data_offsets": [8, 8]}}, struct.pack("<q", -1))
EOF

echo "== fuzzing load_safetensors_bytes for ${seconds}s"
UBSAN_OPTIONS=print_stacktrace=1 \
  ./build/fuzz/fuzz/kiln_safetensors_fuzz "$corpus" -dict=fuzz/safetensors.dict \
  -max_total_time="$seconds" -max_len=4096 -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
  -artifact_prefix=build/fuzz/artifacts/

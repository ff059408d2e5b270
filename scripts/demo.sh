#!/usr/bin/env bash
# The README's first command: install what the build needs and is missing (not the tests'
# packages: scripts/install-deps.sh --test), build the kiln program with tests and benchmarks
# off, train a small byte-level GPT on the GPL-3 text (about 9 s on one core), sample from it.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
cmake --preset release -DKILN_BUILD_TESTS=OFF -DKILN_BUILD_BENCH=OFF >/dev/null
cmake --build --preset release --target kiln_cli
./build/release/kiln train --out build/release/kiln_ckpt.safetensors
./build/release/kiln generate --ckpt build/release/kiln_ckpt.safetensors --prompt "This License " \
  --tokens 200

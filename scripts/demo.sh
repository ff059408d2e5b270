#!/usr/bin/env bash
# The README's first command: install what is missing, build the kiln program, train a small
# byte-level GPT on the GPL-3 text (about 30 s on two cores), then sample from it.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
cmake --preset release -DKILN_BUILD_TESTS=OFF -DKILN_BUILD_BENCH=OFF >/dev/null
cmake --build --preset release --target kiln_cli
./build/release/kiln train --out build/release/kiln_ckpt.safetensors
./build/release/kiln generate --ckpt build/release/kiln_ckpt.safetensors --prompt "This License " \
  --tokens 200

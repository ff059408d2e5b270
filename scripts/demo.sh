#!/usr/bin/env bash
# The README's first command: install what is missing, build, run Kiln's demo.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
cmake --preset release -DKILN_BUILD_TESTS=OFF -DKILN_BUILD_BENCH=OFF >/dev/null
cmake --build --preset release --target kiln_demo
./build/release/kiln_demo

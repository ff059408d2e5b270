#!/usr/bin/env bash
# On the GPU machine: builds the Python module against the python3 there (the one with PyTorch
# 2.11 and pip's pybind11), runs the pytest suite (python/tests/test_cuda.py included, and the
# PyTorch comparisons against 2.11's versioned DLPack capsules), then the Python benchmarks:
# the mlp and gpt steps on cuda against the C++ ones, the op-call overhead against PyTorch on
# that host, and examples/python/train_gpt.py on cuda.
#   bash scripts/gpu_python.sh [OUT_DIR]     (logs and JSON in OUT_DIR, default build/gpu-py)
# KILN_PY_BENCH_ONLY=1 skips pytest and the example; the benchmarks run pinned to one core
# (KILN_PY_BENCH_CPU, default 3): a host-bound eager GPU step moved between cores drifts by
# tens of percent between runs.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${1:-build/gpu-py}
mkdir -p "$out"
py=$(command -v python3)
echo "python: $py $($py -c 'import sys, torch, numpy; print(sys.version.split()[0], "torch", torch.__version__, "numpy", numpy.__version__)')"
pybind11_dir=$($py -m pybind11 --cmakedir) || { echo "no pybind11 for $py"; exit 1; }
cmake --preset release -DKILN_BUILD_TESTS=OFF -DKILN_BUILD_BENCH=OFF -DKILN_WERROR=OFF \
  -DKILN_PYTHON=ON -DPython_EXECUTABLE="$py" -Dpybind11_DIR="$pybind11_dir" \
  > "$out/configure.log" 2>&1 || { tail -30 "$out/configure.log"; exit 1; }
cmake --build --preset release -j "$(nproc)" --target kiln_python_package kiln_cuda kiln_sim kiln_cli \
  > "$out/build.log" 2>&1 || { grep -B2 -A12 -m3 "error" "$out/build.log"; exit 1; }
export PYTHONPATH=$PWD/build/release/python PYTHONUNBUFFERED=1
if [[ -z ${KILN_PY_BENCH_ONLY:-} ]]; then
  timeout 240 $py -m pytest -q -p no:cacheprovider -rs python/tests > "$out/pytest.log" 2>&1
  echo "pytest exit $?"
  tail -15 "$out/pytest.log"
fi
pin=(taskset -c "${KILN_PY_BENCH_CPU:-3}")
timeout 400 "${pin[@]}" $py bench/python_train_bench.py --device cuda > "$out/train_cuda.json" 2> "$out/train_cuda.err"
echo "train (cuda): $(tr -d '\n ' < "$out/train_cuda.json")"; tail -3 "$out/train_cuda.err"
timeout 60 "${pin[@]}" $py -X faulthandler bench/python_op_bench.py > "$out/op.json" 2> "$out/op.err"
echo "op: $(tr -d '\n ' < "$out/op.json")"; tail -3 "$out/op.err"
[[ -n ${KILN_PY_BENCH_ONLY:-} ]] && exit 0
timeout 60 $py examples/python/train_gpt.py --device cuda --compile --steps 300 --batch 64 \
  --context 128 > "$out/train_gpt_cuda.log" 2>&1
tail -4 "$out/train_gpt_cuda.log" | head -3

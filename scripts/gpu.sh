#!/usr/bin/env bash
# On a machine with an NVIDIA GPU (and without Debian's libtorch, like the project's GPU
# machine): build with every core, run the whole test suite (the CUDA tests included), then
# `kiln bench` on cuda for each workload, and PyTorch's anchor when its script is given, then
# the ratio table (scripts/gpu_ratios.py, also in OUT_DIR/ratios.txt).
#   bash scripts/gpu.sh [OUT_DIR] [path/to/torch_anchor.py]
# Logs and JSON land in OUT_DIR (default build/gpu-out). KILN_GPU_QUICK=1 builds only the CUDA
# tests, the benchmarks and the kiln program and skips the CPU suite (which CI runs), for a
# short lease (KILN_GPU_NO_BENCH=1: and no workloads); KILN_SANITIZE_GPU=1 adds a
# compute-sanitizer memcheck run of the CUDA tests.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${1:-build/gpu-out}
anchor=${2:-}
mkdir -p "$out"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv | tee "$out/gpu.txt"
# KILN_GPU_ORACLE=1 also builds the op table test against PyTorch's libtorch (the machine has no
# Debian one) and runs the table on CUDA against ATen (Note [The op table on CUDA]).
mapfile -t oracle < <(scripts/torch_cmake_flags.sh)
cmake --preset release "${oracle[@]}" -DKILN_BUILD_BENCH=OFF -DKILN_BUILD_TESTS=ON -DKILN_WERROR=OFF \
  > "$out/configure.log" 2>&1 || { tail -30 "$out/configure.log"; exit 1; }
targets=()
if [ -n "${KILN_GPU_QUICK:-}" ]; then targets=(--target kiln_cuda_test kiln_cuda_bench kiln_cli); fi
oracle_on=
[ "${oracle[0]}" = -DKILN_ORACLE_TESTS=ON ] && oracle_on=1
if [ -n "${KILN_GPU_QUICK:-}" ] && [ -n "$oracle_on" ]; then targets+=(kiln_op_test); fi
cmake --build --preset release -j "$(nproc)" "${targets[@]}" > "$out/build.log" 2>&1 ||
  { grep -B2 -A12 -m3 "error" "$out/build.log"; exit 1; }
grep -c "warning" "$out/build.log" | sed "s/^/build warnings: /"
if [ -z "${KILN_GPU_QUICK:-}" ]; then
  ctest --preset release -j 8 --timeout 600 > "$out/ctest.log" 2>&1
  tail -15 "$out/ctest.log"
fi
timeout 300 ./build/release/tests/kiln_cuda_test > "$out/cuda_test.log" 2>&1
grep -E '^\[  (FAILED|PASSED|SKIPPED) ' "$out/cuda_test.log" | head -40
grep -B1 -A6 'Failure' "$out/cuda_test.log" | head -120
if [ -n "$oracle_on" ]; then
  timeout 400 ./build/release/tests/kiln_op_test --gtest_filter='*/OpCuda.*' > "$out/op_cuda.log" 2>&1
  echo "op table on cuda: exit $?; $(grep -E '^\[  (PASSED|FAILED|SKIPPED)  \]' "$out/op_cuda.log" | head -3 | tr '\n' ' ')"
  grep -E '^\[  FAILED  \] .*OpCuda' "$out/op_cuda.log" | head -60
  grep -B1 -A4 'Failure' "$out/op_cuda.log" | head -150
fi
timeout 120 ./build/release/kiln_cuda_bench --json "$out/cuda_bench.json"
# KILN_GPU_NO_BENCH=1 stops after the tests and kiln_cuda_bench (and memcheck, when asked).
bench=1
[ -n "${KILN_GPU_NO_BENCH:-}" ] && bench=
for w in ${bench:+chain adamw mlp gpt gpt_large}; do
  KILN_BENCH_STEPS=1 timeout 120 ./build/release/kiln bench "$w" --device cuda --json > "$out/kiln_$w.json" \
    2> "$out/kiln_$w.err"
  echo "== $w: $(tr -d '\n' < "$out/kiln_$w.json")"
  grep -v '^[0-9]*: ' "$out/kiln_$w.err" | tail -3
done
# The GPT steps again with attention on the math path (matmul, softmax, matmul) instead of the
# fused kernels, for comparison.
for w in ${bench:+gpt gpt_large}; do
  KILN_BENCH_STEPS=1 timeout 120 ./build/release/kiln bench "$w" --device cuda --json \
    --math-attention > "$out/kiln_${w}_math.json" 2> "$out/kiln_${w}_math.err"
  echo "== $w (math attention): $(tr -d '\n' < "$out/kiln_${w}_math.json")"
done
if [ -n "$bench" ]; then
  # The kernels a replay of the gpt step runs, by op.
  grep -E '^[0-9]+: ' "$out/kiln_gpt.err" | awk '{print $2}' | sort | uniq -c | sort -rn | head -25
  timeout 300 python3 bench/torch_gpt_large.py "$out/torch_gpt_large.json" > "$out/torch_gpt_large.log" 2>&1
  tail -8 "$out/torch_gpt_large.log"
fi
if [ -n "${KILN_SANITIZE_GPU:-}" ] && command -v compute-sanitizer > /dev/null; then
  timeout 300 compute-sanitizer --tool memcheck --report-api-errors no \
    ./build/release/tests/kiln_cuda_test --gtest_filter="${KILN_SANITIZE_FILTER:-*}" \
    > "$out/memcheck.log" 2>&1
  echo "memcheck exit $?: $(grep -E 'ERROR SUMMARY|PASSED|FAILED' "$out/memcheck.log" | tail -3)"
fi
if [ -n "$anchor" ] && [ -n "$bench" ]; then
  (cd "$out" && OUT="$PWD" PYTHONUNBUFFERED=1 timeout 300 python3 "$OLDPWD/$anchor" > anchor.log 2>&1)
  tail -3 "$out/anchor.log"
  python3 scripts/gpu_ratios.py "$out" | tee "$out/ratios.txt"
fi

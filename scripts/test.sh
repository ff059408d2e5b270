#!/usr/bin/env bash
# The README's second command (and CI's): install, build, and pass every test, in the release
# build and again under AddressSanitizer + UndefinedBehaviorSanitizer; check formatting; build
# an example outside the tree against the installed CMake package.
set -euo pipefail
cd "$(dirname "$0")/.."
jobs=$(nproc)
bash scripts/install-deps.sh --test

echo "== format"
files=$(git ls-files '*.h' '*.cpp')
clang-format --dry-run --Werror $files

echo "== release build and tests"
cmake --preset release -DKILN_BUILD_TESTS=ON -DKILN_BUILD_BENCH=ON >/dev/null
cmake --build --preset release -j "$jobs"
ctest --preset release -j "$jobs"

echo "== install and build an out-of-tree consumer"
rm -rf build/install build/consumer
cmake --install build/release --prefix build/install >/dev/null
cmake -S examples/consumer -B build/consumer -G Ninja -DCMAKE_PREFIX_PATH="$PWD/build/install" >/dev/null
cmake --build build/consumer
./build/consumer/app  # as a user runs it: the RUNPATH CMake gave it finds libkiln
# Built where the CUDA plugin is installed (Kiln::kiln_cuda); without a GPU it says so and exits 0.
if [ -x build/consumer/app_cuda ]; then ./build/consumer/app_cuda; fi

echo "== benchmark smoke run (no timing is checked)"
./build/release/bench/kiln_bench --smoke
./build/release/bench/kiln_train_bench --smoke
./build/release/bench/kiln_sim_bench --smoke
# Built when nvcc is present; without a GPU it says so and exits 0.
if [ -x build/release/kiln_cuda_bench ]; then ./build/release/kiln_cuda_bench; fi

echo "== fuzz the safetensors reader for 30 s (clang, libFuzzer, ASan+UBSan)"
bash scripts/fuzz.sh 30

echo "== sanitizer build and tests"
cmake --preset asan >/dev/null
cmake --build --preset asan -j "$jobs"
ASAN_OPTIONS=detect_leaks=0:detect_odr_violation=0 UBSAN_OPTIONS=print_stacktrace=1 \
  ctest --preset asan -j "$jobs"
echo "== all checks passed"

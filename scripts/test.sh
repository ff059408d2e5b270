#!/usr/bin/env bash
# The README's second command (and CI's): install, build, and pass every test, in the release
# build and again under AddressSanitizer + UndefinedBehaviorSanitizer + LeakSanitizer; check
# formatting; build an example outside the tree against the installed CMake package; fuzz the
# safetensors reader. Each stage prints its wall time, and the run its total.
set -euo pipefail
cd "$(dirname "$0")/.."
jobs=$(nproc)
run_start=$SECONDS
times=()

# stage <title> <function>: runs one stage, then prints its wall time.
stage() {
  local start=$SECONDS
  echo "== $1"
  "$2"
  times+=("$(printf '%5d s  %s' $((SECONDS - start)) "$1")")
  echo "== $1: done in $((SECONDS - start)) s"
}

install_deps() { bash scripts/install-deps.sh --test; }

format_check() {
  local files
  files=$(git ls-files '*.h' '*.cpp' '*.cu' '*.cuh')
  clang-format --dry-run --Werror $files
}

release_build() {
  cmake --preset release -DKILN_BUILD_TESTS=ON -DKILN_BUILD_BENCH=ON >/dev/null
  cmake --build --preset release -j "$jobs"
}

release_tests() { ctest --preset release -j "$jobs"; }

consumer() {
  rm -rf build/install build/consumer
  cmake --install build/release --prefix build/install >/dev/null
  cmake -S examples/consumer -B build/consumer -G Ninja -DCMAKE_PREFIX_PATH="$PWD/build/install" \
    >/dev/null
  cmake --build build/consumer
  ./build/consumer/app # as a user runs it: the RUNPATH CMake gave it finds libkiln
  # Built where the CUDA plugin is installed (Kiln::kiln_cuda); without a GPU it says so and
  # exits 0.
  if [ -x build/consumer/app_cuda ]; then ./build/consumer/app_cuda; fi
}

bench_smoke() {
  ./build/release/bench/kiln_bench --smoke
  ./build/release/bench/kiln_train_bench --smoke
  ./build/release/bench/kiln_sim_bench --smoke
  # Built when nvcc is present; without a GPU it says so and exits 0.
  if [ -x build/release/kiln_cuda_bench ]; then ./build/release/kiln_cuda_bench; fi
}

fuzz() { bash scripts/fuzz.sh 30; }

asan_build() {
  cmake --preset asan >/dev/null
  cmake --build --preset asan -j "$jobs"
}

# Leaks are reported, except those scripts/lsan.supp attributes to third-party libraries.
asan_tests() {
  ASAN_OPTIONS=detect_leaks=1:detect_odr_violation=0 \
    LSAN_OPTIONS=suppressions="$PWD/scripts/lsan.supp":print_suppressions=0 \
    UBSAN_OPTIONS=print_stacktrace=1 ctest --preset asan -j "$jobs"
}

stage "install dependencies" install_deps
stage "format check" format_check
stage "release build" release_build
stage "release tests" release_tests
stage "install and build an out-of-tree consumer" consumer
stage "benchmark smoke runs (no timing is checked)" bench_smoke
stage "fuzz the safetensors reader for 30 s (clang, libFuzzer, ASan+UBSan)" fuzz
stage "sanitizer build" asan_build
stage "sanitizer tests (ASan, UBSan, LSan)" asan_tests

echo "== stage times"
printf '%s\n' "${times[@]}"
echo "== all checks passed in $((SECONDS - run_start)) s"

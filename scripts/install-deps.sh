#!/usr/bin/env bash
# Installs the Debian packages Kiln needs; only those missing, with one `apt-get update` and one
# `apt-get install` when anything is missing, nothing at all otherwise.
#   scripts/install-deps.sh          building the library and the `kiln` program, with tests and
#                                    benchmarks off (scripts/demo.sh)
#   scripts/install-deps.sh --test   that, and what the tests, benchmarks, format check and
#                                    fuzzing need (scripts/test.sh)
set -euo pipefail

# What the top-level CMakeLists.txt and tools/kiln find unconditionally: fmt, nlohmann_json,
# OpenMP (g++'s own libgomp), BLAS and cblas.h (OpenBLAS), CLI11, Open MPI (kiln/distributed and
# `mpirun`; without it Kiln builds as a world of one), zlib (kiln/data inflates gzip-compressed
# IDX files), and Fashion-MNIST's IDX files under /usr/share/datasets/fashion-mnist (the data set
# `kiln train --model cnn` trains on; tests/data reads it when present), and oneDNN (libdnnl-dev:
# the CPU convolution kernels, kiln/backend/cpu/conv.cpp, as PyTorch uses it on the CPU), with
# ocl-icd-opencl-dev, which libdnnl-dev only recommends but whose CMake config requires (its
# find_package(OpenCL) fails without it, and `--no-install-recommends` leaves it out).
build=(cmake ninja-build g++ libfmt-dev libcli11-dev nlohmann-json3-dev libopenblas-dev openmpi-bin
       libopenmpi-dev zlib1g-dev dataset-fashion-mnist libdnnl-dev ocl-icd-opencl-dev)
# GoogleTest and Google Benchmark (tests/, bench/), libtorch 1.13 (the oracle the tests and
# benchmarks compare against), clang-format (the format check), clang with its libFuzzer runtime
# and LLVM's OpenMP (scripts/fuzz.sh builds with clang++), python3 (the safetensors interop test,
# the fuzz corpus, scripts/gpu_ratios.py's test), gloo's headers (kiln_allreduce_bench times
# libtorch's ProcessGroupGloo beside Kiln's all-reduce; libtorch ships gloo's library only),
# and for the Python module (python/) pybind11 and Python's headers, with NumPy and pytest for
# its tests and venv, pip, setuptools and wheel to install it (all for Debian's /usr/bin/python3).
test=(libgtest-dev libgmock-dev libbenchmark-dev libtorch-dev clang-format clang libclang-rt-dev
      libomp-dev python3 libgloo-dev pybind11-dev python3-dev python3-numpy python3-pytest python3-venv python3-pip
      python3-setuptools python3-wheel)

pkgs=("${build[@]}")
case "${1:-}" in
  "") ;;
  --test) pkgs+=("${test[@]}") ;;
  *) echo "usage: scripts/install-deps.sh [--test]" >&2; exit 2 ;;
esac

missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "install-deps: installing ${missing[*]}"
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
else
  echo "install-deps: all packages present"
fi

#!/usr/bin/env bash
# The CMake flags that point the build at PyTorch's libtorch on the GPU machine (which has no
# Debian libtorch), one a line, for scripts/gpu.sh and scripts/gpu_dist.sh: the benchmarks link
# it (libtorch is their reference), and under KILN_GPU_ORACLE=1 the op table test is built
# against it too (Note [The op table on CUDA]). Without a usable PyTorch (none, or one built
# without the C++11 ABI: Kiln, GoogleTest and fmt are built with it, so they cannot link with
# it) only -DKILN_ORACLE_TESTS=OFF. What it found goes to stderr.
set -uo pipefail
oracle=OFF
if ! torch_dir=$(python3 -c 'import os, torch; print(os.path.dirname(torch.__file__))' 2>/dev/null); then
  echo "torch: no PyTorch for python3" >&2
  echo -DKILN_ORACLE_TESTS=OFF
  exit 0
fi
abi=$(python3 -c 'import torch; print(torch._C._GLIBCXX_USE_CXX11_ABI)')
echo "torch: in $torch_dir, C++11 ABI $abi" >&2
if [ "$abi" != True ]; then
  echo "torch: not usable (built without the C++11 ABI)" >&2
  echo -DKILN_ORACLE_TESTS=OFF
  exit 0
fi
[ -n "${KILN_GPU_ORACLE:-}" ] && oracle=ON
echo "-DKILN_ORACLE_TESTS=$oracle"
echo "-DKILN_TORCH_DIR=$torch_dir"

#!/usr/bin/env bash
# The CMake flags that build the op table test against PyTorch's libtorch on the GPU machine
# (which has no Debian libtorch), one a line, for scripts/gpu.sh and scripts/gpu_dist.sh under
# KILN_GPU_ORACLE=1 (Note [The op table on CUDA]); -DKILN_ORACLE_TESTS=OFF otherwise, or when
# that PyTorch was built without the C++11 ABI (Kiln, GoogleTest and fmt are built with it, so
# they cannot link with it). What it found goes to stderr.
set -uo pipefail
if [ -z "${KILN_GPU_ORACLE:-}" ]; then
  echo -DKILN_ORACLE_TESTS=OFF
  exit 0
fi
torch_dir=$(python3 -c 'import os, torch; print(os.path.dirname(torch.__file__))')
abi=$(python3 -c 'import torch; print(torch._C._GLIBCXX_USE_CXX11_ABI)')
echo "oracle: torch in $torch_dir, C++11 ABI $abi" >&2
if [ "$abi" = True ]; then
  echo -DKILN_ORACLE_TESTS=ON
  echo "-DKILN_TORCH_DIR=$torch_dir"
else
  echo "oracle: skipped (this PyTorch was built without the C++11 ABI)" >&2
  echo -DKILN_ORACLE_TESTS=OFF
fi

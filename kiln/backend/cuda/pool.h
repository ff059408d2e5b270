#pragma once
// Launchers of the CUDA pooling kernels (Note [Pooling] in kiln/ops/pool_meta.cpp). Data pointers
// are device memory of contiguous tensors of the floating dtype `dt`. Internal to
// kiln/backend/cuda.
#include <cuda_runtime.h>

#include <cstdint>

#include "kiln/backend/cuda/kernel_args.h"

namespace kiln::cuda {

// detail::PoolGeom without Kiln's types: `planes` planes of spatial shape x pooled to y, spatial
// dims right-aligned in 3 slots. kind: 0 max, 1 avg, 2 adaptive.
struct PoolArgs {
  int kind = 0;
  int64_t planes = 0;
  int64_t x[3], y[3], k[3], stride[3], pad[3], dil[3];
  bool count_include_pad = true;
  int64_t divisor = 0;  // avg: divisor_override, 0 for none
};

// y [planes, *y] (and for max the int64 indices, flat within a plane) from x [planes, *x]: one
// thread per output element.
void launch_pool_forward(Dt dt, const PoolArgs& a, const void* x, void* y, int64_t* indices,
                         cudaStream_t stream);
// gx [planes, *x] from gy [planes, *y] (and for max the indices): one thread per input element,
// summing over the windows that cover it in a fixed order (no atomics: the same bits every run).
// For max, an index outside its plane sets *err to `code` (the device's error word, common.h).
void launch_pool_backward(Dt dt, const PoolArgs& a, const void* gy, const int64_t* indices,
                          void* gx, int* err, int code, cudaStream_t stream);

}  // namespace kiln::cuda

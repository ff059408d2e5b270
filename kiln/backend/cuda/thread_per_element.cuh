#pragma once
// Helpers of kernels that run one thread per element, kBlock threads a block, and report a bad
// index through the device's error word (common.h). Internal to kiln/backend/cuda.
#include <cuda_runtime.h>

#include <cstdint>

#include "kiln/backend/cuda/kernel_args.h"

namespace kiln::cuda {

inline unsigned blocks_for(int64_t n) { return static_cast<unsigned>((n + kBlock - 1) / kBlock); }

__device__ __forceinline__ int64_t thread_index() {
  return static_cast<int64_t>(blockIdx.x) * kBlock + threadIdx.x;
}

// Reports a bad index once per device (the first code wins); the caller skips its write.
__device__ __forceinline__ void report(int* err, int code) { atomicCAS(err, 0, code); }

}  // namespace kiln::cuda

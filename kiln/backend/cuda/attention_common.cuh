#pragma once
// What the float32 (attention.cu) and 16-bit (attention16.cu) fused attention kernels share:
// the causal mask, base-2 constants, and the launch helpers. Internal to kiln/backend/cuda.
#include <cuda_runtime.h>

#include <atomic>
#include <cstdint>

#include "kiln/backend/cuda/attention.h"

namespace kiln::cuda::attn {

inline constexpr float kLog2e = 1.4426950408889634f;
inline constexpr float kLn2 = 0.6931471805599453f;

// Whether query i may attend to key j.
__device__ __forceinline__ bool visible(const AttnShape& sh, int64_t i, int64_t j) {
  return i < sh.l && j < sh.s && (!sh.causal || j <= i);
}

// Opts a kernel into the shared memory it needs (over the 48 KiB default), once per device;
// `done` is the kernel's own.
inline constexpr int kMaxDevices = 64;
template <class K>
void allow_smem(K kernel, size_t bytes, std::atomic<bool>* done) {
  int dev = 0;
  cudaGetDevice(&dev);
  if (dev < kMaxDevices && done[dev].load(std::memory_order_relaxed)) return;
  cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         static_cast<int>(bytes));
  if (err != cudaSuccess) return;  // the launch fails and check_launch names it
  if (dev < kMaxDevices) done[dev].store(true, std::memory_order_relaxed);
}

// One block per (batch entry, tile of `tile` rows).
inline unsigned blocks_of(int64_t batch, int64_t rows, int tile) {
  return static_cast<unsigned>(batch * ((rows + tile - 1) / tile));
}

}  // namespace kiln::cuda::attn

// hold_stream (common.h): a kernel that keeps a stream busy for a while, so that work queued
// behind it starts only after the host has queued all of it (Note [Timing cuDNN plans] in
// cudnn_graph.cpp). This file includes no Kiln header: common.cpp declares launch_hold and wraps it
// as hold_stream (common.h).
#include <cuda_runtime.h>

#include <cstdint>

namespace kiln::cuda::detail {

namespace {

__global__ void hold_kernel(uint64_t ns) {
  uint64_t start, now;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
  do {
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
  } while (now - start < ns);
}

}  // namespace

cudaError_t launch_hold(cudaStream_t stream, uint64_t ns) {
  hold_kernel<<<1, 1, 0, stream>>>(ns);
  return cudaGetLastError();
}

}  // namespace kiln::cuda::detail

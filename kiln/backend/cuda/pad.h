#pragma once
// Launchers of the CUDA padding and upsampling kernels (Note [Padding and upsampling] in
// kiln/ops/pad_meta.cpp). Data pointers are device memory of contiguous tensors of the floating
// dtype `dt`. Internal to kiln/backend/cuda.
#include <cuda_runtime.h>

#include <cstdint>

#include "kiln/backend/cuda/kernel_args.h"

namespace kiln::cuda {

// detail::PadGeom without Kiln's types (mode: detail::pad::kReflect or kReplicate).
struct PadArgs {
  int mode = 0;
  int64_t planes = 0;
  int64_t x[3], y[3], left[3];
};

// detail::UpsampleGeom without Kiln's types (a scale of 0: not given).
struct UpsampleArgs {
  bool bilinear = false, align_corners = false;
  int64_t planes = 0, ih = 0, iw = 0, oh = 0, ow = 0;
  double scale_h = 0, scale_w = 0;
};

// y [planes, *y] from x [planes, *x]: one thread per output element.
void launch_pad_forward(Dt dt, const PadArgs& a, const void* x, void* y, cudaStream_t stream);
// gx [planes, *x] from gy [planes, *y]: one thread per input element, gathering from the outputs
// that read it in a fixed order (no atomics: the same bits every run).
void launch_pad_backward(Dt dt, const PadArgs& a, const void* gy, void* gx, cudaStream_t stream);
void launch_upsample_forward(Dt dt, const UpsampleArgs& a, const void* x, void* y,
                             cudaStream_t stream);
void launch_upsample_backward(Dt dt, const UpsampleArgs& a, const void* gy, void* gx,
                              cudaStream_t stream);

}  // namespace kiln::cuda

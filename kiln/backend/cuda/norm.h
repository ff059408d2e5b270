#pragma once
// Launchers of the CUDA kernels of batch, group and layer norm (Note [Batch, group and layer
// norm] in kiln/ops/norm_meta.cpp). x, dy, out are contiguous [n, c, hw] of the floating dtype
// `dt`; statistics and coefficients are contiguous in its accumulate type (float for the 16-bit
// floats). Internal to kiln/backend/cuda.
#include <cuda_runtime.h>

#include <cstdint>

#include "kiln/backend/cuda/kernel_args.h"

namespace kiln::cuda {

// mean[j] and biased var[j] of x[:, j, :]: one block per channel, two passes.
void launch_norm_moments(Dt dt, const void* x, int64_t n, int64_t c, int64_t hw, void* mean,
                         void* var, cudaStream_t stream);
// sum_dy[j] and sum_dy_xmu[j] = sums of dy and dy * (x - mean[j]) over x[:, j, :] (mean may be
// null: 0).
void launch_norm_dot(Dt dt, const void* dy, const void* x, const void* mean, int64_t n, int64_t c,
                     int64_t hw, void* sum_dy, void* sum_dy_xmu, cudaStream_t stream);
// out = (a * p[q] + b * r[q] + s[q]) * w[k] + bias[k], q = i * qi + j * qj (b, r, s, w, bias may
// be null).
void launch_norm_apply(Dt dt, void* out, const void* a, const void* p, const void* b, const void* r,
                       const void* s, const void* w, const void* bias, int64_t n, int64_t c,
                       int64_t hw, int64_t qi, int64_t qj, cudaStream_t stream);

}  // namespace kiln::cuda

#pragma once
// Launchers of the CUDA kernels of layer_norm, rms_norm, gelu_backward and nll_loss (embedding
// runs on index_select's kernel, see index.h). Data pointers are device memory of contiguous
// tensors of the floating dtype `dt`. Internal to kiln/backend/cuda.
#include <cuda_runtime.h>

#include <cstdint>

#include "kiln/backend/cuda/kernel_args.h"

namespace kiln::cuda {

// y = (x - mean) / sqrt(var + eps) * w + b per row (rms: mean taken as 0, no bias); x and y
// are (rows, n), w and b are (n) or null.
void launch_norm(Dt dt, const void* x, const void* w, const void* b, void* y, int64_t rows,
                 int64_t n, double eps, bool rms, cudaStream_t stream);
// dx = rstd * (gx - mean(gx) - xhat * mean(gx * xhat)) per row, gx = g * w (w may be null):
// the gradient of layer_norm with respect to x. g, x and dx are (rows, n).
void launch_layer_norm_backward(Dt dt, const void* g, const void* x, const void* w, void* dx,
                                int64_t rows, int64_t n, double eps, cudaStream_t stream);
// out = grad * gelu'(x) over `ix` (erf form, or the tanh approximation's derivative).
void launch_gelu_backward(Dt dt, const Indexer<3>& ix, void* out, const Operand& grad,
                          const Operand& x, bool approximate_tanh, cudaStream_t stream);
// out (one element) = -mean of self[i, target[i]] over the i whose target is not
// ignore_index (NaN when none is); self is (n, classes), target (n). A target outside
// [0, classes) is left out and sets *err to `code`.
void launch_nll_loss(Dt dt, const void* self, const int64_t* target, void* out, int64_t n,
                     int64_t classes, int64_t ignore_index, int* err, int code,
                     cudaStream_t stream);

}  // namespace kiln::cuda

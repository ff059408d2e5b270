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
// layer_norm_fused_backward for rows of n elements that fit in registers
// (layer_norm_fused_backward_fit): dx (if not null) as launch_layer_norm_backward, and dw = sum of
// g * xhat, db = sum of g over the rows (each if not null). `partial` is scratch of (parts, 2n)
// accumulators (float, double for float64), parts = layer_norm_fused_backward_parts(rows, n).
bool layer_norm_fused_backward_fit(int64_t n);
int64_t layer_norm_fused_backward_parts(int64_t rows, int64_t n);
void launch_layer_norm_fused_backward(Dt dt, const void* g, const void* x, const void* w, void* dx,
                                      void* dw, void* db, void* partial, int64_t parts,
                                      int64_t rows, int64_t n, double eps, cudaStream_t stream);
// out = grad where x > threshold, else 0, over `ix` (threshold_backward).
void launch_threshold_backward(Dt dt, const Indexer<3>& ix, void* out, const Operand& grad,
                               const Operand& x, double threshold, cudaStream_t stream);
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

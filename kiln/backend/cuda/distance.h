#pragma once
// Launchers of the CUDA kernels of cdist and pdist and their backward ops (Note [cdist and
// pdist] in kiln/ops/distance_meta.cpp). Data pointers are device memory of contiguous tensors
// of the accumulating type: float (f64 false) or double (f64 true). `kind` is a
// detail::NormKind as an int. One thread per result element, each a gather (no atomics).
// Internal to kiln/backend/cuda.
#include <cuda_runtime.h>

#include <cstdint>

namespace kiln::cuda {

// out [B, P, R] from x1 [B, P, M] and x2 [B, R, M].
void launch_cdist_forward(bool f64, const void* x1, const void* x2, void* out, int64_t B, int64_t P,
                          int64_t R, int64_t M, int kind, double p, cudaStream_t stream);
// gx1 [B, P, M] from grad and cdist [B, P, R], x1 [B, P, M] and x2 [B, R, M].
void launch_cdist_backward(bool f64, const void* grad, const void* x1, const void* x2,
                           const void* cdist, void* gx1, int64_t B, int64_t P, int64_t R, int64_t M,
                           int kind, double p, cudaStream_t stream);
// out [N (N - 1) / 2] from x [N, M].
void launch_pdist_forward(bool f64, const void* x, void* out, int64_t N, int64_t M, int kind,
                          double p, cudaStream_t stream);
// gx [N, M] from grad and pdist [N (N - 1) / 2] and x [N, M].
void launch_pdist_backward(bool f64, const void* grad, const void* x, const void* pdist, void* gx,
                           int64_t N, int64_t M, int kind, double p, cudaStream_t stream);

}  // namespace kiln::cuda

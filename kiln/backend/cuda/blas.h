#pragma once
// Launchers of the CUDA kernels the matrix products need beside cuBLASLt: integer products
// (cuBLASLt has no integer GEMM of these types) and the y = beta * y of an empty sum; and the
// per-stream cuBLASLt workspaces.
// Internal to kiln/backend/cuda.
#include <cuda_runtime.h>

#include <cstdint>

#include "kiln/backend/cuda/kernel_args.h"

namespace kiln::cuda {

// A (batch, rows, cols) operand on the device: element strides of each dim (0 where expanded).
struct MatArg {
  const void* data = nullptr;
  int64_t batch_stride = 0, row_stride = 0, col_stride = 0;
};

// y (batch, m, n), contiguous, = alpha * a (batch, m, k) @ b (batch, k, n) + beta * y for the
// integer dtypes (uint8, int32, int64), summed in int64 as the CPU does; beta 0 ignores y.
void launch_int_gemm(Dt dt, const MatArg& a, const MatArg& b, void* y, int64_t batch, int64_t m,
                     int64_t n, int64_t k, int64_t alpha, int64_t beta, cudaStream_t stream);

// y[i] = y[i] * beta in y's arithmetic type (0 when beta is 0, whatever y holds); y contiguous
// with n elements, any dtype but bool.
void launch_scale(Dt dt, void* y, int64_t n, double beta, cudaStream_t stream);

// Note [cuBLASLt workspaces] (blas.cpp): makes the workspace of (device, stream) now, outside a
// capture, and marks the stream as captured (begin_capture calls it); drops it (destroy_stream,
// after synchronizing the stream; this synchronizes the device when the stream was captured).
void reserve_lt_workspace(int device, cudaStream_t stream);
void release_lt_workspace(int device, cudaStream_t stream);

}  // namespace kiln::cuda

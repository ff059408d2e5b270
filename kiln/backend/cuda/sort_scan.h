#pragma once
// Launchers of the CUDA kernels of sort, topk, cumsum and prod (CUB's segmented sort, scan by
// key and segmented reduce). Data pointers are device memory of contiguous [rows, n] tensors,
// one row per slice. Internal to kiln/backend/cuda.
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "kiln/backend/cuda/kernel_args.h"

namespace kiln::cuda {

// Bytes of device workspace launch_sort needs for `rows` rows of n elements of dtype `dt`.
size_t sort_workspace_bytes(Dt dt, int64_t rows, int64_t n);
// Sorts each row of x stably (NaN largest, -0 equal to 0: Note [Sort keys] in sort_scan.cu),
// ascending or descending: values gets the sorted elements, indices their positions in the row.
void launch_sort(Dt dt, const void* x, void* values, int64_t* indices, int64_t rows, int64_t n,
                 bool descending, void* workspace, cudaStream_t stream);

// The accumulator dtypes of cumsum and prod: Float32, Float64 or Int64.
// Bytes of workspace launch_cumsum needs for rows x n elements of `acc`.
size_t cumsum_workspace_bytes(Dt acc, int64_t rows, int64_t n);
// y = the inclusive running sum of each row of x (both `acc`).
void launch_cumsum(Dt acc, const void* x, void* y, int64_t rows, int64_t n, void* workspace,
                   cudaStream_t stream);
size_t prod_workspace_bytes(Dt acc, int64_t rows, int64_t n);
// y[r] = the product of row r of x (both `acc`; 1 for an empty row).
void launch_prod(Dt acc, const void* x, void* y, int64_t rows, int64_t n, void* workspace,
                 cudaStream_t stream);

}  // namespace kiln::cuda

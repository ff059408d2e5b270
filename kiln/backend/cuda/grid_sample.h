#pragma once
// Launchers of the CUDA kernels of grid_sampler_2d and its backward op (Note [grid_sampler_2d]
// in kiln/ops/grid_sample_meta.cpp). Data pointers are device memory of contiguous tensors of the
// accumulating type: float (f64 false) or double (f64 true). Internal to kiln/backend/cuda.
#include <cuda_runtime.h>

#include "kiln/ops/grid_sample_math.h"

namespace kiln::cuda {

// out [N, C, OH, OW] from input [N, C, H, W] and grid [N, OH, OW, 2]: one thread per output.
void launch_grid_sampler_2d(bool f64, const void* input, const void* grid, void* out,
                            const detail::grid::Geom& g, cudaStream_t stream);
// grad_grid [N, OH, OW, 2] and, when grad_input is not null, grad_input [N, C, H, W] (zeroed by
// the caller) from grad_output [N, C, OH, OW]: one thread per grid point, grad_input by
// atomicAdd (See Note [grid_sampler_2d]).
void launch_grid_sampler_2d_backward(bool f64, const void* grad_output, const void* input,
                                     const void* grid, void* grad_input, void* grad_grid,
                                     const detail::grid::Geom& g, cudaStream_t stream);

}  // namespace kiln::cuda

#pragma once
// grid_sampler_2d and its backward op (Note [grid_sampler_2d] in
// kiln/ops/grid_sample_meta.cpp): meta functions and the geometry the CPU and CUDA kernels
// share. Internal.
#include "kiln/ops/grid_sample_math.h"
#include "kiln/ops/meta.h"

namespace kiln::meta {

// input [N, C, H, W] (H, W > 0) and grid [N, OH, OW, 2] of one floating dtype and device,
// interpolation_mode 0-2 and padding_mode 0-2: the [N, C, OH, OW] result.
TensorSpec grid_sampler_2d(const Tensor& input, const Tensor& grid, int64_t interpolation_mode,
                           int64_t padding_mode, bool align_corners);
// grad_output [N, C, OH, OW] as grid_sampler_2d gives it, output_mask two 0/1 flags (grad_input,
// grad_grid); the arguments otherwise as grid_sampler_2d's.
void grid_sampler_2d_backward(const Tensor& grad_output, const Tensor& input, const Tensor& grid,
                              int64_t interpolation_mode, int64_t padding_mode, bool align_corners,
                              IntArrayRef output_mask);

}  // namespace kiln::meta

namespace kiln::detail {

// The geometry of a valid call.
grid::Geom grid_geom(const Tensor& input, const Tensor& grid, int64_t interpolation_mode,
                     int64_t padding_mode, bool align_corners);

}  // namespace kiln::detail

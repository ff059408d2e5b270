#pragma once
// Sampling an image at grid points as torch.nn.functional.grid_sample, over the grid_sampler_2d
// op (Note [grid_sampler_2d] in kiln/ops/grid_sample_meta.cpp).
#include <string_view>

#include "kiln/core/tensor.h"

namespace kiln {

// input [N, C, H, W] sampled at grid [N, OH, OW, 2] ((x, y) in [-1, 1]): [N, C, OH, OW]. mode
// "bilinear", "nearest" or "bicubic"; padding_mode "zeros", "border" or "reflection";
// align_corners: -1 and 1 are the corner pixels' centres rather than their outer edges.
Tensor grid_sample(const Tensor& input, const Tensor& grid, std::string_view mode = "bilinear",
                   std::string_view padding_mode = "zeros", bool align_corners = false);

}  // namespace kiln

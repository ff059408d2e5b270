#pragma once
// Padding and upsampling as in torch.nn.functional: pad (constant, reflect, replicate, circular)
// and interpolate (nearest, bilinear, linear), over the ops constant_pad_nd,
// reflection_pad1d/2d/3d, replication_pad1d/2d/3d, upsample_nearest2d and upsample_bilinear2d
// (Note [Padding and upsampling] in kiln/ops/pad_meta.cpp). Pads are (left, right) pairs from
// the last dim backwards; a negative pad crops.
#include <optional>
#include <string_view>
#include <vector>

#include "kiln/core/tensor.h"

namespace kiln {

// input padded by `pad`: "constant" (with value, 0 when none; any dtype, any number of dims),
// "reflect" and "replicate" (the last 1-3 dims of a [C, *] or [N, C, *] floating input, as
// torch.nn.functional.pad) or "circular" (wrapping around, each pad at most its dim's size).
Tensor pad(const Tensor& input, IntArrayRef pad, std::string_view mode = "constant",
           std::optional<double> value = std::nullopt);

Tensor constant_pad_nd(const Tensor& input, IntArrayRef pad, const Scalar& value = 0);
Tensor reflection_pad1d(const Tensor& input, IntArrayRef padding);
Tensor reflection_pad2d(const Tensor& input, IntArrayRef padding);
Tensor reflection_pad3d(const Tensor& input, IntArrayRef padding);
Tensor replication_pad1d(const Tensor& input, IntArrayRef padding);
Tensor replication_pad2d(const Tensor& input, IntArrayRef padding);
Tensor replication_pad3d(const Tensor& input, IntArrayRef padding);
// grad_input of the pads above (input's shape): each output's gradient added into its source.
Tensor reflection_pad1d_backward(const Tensor& grad_output, const Tensor& input,
                                 IntArrayRef padding);
Tensor reflection_pad2d_backward(const Tensor& grad_output, const Tensor& input,
                                 IntArrayRef padding);
Tensor reflection_pad3d_backward(const Tensor& grad_output, const Tensor& input,
                                 IntArrayRef padding);
Tensor replication_pad1d_backward(const Tensor& grad_output, const Tensor& input,
                                  IntArrayRef padding);
Tensor replication_pad2d_backward(const Tensor& grad_output, const Tensor& input,
                                  IntArrayRef padding);
Tensor replication_pad3d_backward(const Tensor& grad_output, const Tensor& input,
                                  IntArrayRef padding);

// [N, C, H, W] to [N, C, *output_size]; scales_h/scales_w (used for the source positions when
// positive) as ATen's base overloads.
Tensor upsample_nearest2d(const Tensor& input, IntArrayRef output_size,
                          std::optional<double> scales_h = std::nullopt,
                          std::optional<double> scales_w = std::nullopt);
Tensor upsample_bilinear2d(const Tensor& input, IntArrayRef output_size, bool align_corners,
                           std::optional<double> scales_h = std::nullopt,
                           std::optional<double> scales_w = std::nullopt);
// ATen's .vec overloads: exactly one of output_size (2 sizes) and scale_factors (2 positive
// factors; the output is floor(size * factor), and the factors are the op's scales).
Tensor upsample_nearest2d_vec(const Tensor& input, std::optional<std::vector<int64_t>> output_size,
                              std::optional<std::vector<double>> scale_factors);
Tensor upsample_bilinear2d_vec(const Tensor& input, std::optional<std::vector<int64_t>> output_size,
                               bool align_corners,
                               std::optional<std::vector<double>> scale_factors);
Tensor upsample_nearest2d_backward(const Tensor& grad_output, IntArrayRef output_size,
                                   IntArrayRef input_size,
                                   std::optional<double> scales_h = std::nullopt,
                                   std::optional<double> scales_w = std::nullopt);
Tensor upsample_bilinear2d_backward(const Tensor& grad_output, IntArrayRef output_size,
                                    IntArrayRef input_size, bool align_corners,
                                    std::optional<double> scales_h = std::nullopt,
                                    std::optional<double> scales_w = std::nullopt);

// torch.nn.functional.interpolate for [N, C, L] ("nearest", "linear") and [N, C, H, W]
// ("nearest", "bilinear") inputs: size (one value for every dim, or one per spatial dim) or
// scale_factor (likewise), not both; align_corners only for the linear modes (false when none).
Tensor interpolate(const Tensor& input, std::optional<std::vector<int64_t>> size = std::nullopt,
                   std::optional<std::vector<double>> scale_factor = std::nullopt,
                   std::string_view mode = "nearest",
                   std::optional<bool> align_corners = std::nullopt);

}  // namespace kiln

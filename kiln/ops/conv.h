#pragma once
// Convolutions: conv1d/2d/3d and conv_transpose1d/2d/3d as in torch.nn.functional, composites
// over the convolution op (Note [Convolution] in kiln/ops/conv_meta.cpp). Inputs are batched
// [N, C, *spatial] or unbatched [C, *spatial]; an undefined bias means none.
#include <string_view>
#include <tuple>

#include "kiln/core/tensor.h"

namespace kiln {

// ATen's core op and its backward (output_mask: which of grad_input, grad_weight, grad_bias to
// compute; bias_sizes empty when there is no bias). Undefined results where the mask says no.
Tensor convolution(const Tensor& input, const Tensor& weight, const Tensor& bias,
                   IntArrayRef stride, IntArrayRef padding, IntArrayRef dilation, bool transposed,
                   IntArrayRef output_padding, int64_t groups);
std::tuple<Tensor, Tensor, Tensor> convolution_backward(const Tensor& grad_output,
                                                        const Tensor& input, const Tensor& weight,
                                                        IntArrayRef bias_sizes, IntArrayRef stride,
                                                        IntArrayRef padding, IntArrayRef dilation,
                                                        bool transposed, IntArrayRef output_padding,
                                                        int64_t groups, IntArrayRef output_mask);

// padding as numbers, or "valid" (none) or "same" (the output keeps the input's spatial size:
// stride 1 only; an odd total padding puts the extra element at the end, as PyTorch does).
Tensor conv1d(const Tensor& input, const Tensor& weight, const Tensor& bias = {},
              IntArrayRef stride = {1}, IntArrayRef padding = {0}, IntArrayRef dilation = {1},
              int64_t groups = 1);
Tensor conv1d(const Tensor& input, const Tensor& weight, const Tensor& bias, IntArrayRef stride,
              std::string_view padding, IntArrayRef dilation = {1}, int64_t groups = 1);
Tensor conv2d(const Tensor& input, const Tensor& weight, const Tensor& bias = {},
              IntArrayRef stride = {1}, IntArrayRef padding = {0}, IntArrayRef dilation = {1},
              int64_t groups = 1);
Tensor conv2d(const Tensor& input, const Tensor& weight, const Tensor& bias, IntArrayRef stride,
              std::string_view padding, IntArrayRef dilation = {1}, int64_t groups = 1);
Tensor conv3d(const Tensor& input, const Tensor& weight, const Tensor& bias = {},
              IntArrayRef stride = {1}, IntArrayRef padding = {0}, IntArrayRef dilation = {1},
              int64_t groups = 1);
Tensor conv3d(const Tensor& input, const Tensor& weight, const Tensor& bias, IntArrayRef stride,
              std::string_view padding, IntArrayRef dilation = {1}, int64_t groups = 1);

// torch.nn.functional's argument order: weight [C_in, C_out / groups, *kernel].
Tensor conv_transpose1d(const Tensor& input, const Tensor& weight, const Tensor& bias = {},
                        IntArrayRef stride = {1}, IntArrayRef padding = {0},
                        IntArrayRef output_padding = {0}, int64_t groups = 1,
                        IntArrayRef dilation = {1});
Tensor conv_transpose2d(const Tensor& input, const Tensor& weight, const Tensor& bias = {},
                        IntArrayRef stride = {1}, IntArrayRef padding = {0},
                        IntArrayRef output_padding = {0}, int64_t groups = 1,
                        IntArrayRef dilation = {1});
Tensor conv_transpose3d(const Tensor& input, const Tensor& weight, const Tensor& bias = {},
                        IntArrayRef stride = {1}, IntArrayRef padding = {0},
                        IntArrayRef output_padding = {0}, int64_t groups = 1,
                        IntArrayRef dilation = {1});

}  // namespace kiln

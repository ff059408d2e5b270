#pragma once
// convolution and convolution_backward: their meta functions, and the driver the backends share
// (Note [Convolution] in conv_meta.cpp). Internal: backends call these first, so validation
// happens before any write.
#include <array>

#include "kiln/ops/meta.h"

namespace kiln::meta {

// convolution's arguments after validation, each list expanded to the spatial rank `nd`.
struct ConvArgs {
  int64_t nd = 0;
  Shape stride, padding, dilation, output_padding;
  bool transposed = false;
  int64_t groups = 1;
};

// convolution: input [N, C, *spatial] and weight [C_out, C / groups, *kernel] (transposed:
// [C, C_out / groups, *kernel]) with 1-3 spatial dims, one floating dtype and one device; bias
// undefined or a C_out-vector of that dtype; stride, padding, dilation and output_padding of one
// element or one per spatial dim. Returns the output's spec and fills `args` when given.
TensorSpec convolution(const Tensor& input, const Tensor& weight, const Tensor& bias,
                       IntArrayRef stride, IntArrayRef padding, IntArrayRef dilation,
                       bool transposed, IntArrayRef output_padding, int64_t groups,
                       ConvArgs* args = nullptr);
// convolution_backward: the forward's arguments are valid (a bias of bias_sizes, empty for none),
// grad_output has the forward output's shape, dtype and device, and output_mask is three 0/1
// flags. Returns the forward's arguments.
ConvArgs convolution_backward(const Tensor& grad_output, const Tensor& input, const Tensor& weight,
                              IntArrayRef bias_sizes, IntArrayRef stride, IntArrayRef padding,
                              IntArrayRef dilation, bool transposed, IntArrayRef output_padding,
                              int64_t groups, IntArrayRef output_mask);

}  // namespace kiln::meta

namespace kiln::detail {

// A convolution in its canonical direction (Note [Convolution]): x [n, ci, *x] to y
// [n, co, *y] through weight [co, ci / groups, *k]. Spatial dims are padded to 3 with size 1.
struct ConvGeom {
  int64_t nd = 0, n = 0, ci = 0, co = 0, groups = 1;
  std::array<int64_t, 3> x{1, 1, 1}, y{1, 1, 1}, k{1, 1, 1};
  std::array<int64_t, 3> stride{1, 1, 1}, pad{0, 0, 0}, dil{1, 1, 1};
};

// A backend's three canonical kernels. Each takes contiguous-or-not inputs of the op's dtype and
// returns a new contiguous result of that dtype: y = conv(x, w), gx = conv's adjoint in x
// applied to gy, gw = conv's adjoint in w.
struct ConvKernels {
  Tensor (*forward)(const Tensor& x, const Tensor& w, const ConvGeom& g);
  Tensor (*backward_data)(const Tensor& gy, const Tensor& w, const ConvGeom& g);
  Tensor (*backward_weight)(const Tensor& x, const Tensor& gy, const ConvGeom& g);
};

// convolution and convolution_backward over a backend's kernels, after the meta checks.
Tensor run_convolution(const ConvKernels& k, const Tensor& input, const Tensor& weight,
                       const Tensor& bias, IntArrayRef stride, IntArrayRef padding,
                       IntArrayRef dilation, bool transposed, IntArrayRef output_padding,
                       int64_t groups);
TensorTriple run_convolution_backward(const ConvKernels& k, const Tensor& grad_output,
                                      const Tensor& input, const Tensor& weight,
                                      IntArrayRef bias_sizes, IntArrayRef stride,
                                      IntArrayRef padding, IntArrayRef dilation, bool transposed,
                                      IntArrayRef output_padding, int64_t groups,
                                      IntArrayRef output_mask);

}  // namespace kiln::detail

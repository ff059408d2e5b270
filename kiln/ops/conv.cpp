// conv1d/2d/3d and conv_transpose1d/2d/3d over the convolution op.
#include "kiln/ops/conv.h"

#include "kiln/ops/op_list.h"
#include "kiln/ops/ops.h"

namespace kiln {
namespace {

// Runs f on a batched input: an unbatched [C, *spatial] one gets a batch dim of 1, dropped again.
template <class F>
Tensor batched(const char* op, const Tensor& input, const Tensor& weight, F f) {
  KILN_CHECK(input.defined() && weight.defined(), "[{}] input and weight must be defined", op);
  const int64_t nd = weight.dim() - 2;
  if (input.dim() == nd + 1) return squeeze(f(unsqueeze(input, 0)), 0);
  return f(input);
}

Tensor conv_nd(const char* op, int64_t nd, const Tensor& input, const Tensor& weight,
               const Tensor& bias, IntArrayRef stride, IntArrayRef padding, IntArrayRef dilation,
               int64_t groups) {
  KILN_CHECK(weight.defined() && weight.dim() == nd + 2, "[{}] weight must be {}-D, got shape {}",
             op, nd + 2, weight.defined() ? weight.sizes() : IntArrayRef());
  return batched(op, input, weight, [&](const Tensor& x) {
    return ops::op_convolution(x, weight, bias, stride, padding, dilation, false, {0}, groups);
  });
}

// Note [Same padding]: the total padding along a dim is d (k - 1); half of it (rounded down) is
// padded on both sides by the op, and an odd remainder is one more zero at the end of the input,
// made by copying the input into a zero tensor one larger (PyTorch pads it alike).
Tensor conv_nd(const char* op, int64_t nd, const Tensor& input, const Tensor& weight,
               const Tensor& bias, IntArrayRef stride, std::string_view padding,
               IntArrayRef dilation, int64_t groups) {
  KILN_CHECK(padding == "same" || padding == "valid",
             "[{}] padding must be \"same\", \"valid\" or numbers, got \"{}\"", op, padding);
  if (padding == "valid")
    return conv_nd(op, nd, input, weight, bias, stride, IntArrayRef{0}, dilation, groups);
  for (int64_t s : stride)
    KILN_CHECK(s == 1, "[{}] padding=\"same\" needs stride 1, got {}", op, stride);
  KILN_CHECK(weight.defined() && weight.dim() == nd + 2, "[{}] weight must be {}-D, got shape {}",
             op, nd + 2, weight.defined() ? weight.sizes() : IntArrayRef());
  KILN_CHECK(dilation.size() == 1 || static_cast<int64_t>(dilation.size()) == nd,
             "[{}] dilation must have 1 or {} elements, got {}", op, nd, dilation);
  Shape pad, extra;
  bool any_extra = false;
  for (int64_t i = 0; i < nd; ++i) {
    int64_t d = dilation.size() == 1 ? dilation[0] : dilation[static_cast<size_t>(i)];
    int64_t total = d * (weight.size(2 + i) - 1);
    pad.push_back(total / 2);
    extra.push_back(total % 2);
    any_extra = any_extra || total % 2;
  }
  return batched(op, input, weight, [&](const Tensor& x) {
    Tensor in = x;
    if (any_extra) {
      Shape sizes(x.sizes());
      for (int64_t i = 0; i < nd; ++i) sizes[static_cast<size_t>(2 + i)] += extra[i];
      in = zeros(sizes, x.dtype(), x.device());
      Tensor inner = in;
      for (int64_t i = 0; i < nd; ++i) inner = slice(inner, 2 + i, 0, x.size(2 + i));
      inner.copy_(x);
    }
    return ops::op_convolution(in, weight, bias, {1}, pad, dilation, false, {0}, groups);
  });
}

Tensor conv_transpose_nd(const char* op, int64_t nd, const Tensor& input, const Tensor& weight,
                         const Tensor& bias, IntArrayRef stride, IntArrayRef padding,
                         IntArrayRef output_padding, int64_t groups, IntArrayRef dilation) {
  KILN_CHECK(weight.defined() && weight.dim() == nd + 2, "[{}] weight must be {}-D, got shape {}",
             op, nd + 2, weight.defined() ? weight.sizes() : IntArrayRef());
  return batched(op, input, weight, [&](const Tensor& x) {
    return ops::op_convolution(x, weight, bias, stride, padding, dilation, true, output_padding,
                               groups);
  });
}

}  // namespace

Tensor convolution(const Tensor& input, const Tensor& weight, const Tensor& bias,
                   IntArrayRef stride, IntArrayRef padding, IntArrayRef dilation, bool transposed,
                   IntArrayRef output_padding, int64_t groups) {
  return ops::op_convolution(input, weight, bias, stride, padding, dilation, transposed,
                             output_padding, groups);
}
std::tuple<Tensor, Tensor, Tensor> convolution_backward(const Tensor& grad_output,
                                                        const Tensor& input, const Tensor& weight,
                                                        IntArrayRef bias_sizes, IntArrayRef stride,
                                                        IntArrayRef padding, IntArrayRef dilation,
                                                        bool transposed, IntArrayRef output_padding,
                                                        int64_t groups, IntArrayRef output_mask) {
  return ops::op_convolution_backward(grad_output, input, weight, bias_sizes, stride, padding,
                                      dilation, transposed, output_padding, groups, output_mask);
}

#define KILN_CONV_ND(name, nd)                                                                   \
  Tensor name(const Tensor& input, const Tensor& weight, const Tensor& bias, IntArrayRef stride, \
              IntArrayRef padding, IntArrayRef dilation, int64_t groups) {                       \
    return conv_nd(#name, nd, input, weight, bias, stride, padding, dilation, groups);           \
  }                                                                                              \
  Tensor name(const Tensor& input, const Tensor& weight, const Tensor& bias, IntArrayRef stride, \
              std::string_view padding, IntArrayRef dilation, int64_t groups) {                  \
    return conv_nd(#name, nd, input, weight, bias, stride, padding, dilation, groups);           \
  }
KILN_CONV_ND(conv1d, 1)
KILN_CONV_ND(conv2d, 2)
KILN_CONV_ND(conv3d, 3)
#undef KILN_CONV_ND

#define KILN_CONV_TRANSPOSE_ND(name, nd)                                                         \
  Tensor name(const Tensor& input, const Tensor& weight, const Tensor& bias, IntArrayRef stride, \
              IntArrayRef padding, IntArrayRef output_padding, int64_t groups,                   \
              IntArrayRef dilation) {                                                            \
    return conv_transpose_nd(#name, nd, input, weight, bias, stride, padding, output_padding,    \
                             groups, dilation);                                                  \
  }
KILN_CONV_TRANSPOSE_ND(conv_transpose1d, 1)
KILN_CONV_TRANSPOSE_ND(conv_transpose2d, 2)
KILN_CONV_TRANSPOSE_ND(conv_transpose3d, 3)
#undef KILN_CONV_TRANSPOSE_ND

}  // namespace kiln

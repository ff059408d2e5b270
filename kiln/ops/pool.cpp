// max_pool, avg_pool and adaptive_avg_pool (1-3 spatial dims) over the pooling ops; the 1-D forms
// run the 2-D ops on a [.., 1, L] view.
#include "kiln/ops/pool.h"

#include "kiln/ops/op_list.h"
#include "kiln/ops/ops.h"

namespace kiln {
namespace {

// A 1-D size argument (one element; stride may also be empty), as the 2-D op's [1, v].
Shape as_2d(const char* op, const char* what, IntArrayRef v, bool allow_empty, int64_t fill) {
  KILN_CHECK(v.size() == 1 || (allow_empty && v.empty()), "[{}] {} must have {}1 element, got {}",
             op, what, allow_empty ? "0 or " : "", v);
  if (v.empty()) return {};
  return {fill, v[0]};
}

// Runs f on input [N, C, L] or [C, L] as [.., 1, L], and drops that dim again.
template <class F>
auto on_1d(const char* op, const Tensor& input, F f) {
  KILN_CHECK(input.defined() && (input.dim() == 2 || input.dim() == 3),
             "[{}] input must be 2-D ([C, L]) or 3-D ([N, C, L]), got shape {}", op,
             input.defined() ? input.sizes() : IntArrayRef());
  return f(unsqueeze(input, -2));
}

}  // namespace

#define KILN_MAX_POOL_ND(nd)                                                                       \
  Tensor max_pool##nd##d(const Tensor& input, IntArrayRef kernel_size, IntArrayRef stride,         \
                         IntArrayRef padding, IntArrayRef dilation, bool ceil_mode) {              \
    return std::get<0>(ops::op_max_pool##nd##d_with_indices(input, kernel_size, stride, padding,   \
                                                            dilation, ceil_mode));                 \
  }                                                                                                \
  std::tuple<Tensor, Tensor> max_pool##nd##d_with_indices(                                         \
      const Tensor& input, IntArrayRef kernel_size, IntArrayRef stride, IntArrayRef padding,       \
      IntArrayRef dilation, bool ceil_mode) {                                                      \
    return ops::op_max_pool##nd##d_with_indices(input, kernel_size, stride, padding, dilation,     \
                                                ceil_mode);                                        \
  }                                                                                                \
  Tensor max_pool##nd##d_with_indices_backward(                                                    \
      const Tensor& grad_output, const Tensor& input, IntArrayRef kernel_size, IntArrayRef stride, \
      IntArrayRef padding, IntArrayRef dilation, bool ceil_mode, const Tensor& indices) {          \
    return ops::op_max_pool##nd##d_with_indices_backward(grad_output, input, kernel_size, stride,  \
                                                         padding, dilation, ceil_mode, indices);   \
  }                                                                                                \
  Tensor avg_pool##nd##d(const Tensor& input, IntArrayRef kernel_size, IntArrayRef stride,         \
                         IntArrayRef padding, bool ceil_mode, bool count_include_pad,              \
                         std::optional<int64_t> divisor_override) {                                \
    return ops::op_avg_pool##nd##d(input, kernel_size, stride, padding, ceil_mode,                 \
                                   count_include_pad, divisor_override);                           \
  }                                                                                                \
  Tensor avg_pool##nd##d_backward(const Tensor& grad_output, const Tensor& input,                  \
                                  IntArrayRef kernel_size, IntArrayRef stride,                     \
                                  IntArrayRef padding, bool ceil_mode, bool count_include_pad,     \
                                  std::optional<int64_t> divisor_override) {                       \
    return ops::op_avg_pool##nd##d_backward(grad_output, input, kernel_size, stride, padding,      \
                                            ceil_mode, count_include_pad, divisor_override);       \
  }                                                                                                \
  Tensor adaptive_avg_pool##nd##d(const Tensor& input, IntArrayRef output_size) {                  \
    return ops::op_adaptive_avg_pool##nd##d(input, output_size);                                   \
  }                                                                                                \
  Tensor adaptive_avg_pool##nd##d_backward(const Tensor& grad_output, const Tensor& input) {       \
    return ops::op_adaptive_avg_pool##nd##d_backward(grad_output, input);                          \
  }
KILN_MAX_POOL_ND(2)
KILN_MAX_POOL_ND(3)
#undef KILN_MAX_POOL_ND

std::tuple<Tensor, Tensor> max_pool1d_with_indices(const Tensor& input, IntArrayRef kernel_size,
                                                   IntArrayRef stride, IntArrayRef padding,
                                                   IntArrayRef dilation, bool ceil_mode) {
  const char* op = "max_pool1d";
  Shape k = as_2d(op, "kernel_size", kernel_size, false, 1);
  Shape s = as_2d(op, "stride", stride, true, 1);
  Shape p = as_2d(op, "padding", padding, false, 0);
  Shape d = as_2d(op, "dilation", dilation, false, 1);
  auto [y, i] = on_1d(op, input, [&](const Tensor& x) {
    return ops::op_max_pool2d_with_indices(x, k, s, p, d, ceil_mode);
  });
  return {squeeze(y, -2), squeeze(i, -2)};
}
Tensor max_pool1d(const Tensor& input, IntArrayRef kernel_size, IntArrayRef stride,
                  IntArrayRef padding, IntArrayRef dilation, bool ceil_mode) {
  return std::get<0>(
      max_pool1d_with_indices(input, kernel_size, stride, padding, dilation, ceil_mode));
}

Tensor avg_pool1d(const Tensor& input, IntArrayRef kernel_size, IntArrayRef stride,
                  IntArrayRef padding, bool ceil_mode, bool count_include_pad) {
  const char* op = "avg_pool1d";
  Shape k = as_2d(op, "kernel_size", kernel_size, false, 1);
  Shape s = as_2d(op, "stride", stride, true, 1);
  Shape p = as_2d(op, "padding", padding, false, 0);
  return squeeze(on_1d(op, input,
                       [&](const Tensor& x) {
                         return ops::op_avg_pool2d(x, k, s, p, ceil_mode, count_include_pad,
                                                   std::nullopt);
                       }),
                 -2);
}

Tensor adaptive_avg_pool1d(const Tensor& input, IntArrayRef output_size) {
  const char* op = "adaptive_avg_pool1d";
  Shape o = as_2d(op, "output_size", output_size, false, 1);
  return squeeze(
      on_1d(op, input, [&](const Tensor& x) { return ops::op_adaptive_avg_pool2d(x, o); }), -2);
}

}  // namespace kiln

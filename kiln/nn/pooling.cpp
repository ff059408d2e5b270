#include "kiln/nn/pooling.h"

#include "kiln/core/error.h"
#include "kiln/ops/pool.h"

namespace kiln::nn {
namespace {

// A size list of one value (both dims) or two (or none, where allowed), each at least `min`.
void check_sizes(const char* module, const char* what, const std::vector<int64_t>& v, int64_t min,
                 bool allow_empty = false) {
  KILN_CHECK(v.size() == 1 || v.size() == 2 || (allow_empty && v.empty()),
             "[{}] {} must have {}1 or 2 values, got {}", module, what, allow_empty ? "0, " : "",
             IntArrayRef(v));
  for (int64_t x : v)
    KILN_CHECK(x >= min, "[{}] {} must be at least {}, got {}", module, what, min, IntArrayRef(v));
}

}  // namespace

MaxPool2d::MaxPool2d(std::vector<int64_t> kernel, const MaxPoolOptions& opt)
    : kernel_size(std::move(kernel)), options(opt) {
  const char* m = "MaxPool2d";
  check_sizes(m, "kernel_size", kernel_size, 1);
  check_sizes(m, "stride", opt.stride, 1, true);
  check_sizes(m, "padding", opt.padding, 0);
  check_sizes(m, "dilation", opt.dilation, 1);
}

Tensor MaxPool2d::forward(const Tensor& x) {
  return max_pool2d(x, kernel_size, options.stride, options.padding, options.dilation,
                    options.ceil_mode);
}

AvgPool2d::AvgPool2d(std::vector<int64_t> kernel, const AvgPoolOptions& opt)
    : kernel_size(std::move(kernel)), options(opt) {
  const char* m = "AvgPool2d";
  check_sizes(m, "kernel_size", kernel_size, 1);
  check_sizes(m, "stride", opt.stride, 1, true);
  check_sizes(m, "padding", opt.padding, 0);
  KILN_CHECK(!opt.divisor_override || *opt.divisor_override != 0,
             "[{}] divisor_override must not be zero", m);
}

Tensor AvgPool2d::forward(const Tensor& x) {
  return avg_pool2d(x, kernel_size, options.stride, options.padding, options.ceil_mode,
                    options.count_include_pad, options.divisor_override);
}

AdaptiveAvgPool2d::AdaptiveAvgPool2d(std::vector<int64_t> size) : output_size(std::move(size)) {
  check_sizes("AdaptiveAvgPool2d", "output_size", output_size, 0);
  if (output_size.size() == 1) output_size = {output_size[0], output_size[0]};
}

Tensor AdaptiveAvgPool2d::forward(const Tensor& x) { return adaptive_avg_pool2d(x, output_size); }

}  // namespace kiln::nn

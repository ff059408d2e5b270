#include "kiln/nn/conv.h"

#include <cmath>

#include "kiln/core/error.h"
#include "kiln/ops/conv.h"
#include "kiln/ops/ops.h"

namespace kiln::nn {
namespace {

// A size list of one value (every dim) or one per spatial dim, each at least `min`.
void check_sizes(const char* module, const char* what, const std::vector<int64_t>& v, int64_t dims,
                 int64_t min) {
  KILN_CHECK(v.size() == 1 || static_cast<int64_t>(v.size()) == dims,
             "[{}] {} must have 1 or {} values, got {}", module, what, dims, IntArrayRef(v));
  for (int64_t x : v)
    KILN_CHECK(x >= min, "[{}] {} must be at least {}, got {}", module, what, min, IntArrayRef(v));
}

// The weight [a, b, *kernel] and bias [bias_size], drawn from U(-1/sqrt(fan_in), 1/sqrt(fan_in))
// with fan_in = b * prod(kernel), as torch.nn's _ConvNd.reset_parameters.
void init_weights(Tensor& weight, Tensor& bias, int64_t a, int64_t b, int64_t bias_size,
                  const std::vector<int64_t>& kernel, int64_t dims, bool has_bias,
                  const Init& init) {
  Shape shape{a, b};
  int64_t fan_in = b;
  for (int64_t i = 0; i < dims; ++i) {
    int64_t k = kernel.size() == 1 ? kernel[0] : kernel[static_cast<size_t>(i)];
    shape.push_back(k);
    fan_in *= k;
  }
  double bound = 1.0 / std::sqrt(static_cast<double>(fan_in));
  weight = empty(shape, init.dtype, init.device);
  uniform_(weight, -bound, bound, init.gen);
  if (has_bias) {
    bias = empty({bias_size}, init.dtype, init.device);
    uniform_(bias, -bound, bound, init.gen);
  }
}

void check_channels(const char* module, int64_t in, int64_t out, int64_t groups, int64_t dims) {
  KILN_CHECK(dims >= 1 && dims <= 3, "[{}] 1 to 3 spatial dims, got {}", module, dims);
  KILN_CHECK(in > 0 && out > 0 && groups > 0,
             "[{}] channels and groups must be positive, got in={} out={} groups={}", module, in,
             out, groups);
  KILN_CHECK(in % groups == 0 && out % groups == 0,
             "[{}] groups={} must divide in_channels={} and out_channels={}", module, groups, in,
             out);
}

}  // namespace

ConvNd::ConvNd(int64_t dims, int64_t in, int64_t out, std::vector<int64_t> kernel,
               const ConvOptions& opt, const Init& init)
    : spatial_dims(dims), options(opt) {
  const char* m = "Conv";
  check_channels(m, in, out, opt.groups, dims);
  check_sizes(m, "kernel_size", kernel, dims, 1);
  check_sizes(m, "stride", opt.stride, dims, 1);
  check_sizes(m, "dilation", opt.dilation, dims, 1);
  if (opt.padding_str.empty()) {
    check_sizes(m, "padding", opt.padding, dims, 0);
  } else {
    KILN_CHECK(opt.padding_str == "same" || opt.padding_str == "valid",
               "[Conv] padding_str must be \"same\", \"valid\" or empty, got \"{}\"",
               opt.padding_str);
    for (int64_t s : opt.stride)
      KILN_CHECK(opt.padding_str != "same" || s == 1,
                 "[Conv] padding=\"same\" needs stride 1, got {}", IntArrayRef(opt.stride));
  }
  init_weights(weight, bias, out, in / opt.groups, out, kernel, dims, opt.bias, init);
  register_parameter("weight", &weight);
  if (opt.bias) register_parameter("bias", &bias);
}

Tensor ConvNd::forward(const Tensor& x) {
  const ConvOptions& o = options;
  using Fn = Tensor (*)(const Tensor&, const Tensor&, const Tensor&, IntArrayRef, IntArrayRef,
                        IntArrayRef, int64_t);
  using StrFn = Tensor (*)(const Tensor&, const Tensor&, const Tensor&, IntArrayRef,
                           std::string_view, IntArrayRef, int64_t);
  static constexpr Fn kFns[] = {&conv1d, &conv2d, &conv3d};
  static constexpr StrFn kStrFns[] = {&conv1d, &conv2d, &conv3d};
  const auto i = static_cast<size_t>(spatial_dims - 1);
  if (!o.padding_str.empty())
    return kStrFns[i](x, weight, bias, o.stride, o.padding_str, o.dilation, o.groups);
  return kFns[i](x, weight, bias, o.stride, o.padding, o.dilation, o.groups);
}

ConvTransposeNd::ConvTransposeNd(int64_t dims, int64_t in, int64_t out, std::vector<int64_t> kernel,
                                 const ConvTransposeOptions& opt, const Init& init)
    : spatial_dims(dims), options(opt) {
  const char* m = "ConvTranspose";
  check_channels(m, in, out, opt.groups, dims);
  check_sizes(m, "kernel_size", kernel, dims, 1);
  check_sizes(m, "stride", opt.stride, dims, 1);
  check_sizes(m, "dilation", opt.dilation, dims, 1);
  check_sizes(m, "padding", opt.padding, dims, 0);
  check_sizes(m, "output_padding", opt.output_padding, dims, 0);
  init_weights(weight, bias, in, out / opt.groups, out, kernel, dims, opt.bias, init);
  register_parameter("weight", &weight);
  if (opt.bias) register_parameter("bias", &bias);
}

Tensor ConvTransposeNd::forward(const Tensor& x) {
  const ConvTransposeOptions& o = options;
  using Fn = Tensor (*)(const Tensor&, const Tensor&, const Tensor&, IntArrayRef, IntArrayRef,
                        IntArrayRef, int64_t, IntArrayRef);
  static constexpr Fn kFns[] = {&conv_transpose1d, &conv_transpose2d, &conv_transpose3d};
  return kFns[static_cast<size_t>(spatial_dims - 1)](x, weight, bias, o.stride, o.padding,
                                                     o.output_padding, o.groups, o.dilation);
}

}  // namespace kiln::nn

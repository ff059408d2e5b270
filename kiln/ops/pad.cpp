// pad and interpolate (torch.nn.functional's) and the public forms of the padding and upsampling
// ops (Note [Padding and upsampling] in kiln/ops/pad_meta.cpp).
#include "kiln/ops/pad.h"

#include <cmath>
#include <string>

#include "kiln/ops/op_list.h"
#include "kiln/ops/ops.h"

namespace kiln {

Tensor constant_pad_nd(const Tensor& input, IntArrayRef pad, const Scalar& value) {
  return ops::op_constant_pad_nd(input, pad, value);
}

#define KILN_PAD_PUBLIC(mode, nd)                                                   \
  Tensor mode##_pad##nd##d(const Tensor& input, IntArrayRef padding) {              \
    return ops::op_##mode##_pad##nd##d(input, padding);                             \
  }                                                                                 \
  Tensor mode##_pad##nd##d_backward(const Tensor& grad_output, const Tensor& input, \
                                    IntArrayRef padding) {                          \
    return ops::op_##mode##_pad##nd##d_backward(grad_output, input, padding);       \
  }
KILN_PAD_PUBLIC(reflection, 1)
KILN_PAD_PUBLIC(reflection, 2)
KILN_PAD_PUBLIC(reflection, 3)
KILN_PAD_PUBLIC(replication, 1)
KILN_PAD_PUBLIC(replication, 2)
KILN_PAD_PUBLIC(replication, 3)
#undef KILN_PAD_PUBLIC

namespace {

// Circular padding (ATen's _pad_circular): per padded dim, the cropped input with its last
// `left` and first `right` elements wrapped around to the other side (a cat of slices).
Tensor pad_circular(const Tensor& input, IntArrayRef pad) {
  const int64_t n = static_cast<int64_t>(pad.size()) / 2;
  KILN_CHECK(input.dim() == n + 1 || input.dim() == n + 2,
             "[pad] circular padding of {} dims expects a {}-D or {}-D input, got shape {}", n,
             n + 1, n + 2, input.sizes());
  Tensor x = input;
  for (int64_t k = 0; k < n; ++k) {
    const int64_t d = input.dim() - 1 - k;
    const int64_t l = pad[static_cast<size_t>(2 * k)], r = pad[static_cast<size_t>(2 * k + 1)];
    if (l < 0) x = slice(x, d, -l, x.size(d));
    if (r < 0) x = slice(x, d, 0, x.size(d) + r);
    const int64_t size = x.size(d);
    KILN_CHECK(size > 0, "[pad] negative padding {} empties dim {} of input {}", pad, d,
               input.sizes());
    KILN_CHECK(l <= size && r <= size,
               "[pad] padding {} wraps around more than once at dim {} of input {}", pad, d,
               input.sizes());
    std::vector<Tensor> parts;
    if (l > 0) parts.push_back(slice(x, d, size - l, size));
    parts.push_back(x);
    if (r > 0) parts.push_back(slice(x, d, 0, r));
    if (parts.size() > 1) x = cat(parts, d);
  }
  return x;
}

}  // namespace

Tensor pad(const Tensor& input, IntArrayRef pad, std::string_view mode,
           std::optional<double> value) {
  KILN_CHECK(input.defined(), "[pad] input is undefined");
  KILN_CHECK(pad.size() % 2 == 0, "[pad] padding length must be divisible by 2, got {}", pad);
  KILN_CHECK(static_cast<int64_t>(pad.size()) / 2 <= input.dim(),
             "[pad] padding length should be at most twice the input's dims, got padding {} "
             "for an input of {} dims",
             pad, input.dim());
  if (mode == "constant") return ops::op_constant_pad_nd(input, pad, value.value_or(0.0));
  KILN_CHECK(!value, "[pad] padding mode \"{}\" doesn't take a value argument", mode);
  const int64_t n = static_cast<int64_t>(pad.size()) / 2, dim = input.dim();
  if (mode == "circular") return pad_circular(input, pad);
  const bool reflect = mode == "reflect";
  KILN_CHECK(reflect || mode == "replicate",
             "[pad] unknown padding mode \"{}\" (constant, reflect, replicate or circular)", mode);
  KILN_CHECK(n >= 1 && n <= 3 && (dim == n + 1 || dim == n + 2),
             "[pad] {} padding of {} dims takes a {}-D or {}-D input, got shape {} (only 2D, 3D, "
             "4D and 5D inputs)",
             mode, n, n + 1, n + 2, input.sizes());
  if (n == 1) return reflect ? reflection_pad1d(input, pad) : replication_pad1d(input, pad);
  if (n == 2) return reflect ? reflection_pad2d(input, pad) : replication_pad2d(input, pad);
  return reflect ? reflection_pad3d(input, pad) : replication_pad3d(input, pad);
}

Tensor upsample_nearest2d(const Tensor& input, IntArrayRef output_size,
                          std::optional<double> scales_h, std::optional<double> scales_w) {
  return ops::op_upsample_nearest2d(input, output_size, scales_h, scales_w);
}
Tensor upsample_bilinear2d(const Tensor& input, IntArrayRef output_size, bool align_corners,
                           std::optional<double> scales_h, std::optional<double> scales_w) {
  return ops::op_upsample_bilinear2d(input, output_size, align_corners, scales_h, scales_w);
}
Tensor upsample_nearest2d_backward(const Tensor& grad_output, IntArrayRef output_size,
                                   IntArrayRef input_size, std::optional<double> scales_h,
                                   std::optional<double> scales_w) {
  return ops::op_upsample_nearest2d_backward(grad_output, output_size, input_size, scales_h,
                                             scales_w);
}
Tensor upsample_bilinear2d_backward(const Tensor& grad_output, IntArrayRef output_size,
                                    IntArrayRef input_size, bool align_corners,
                                    std::optional<double> scales_h,
                                    std::optional<double> scales_w) {
  return ops::op_upsample_bilinear2d_backward(grad_output, output_size, input_size, align_corners,
                                              scales_h, scales_w);
}

namespace {

// The .vec overloads' output size and scales (ATen's upsample::compute_output_size): from
// output_size, or floor(size * factor) with the factors as scales.
struct VecSizes {
  Shape out;
  std::optional<double> sh, sw;
};
VecSizes vec_sizes(const char* op, const Tensor& input,
                   const std::optional<std::vector<int64_t>>& output_size,
                   const std::optional<std::vector<double>>& scale_factors) {
  KILN_CHECK(input.defined() && input.dim() == 4, "[{}] expected a 4-D input [N, C, H, W], got {}",
             op, input.defined() ? input.sizes() : IntArrayRef());
  KILN_CHECK(output_size.has_value() != scale_factors.has_value(),
             "[{}] must specify exactly one of output_size and scale_factors", op);
  if (output_size) {
    KILN_CHECK(output_size->size() == 2, "[{}] output_size must have 2 elements, got {}", op,
               IntArrayRef(*output_size));
    return {Shape(*output_size), std::nullopt, std::nullopt};
  }
  KILN_CHECK(scale_factors->size() == 2, "[{}] scale_factors must have 2 elements, got {}", op,
             scale_factors->size());
  VecSizes v;
  for (size_t i = 0; i < 2; ++i)
    v.out.push_back(static_cast<int64_t>(std::floor(
        static_cast<double>(input.size(2 + static_cast<int64_t>(i))) * (*scale_factors)[i])));
  v.sh = (*scale_factors)[0];
  v.sw = (*scale_factors)[1];
  return v;
}

}  // namespace

Tensor upsample_nearest2d_vec(const Tensor& input, std::optional<std::vector<int64_t>> output_size,
                              std::optional<std::vector<double>> scale_factors) {
  VecSizes v = vec_sizes("upsample_nearest2d", input, output_size, scale_factors);
  return ops::op_upsample_nearest2d(input, v.out, v.sh, v.sw);
}
Tensor upsample_bilinear2d_vec(const Tensor& input, std::optional<std::vector<int64_t>> output_size,
                               bool align_corners,
                               std::optional<std::vector<double>> scale_factors) {
  VecSizes v = vec_sizes("upsample_bilinear2d", input, output_size, scale_factors);
  return ops::op_upsample_bilinear2d(input, v.out, align_corners, v.sh, v.sw);
}

Tensor interpolate(const Tensor& input, std::optional<std::vector<int64_t>> size,
                   std::optional<std::vector<double>> scale_factor, std::string_view mode,
                   std::optional<bool> align_corners) {
  const char* op = "interpolate";
  KILN_CHECK(input.defined() && (input.dim() == 3 || input.dim() == 4),
             "[{}] expected a 3-D [N, C, L] or 4-D [N, C, H, W] input, got shape {}", op,
             input.defined() ? input.sizes() : IntArrayRef());
  const bool linear = mode == "linear" || mode == "bilinear";
  KILN_CHECK(mode == "nearest" || linear,
             "[{}] mode \"{}\" is not supported (nearest, linear or bilinear)", op, mode);
  KILN_CHECK(linear || !align_corners,
             "[{}] align_corners option can only be set with the interpolating modes: linear | "
             "bilinear, got mode \"{}\"",
             op, mode);
  const int64_t nd = input.dim() - 2;
  KILN_CHECK(mode != "linear" || nd == 1, "[{}] got {}D input, but linear mode needs 3D input", op,
             input.dim());
  KILN_CHECK(mode != "bilinear" || nd == 2, "[{}] got {}D input, but bilinear mode needs 4D input",
             op, input.dim());
  KILN_CHECK(size.has_value() != scale_factor.has_value(), "[{}] {}", op,
             size ? "only one of size or scale_factor should be defined"
                  : "either size or scale_factor should be defined");
  std::optional<std::vector<int64_t>> out_size;
  std::optional<std::vector<double>> factors;
  if (size) {
    KILN_CHECK(size->size() == 1 || static_cast<int64_t>(size->size()) == nd,
               "[{}] input and output must have the same number of spatial dimensions, but got "
               "input with spatial dimensions of {} and output size of {}",
               op, nd, IntArrayRef(*size));
    out_size =
        size->size() == 1 ? std::vector<int64_t>(static_cast<size_t>(nd), (*size)[0]) : *size;
  } else {
    KILN_CHECK(scale_factor->size() == 1 || static_cast<int64_t>(scale_factor->size()) == nd,
               "[{}] input and scale_factor must have the same number of spatial dimensions, "
               "but got input with spatial dimensions of {} and scale_factor of {} elements",
               op, nd, scale_factor->size());
    factors = scale_factor->size() == 1
                  ? std::vector<double>(static_cast<size_t>(nd), (*scale_factor)[0])
                  : *scale_factor;
    for (double f : *factors)
      KILN_CHECK(f > 0 && std::isfinite(f), "[{}] scale_factor must be positive, got {}", op, f);
  }
  const bool ac = align_corners.value_or(false);
  if (nd == 2)
    return linear ? upsample_bilinear2d_vec(input, out_size, ac, factors)
                  : upsample_nearest2d_vec(input, out_size, factors);
  // 1-D: the 2-D op on [N, C, 1, L] (a height of 1 is copied as is).
  Tensor x = unsqueeze(input, 2);
  std::optional<std::vector<int64_t>> os2;
  std::optional<std::vector<double>> f2;
  if (out_size) os2 = std::vector<int64_t>{1, (*out_size)[0]};
  if (factors) f2 = std::vector<double>{1.0, (*factors)[0]};
  Tensor y = linear ? upsample_bilinear2d_vec(x, os2, ac, f2) : upsample_nearest2d_vec(x, os2, f2);
  return squeeze(y, 2);
}

}  // namespace kiln

// The padding and upsampling ops: meta functions, meta kernels and the driver the CPU and CUDA
// kernels share.
#include "kiln/ops/pad_meta.h"

#include <algorithm>

#include "kiln/ops/structured.h"

namespace kiln {

// Note [Padding and upsampling]
// ATen's core padding and upsampling ops, with ATen's checks and index arithmetic
// (kiln/ops/pad_math.h holds what the CPU and CUDA kernels share):
//   constant_pad_nd   pad = (left, right) pairs from the last dim backwards, at most one per dim;
//                     a negative pad crops. A composite as in ATen: a tensor full of `value` and
//                     the input copied into its inner box (any dtype, any backend). Its
//                     gradient is constant_pad_nd of grad_output with the pads negated.
//   reflection_pad    [N, C, *spatial] or [C, *spatial], 1-3 spatial dims, (left, right) per
//                     dim from the last. Output j of a dim reads t = j - left reflected into
//                     [0, I) (t < 0: -t; t > I - 1: 2 (I - 1) - t); pads must be < I, so one
//                     reflection suffices. Negative pads crop, as ATen.
//   replication_pad   the same with t clamped to [0, I).
//   upsample_nearest2d  [N, C, H, W] to output_size: output j reads min(floor(j * s), I - 1) in
//                     float, s = 1 / scale when a positive scale is given, else I / O (ATen's
//                     CPU nearest_idx, with its shortcuts j for O == I and j / 2 for O == 2 I).
//   upsample_bilinear2d  per dim ATen's area_pixel_compute_source_index: with align_corners the
//                     source is j (I - 1) / (O - 1), else (j + 0.5) s - 0.5 clamped at 0; the
//                     taps floor(src) and the next (clamped to I - 1), weights 1 - l and l; O == I
//                     copies. The value is the weighted sum of the 4 taps, in acc_t.
// The backward ops compute the input's gradient. CPU kernels take one plane per thread and add
// every output's gradient into its sources in output order (an acc_t buffer for the 16-bit
// floats). CUDA kernels take one thread per input element and gather from the outputs that read
// it, found from the same index functions (pad::readers, nearest_first, linear_first): no
// atomics, so the same bits every run.

namespace meta {
namespace {

const char* pad_name(detail::PadMode mode, int64_t nd, bool backward) {
  static const char* names[2][3][2] = {{{"reflection_pad1d", "reflection_pad1d_backward"},
                                        {"reflection_pad2d", "reflection_pad2d_backward"},
                                        {"reflection_pad3d", "reflection_pad3d_backward"}},
                                       {{"replication_pad1d", "replication_pad1d_backward"},
                                        {"replication_pad2d", "replication_pad2d_backward"},
                                        {"replication_pad3d", "replication_pad3d_backward"}}};
  return names[static_cast<int>(mode)][nd - 1][backward ? 1 : 0];
}

const char* upsample_name(bool bilinear, bool backward) {
  if (bilinear) return backward ? "upsample_bilinear2d_backward" : "upsample_bilinear2d";
  return backward ? "upsample_nearest2d_backward" : "upsample_nearest2d";
}

void check_grad_output(const char* op, const Tensor& grad, IntArrayRef sizes, DType dtype,
                       Device device) {
  check_defined(op, grad, "grad_output");
  KILN_CHECK(grad.sizes() == sizes,
             "[{}] grad_output must have the forward output's shape {}, got {}", op, sizes,
             grad.sizes());
  KILN_CHECK_TYPE(grad.dtype() == dtype, "[{}] grad_output must be {}, got {}", op, dtype,
                  grad.dtype());
  KILN_CHECK_DEVICE(grad.device() == device, "[{}] grad_output is on {}, expected {}", op,
                    grad.device(), device);
}

detail::PadGeom pad_geom(detail::PadMode mode, int64_t nd, const Tensor& self, IntArrayRef padding,
                         const char* op) {
  check_defined(op, self, "self");
  KILN_CHECK(static_cast<int64_t>(padding.size()) == 2 * nd,
             "[{}] padding must have {} elements, got {}", op, 2 * nd, padding);
  KILN_CHECK(self.dim() == nd + 1 || self.dim() == nd + 2,
             "[{}] expected a {}-D or {}-D (batch mode) input with possibly 0 batch size and "
             "other non-zero dims, got shape {}",
             op, nd + 1, nd + 2, self.sizes());
  for (int64_t i = self.dim() - nd - 1; i < self.dim(); ++i)
    KILN_CHECK(self.size(i) > 0,
               "[{}] expected a {}-D or {}-D (batch mode) input with possibly 0 batch size and "
               "other non-zero dims, got shape {}",
               op, nd + 1, nd + 2, self.sizes());
  KILN_CHECK_TYPE(is_floating(self.dtype()), "[{}] input must have a floating dtype, got {}", op,
                  self.dtype());
  detail::PadGeom g;
  g.mode = mode;
  g.nd = nd;
  g.in_sizes = Shape(self.sizes());
  g.planes = 1;
  Shape out;
  for (int64_t i = 0; i < self.dim() - nd; ++i) {
    g.planes *= self.size(i);
    out.push_back(self.size(i));
  }
  for (int64_t i = 0; i < nd; ++i) {
    // Spatial dim i (of nd, outermost first) takes the pads of dim nd - 1 - i from the last.
    const int64_t dim = self.dim() - nd + i;
    const size_t j = static_cast<size_t>(3 - nd + i);
    const int64_t l = padding[static_cast<size_t>(2 * (nd - 1 - i))];
    const int64_t r = padding[static_cast<size_t>(2 * (nd - 1 - i) + 1)];
    const int64_t in = self.size(dim);
    if (mode == detail::PadMode::Reflect)
      KILN_CHECK(l < in && r < in,
                 "[{}] padding size should be less than the corresponding input dimension, but "
                 "got: padding ({}, {}) at dimension {} of input {}",
                 op, l, r, dim, self.sizes());
    g.x[j] = in;
    g.y[j] = in + l + r;
    g.left[j] = l;
    out.push_back(g.y[j]);
  }
  for (int64_t i = 0; i < nd; ++i)
    KILN_CHECK(g.y[static_cast<size_t>(3 - nd + i)] >= 1,
               "[{}] input {} is too small for padding {}: the output would be {}", op,
               self.sizes(), padding, IntArrayRef(out));
  g.out_sizes = out;
  return g;
}

Shape two_sizes(const char* op, const char* what, IntArrayRef v, size_t n) {
  KILN_CHECK(v.size() == n, "[{}] {} must have {} elements, got {}", op, what, n, v);
  return Shape(v);
}

detail::UpsampleGeom upsample_geom(bool bilinear, const char* op, IntArrayRef input_size,
                                   IntArrayRef output_size, bool align_corners,
                                   const OptDouble& scales_h, const OptDouble& scales_w) {
  Shape o = two_sizes(op, "output_size", output_size, 2);
  detail::UpsampleGeom g;
  g.bilinear = bilinear;
  g.align_corners = align_corners;
  g.planes = input_size[0] * input_size[1];
  g.ih = input_size[2];
  g.iw = input_size[3];
  g.oh = o[0];
  g.ow = o[1];
  KILN_CHECK(g.ih > 0 && g.iw > 0 && g.oh > 0 && g.ow > 0,
             "[{}] input and output sizes should be greater than 0, but got input (H: {}, W: {}) "
             "output (H: {}, W: {})",
             op, g.ih, g.iw, g.oh, g.ow);
  g.scale_h = scales_h.value_or(0);
  g.scale_w = scales_w.value_or(0);
  g.in_sizes = Shape(input_size);
  g.out_sizes = {input_size[0], input_size[1], g.oh, g.ow};
  return g;
}

}  // namespace

TensorSpec constant_pad_nd(const Tensor& self, IntArrayRef pad, const Scalar&) {
  const char* op = "constant_pad_nd";
  check_defined(op, self, "self");
  KILN_CHECK(pad.size() % 2 == 0, "[{}] length of pad must be even, got {} ({})", op, pad.size(),
             pad);
  KILN_CHECK(static_cast<int64_t>(pad.size()) <= 2 * self.dim(),
             "[{}] length of pad should be no more than twice the number of dims of the input: "
             "pad {} for an input of {} dims",
             op, pad, self.dim());
  Shape out(self.sizes());
  for (size_t k = 0; k < pad.size() / 2; ++k) {
    const int64_t dim = self.dim() - 1 - static_cast<int64_t>(k);
    const int64_t n = self.size(dim) + pad[2 * k] + pad[2 * k + 1];
    KILN_CHECK(n >= 0,
               "[{}] the input size {}, plus negative padding {} and {}, gives a negative output "
               "size at dim {} of input {}",
               op, self.size(dim), pad[2 * k], pad[2 * k + 1], dim, self.sizes());
    out[static_cast<size_t>(dim)] = n;
  }
  return {out, self.dtype(), self.device()};
}

detail::PadGeom pad(detail::PadMode mode, int64_t nd, const Tensor& self, IntArrayRef padding) {
  return pad_geom(mode, nd, self, padding, pad_name(mode, nd, false));
}

detail::PadGeom pad_backward(detail::PadMode mode, int64_t nd, const Tensor& grad_output,
                             const Tensor& self, IntArrayRef padding) {
  const char* op = pad_name(mode, nd, true);
  detail::PadGeom g = pad_geom(mode, nd, self, padding, op);
  check_grad_output(op, grad_output, g.out_sizes, self.dtype(), self.device());
  return g;
}

detail::UpsampleGeom upsample(bool bilinear, const Tensor& self, IntArrayRef output_size,
                              bool align_corners, const OptDouble& scales_h,
                              const OptDouble& scales_w) {
  const char* op = upsample_name(bilinear, false);
  check_defined(op, self, "self");
  KILN_CHECK(self.dim() == 4, "[{}] expected a 4-D input [N, C, H, W], got shape {}", op,
             self.sizes());
  KILN_CHECK(self.numel() != 0 || self.size(1) * self.size(2) * self.size(3) != 0,
             "[{}] non-empty 4-D data tensor expected but got a tensor with sizes {}", op,
             self.sizes());
  KILN_CHECK_TYPE(is_floating(self.dtype()), "[{}] input must have a floating dtype, got {}", op,
                  self.dtype());
  return upsample_geom(bilinear, op, self.sizes(), output_size, align_corners, scales_h, scales_w);
}

detail::UpsampleGeom upsample_backward(bool bilinear, const Tensor& grad_output,
                                       IntArrayRef output_size, IntArrayRef input_size,
                                       bool align_corners, const OptDouble& scales_h,
                                       const OptDouble& scales_w) {
  const char* op = upsample_name(bilinear, true);
  check_defined(op, grad_output, "grad_output");
  Shape in = two_sizes(op, "input_size", input_size, 4);
  KILN_CHECK(in[0] >= 0 && in[1] >= 0, "[{}] input_size must not be negative, got {}", op,
             input_size);
  KILN_CHECK_TYPE(is_floating(grad_output.dtype()),
                  "[{}] grad_output must have a floating dtype, got {}", op, grad_output.dtype());
  detail::UpsampleGeom g =
      upsample_geom(bilinear, op, in, output_size, align_corners, scales_h, scales_w);
  check_grad_output(op, grad_output, g.out_sizes, grad_output.dtype(), grad_output.device());
  return g;
}

}  // namespace meta

namespace detail {
namespace {

Tensor zeros_for(IntArrayRef sizes, const Tensor& like) {
  return ops::op_full(sizes, 0, like.dtype(), like.device());
}

}  // namespace

Tensor constant_pad_nd_impl(const Tensor& self, IntArrayRef pad, const Scalar& value) {
  TensorSpec s = meta::constant_pad_nd(self, pad, value);
  Tensor out = ops::op_full(s.sizes, value, self.dtype(), self.device());
  Tensor src = self, dst = out;
  for (size_t k = 0; k < pad.size() / 2; ++k) {
    const int64_t dim = self.dim() - 1 - static_cast<int64_t>(k);
    const int64_t l = pad[2 * k], r = pad[2 * k + 1];
    const int64_t from = std::max<int64_t>(0, -l);
    const int64_t len = self.size(dim) - from - std::max<int64_t>(0, -r);
    if (len <= 0) return out;  // cropped away: nothing of self is left
    src = ops::op_slice(src, dim, from, from + len, 1);
    const int64_t at = std::max<int64_t>(0, l);
    dst = ops::op_slice(dst, dim, at, at + len, 1);
  }
  if (src.numel() > 0) ops::op_copy_(dst, src);
  return out;
}

Tensor run_pad(const PadKernels& k, PadMode mode, int64_t nd, const Tensor& self,
               IntArrayRef padding) {
  PadGeom g = meta::pad(mode, nd, self, padding);
  if (g.planes == 0) return ops::op_empty(g.out_sizes, self.dtype(), self.device());
  return k.pad(self, g);
}

Tensor run_pad_backward(const PadKernels& k, PadMode mode, int64_t nd, const Tensor& grad_output,
                        const Tensor& self, IntArrayRef padding) {
  PadGeom g = meta::pad_backward(mode, nd, grad_output, self, padding);
  if (g.planes == 0) return zeros_for(g.in_sizes, self);
  return k.pad_backward(grad_output, g);
}

Tensor run_upsample(const PadKernels& k, bool bilinear, const Tensor& self, IntArrayRef output_size,
                    bool align_corners, const OptDouble& scales_h, const OptDouble& scales_w) {
  UpsampleGeom g = meta::upsample(bilinear, self, output_size, align_corners, scales_h, scales_w);
  if (g.planes == 0) return ops::op_empty(g.out_sizes, self.dtype(), self.device());
  return k.upsample(self, g);
}

Tensor run_upsample_backward(const PadKernels& k, bool bilinear, const Tensor& grad_output,
                             IntArrayRef output_size, IntArrayRef input_size, bool align_corners,
                             const OptDouble& scales_h, const OptDouble& scales_w) {
  UpsampleGeom g = meta::upsample_backward(bilinear, grad_output, output_size, input_size,
                                           align_corners, scales_h, scales_w);
  if (g.planes == 0) return zeros_for(g.in_sizes, grad_output);
  return k.upsample_backward(grad_output, g);
}

}  // namespace detail

namespace {

Device meta_dev() { return Device(kMeta); }

template <detail::PadMode mode, int64_t nd>
Tensor meta_pad(const Tensor& self, IntArrayRef p) {
  return detail::empty_tensor(meta::pad(mode, nd, self, p).out_sizes, self.dtype(), meta_dev());
}
template <detail::PadMode mode, int64_t nd>
Tensor meta_pad_backward(const Tensor& gy, const Tensor& self, IntArrayRef p) {
  meta::pad_backward(mode, nd, gy, self, p);
  return detail::empty_tensor(self.sizes(), self.dtype(), meta_dev());
}
Tensor meta_constant_pad(const Tensor& self, IntArrayRef pad, const Scalar& value) {
  TensorSpec s = meta::constant_pad_nd(self, pad, value);
  return detail::empty_tensor(s.sizes, s.dtype, meta_dev());
}
Tensor meta_nearest(const Tensor& self, IntArrayRef os, const OptDouble& sh, const OptDouble& sw) {
  return detail::empty_tensor(meta::upsample(false, self, os, false, sh, sw).out_sizes,
                              self.dtype(), meta_dev());
}
Tensor meta_nearest_backward(const Tensor& gy, IntArrayRef os, IntArrayRef is, const OptDouble& sh,
                             const OptDouble& sw) {
  return detail::empty_tensor(meta::upsample_backward(false, gy, os, is, false, sh, sw).in_sizes,
                              gy.dtype(), meta_dev());
}
Tensor meta_bilinear(const Tensor& self, IntArrayRef os, bool ac, const OptDouble& sh,
                     const OptDouble& sw) {
  return detail::empty_tensor(meta::upsample(true, self, os, ac, sh, sw).out_sizes, self.dtype(),
                              meta_dev());
}
Tensor meta_bilinear_backward(const Tensor& gy, IntArrayRef os, IntArrayRef is, bool ac,
                              const OptDouble& sh, const OptDouble& sw) {
  return detail::empty_tensor(meta::upsample_backward(true, gy, os, is, ac, sh, sw).in_sizes,
                              gy.dtype(), meta_dev());
}

template <class Sig>
void reg(TypedOp<Sig>& op, Sig* fn) {
  op.def.set_meta_raw(reinterpret_cast<void*>(fn));
  op.set_kernel(DispatchKey::Meta, fn);
}
constexpr auto kReflect = detail::PadMode::Reflect;
constexpr auto kReplicate = detail::PadMode::Replicate;
const bool registered = [] {
  reg(ops::op_constant_pad_nd, &meta_constant_pad);
  reg(ops::op_reflection_pad1d, &meta_pad<kReflect, 1>);
  reg(ops::op_reflection_pad2d, &meta_pad<kReflect, 2>);
  reg(ops::op_reflection_pad3d, &meta_pad<kReflect, 3>);
  reg(ops::op_replication_pad1d, &meta_pad<kReplicate, 1>);
  reg(ops::op_replication_pad2d, &meta_pad<kReplicate, 2>);
  reg(ops::op_replication_pad3d, &meta_pad<kReplicate, 3>);
  reg(ops::op_reflection_pad1d_backward, &meta_pad_backward<kReflect, 1>);
  reg(ops::op_reflection_pad2d_backward, &meta_pad_backward<kReflect, 2>);
  reg(ops::op_reflection_pad3d_backward, &meta_pad_backward<kReflect, 3>);
  reg(ops::op_replication_pad1d_backward, &meta_pad_backward<kReplicate, 1>);
  reg(ops::op_replication_pad2d_backward, &meta_pad_backward<kReplicate, 2>);
  reg(ops::op_replication_pad3d_backward, &meta_pad_backward<kReplicate, 3>);
  reg(ops::op_upsample_nearest2d, &meta_nearest);
  reg(ops::op_upsample_nearest2d_backward, &meta_nearest_backward);
  reg(ops::op_upsample_bilinear2d, &meta_bilinear);
  reg(ops::op_upsample_bilinear2d_backward, &meta_bilinear_backward);
  return true;
}();

}  // namespace
}  // namespace kiln

// The pooling ops: meta functions, meta kernels and the driver the CPU and CUDA kernels share.
#include "kiln/ops/pool_meta.h"

#include <algorithm>

#include "kiln/ops/structured.h"

namespace kiln {

// Note [Pooling]
// max_pool{2,3}d_with_indices, avg_pool{2,3}d and adaptive_avg_pool{2,3}d are ATen's core ops,
// with ATen's checks and semantics; the 1-D forms are composites over the 2-D ops
// (kiln/ops/pool.cpp). The input is [N, C, *spatial] or unbatched [C, *spatial]; every (n, c)
// plane is pooled on its own, so the backends see `planes` planes of a 1-3-D spatial shape
// (PoolGeom, right-aligned in 3 slots) and one kernel serves 2-D and 3-D. Per spatial dim, for
// input size I, kernel k, stride s (an empty stride is k), padding p and dilation d:
//   output size  O = floor((I + 2p - d (k - 1) - 1 + (ceil_mode ? s - 1 : 0)) / s) + 1, less one
//                when ceil_mode puts the last window's start at or past I + p;
//   max          window o reads o s - p + j d for j < k, inside [0, I); the largest element,
//                the first of equals, and a NaN (the last one) over any number; its index is
//                flat within the plane (h W + w; 3-D: (t H + h) W + w);
//   avg          window o covers [o s - p, min(o s - p + k, I + p)) (the padded extent, its
//                size counted when count_include_pad) clipped to [0, I); the sum over the
//                clipped window is divided by divisor_override, or by the padded or clipped
//                size (the product over the dims);
//   adaptive     window o covers [floor(o I / O), ceil((o + 1) I / O)); the mean.
// p <= k / 2 (checked, as ATen) keeps every window inside the input. The backward ops compute
// the input's gradient: max adds grad_output at the saved indices; avg and adaptive give each
// input element the sum of grad_output / divisor over the windows that cover it (a gather: no
// two threads write one element, so the result does not depend on their order).

namespace meta {
namespace {

const char* fwd_name(detail::PoolKind kind, int64_t nd) {
  static const char* names[3][2] = {{"max_pool2d_with_indices", "max_pool3d_with_indices"},
                                    {"avg_pool2d", "avg_pool3d"},
                                    {"adaptive_avg_pool2d", "adaptive_avg_pool3d"}};
  return names[static_cast<int>(kind)][nd - 2];
}

// A size list of 1 or nd elements (or empty, where `allow_empty`), expanded to nd.
Shape expand(const char* op, const char* what, IntArrayRef v, int64_t nd, bool allow_empty,
             IntArrayRef if_empty = {}) {
  if (allow_empty && v.empty()) return Shape(if_empty);
  KILN_CHECK(v.size() == 1 || static_cast<int64_t>(v.size()) == nd,
             "[{}] {} must have 1 or {} elements{}, got {}", op, what, nd,
             allow_empty ? " (or none: the kernel size)" : "", v);
  Shape out;
  for (int64_t i = 0; i < nd; ++i) out.push_back(v.size() == 1 ? v[0] : v[static_cast<size_t>(i)]);
  return out;
}

// The input: 1 + nd or 2 + nd dims, non-empty planes (a batch of 0 is fine), a floating dtype.
void check_input(const char* op, int64_t nd, const Tensor& self) {
  check_defined(op, self, "self");
  KILN_CHECK(self.dim() == nd + 1 || self.dim() == nd + 2,
             "[{}] input must be {}-D ([C, {} spatial dims]) or {}-D (with a batch dim), got "
             "shape {}",
             op, nd + 1, nd, nd + 2, self.sizes());
  for (int64_t i = self.dim() - nd - 1; i < self.dim(); ++i)
    KILN_CHECK(self.size(i) > 0,
               "[{}] input must have non-empty channel and spatial dims, got shape {}", op,
               self.sizes());
  KILN_CHECK_TYPE(is_floating(self.dtype()), "[{}] input must have a floating dtype, got {}", op,
                  self.dtype());
}

// ATen's pooling_output_shape.
int64_t pooled_size(int64_t in, int64_t k, int64_t pad, int64_t stride, int64_t dil, bool ceil) {
  int64_t num = in + 2 * pad - dil * (k - 1) - 1 + (ceil ? stride - 1 : 0);
  int64_t o = (num >= 0 ? num / stride : -((-num + stride - 1) / stride)) + 1;
  if (ceil && (o - 1) * stride >= in + pad) --o;
  return o;
}

// Fills the geometry's sizes from the input and the per-dim output sizes.
TensorSpec finish(const Tensor& self, int64_t nd, const Shape& out_spatial, detail::PoolGeom& g) {
  g.nd = nd;
  g.in_sizes = Shape(self.sizes());
  g.planes = 1;
  for (int64_t i = 0; i < self.dim() - nd; ++i) g.planes *= self.size(i);
  Shape out;
  for (int64_t i = 0; i < self.dim() - nd; ++i) out.push_back(self.size(i));
  for (int64_t i = 0; i < nd; ++i) {
    size_t j = static_cast<size_t>(3 - nd + i);
    g.x[j] = self.size(self.dim() - nd + i);
    g.y[j] = out_spatial[static_cast<size_t>(i)];
    out.push_back(g.y[j]);
  }
  g.out_sizes = out;
  return {out, self.dtype(), self.device()};
}

// Kernel, stride, padding and dilation of a window pooling (max and avg), checked as ATen's
// pool2d_shape_check / pool3d_shape_check.
TensorSpec window_pool(detail::PoolKind kind, int64_t nd, const Tensor& self,
                       IntArrayRef kernel_size, IntArrayRef stride, IntArrayRef padding,
                       IntArrayRef dilation, bool ceil_mode, detail::PoolGeom& g) {
  const char* op = fwd_name(kind, nd);
  g.kind = kind;
  Shape k = expand(op, "kernel_size", kernel_size, nd, false);
  Shape s = expand(op, "stride", stride, nd, true, k);
  Shape p = expand(op, "padding", padding, nd, false);
  Shape d = expand(op, "dilation", dilation, nd, false);
  for (int64_t i = 0; i < nd; ++i) {
    KILN_CHECK(k[i] > 0, "[{}] kernel_size must be positive, got {}", op, kernel_size);
    KILN_CHECK(s[i] > 0, "[{}] stride must be positive, got {}", op, stride);
    KILN_CHECK(d[i] > 0, "[{}] dilation must be positive, got {}", op, dilation);
    KILN_CHECK(p[i] >= 0 && p[i] <= k[i] / 2,
               "[{}] padding must be non-negative and at most half the kernel size, got padding "
               "{} for kernel_size {}",
               op, padding, kernel_size);
  }
  check_input(op, nd, self);
  Shape out;
  for (int64_t i = 0; i < nd; ++i) {
    int64_t in = self.size(self.dim() - nd + i);
    int64_t o = pooled_size(in, k[i], p[i], s[i], d[i], ceil_mode);
    KILN_CHECK(o > 0,
               "[{}] the output would have size {} in spatial dim {}: input {}, kernel_size {}, "
               "stride {}, padding {}, dilation {}, ceil_mode {}",
               op, o, i, self.sizes(), kernel_size, stride, padding, dilation, ceil_mode);
    out.push_back(o);
    size_t j = static_cast<size_t>(3 - nd + i);
    g.k[j] = k[i];
    g.stride[j] = s[i];
    g.pad[j] = p[i];
    g.dil[j] = d[i];
  }
  return finish(self, nd, out, g);
}

void check_grad(const char* op, const Tensor& grad, const char* what, const TensorSpec& s,
                DType dtype) {
  check_defined(op, grad, what);
  KILN_CHECK(grad.sizes() == IntArrayRef(s.sizes),
             "[{}] {} must have the forward output's shape {}, got {}", op, what,
             IntArrayRef(s.sizes), grad.sizes());
  KILN_CHECK_TYPE(grad.dtype() == dtype, "[{}] {} must be {}, got {}", op, what, dtype,
                  grad.dtype());
  KILN_CHECK_DEVICE(grad.device() == s.device, "[{}] {} is on {}, self on {}", op, what,
                    grad.device(), s.device);
}

}  // namespace

TensorSpec max_pool(int64_t nd, const Tensor& self, IntArrayRef kernel_size, IntArrayRef stride,
                    IntArrayRef padding, IntArrayRef dilation, bool ceil_mode,
                    detail::PoolGeom* geom) {
  detail::PoolGeom g;
  TensorSpec s = window_pool(detail::PoolKind::Max, nd, self, kernel_size, stride, padding,
                             dilation, ceil_mode, g);
  if (geom) *geom = g;
  return s;
}

TensorSpec avg_pool(int64_t nd, const Tensor& self, IntArrayRef kernel_size, IntArrayRef stride,
                    IntArrayRef padding, bool ceil_mode, bool count_include_pad,
                    const std::optional<int64_t>& divisor_override, detail::PoolGeom* geom) {
  detail::PoolGeom g;
  KILN_CHECK(!divisor_override || *divisor_override != 0, "[{}] divisor_override must not be zero",
             fwd_name(detail::PoolKind::Avg, nd));
  TensorSpec s =
      window_pool(detail::PoolKind::Avg, nd, self, kernel_size, stride, padding, {1}, ceil_mode, g);
  g.count_include_pad = count_include_pad;
  g.divisor = divisor_override.value_or(0);
  if (geom) *geom = g;
  return s;
}

TensorSpec adaptive_avg_pool(int64_t nd, const Tensor& self, IntArrayRef output_size,
                             detail::PoolGeom* geom) {
  const char* op = fwd_name(detail::PoolKind::Adaptive, nd);
  KILN_CHECK(static_cast<int64_t>(output_size.size()) == nd,
             "[{}] output_size must have {} elements, got {}", op, nd, output_size);
  for (int64_t o : output_size)
    KILN_CHECK(o >= 0, "[{}] output_size must be non-negative, got {}", op, output_size);
  check_input(op, nd, self);
  detail::PoolGeom g;
  g.kind = detail::PoolKind::Adaptive;
  TensorSpec s = finish(self, nd, Shape(output_size), g);
  if (geom) *geom = g;
  return s;
}

detail::PoolGeom max_pool_backward(int64_t nd, const Tensor& grad_output, const Tensor& self,
                                   IntArrayRef kernel_size, IntArrayRef stride, IntArrayRef padding,
                                   IntArrayRef dilation, bool ceil_mode, const Tensor& indices) {
  const char* op =
      nd == 2 ? "max_pool2d_with_indices_backward" : "max_pool3d_with_indices_backward";
  check_defined(op, self, "self");
  detail::PoolGeom g;
  TensorSpec s = max_pool(nd, self, kernel_size, stride, padding, dilation, ceil_mode, &g);
  check_grad(op, grad_output, "grad_output", s, self.dtype());
  check_grad(op, indices, "indices", s, kInt64);
  return g;
}

detail::PoolGeom avg_pool_backward(int64_t nd, const Tensor& grad_output, const Tensor& self,
                                   IntArrayRef kernel_size, IntArrayRef stride, IntArrayRef padding,
                                   bool ceil_mode, bool count_include_pad,
                                   const std::optional<int64_t>& divisor_override) {
  const char* op = nd == 2 ? "avg_pool2d_backward" : "avg_pool3d_backward";
  check_defined(op, self, "self");
  detail::PoolGeom g;
  TensorSpec s = avg_pool(nd, self, kernel_size, stride, padding, ceil_mode, count_include_pad,
                          divisor_override, &g);
  check_grad(op, grad_output, "grad_output", s, self.dtype());
  return g;
}

detail::PoolGeom adaptive_avg_pool_backward(int64_t nd, const Tensor& grad_output,
                                            const Tensor& self) {
  const char* op = nd == 2 ? "adaptive_avg_pool2d_backward" : "adaptive_avg_pool3d_backward";
  check_input(op, nd, self);
  check_defined(op, grad_output, "grad_output");
  KILN_CHECK(grad_output.dim() == self.dim(),
             "[{}] grad_output must have self's {} dims, got shape {} for self {}", op, self.dim(),
             grad_output.sizes(), self.sizes());
  Shape out_spatial;
  for (int64_t i = std::max<int64_t>(0, grad_output.dim() - nd); i < grad_output.dim(); ++i)
    out_spatial.push_back(grad_output.size(i));
  detail::PoolGeom g;
  TensorSpec s = adaptive_avg_pool(nd, self, out_spatial, &g);
  check_grad(op, grad_output, "grad_output", s, self.dtype());
  return g;
}

}  // namespace meta

namespace detail {
namespace {

Tensor zeros_for(IntArrayRef sizes, const Tensor& like) {
  return ops::op_full(sizes, 0, like.dtype(), like.device());
}

}  // namespace

TensorPair run_max_pool(const PoolKernels& k, int64_t nd, const Tensor& self,
                        IntArrayRef kernel_size, IntArrayRef stride, IntArrayRef padding,
                        IntArrayRef dilation, bool ceil_mode) {
  PoolGeom g;
  meta::max_pool(nd, self, kernel_size, stride, padding, dilation, ceil_mode, &g);
  if (g.planes == 0)
    return {ops::op_empty(g.out_sizes, self.dtype(), self.device()),
            ops::op_empty(g.out_sizes, kInt64, self.device())};
  return k.forward(self, g);
}

Tensor run_max_pool_backward(const PoolKernels& k, int64_t nd, const Tensor& grad_output,
                             const Tensor& self, IntArrayRef kernel_size, IntArrayRef stride,
                             IntArrayRef padding, IntArrayRef dilation, bool ceil_mode,
                             const Tensor& indices) {
  PoolGeom g = meta::max_pool_backward(nd, grad_output, self, kernel_size, stride, padding,
                                       dilation, ceil_mode, indices);
  if (g.planes == 0) return zeros_for(g.in_sizes, self);
  return k.backward(grad_output, indices, g);
}

Tensor run_avg_pool(const PoolKernels& k, int64_t nd, const Tensor& self, IntArrayRef kernel_size,
                    IntArrayRef stride, IntArrayRef padding, bool ceil_mode, bool count_include_pad,
                    const std::optional<int64_t>& divisor_override) {
  PoolGeom g;
  meta::avg_pool(nd, self, kernel_size, stride, padding, ceil_mode, count_include_pad,
                 divisor_override, &g);
  if (g.planes == 0) return ops::op_empty(g.out_sizes, self.dtype(), self.device());
  return std::get<0>(k.forward(self, g));
}

Tensor run_avg_pool_backward(const PoolKernels& k, int64_t nd, const Tensor& grad_output,
                             const Tensor& self, IntArrayRef kernel_size, IntArrayRef stride,
                             IntArrayRef padding, bool ceil_mode, bool count_include_pad,
                             const std::optional<int64_t>& divisor_override) {
  PoolGeom g = meta::avg_pool_backward(nd, grad_output, self, kernel_size, stride, padding,
                                       ceil_mode, count_include_pad, divisor_override);
  if (g.planes == 0) return zeros_for(g.in_sizes, self);
  return k.backward(grad_output, Tensor(), g);
}

Tensor run_adaptive_avg_pool(const PoolKernels& k, int64_t nd, const Tensor& self,
                             IntArrayRef output_size) {
  PoolGeom g;
  meta::adaptive_avg_pool(nd, self, output_size, &g);
  if (g.planes == 0 || g.y_plane() == 0)
    return ops::op_empty(g.out_sizes, self.dtype(), self.device());
  return std::get<0>(k.forward(self, g));
}

Tensor run_adaptive_avg_pool_backward(const PoolKernels& k, int64_t nd, const Tensor& grad_output,
                                      const Tensor& self) {
  PoolGeom g = meta::adaptive_avg_pool_backward(nd, grad_output, self);
  if (g.planes == 0 || g.y_plane() == 0) return zeros_for(g.in_sizes, self);
  return k.backward(grad_output, Tensor(), g);
}

}  // namespace detail

namespace {

Device meta_dev() { return Device(kMeta); }
Tensor meta_like(const TensorSpec& s) { return detail::empty_tensor(s.sizes, s.dtype, meta_dev()); }

template <int64_t nd>
TensorPair meta_max_pool(const Tensor& self, IntArrayRef k, IntArrayRef s, IntArrayRef p,
                         IntArrayRef d, bool ceil) {
  TensorSpec spec = meta::max_pool(nd, self, k, s, p, d, ceil);
  return {meta_like(spec), detail::empty_tensor(spec.sizes, kInt64, meta_dev())};
}
template <int64_t nd>
Tensor meta_max_pool_backward(const Tensor& gy, const Tensor& self, IntArrayRef k, IntArrayRef s,
                              IntArrayRef p, IntArrayRef d, bool ceil, const Tensor& idx) {
  meta::max_pool_backward(nd, gy, self, k, s, p, d, ceil, idx);
  return detail::empty_tensor(self.sizes(), self.dtype(), meta_dev());
}
template <int64_t nd>
Tensor meta_avg_pool(const Tensor& self, IntArrayRef k, IntArrayRef s, IntArrayRef p, bool ceil,
                     bool cip, const std::optional<int64_t>& div) {
  return meta_like(meta::avg_pool(nd, self, k, s, p, ceil, cip, div));
}
template <int64_t nd>
Tensor meta_avg_pool_backward(const Tensor& gy, const Tensor& self, IntArrayRef k, IntArrayRef s,
                              IntArrayRef p, bool ceil, bool cip,
                              const std::optional<int64_t>& div) {
  meta::avg_pool_backward(nd, gy, self, k, s, p, ceil, cip, div);
  return detail::empty_tensor(self.sizes(), self.dtype(), meta_dev());
}
template <int64_t nd>
Tensor meta_adaptive(const Tensor& self, IntArrayRef output_size) {
  return meta_like(meta::adaptive_avg_pool(nd, self, output_size));
}
template <int64_t nd>
Tensor meta_adaptive_backward(const Tensor& gy, const Tensor& self) {
  meta::adaptive_avg_pool_backward(nd, gy, self);
  return detail::empty_tensor(self.sizes(), self.dtype(), meta_dev());
}

template <class Sig>
void reg(TypedOp<Sig>& op, Sig* fn) {
  op.def.set_meta_raw(reinterpret_cast<void*>(fn));
  op.set_kernel(DispatchKey::Meta, fn);
}
const bool registered = [] {
  reg(ops::op_max_pool2d_with_indices, &meta_max_pool<2>);
  reg(ops::op_max_pool3d_with_indices, &meta_max_pool<3>);
  reg(ops::op_max_pool2d_with_indices_backward, &meta_max_pool_backward<2>);
  reg(ops::op_max_pool3d_with_indices_backward, &meta_max_pool_backward<3>);
  reg(ops::op_avg_pool2d, &meta_avg_pool<2>);
  reg(ops::op_avg_pool3d, &meta_avg_pool<3>);
  reg(ops::op_avg_pool2d_backward, &meta_avg_pool_backward<2>);
  reg(ops::op_avg_pool3d_backward, &meta_avg_pool_backward<3>);
  reg(ops::op_adaptive_avg_pool2d, &meta_adaptive<2>);
  reg(ops::op_adaptive_avg_pool3d, &meta_adaptive<3>);
  reg(ops::op_adaptive_avg_pool2d_backward, &meta_adaptive_backward<2>);
  reg(ops::op_adaptive_avg_pool3d_backward, &meta_adaptive_backward<3>);
  return true;
}();

}  // namespace
}  // namespace kiln

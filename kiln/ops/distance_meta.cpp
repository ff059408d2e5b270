// cdist and pdist: meta functions, meta-device kernels and the geometry the backends share.
#include "kiln/ops/distance_meta.h"

#include <cmath>

#include "kiln/ops/structured.h"

namespace kiln {

// Note [cdist and pdist]
// cdist_forward(x1, x2, p) is ATen's _cdist_forward: out[b, i, j] = ||x1[b, i] - x2[b, j]||_p
// over the last dim, with p = 0 counting the nonzero differences, p = inf their largest absolute
// value, and sum(|d|^p)^(1/p) otherwise (p = 1 and 2 without pow). Kiln always computes the
// differences directly, whatever compute_mode says: ATen's compute_mode lets p = 2 use the
// matrix-product form sqrt(|x1|^2 + |x2|^2 - 2 x1 x2^T) (its default for more than 25 rows), which
// loses digits to cancellation where points are close; the direct sum is at least as accurate,
// so Kiln's results equal ATen's within the product form's rounding. compute_mode is validated.
// pdist_forward(self, p) is ATen's _pdist_forward: the distances of rows i < j of self [N, M] in
// row-major order, pair (i, j) at i N - i (i + 1) / 2 + j - i - 1.
// The backward ops are ATen's: cdist_backward gives x1's gradient (x2's is cdist_backward of the
// transposed grad with x1 and x2 swapped), pdist_backward self's. The gradient of a distance d
// with respect to one difference t is, times the incoming gradient,
//   p = 0   0                     p = 1   sign(t)
//   p = 2   t / d                 p = inf sign(t) where |t| = d, else 0
//   other   sign(t) |t|^(p-1) / d^(p-1)
// and 0 where d = 0 (for p < 1 also where t = 0), as ATen's. Every gradient element is a gather
// over the distances it enters (no atomics: the same bits every run). 16-bit inputs are
// computed in float32 and rounded once.

namespace meta {
namespace {

void check_p(const char* op, double p) {
  KILN_CHECK(p >= 0, "[{}] only supports non-negative p values, got {}", op, p);
}
void check_float(const char* op, const Tensor& t, const char* arg) {
  KILN_CHECK_TYPE(is_floating(t.dtype()), "[{}] only supports floating-point dtypes, {} got {}", op,
                  arg, t.dtype());
}
void check_like(const char* op, const Tensor& t, const char* arg, IntArrayRef sizes, DType dtype) {
  check_defined(op, t, arg);
  KILN_CHECK(t.sizes() == sizes, "[{}] {} must have sizes {}, got {}", op, arg, sizes, t.sizes());
  KILN_CHECK_TYPE(t.dtype() == dtype, "[{}] {} must be {}, got {}", op, arg, dtype, t.dtype());
}

}  // namespace

TensorSpec cdist_forward(const Tensor& x1, const Tensor& x2, double p, const OptInt& compute_mode) {
  const char* op = "cdist_forward";
  check_defined(op, x1, "x1");
  check_defined(op, x2, "x2");
  KILN_CHECK(x1.dim() >= 2, "[{}] x1 should have at least 2 dimensions, got {} (sizes {})", op,
             x1.dim(), x1.sizes());
  KILN_CHECK(x2.dim() >= 2, "[{}] x2 should have at least 2 dimensions, got {} (sizes {})", op,
             x2.dim(), x2.sizes());
  KILN_CHECK(x1.size(-1) == x2.size(-1),
             "[{}] x1 and x2 must have the same number of columns: x1 {} (sizes {}), x2 {} "
             "(sizes {})",
             op, x1.size(-1), x1.sizes(), x2.size(-1), x2.sizes());
  check_float(op, x1, "x1");
  KILN_CHECK_TYPE(x1.dtype() == x2.dtype(),
                  "[{}] x1 and x2 must have the same dtype, got {} and {}", op, x1.dtype(),
                  x2.dtype());
  Device d = common_device(op, {&x1, &x2});
  check_p(op, p);
  if (compute_mode)
    KILN_CHECK(*compute_mode >= 0 && *compute_mode <= 2,
               "[{}] possible modes: 0, 1, 2, but was: {}", op, *compute_mode);
  detail::CdistGeom g = detail::cdist_geom(x1, x2);
  Shape out = g.batch;
  out.push_back(g.P);
  out.push_back(g.R);
  return {out, x1.dtype(), d};
}

TensorSpec cdist_backward(const Tensor& grad, const Tensor& x1, const Tensor& x2, double p,
                          const Tensor& cdist) {
  const char* op = "cdist_backward";
  TensorSpec fwd = cdist_forward(x1, x2, p, std::nullopt);
  check_like(op, grad, "grad", fwd.sizes, fwd.dtype);
  check_like(op, cdist, "cdist", fwd.sizes, fwd.dtype);
  Device d = common_device(op, {&grad, &x1, &x2, &cdist});
  Shape out(fwd.sizes);
  out.back() = x1.size(-1);
  return {out, x1.dtype(), d};
}

TensorSpec pdist_forward(const Tensor& self, double p) {
  const char* op = "pdist_forward";
  check_defined(op, self, "self");
  KILN_CHECK(self.dim() == 2, "[{}] only supports 2-D tensors, got {}-D (sizes {})", op, self.dim(),
             self.sizes());
  check_float(op, self, "self");
  check_p(op, p);
  const int64_t n = self.size(0);
  return {Shape{n > 1 ? n * (n - 1) / 2 : 0}, self.dtype(), self.device()};
}

TensorSpec pdist_backward(const Tensor& grad, const Tensor& self, double p, const Tensor& pdist) {
  const char* op = "pdist_backward";
  TensorSpec fwd = pdist_forward(self, p);
  check_like(op, grad, "grad", fwd.sizes, fwd.dtype);
  check_like(op, pdist, "pdist", fwd.sizes, fwd.dtype);
  Device d = common_device(op, {&grad, &self, &pdist});
  return {Shape(self.sizes()), self.dtype(), d};
}

}  // namespace meta

namespace detail {

NormKind norm_kind(double p) {
  if (p == 0) return NormKind::Zero;
  if (p == 1) return NormKind::One;
  if (p == 2) return NormKind::Two;
  if (std::isinf(p)) return NormKind::Inf;
  return p < 2 ? NormKind::Below2 : NormKind::Above2;
}

CdistGeom cdist_geom(const Tensor& x1, const Tensor& x2) {
  CdistGeom g;
  g.batch = meta::broadcast_shapes("cdist_forward", x1.sizes().subspan(0, x1.dim() - 2),
                                   x2.sizes().subspan(0, x2.dim() - 2));
  for (int64_t s : g.batch) g.B *= s;
  g.P = x1.size(-2);
  g.R = x2.size(-2);
  g.M = x1.size(-1);
  return g;
}

Tensor expanded(const Tensor& t, const CdistGeom& g) {
  Shape full = g.batch;
  full.push_back(t.size(-2));
  full.push_back(t.size(-1));
  return ops::op_expand(t, full);
}

}  // namespace detail

namespace {
Tensor meta_dev_tensor(const TensorSpec& s) {
  return detail::empty_tensor(s.sizes, s.dtype, Device(kMeta));
}
Tensor meta_cdist_forward(const Tensor& x1, const Tensor& x2, double p, const OptInt& mode) {
  return meta_dev_tensor(meta::cdist_forward(x1, x2, p, mode));
}
Tensor meta_cdist_backward(const Tensor& grad, const Tensor& x1, const Tensor& x2, double p,
                           const Tensor& cdist) {
  return meta_dev_tensor(meta::cdist_backward(grad, x1, x2, p, cdist));
}
Tensor meta_pdist_forward(const Tensor& self, double p) {
  return meta_dev_tensor(meta::pdist_forward(self, p));
}
Tensor meta_pdist_backward(const Tensor& grad, const Tensor& self, double p, const Tensor& pdist) {
  return meta_dev_tensor(meta::pdist_backward(grad, self, p, pdist));
}

template <class Sig>
void reg(TypedOp<Sig>& op, Sig* fn) {
  op.def.set_meta_raw(reinterpret_cast<void*>(fn));
  op.set_kernel(DispatchKey::Meta, fn);
}
const bool registered = [] {
  reg(ops::op_cdist_forward, &meta_cdist_forward);
  reg(ops::op_cdist_backward, &meta_cdist_backward);
  reg(ops::op_pdist_forward, &meta_pdist_forward);
  reg(ops::op_pdist_backward, &meta_pdist_backward);
  return true;
}();
}  // namespace

}  // namespace kiln

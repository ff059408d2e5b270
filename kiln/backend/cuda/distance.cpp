// CUDA kernels of cdist and pdist and their backward ops: host glue (Note [cdist and pdist] in
// kiln/ops/distance_meta.cpp). Operands are made contiguous in the accumulating type (float for
// the 16-bit floats), as on the CPU, and the result cast once.
#include "kiln/backend/cuda/distance.h"
#include "kiln/backend/cuda/common.h"
#include "kiln/ops/distance_meta.h"

namespace kiln::cuda {
namespace {

DType acc_of(DType t) { return t == kFloat64 ? kFloat64 : kFloat32; }
const void* cdata(const Tensor& t) { return t.impl()->data(); }
Tensor finished(const Tensor& out, DType dtype) {
  return out.dtype() == dtype ? out : contiguous_as(out, dtype);
}
int kind_of(double p) { return static_cast<int>(detail::norm_kind(p)); }

Tensor cdist_forward_kernel(const Tensor& x1_, const Tensor& x2_, double p, const OptInt& mode) {
  TensorSpec s = meta::cdist_forward(x1_, x2_, p, mode);
  detail::CdistGeom g = detail::cdist_geom(x1_, x2_);
  const DType acc = acc_of(s.dtype);
  Tensor x1 = contiguous_as(detail::expanded(x1_, g), acc);
  Tensor x2 = contiguous_as(detail::expanded(x2_, g), acc);
  Tensor out = empty_cuda(s.sizes, acc, s.device);
  launch_cdist_forward(acc == kFloat64, cdata(x1), cdata(x2), out.impl()->data(), g.B, g.P, g.R,
                       g.M, kind_of(p), p, stream_for(out));
  check_launch("cdist_forward");
  return finished(out, s.dtype);
}

Tensor cdist_backward_kernel(const Tensor& grad_, const Tensor& x1_, const Tensor& x2_, double p,
                             const Tensor& cdist_) {
  TensorSpec s = meta::cdist_backward(grad_, x1_, x2_, p, cdist_);
  detail::CdistGeom g = detail::cdist_geom(x1_, x2_);
  const DType acc = acc_of(s.dtype);
  Tensor x1 = contiguous_as(detail::expanded(x1_, g), acc);
  Tensor x2 = contiguous_as(detail::expanded(x2_, g), acc);
  Tensor gr = contiguous_as(grad_, acc), d = contiguous_as(cdist_, acc);
  Tensor out = empty_cuda(s.sizes, acc, s.device);
  launch_cdist_backward(acc == kFloat64, cdata(gr), cdata(x1), cdata(x2), cdata(d),
                        out.impl()->data(), g.B, g.P, g.R, g.M, kind_of(p), p, stream_for(out));
  check_launch("cdist_backward");
  return finished(out, s.dtype);
}

Tensor pdist_forward_kernel(const Tensor& self, double p) {
  TensorSpec s = meta::pdist_forward(self, p);
  const DType acc = acc_of(s.dtype);
  Tensor x = contiguous_as(self, acc);
  Tensor out = empty_cuda(s.sizes, acc, s.device);
  launch_pdist_forward(acc == kFloat64, cdata(x), out.impl()->data(), self.size(0), self.size(1),
                       kind_of(p), p, stream_for(out));
  check_launch("pdist_forward");
  return finished(out, s.dtype);
}

Tensor pdist_backward_kernel(const Tensor& grad_, const Tensor& self, double p,
                             const Tensor& pdist_) {
  TensorSpec s = meta::pdist_backward(grad_, self, p, pdist_);
  const DType acc = acc_of(s.dtype);
  Tensor x = contiguous_as(self, acc), gr = contiguous_as(grad_, acc);
  Tensor d = contiguous_as(pdist_, acc);
  Tensor out = empty_cuda(s.sizes, acc, s.device);
  launch_pdist_backward(acc == kFloat64, cdata(gr), cdata(x), cdata(d), out.impl()->data(),
                        self.size(0), self.size(1), kind_of(p), p, stream_for(out));
  check_launch("pdist_backward");
  return finished(out, s.dtype);
}

}  // namespace

KILN_CUDA_KERNELS(backend_kernel(ops::op_cdist_forward, &cdist_forward_kernel),
                  backend_kernel(ops::op_cdist_backward, &cdist_backward_kernel),
                  backend_kernel(ops::op_pdist_forward, &pdist_forward_kernel),
                  backend_kernel(ops::op_pdist_backward, &pdist_backward_kernel));

}  // namespace kiln::cuda

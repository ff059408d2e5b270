// CUDA kernels of im2col and col2im: host glue (Note [im2col and col2im] in
// kiln/ops/fold_meta.cpp). The input is made contiguous in the accumulating type (float for the
// 16-bit floats), as on the CPU, and the result cast once.
#include "kiln/backend/cuda/fold.h"
#include "kiln/backend/cuda/common.h"
#include "kiln/ops/fold_meta.h"

namespace kiln::cuda {
namespace {

DType acc_of(DType t) { return t == kFloat64 ? kFloat64 : kFloat32; }
Tensor finished(const Tensor& out, DType dtype) {
  return out.dtype() == dtype ? out : contiguous_as(out, dtype);
}

Tensor im2col_kernel(const Tensor& self, IntArrayRef k, IntArrayRef d, IntArrayRef p,
                     IntArrayRef s) {
  TensorSpec spec = meta::im2col(self, k, d, p, s);
  const detail::FoldGeom g = detail::im2col_geom(self, k, d, p, s);
  const DType acc = acc_of(spec.dtype);
  Tensor in = contiguous_as(self, acc);
  Tensor out = empty_cuda(spec.sizes, acc, spec.device);
  launch_im2col(acc == kFloat64, in.impl()->data(), out.impl()->data(), g.N, g.d, stream_for(out));
  check_launch("im2col");
  return finished(out, spec.dtype);
}

Tensor col2im_kernel(const Tensor& self, IntArrayRef out_size, IntArrayRef k, IntArrayRef d,
                     IntArrayRef p, IntArrayRef s) {
  TensorSpec spec = meta::col2im(self, out_size, k, d, p, s);
  const detail::FoldGeom g = detail::col2im_geom(self, out_size, k, d, p, s);
  const DType acc = acc_of(spec.dtype);
  Tensor in = contiguous_as(self, acc);
  Tensor out = empty_cuda(spec.sizes, acc, spec.device);
  launch_col2im(acc == kFloat64, in.impl()->data(), out.impl()->data(), g.N, g.d, stream_for(out));
  check_launch("col2im");
  return finished(out, spec.dtype);
}

}  // namespace

KILN_CUDA_KERNELS(backend_kernel(ops::op_im2col, &im2col_kernel),
                  backend_kernel(ops::op_col2im, &col2im_kernel));

}  // namespace kiln::cuda

// CPU kernels of im2col and col2im (Note [im2col and col2im] in kiln/ops/fold_meta.cpp): the
// input contiguous in the accumulating type (float for the 16-bit floats), one OpenMP loop over
// the result's elements, the result cast once.
#include "kiln/backend/cpu/loops.h"
#include "kiln/ops/fold_meta.h"

namespace kiln::cpu {
namespace {

DType acc_of(DType t) { return t == kFloat64 ? kFloat64 : kFloat32; }
// Runs f(A{}) with A the accumulating type `acc`.
template <class F>
void with_acc(DType acc, F f) {
  if (acc == kFloat64)
    f(double{});
  else
    f(float{});
}

// self [N, C, H, W] -> [N, C kh kw, L].
Tensor im2col_kernel(const Tensor& self, IntArrayRef k, IntArrayRef d, IntArrayRef p,
                     IntArrayRef s) {
  TensorSpec spec = meta::im2col(self, k, d, p, s);
  const detail::FoldGeom g = detail::im2col_geom(self, k, d, p, s);
  const DType acc = acc_of(spec.dtype);
  Tensor in = contiguous_as(self, acc);
  Tensor out = empty_cpu(spec.sizes, acc);
  with_acc(acc, [&](auto zero) {
    using A = decltype(zero);
    const A* im = static_cast<const A*>(in.impl()->data());
    A* col = static_cast<A*>(out.impl()->data());
    const detail::FoldDims& f = g.d;
    const int64_t per = f.rows() * f.blocks(), total = g.N * per, image = f.C * f.H * f.W;
#pragma omp parallel for if (total > kGrainSize)
    for (int64_t e = 0; e < total; ++e) {
      const int64_t n = e / per, r = e % per;
      col[e] = detail::im2col_at(im + n * image, f, r / f.blocks(), r % f.blocks());
    }
  });
  return spec.dtype == acc ? out : contiguous_as(out, spec.dtype);
}

// self [N, C kh kw, L] -> [N, C, H, W].
Tensor col2im_kernel(const Tensor& self, IntArrayRef out_size, IntArrayRef k, IntArrayRef d,
                     IntArrayRef p, IntArrayRef s) {
  TensorSpec spec = meta::col2im(self, out_size, k, d, p, s);
  const detail::FoldGeom g = detail::col2im_geom(self, out_size, k, d, p, s);
  const DType acc = acc_of(spec.dtype);
  Tensor in = contiguous_as(self, acc);
  Tensor out = empty_cpu(spec.sizes, acc);
  with_acc(acc, [&](auto zero) {
    using A = decltype(zero);
    const A* col = static_cast<const A*>(in.impl()->data());
    A* im = static_cast<A*>(out.impl()->data());
    const detail::FoldDims& f = g.d;
    const int64_t per = f.C * f.H * f.W, total = g.N * per, cols = f.rows() * f.blocks();
#pragma omp parallel for if (total * f.kh * f.kw > kGrainSize)
    for (int64_t e = 0; e < total; ++e) {
      const int64_t n = e / per, r = e % per;
      im[e] = detail::col2im_at(col + n * cols, f, r / (f.H * f.W), (r / f.W) % f.H, r % f.W);
    }
  });
  return spec.dtype == acc ? out : contiguous_as(out, spec.dtype);
}

const bool registered = [] {
  constexpr auto K = DispatchKey::CPU;
  ops::op_im2col.set_kernel(K, &im2col_kernel);
  ops::op_col2im.set_kernel(K, &col2im_kernel);
  return true;
}();

}  // namespace
}  // namespace kiln::cpu

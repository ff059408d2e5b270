// CPU kernels of grid_sampler_2d and its backward op (Note [grid_sampler_2d] in
// kiln/ops/grid_sample_meta.cpp): operands contiguous in the accumulating type (float for the
// 16-bit floats), the results cast once. The forward is one OpenMP loop over the output; the
// backward one image per thread, so every input gradient sums in one order.
#include <cstring>

#include "kiln/backend/cpu/loops.h"
#include "kiln/ops/grid_sample_meta.h"

namespace kiln::cpu {
namespace {

namespace grid = detail::grid;

DType acc_of(DType t) { return t == kFloat64 ? kFloat64 : kFloat32; }
template <class F>
void with_acc(DType acc, F f) {
  if (acc == kFloat64)
    f(double{});
  else
    f(float{});
}
template <class A>
A* ptr(const Tensor& t) {
  return static_cast<A*>(t.impl()->data());
}
Tensor finished(const Tensor& t, DType dtype) {
  return t.dtype() == dtype ? t : contiguous_as(t, dtype);
}

// input [N, C, H, W], grid [N, OH, OW, 2] -> [N, C, OH, OW].
Tensor grid_sampler_2d_kernel(const Tensor& input_, const Tensor& grid_, int64_t interp,
                              int64_t pad, bool align) {
  TensorSpec s = meta::grid_sampler_2d(input_, grid_, interp, pad, align);
  const grid::Geom g = detail::grid_geom(input_, grid_, interp, pad, align);
  const DType acc = acc_of(s.dtype);
  Tensor input = contiguous_as(input_, acc), gr = contiguous_as(grid_, acc);
  Tensor out = empty_cpu(s.sizes, acc);
  with_acc(acc, [&](auto zero) {
    using A = decltype(zero);
    const A* in = ptr<A>(input);
    const A* gp = ptr<A>(gr);
    A* o = ptr<A>(out);
    const int64_t ohw = g.OH * g.OW, total = g.N * g.C * ohw;
#pragma omp parallel for if (total * (g.interp == grid::kBicubic ? 16 : 4) > kGrainSize)
    for (int64_t e = 0; e < total; ++e) {
      const int64_t nc = e / ohw, p = e % ohw, n = nc / g.C;
      const A* xy = gp + (n * ohw + p) * 2;
      o[e] = grid::sample(in + nc * g.H * g.W, g, xy[0], xy[1]);
    }
  });
  return finished(out, s.dtype);
}

std::tuple<Tensor, Tensor> grid_sampler_2d_backward_kernel(const Tensor& grad_output_,
                                                           const Tensor& input_,
                                                           const Tensor& grid_, int64_t interp,
                                                           int64_t pad, bool align,
                                                           IntArrayRef output_mask) {
  meta::grid_sampler_2d_backward(grad_output_, input_, grid_, interp, pad, align, output_mask);
  const grid::Geom g = detail::grid_geom(input_, grid_, interp, pad, align);
  const DType acc = acc_of(input_.dtype());
  Tensor input = contiguous_as(input_, acc), gr = contiguous_as(grid_, acc);
  Tensor go = contiguous_as(grad_output_, acc);
  Tensor gin, ggrid = empty_cpu(grid_.sizes(), acc);
  if (output_mask[0]) {
    gin = empty_cpu(input_.sizes(), acc);
    std::memset(gin.impl()->data(), 0, static_cast<size_t>(gin.numel()) * itemsize(acc));
  }
  with_acc(acc, [&](auto zero) {
    using A = decltype(zero);
    const A* in = ptr<A>(input);
    const A* gp = ptr<A>(gr);
    const A* gop = ptr<A>(go);
    A* gi = gin.defined() ? ptr<A>(gin) : nullptr;
    A* gg = ptr<A>(ggrid);
    const int64_t ohw = g.OH * g.OW, image = g.C * g.H * g.W;
    auto add = [](A* p, A v) { *p += v; };
#pragma omp parallel for if (g.N * g.C * ohw * 4 > kGrainSize)
    for (int64_t n = 0; n < g.N; ++n)
      for (int64_t p = 0; p < ohw; ++p) {
        const A* xy = gp + (n * ohw + p) * 2;
        A* gxy = gg + (n * ohw + p) * 2;
        grid::backward_at(gop + n * g.C * ohw + p, ohw, in + n * image, gi ? gi + n * image : gi, g,
                          xy[0], xy[1], gxy, gxy + 1, add);
      }
  });
  Tensor ri, rg;
  if (output_mask[0]) ri = finished(gin, input_.dtype());
  if (output_mask[1]) rg = finished(ggrid, grid_.dtype());
  return {ri, rg};
}

const bool registered = [] {
  constexpr auto K = DispatchKey::CPU;
  ops::op_grid_sampler_2d.set_kernel(K, &grid_sampler_2d_kernel);
  ops::op_grid_sampler_2d_backward.set_kernel(K, &grid_sampler_2d_backward_kernel);
  return true;
}();

}  // namespace
}  // namespace kiln::cpu

// CPU kernels of scatter (scatter.src), scatter_reduce, select_scatter and slice_scatter. scatter
// checks every index before writing; a repeated position keeps its last value.
#include "kiln/backend/cpu/loops.h"
#include "kiln/ops/index_meta.h"
#include "kiln/ops/scatter_operands.h"
#include "kiln/ops/scatter_reduce_math.h"
#include "kiln/ops/structured.h"

namespace kiln::cpu {
namespace {

void scatter_impl(const Tensor& out, const Tensor& self, int64_t dim, const Tensor& index,
                  const Tensor& src) {
  const meta::ScatterOperands o = meta::scatter_operands("scatter", self, dim, index, src);
  const int64_t d = o.d;
  std::vector<int64_t> idx = checked_indices("scatter", index, o.bound, "dimension");
  Tensor acc = empty_cpu(self.sizes(), self.dtype());
  copy_kernel(acc, self);
  Tensor cs = contiguous_as(o.src, self.dtype());
  IntArrayRef walk = o.index_sizes;
  Shape st = contiguous_strides(o.self_sizes);
  const int64_t nd = static_cast<int64_t>(walk.size());
  KILN_DISPATCH_TYPES(self.dtype(), "scatter", [&] {
    const scalar_t* ps = static_cast<const scalar_t*>(cs.impl()->data());
    scalar_t* pa = static_cast<scalar_t*>(acc.impl()->data());
    Shape coord(static_cast<size_t>(nd), 0);
    for (size_t p = 0; p < idx.size(); ++p) {
      int64_t off = 0;
      for (int64_t k = 0; k < nd; ++k) off += (k == d ? idx[p] : coord[k]) * st[k];
      pa[off] = ps[p];
      for (int64_t k = nd - 1; k >= 0; --k) {
        if (++coord[k] < walk[k]) break;
        coord[k] = 0;
      }
    }
  });
  copy_kernel(out, acc);
}

// See Note [scatter_reduce] in kiln/ops/scatter_meta.cpp: the index checked as scatter's, then
// one pass in index order in the computing type A, the result cast once.
template <class A>
void scatter_reduce_run(const Tensor& acc, const Tensor& cs, const std::vector<int64_t>& idx,
                        IntArrayRef walk, IntArrayRef st, int64_t d, int64_t reduce,
                        bool include_self) {
  namespace sr = detail::scatter_reduce;
  const A* ps = static_cast<const A*>(cs.impl()->data());
  A* pa = static_cast<A*>(acc.impl()->data());
  const int64_t nd = static_cast<int64_t>(walk.size());
  const size_t n = static_cast<size_t>(acc.numel());
  std::vector<int64_t> count(reduce == sr::kMean ? n : 0, 0);
  std::vector<char> touched(include_self ? 0 : n, 0);
  Shape coord(static_cast<size_t>(nd), 0);
  for (size_t p = 0; p < idx.size(); ++p) {
    int64_t off = 0;
    for (int64_t k = 0; k < nd; ++k) off += (k == d ? idx[p] : coord[k]) * st[k];
    if (!include_self && !touched[off]) {
      touched[off] = 1;
      pa[off] = sr::identity<A>(reduce);
    }
    pa[off] = sr::combine<A>(reduce, pa[off], ps[p]);
    if (reduce == sr::kMean) ++count[off];
    for (int64_t k = nd - 1; k >= 0; --k) {
      if (++coord[k] < walk[k]) break;
      coord[k] = 0;
    }
  }
  if (reduce == sr::kMean)
    for (size_t i = 0; i < n; ++i)
      pa[i] = sr::mean_of<A>(pa[i], count[i] + (include_self && count[i] ? 1 : 0));
}

void scatter_reduce_impl(const Tensor& out, const Tensor& self, int64_t dim, const Tensor& index,
                         const Tensor& src, int64_t reduce, bool include_self) {
  const meta::ScatterOperands o = meta::scatter_operands("scatter_reduce", self, dim, index, src);
  std::vector<int64_t> idx = checked_indices("scatter_reduce", index, o.bound, "dimension");
  const DType a = self.dtype() == kFloat64    ? kFloat64
                  : is_floating(self.dtype()) ? kFloat32
                                              : kInt64;
  Tensor acc = empty_cpu(self.sizes(), a);
  copy_kernel(acc, self);
  Tensor cs = contiguous_as(o.src, a);
  IntArrayRef walk = o.index_sizes;
  Shape st = contiguous_strides(o.self_sizes);
  const int64_t d = o.d;
  if (a == kFloat64)
    scatter_reduce_run<double>(acc, cs, idx, walk, st, d, reduce, include_self);
  else if (a == kFloat32)
    scatter_reduce_run<float>(acc, cs, idx, walk, st, d, reduce, include_self);
  else
    scatter_reduce_run<int64_t>(acc, cs, idx, walk, st, d, reduce, include_self);
  copy_kernel(out, acc);
}

void select_scatter_impl(const Tensor& out, const Tensor& self, const Tensor& src, int64_t dim,
                         int64_t index) {
  meta::select_scatter_by(&copy_kernel, out, self, src, dim, index);
}

void slice_scatter_impl(const Tensor& out, const Tensor& self, const Tensor& src, int64_t dim,
                        const OptInt& start, const OptInt& end, int64_t step) {
  meta::slice_scatter_by(&copy_kernel, out, self, src, dim, start, end, step);
}

constexpr auto K = DispatchKey::CPU;
KILN_REGISTER_STRUCTURED(scatter, K, &scatter_impl);
KILN_REGISTER_STRUCTURED(scatter_reduce, K, &scatter_reduce_impl);
KILN_REGISTER_STRUCTURED(select_scatter, K, &select_scatter_impl);
KILN_REGISTER_STRUCTURED(slice_scatter, K, &slice_scatter_impl);

}  // namespace
}  // namespace kiln::cpu

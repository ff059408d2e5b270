// CPU kernels of scatter (scatter.src), select_scatter and slice_scatter. scatter checks every
// index before writing; a repeated position keeps its last value.
#include "kiln/backend/cpu/loops.h"
#include "kiln/ops/index_meta.h"
#include "kiln/ops/structured.h"

namespace kiln::cpu {
namespace {

void scatter_impl(const Tensor& out, const Tensor& self, int64_t dim, const Tensor& index,
                  const Tensor& src) {
  const int64_t d = wrap_dim(dim, self.dim(), "scatter");
  const int64_t bound = self.dim() == 0 ? 1 : self.sizes()[d];
  std::vector<int64_t> idx = checked_indices("scatter", index, bound, "dimension");
  Tensor acc = empty_cpu(self.sizes(), self.dtype());
  copy_kernel(acc, self);
  // src is read at the index's coordinates: slice it down to the index's shape first.
  Tensor s = src;
  for (int64_t k = 0; k < index.dim() && k < src.dim(); ++k)
    s = ops::op_slice(s, k, 0, index.sizes()[k], 1);
  Tensor cs = contiguous_as(s, self.dtype());
  const std::vector<int64_t> one{1};
  IntArrayRef walk = index.dim() == 0 ? IntArrayRef(one) : index.sizes();
  Shape st = contiguous_strides(self.dim() == 0 ? IntArrayRef(one) : self.sizes());
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

void select_scatter_impl(const Tensor& out, const Tensor& self, const Tensor& src, int64_t dim,
                         int64_t index) {
  const int64_t d = wrap_dim(dim, self.dim(), "select_scatter");
  const int64_t size = self.sizes()[d];
  copy_kernel(out, self);
  copy_kernel(ops::op_select(out, d, index < 0 ? index + size : index), src);
}

void slice_scatter_impl(const Tensor& out, const Tensor& self, const Tensor& src, int64_t dim,
                        const OptInt& start, const OptInt& end, int64_t step) {
  const int64_t d = wrap_dim(dim, self.dim(), "slice_scatter");
  const auto [s, e] = meta::slice_bounds(self.sizes()[d], start, end);
  copy_kernel(out, self);
  copy_kernel(ops::op_slice(out, d, s, e, step), src);
}

constexpr auto K = DispatchKey::CPU;
KILN_REGISTER_STRUCTURED(scatter, K, &scatter_impl);
KILN_REGISTER_STRUCTURED(select_scatter, K, &select_scatter_impl);
KILN_REGISTER_STRUCTURED(slice_scatter, K, &slice_scatter_impl);

}  // namespace
}  // namespace kiln::cpu

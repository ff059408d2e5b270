// CPU kernels of index, index_put (see Note [Advanced indexing] in kiln/ops/index_meta.cpp) and
// nonzero. Every index value is checked before anything is written.
#include "kiln/backend/cpu/loops.h"
#include "kiln/ops/index_meta.h"
#include "kiln/ops/structured.h"

namespace kiln::cpu {
namespace {

// The index tensors of a plan as int64 values over its broadcast shape, negative ones wrapped,
// each checked against its dim of self (sizes `self_sizes`).
std::vector<std::vector<int64_t>> checked_plan_indices(const char* op, const meta::IndexPlan& p,
                                                       const TensorList& indices,
                                                       IntArrayRef self_sizes) {
  std::vector<std::vector<int64_t>> idx(p.adv_dims.size());
  for (size_t k = 0; k < idx.size(); ++k) {
    const int64_t d = p.adv_dims[k], size = self_sizes[d];
    idx[k] = meta::broadcast_index(p, indices, k, Device(kCPU)).to_vector<int64_t>();
    for (int64_t& v : idx[k]) {
      meta::check_index_value(op, v, d, size);
      if (v < 0) v += size;
    }
  }
  return idx;
}

// Calls f(p, off) for every position p of the plan's indexed shape (row-major), with off the
// element offset, under `strides` (self's or an equally shaped destination's), that p reads.
template <class F>
void walk(const meta::IndexPlan& p, IntArrayRef strides,
          const std::vector<std::vector<int64_t>>& idx, F f) {
  const int64_t nr = static_cast<int64_t>(p.result.size());
  const int64_t n = checked_numel(p.result, "index");
  const int64_t nb = static_cast<int64_t>(p.bshape.size());
  Shape bstride(static_cast<size_t>(nb), 1);
  for (int64_t i = nb - 2; i >= 0; --i) bstride[i] = bstride[i + 1] * p.bshape[i + 1];
  Shape coord(static_cast<size_t>(nr), 0);
  for (int64_t q = 0; q < n; ++q) {
    int64_t off = 0, b = 0;
    for (int64_t r = 0; r < nr; ++r) {
      if (p.self_dim[r] >= 0)
        off += coord[r] * strides[p.self_dim[r]];
      else
        b += coord[r] * bstride[r - p.bpos];
    }
    for (size_t k = 0; k < idx.size(); ++k) off += idx[k][b] * strides[p.adv_dims[k]];
    f(q, off);
    for (int64_t r = nr - 1; r >= 0; --r) {
      if (++coord[r] < p.result[r]) break;
      coord[r] = 0;
    }
  }
}

void index_impl(const Tensor& out, const Tensor& self, const TensorList& indices) {
  meta::IndexPlan p = meta::plan_index("index", self, indices);
  auto idx = checked_plan_indices("index", p, indices, self.sizes());
  with_contiguous_result(out, self.dtype(), [&](const Tensor& y) {
    KILN_DISPATCH_TYPES(self.dtype(), "index", [&] {
      const scalar_t* ps = static_cast<const scalar_t*>(self.impl()->data());
      scalar_t* py = static_cast<scalar_t*>(y.impl()->data());
      walk(p, self.strides(), idx, [&](int64_t q, int64_t off) { py[q] = ps[off]; });
    });
  });
}

void index_put_impl(const Tensor& out, const Tensor& self, const TensorList& indices,
                    const Tensor& values, bool accumulate) {
  meta::IndexPlan p = meta::plan_index("index_put", self, indices);
  auto idx = checked_plan_indices("index_put", p, indices, self.sizes());
  // values broadcast to the indexed shape (a 0-d cpu values tensor may come with any self).
  Tensor v = contiguous_as(ops::op_expand(values, p.result), self.dtype());
  copy_kernel(out, self);
  KILN_DISPATCH_TYPES(self.dtype(), "index_put", [&] {
    using V = acc_t<scalar_t>;
    const scalar_t* pv = static_cast<const scalar_t*>(v.impl()->data());
    scalar_t* po = static_cast<scalar_t*>(out.impl()->data());
    if (accumulate)
      walk(p, out.strides(), idx, [&](int64_t q, int64_t off) {
        po[off] = static_cast<scalar_t>(static_cast<V>(po[off]) + static_cast<V>(pv[q]));
      });
    else
      walk(p, out.strides(), idx, [&](int64_t q, int64_t off) { po[off] = pv[q]; });
  });
}

Tensor nonzero_kernel(const Tensor& self) {
  meta::check_defined("nonzero", self, "self");
  Tensor x = contiguous_as(self, self.dtype());
  const int64_t nd = self.dim(), n = self.numel();
  std::vector<int64_t> hits;
  KILN_DISPATCH_TYPES(self.dtype(), "nonzero", [&] {
    using V = acc_t<scalar_t>;
    const scalar_t* px = static_cast<const scalar_t*>(x.impl()->data());
    for (int64_t i = 0; i < n; ++i)
      if (static_cast<V>(px[i]) != V(0)) hits.push_back(i);
  });
  Tensor y = empty_cpu({static_cast<int64_t>(hits.size()), nd}, kInt64);
  int64_t* py = static_cast<int64_t*>(y.impl()->data());
  for (size_t h = 0; h < hits.size(); ++h) {
    int64_t rest = hits[h];
    for (int64_t d = nd - 1; d >= 0; --d) {
      py[static_cast<int64_t>(h) * nd + d] = rest % self.sizes()[d];
      rest /= self.sizes()[d];
    }
  }
  return y;
}

constexpr auto K = DispatchKey::CPU;
KILN_REGISTER_STRUCTURED(index, K, &index_impl);
KILN_REGISTER_STRUCTURED(index_put, K, &index_put_impl);
const bool registered = [] {
  ops::op_nonzero.set_kernel(K, &nonzero_kernel);
  return true;
}();

}  // namespace
}  // namespace kiln::cpu

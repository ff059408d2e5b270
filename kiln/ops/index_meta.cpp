// Meta functions of index and index_put (ATen's advanced indexing), and the plan their kernels
// share.
//
// Note [Advanced indexing]
// index(self, indices) takes up to self.dim() optional index tensors; indices[i] indexes self's
// dim i and an undefined one (None) keeps dim i whole, as do the dims past the list. The
// defined ones (int64 or int32 here: a bool/uint8 mask is turned into its nonzero() positions
// by kiln::index before the op, a host read) broadcast together to a shape B, and the result is
//   - self's kept dims before the first indexed dim, then B, then the kept dims after, when the
//     indexed dims are adjacent (x[:, i, j] of [2, 3, 4, 5] with i, j of [6] is [2, 6, 5]);
//   - B first, then every kept dim in order, when a kept dim separates them (x[i, :, j] is
//     [6, 3, 5]): ATen's transposition rule, as NumPy's.
// An index value v reads position v of its dim, counting from the end when negative; outside
// [-size, size) it is an IndexError, "[index] index 5 is out of bounds for dimension 0 with size
// 4" as ATen's. index_put(self, indices, values, accumulate) returns self with `values`
// (broadcast to the indexed shape, self's dtype) written at those positions; with accumulate
// they are added, duplicates included; without it a duplicate position keeps one of its
// values (ATen leaves which one unspecified; the CPU keeps the last).
//
// Each kernel walks the indexed shape: element p reads (or writes) self at
//   sum over kept dims r of coord_r * stride(self_dim[r]) + sum over k of idx_k[b(p)] * stride_k
// where b(p) is p's position in B and idx_k the k-th index tensor broadcast to B.
#include "kiln/ops/index_meta.h"

#include <algorithm>

#include "kiln/ops/ops.h"

namespace kiln::meta {

void check_index_value(const char* op, int64_t v, int64_t dim, int64_t size) {
  KILN_CHECK_INDEX(v >= -size && v < size,
                   "[{}] index {} is out of bounds for dimension {} with size {}", op, v, dim,
                   size);
}

std::pair<int64_t, int64_t> slice_bounds(int64_t size, const OptInt& start, const OptInt& end) {
  auto clamp = [&](const OptInt& v, int64_t dflt) {
    if (!v) return dflt;
    const int64_t x = *v < 0 ? *v + size : *v;
    return std::clamp<int64_t>(x, 0, size);
  };
  const int64_t s = clamp(start, 0);
  return {s, std::max(s, clamp(end, size))};
}

IndexPlan plan_index(const char* op, const Tensor& self, const TensorList& indices) {
  check_defined(op, self, "self");
  const int64_t nd = self.dim();
  const int64_t n = static_cast<int64_t>(indices.size());
  KILN_CHECK_INDEX(n <= nd, "[{}] too many indices for tensor of dimension {} (got {})", op, nd, n);
  IndexPlan p;
  Shape b;
  bool first = true;
  for (int64_t i = 0; i < n; ++i) {
    const Tensor& t = indices[static_cast<size_t>(i)];
    if (!t.defined()) continue;
    KILN_CHECK_TYPE(t.dtype() == kInt64 || t.dtype() == kInt32,
                    "[{}] tensors used as indices must be int64 or int32 (bool masks go through "
                    "kiln::index, which takes their nonzero() positions), got {} at position {}",
                    op, t.dtype(), i);
    KILN_CHECK(t.device() == self.device() || t.device().is_cpu(),
               "[{}] indices are on {}, self on {} (an index tensor must be on self's device or "
               "the cpu)",
               op, t.device(), self.device());
    b = first ? Shape(t.sizes()) : broadcast_shapes(op, b, t.sizes());
    first = false;
    p.adv_dims.push_back(i);
    p.adv_args.push_back(i);
  }
  p.bshape = b;
  if (p.adv_dims.empty()) {  // nothing indexed: a copy of self
    p.result = Shape(self.sizes());
    for (int64_t d = 0; d < nd; ++d) p.self_dim.push_back(d);
    p.bpos = nd;
    return p;
  }
  bool adjacent =
      p.adv_dims.back() - p.adv_dims.front() + 1 == static_cast<int64_t>(p.adv_dims.size());
  p.bpos = adjacent ? p.adv_dims.front() : 0;
  auto is_adv = [&](int64_t d) {
    return std::find(p.adv_dims.begin(), p.adv_dims.end(), d) != p.adv_dims.end();
  };
  auto push_kept = [&](int64_t from, int64_t to) {
    for (int64_t d = from; d < to; ++d)
      if (!is_adv(d)) {
        p.result.push_back(self.sizes()[d]);
        p.self_dim.push_back(d);
      }
  };
  push_kept(0, p.bpos);
  for (int64_t s : b) {
    p.result.push_back(s);
    p.self_dim.push_back(-1);
  }
  push_kept(p.bpos, nd);
  return p;
}

Tensor broadcast_index(const IndexPlan& plan, const TensorList& indices, size_t k, Device device) {
  const Tensor& t = indices[static_cast<size_t>(plan.adv_args[k])];
  Tensor on = t.device() == device ? t : t.to(device);
  return ops::op_to_copy(ops::op_expand(on, plan.bshape), kInt64, device);
}

TensorSpec index(const Tensor& self, const TensorList& indices) {
  IndexPlan p = plan_index("index", self, indices);
  return {p.result, self.dtype(), self.device()};
}

TensorSpec index_put(const Tensor& self, const TensorList& indices, const Tensor& values, bool) {
  IndexPlan p = plan_index("index_put", self, indices);
  check_defined("index_put", values, "values");
  KILN_CHECK_TYPE(values.dtype() == self.dtype(),
                  "[index_put] values dtype {} differs from self {} (index_put requires the "
                  "source and destination dtypes match)",
                  values.dtype(), self.dtype());
  KILN_CHECK(values.device() == self.device() || (values.device().is_cpu() && values.dim() == 0),
             "[index_put] values are on {}, self on {}", values.device(), self.device());
  check_broadcasts_to("index_put", "values", values.sizes(), p.result);
  return {Shape(self.sizes()), self.dtype(), self.device()};
}

}  // namespace kiln::meta

namespace kiln::detail {
namespace {
// nonzero's result size is its count of nonzero values, which a meta tensor does not have.
Tensor meta_nonzero(const Tensor& self) {
  meta::check_defined("nonzero", self, "self");
  KILN_THROW(Device,
             "[nonzero] the result's size depends on self's values, which a meta tensor of "
             "shape [{}] does not have",
             fmt::join(self.sizes(), ", "));
}
const bool registered = [] {
  ops::op_nonzero.def.set_meta_raw(reinterpret_cast<void*>(&meta_nonzero));
  ops::op_nonzero.set_kernel(DispatchKey::Meta, &meta_nonzero);
  return true;
}();
}  // namespace
}  // namespace kiln::detail

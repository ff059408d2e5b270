#pragma once
// The shape rule of advanced indexing (index, index_put), shared by the meta functions and
// every backend's kernels. See Note [Advanced indexing] in index_meta.cpp. Internal to kiln/ops
// and the backends.
#include <vector>

#include "kiln/ops/meta.h"

namespace kiln::meta {

// How index(self, indices) walks self. The result ("indexed") shape has `result.size()` dims;
// result dim r is either self dim `self_dim[r]` or, where self_dim[r] is -1, a dim of the
// broadcast index shape `bshape` (which spans result dims [bpos, bpos + bshape.size())).
struct IndexPlan {
  Shape result;
  Shape bshape;
  int64_t bpos = 0;
  std::vector<int64_t> self_dim;  // per result dim
  std::vector<int64_t> adv_dims;  // self dims with an index tensor, in order
  std::vector<int64_t> adv_args;  // their positions in `indices`
};

// Validates self and the indices (defined or undefined = a whole dim; int64/int32; at most
// self.dim() of them; broadcastable; one device) and plans the walk. `op` names the errors.
IndexPlan plan_index(const char* op, const Tensor& self, const TensorList& indices);

// Index tensor `k` of the plan (indices[plan.adv_args[k]]) as int64 of shape plan.bshape,
// contiguous on `device`.
Tensor broadcast_index(const IndexPlan& plan, const TensorList& indices, size_t k, Device device);

// Python's start:end of a dim of `size` (negative ends wrapped, both clamped to [0, size],
// end >= start), as slice_scatter and Slice take them.
std::pair<int64_t, int64_t> slice_bounds(int64_t size, const OptInt& start, const OptInt& end);

// scatter's checks (scatter, scatter_reduce): index int64, src of self's dtype, one rank (0-d
// as 1-d), the index no larger than src and, off dim, than self. Returns the common device.
Device check_scatter_args(const char* op, const Tensor& self, int64_t dim, const Tensor& index,
                          const Tensor& src);

// "[op] index v is out of bounds for dimension d with size n" unless -n <= v < n.
void check_index_value(const char* op, int64_t v, int64_t dim, int64_t size);

}  // namespace kiln::meta

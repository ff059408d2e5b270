// Backward formulas of the collectives, with the semantics of PyTorch's
// torch.distributed.nn.functional: each gradient is itself a collective (so every rank must
// run backward, as every rank ran forward).
#include "kiln/autograd/derivative.h"
#include "kiln/distributed/process_group.h"
#include "kiln/ops/op_list.h"
#include "kiln/ops/ops.h"

namespace kiln::distributed {
namespace {

using autograd::BackwardCtx;
using autograd::Derivative;
using autograd::Differentiability;

[[noreturn]] void no_gradient(const char* op, ReduceOp r) {
  KILN_THROW(NotImplemented,
             "[{}] the gradient of a {} reduction is not implemented; only sum and avg are "
             "differentiable",
             op, reduce_op_name(r));
}

// y = reduce over ranks of x: sum -> dx = all_reduce(dy, sum); avg -> all_reduce(dy, avg).
void all_reduce_bw(const BackwardCtx& c, const TensorList& g, TensorList& gi) {
  auto r = static_cast<ReduceOp>(c.get<int64_t>(1));
  if (r != ReduceOp::Sum && r != ReduceOp::Avg) no_gradient("all_reduce", r);
  gi[0] = ops::op_all_reduce(g[0], static_cast<int64_t>(r), c.get<int64_t>(2));
}
// y = ranks' x stacked along dim 0 -> dx = this rank's block of the sum of every rank's dy.
void all_gather_bw(const BackwardCtx& c, const TensorList& g, TensorList& gi) {
  int64_t n = c.get<int64_t>(1);
  Tensor d = ops::op_reduce_scatter_tensor(g[0].contiguous(), static_cast<int64_t>(ReduceOp::Sum),
                                           n, c.get<int64_t>(2));
  gi[0] = d.reshape(c.sizes(0));
}
// y = block r of the reduction -> dx = every rank's dy stacked (divided by n for avg).
void reduce_scatter_bw(const BackwardCtx& c, const TensorList& g, TensorList& gi) {
  auto r = static_cast<ReduceOp>(c.get<int64_t>(1));
  if (r != ReduceOp::Sum && r != ReduceOp::Avg) no_gradient("reduce_scatter_tensor", r);
  int64_t n = c.get<int64_t>(2);
  Tensor d = ops::op_all_gather_into_tensor(g[0].contiguous(), n, c.get<int64_t>(3));
  gi[0] = r == ReduceOp::Avg ? div(d, static_cast<double>(n)) : d;
}
// y = x of rank src on every rank -> dx = sum of every rank's dy on src, zero elsewhere.
void broadcast_bw(const BackwardCtx& c, const TensorList& g, TensorList& gi) {
  int64_t src = c.get<int64_t>(1), group = c.get<int64_t>(2);
  Tensor sum = ops::op_all_reduce(g[0], static_cast<int64_t>(ReduceOp::Sum), group);
  gi[0] = group_by_id(group, "broadcast").rank() == src ? sum : zeros_like(sum);
}
// The reverse exchange: what went to rank j comes back from it.
void all_to_all_bw(const BackwardCtx& c, const TensorList& g, TensorList& gi) {
  const Shape& out_splits = c.get<Shape>(1);
  const Shape& in_splits = c.get<Shape>(2);
  gi[0] = ops::op_all_to_all_single(g[0].contiguous(), in_splits.span(), out_splits.span(),
                                    c.get<int64_t>(3));
}

constexpr Derivative F(autograd::BackwardFn fn) { return {Differentiability::Formula, fn, 0, 0}; }
constexpr Derivative kAllReduce = F(all_reduce_bw);
constexpr Derivative kAllGather = F(all_gather_bw);
constexpr Derivative kReduceScatter = F(reduce_scatter_bw);
constexpr Derivative kBroadcast = F(broadcast_bw);
constexpr Derivative kAllToAll = F(all_to_all_bw);

constexpr Derivative kNone{Differentiability::None, nullptr, 0, 0};

// The out= forms, send and recv_ keep the default (Unsupported): asking a gradient of them
// raises NotImplementedError at the call. barrier has no tensors.
const bool registered = [] {
  ops::op_all_reduce.def.set_derivative(&kAllReduce);
  ops::op_all_reduce_.def.set_derivative(&kAllReduce);
  ops::op_all_gather_into_tensor.def.set_derivative(&kAllGather);
  ops::op_reduce_scatter_tensor.def.set_derivative(&kReduceScatter);
  ops::op_broadcast.def.set_derivative(&kBroadcast);
  ops::op_broadcast_.def.set_derivative(&kBroadcast);
  ops::op_all_to_all_single.def.set_derivative(&kAllToAll);
  ops::op_barrier.def.set_derivative(&kNone);
  return true;
}();

}  // namespace
}  // namespace kiln::distributed

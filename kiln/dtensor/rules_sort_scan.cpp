// Sharding rules of sort, topk, cumsum, prod, flip and repeat. See Note [Sort and scan
// placements].
#include "kiln/distributed/collectives.h"
#include "kiln/dtensor/rule_options.h"
#include "kiln/ops/op_list.h"

namespace kiln::dtensor {
namespace {

// Note [Sort and scan placements]
// Each op reads whole slices along some dims and treats the other dims independently: sort,
// topk and cumsum along `dim`, prod along `dim` (every dim when none), flip along the flipped
// dims, repeat along the dims it repeats more than once. A shard of an independent dim stays
// (renumbered where the result's dims move: prod without keepdim, repeat's new leading dims),
// and the local op with the same arguments computes the rank's chunk of the result. A shard of
// a slice dim is gathered first (a sort, scan or product across ranks would need a merge this
// rule does not do). cumsum, flip and repeat are linear, so a Partial(sum) input stays
// Partial(sum); sort, topk and prod are not, so Partial inputs are reduced first.

// Result dim of each input dim, or -1 for a dim that must be whole.
using DimMap = std::vector<int64_t>;

size_t base(const ShardingCall& call) { return call.op().kind() == OpKind::Out ? 1 : 0; }
size_t results(const ShardingCall& call, size_t functional) {
  return call.op().kind() == OpKind::Out ? 0 : functional;
}

void decide(const ShardingCall& call, ShardingDecision& d, const DimMap& map, bool linear,
            size_t n_out) {
  const int64_t self = call.input_at(base(call));
  KILN_CHECK(self >= 0, "[{}] self must be a DTensor when the other tensors are (inputs: {})",
             call.op().name(), inputs_str(call));
  const DTensorSpec& s = call.input(static_cast<size_t>(self));
  decide_by_options(call, d, n_out, [&](int64_t m) {
    RuleOptions opts;
    auto option = [&](const Placement& in, const Placement& out) {
      RuleOption o;
      for (size_t i = 0; i < call.num_inputs(); ++i)
        o.in.push_back(static_cast<int64_t>(i) == self ? in : out);  // out= takes the result's
      o.out.assign(n_out, out);
      opts.push_back(std::move(o));
    };
    const Placement& p = s.placement(m);
    if (p.is_shard() && p.dim() < static_cast<int64_t>(map.size()) && map[p.dim()] >= 0)
      option(p, Shard(map[p.dim()]));
    if (p.is_partial() && linear && p.reduce_op() == ReduceOp::Sum) option(p, p);
    option(Replicate(), Replicate());
    return opts;
  });
}

// Every dim kept in place except `whole` (wrapped; out of range: the op raises).
DimMap all_but(int64_t ndim, IntArrayRef whole) {
  DimMap map(static_cast<size_t>(ndim));
  for (int64_t k = 0; k < ndim; ++k) map[k] = k;
  for (int64_t w : whole) {
    const int64_t k = w < 0 ? w + ndim : w;
    if (k >= 0 && k < ndim) map[k] = -1;
  }
  return map;
}

// sort(self, dim, descending) -> (values, indices).
void sort_rule(const ShardingCall& call, ShardingDecision& d) {
  const int64_t dim = call.int_arg(1);
  decide(call, d, all_but(call.tensor_ndim(0), IntArrayRef(&dim, 1)), false, 2);
}
// topk(self, k, dim, largest, sorted) -> (values, indices).
void topk_rule(const ShardingCall& call, ShardingDecision& d) {
  const int64_t dim = call.int_arg(2);
  decide(call, d, all_but(call.tensor_ndim(0), IntArrayRef(&dim, 1)), false, 2);
}
// cumsum(self, dim, dtype).
void cumsum_rule(const ShardingCall& call, ShardingDecision& d) {
  const size_t b = base(call);
  const int64_t dim = call.int_arg(b + 1);
  decide(call, d, all_but(call.tensor_ndim(b), IntArrayRef(&dim, 1)), true, results(call, 1));
}
// prod(self, dim?, keepdim, dtype): without keepdim the dims after `dim` move down one.
void prod_rule(const ShardingCall& call, ShardingDecision& d) {
  const size_t b = base(call);
  const int64_t nd = call.tensor_ndim(b);
  DimMap map(static_cast<size_t>(nd), -1);
  if (!call.is_none(b + 1)) {
    const int64_t dim = call.int_arg(b + 1);
    const int64_t w = dim < 0 ? dim + nd : dim;
    const bool keepdim = call.bool_arg(b + 2);
    for (int64_t k = 0; k < nd; ++k)
      if (k != w) map[k] = keepdim || k < w ? k : k - 1;
  }
  decide(call, d, map, false, results(call, 1));
}
// flip(self, dims).
void flip_rule(const ShardingCall& call, ShardingDecision& d) {
  const size_t b = base(call);
  decide(call, d, all_but(call.tensor_ndim(b), call.ints_arg(b + 1)), true, results(call, 1));
}
// repeat(self, repeats): input dim k is result dim k + (new leading dims).
void repeat_rule(const ShardingCall& call, ShardingDecision& d) {
  const size_t b = base(call);
  const int64_t nd = call.tensor_ndim(b);
  IntArrayRef repeats = call.ints_arg(b + 1);
  const int64_t lead = static_cast<int64_t>(repeats.size()) - nd;
  DimMap map(static_cast<size_t>(nd), -1);
  if (lead >= 0)  // else the op raises
    for (int64_t k = 0; k < nd; ++k) map[k] = repeats[k + lead] == 1 ? k + lead : -1;
  decide(call, d, map, true, results(call, 1));
}

const ShardingRule kSort{"sort (the sorted dim whole)", &sort_rule};
const ShardingRule kTopk{"topk (the searched dim whole)", &topk_rule};
const ShardingRule kCumsum{"cumsum (the scanned dim whole; Partial(sum) stays)", &cumsum_rule};
const ShardingRule kProd{"prod (the reduced dims whole)", &prod_rule};
const ShardingRule kFlip{"flip (the flipped dims whole; Partial(sum) stays)", &flip_rule};
const ShardingRule kRepeat{"repeat (the repeated dims whole; Partial(sum) stays)", &repeat_rule};

const bool g_registered = [] {
  auto both = [](auto& op, auto& out, const ShardingRule* r) {
    set_sharding_rule(op.def, r);
    set_sharding_rule(out.def, r);
  };
  set_sharding_rule(ops::op_sort.def, &kSort);
  set_sharding_rule(ops::op_topk.def, &kTopk);
  both(ops::op_cumsum, ops::op_cumsum_out, &kCumsum);
  both(ops::op_prod, ops::op_prod_out, &kProd);
  both(ops::op_flip, ops::op_flip_out, &kFlip);
  both(ops::op_repeat, ops::op_repeat_out, &kRepeat);
  return true;
}();

}  // namespace
}  // namespace kiln::dtensor

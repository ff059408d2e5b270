// Sharding rules of cdist and pdist and their backward ops (Note [Distance placements]).
#include "kiln/dtensor/dtensor.h"
#include "kiln/dtensor/rule_options.h"
#include "kiln/ops/op_list.h"

namespace kiln::dtensor {
namespace {

// Note [Distance placements]
// cdist_forward(x1 [*, P, M], x2 [*, R, M]) -> [*, P, R] computes each result row from one row of
// x1 and all of x2, and each column from one row of x2 and all of x1: x1 sharded by rows
// (Shard(-2)) with x2 replicated gives the result Shard(-2), and x2 sharded by rows with x1
// replicated gives Shard(-1). cdist_backward(grad, x1, x2, p, cdist) gives x1's gradient row by
// row: grad, x1 and cdist sharded by rows with x2 replicated give it Shard(-2). Every other
// placement (a batch or feature shard, a Partial input: a p-norm is not linear) is gathered to
// Replicate; so is everything for pdist and its backward, whose pairs mix all rows. A rule
// only lists a sharded option when an input is already sharded that way, so replicated inputs
// stay replicated.

bool is_shard_of(const ShardingCall& call, size_t i, int64_t m, int64_t dim) {
  const Placement& p = call.input(i).placement(m);
  return p.is_shard() && p.dim() == dim;
}
// The rows dim (ndim - 2) of the tensor at stack position pos.
int64_t rows_dim(const ShardingCall& call, size_t pos) { return call.tensor_ndim(pos) - 2; }

// One option: DTensor inputs at the positions in `sharded` get Shard(their rows dim), the others
// Replicate; the result gets `out`.
RuleOption rows_option(const ShardingCall& call, std::initializer_list<size_t> sharded,
                       const Placement& out) {
  RuleOption o;
  for (size_t i = 0; i < call.num_inputs(); ++i) {
    const size_t pos = call.position(i);
    bool here = false;
    for (size_t s : sharded) here = here || s == pos;
    o.in.push_back(here ? Placement(Shard(rows_dim(call, pos))) : Placement(Replicate()));
  }
  o.out = {out};
  return o;
}

int64_t out_ndim(const ShardingCall& call) {
  return std::max(call.tensor_ndim(call.op().name() == "cdist_forward" ? 0 : 1),
                  call.tensor_ndim(call.op().name() == "cdist_forward" ? 1 : 2));
}

void cdist_rule(const ShardingCall& call, ShardingDecision& d) {
  const int64_t nd = out_ndim(call);
  const int64_t i1 = call.input_at(0), i2 = call.input_at(1);
  decide_by_options(call, d, 1, [&](int64_t m) {
    RuleOptions opts;
    if (i1 >= 0 && is_shard_of(call, static_cast<size_t>(i1), m, rows_dim(call, 0)))
      opts.push_back(rows_option(call, {0}, Shard(nd - 2)));
    if (i2 >= 0 && is_shard_of(call, static_cast<size_t>(i2), m, rows_dim(call, 1)))
      opts.push_back(rows_option(call, {1}, Shard(nd - 1)));
    opts.push_back(uniform_option(call, 1, Replicate()));
    return opts;
  });
}

void cdist_backward_rule(const ShardingCall& call, ShardingDecision& d) {
  const int64_t nd = out_ndim(call);
  const int64_t i1 = call.input_at(1);
  decide_by_options(call, d, 1, [&](int64_t m) {
    RuleOptions opts;
    if (i1 >= 0 && is_shard_of(call, static_cast<size_t>(i1), m, rows_dim(call, 1)))
      opts.push_back(rows_option(call, {0, 1, 4}, Shard(nd - 2)));
    opts.push_back(uniform_option(call, 1, Replicate()));
    return opts;
  });
}

void replicate_rule(const ShardingCall& call, ShardingDecision& d) {
  decide_by_options(call, d, 1,
                    [&](int64_t) { return RuleOptions{uniform_option(call, 1, Replicate())}; });
}

const ShardingRule kCdist{"cdist (row shards of x1 or x2 stay local)", &cdist_rule};
const ShardingRule kCdistBackward{"cdist_backward (row shards of x1 stay local)",
                                  &cdist_backward_rule};
const ShardingRule kPdist{"pdist (gathered to Replicate: every pair of rows)", &replicate_rule};

const bool g_registered = [] {
  set_sharding_rule(ops::op_cdist_forward.def, &kCdist);
  set_sharding_rule(ops::op_cdist_backward.def, &kCdistBackward);
  set_sharding_rule(ops::op_pdist_forward.def, &kPdist);
  set_sharding_rule(ops::op_pdist_backward.def, &kPdist);
  return true;
}();

}  // namespace
}  // namespace kiln::dtensor

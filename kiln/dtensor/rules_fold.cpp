// Sharding rules of im2col and col2im (Note [Sliding block placements]).
#include "kiln/dtensor/dtensor.h"
#include "kiln/dtensor/rule_options.h"
#include "kiln/ops/op_list.h"

namespace kiln::dtensor {
namespace {

// Note [Sliding block placements]
// im2col and col2im treat every image of a batch on its own, so a batched input ([N, C, H, W]
// for im2col, [N, C kh kw, L] for col2im) sharded along N runs locally and gives the result
// Shard(0); an empty batch shard is fine (both ops take a batch of 0, as ATen's). Every other
// placement is gathered to Replicate: a channel shard of im2col does not chunk its C kh kw rows
// as the result's Shard(1) would (chunks round up per dim), col2im's rows shard would split a
// channel's taps, a spatial or blocks shard crosses shards, and a Partial input is left to the
// general path.
void batch_rule(const ShardingCall& call, ShardingDecision& d, int64_t batched_ndim) {
  decide_by_options(call, d, 1, [&](int64_t m) {
    RuleOptions opts;
    const Placement& p = call.input(0).placement(m);
    if (call.tensor_ndim(0) == batched_ndim && p.is_shard() && p.dim() == 0)
      opts.push_back(uniform_option(call, 1, Shard(0)));
    opts.push_back(uniform_option(call, 1, Replicate()));
    return opts;
  });
}
void im2col_rule(const ShardingCall& call, ShardingDecision& d) { batch_rule(call, d, 4); }
void col2im_rule(const ShardingCall& call, ShardingDecision& d) { batch_rule(call, d, 3); }

const ShardingRule kIm2col{"im2col (batch shards stay local)", &im2col_rule};
const ShardingRule kCol2im{"col2im (batch shards stay local)", &col2im_rule};

const bool g_registered = [] {
  set_sharding_rule(ops::op_im2col.def, &kIm2col);
  set_sharding_rule(ops::op_col2im.def, &kCol2im);
  return true;
}();

}  // namespace
}  // namespace kiln::dtensor

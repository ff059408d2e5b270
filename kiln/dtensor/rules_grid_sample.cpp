// Sharding rules of grid_sampler_2d and its backward op (Note [Grid sampler placements]).
#include "kiln/dtensor/dtensor.h"
#include "kiln/dtensor/rule_options.h"
#include "kiln/ops/op_list.h"

namespace kiln::dtensor {
namespace {

// Note [Grid sampler placements]
// grid_sampler_2d samples image n only at grid n, so a batch shard (dim 0) of the input or the
// grid runs locally with every tensor argument sharded alike along the batch: the result is
// Shard(0), and the backward op's grad_input and grad_grid too (grad_output, input and grid all
// Shard(0)). Every other placement is gathered to Replicate: a channel shard would make the
// grid's gradient a sum over ranks, and a spatial shard of the input or the grid moves the
// points each rank must read.
void batch_rule(const ShardingCall& call, ShardingDecision& d, size_t n_out) {
  decide_by_options(call, d, n_out, [&](int64_t m) {
    RuleOptions opts;
    bool shard0 = false;
    for (size_t i = 0; i < call.num_inputs(); ++i) {
      const Placement& p = call.input(i).placement(m);
      shard0 = shard0 || (p.is_shard() && p.dim() == 0);
    }
    if (shard0) opts.push_back(uniform_option(call, n_out, Shard(0)));
    opts.push_back(uniform_option(call, n_out, Replicate()));
    return opts;
  });
}
void forward_rule(const ShardingCall& call, ShardingDecision& d) { batch_rule(call, d, 1); }
void backward_rule(const ShardingCall& call, ShardingDecision& d) { batch_rule(call, d, 2); }

const ShardingRule kGridSampler{"grid_sampler_2d (batch shards stay local)", &forward_rule};
const ShardingRule kGridSamplerBackward{"grid_sampler_2d_backward (batch shards stay local)",
                                        &backward_rule};

const bool g_registered = [] {
  set_sharding_rule(ops::op_grid_sampler_2d.def, &kGridSampler);
  set_sharding_rule(ops::op_grid_sampler_2d_backward.def, &kGridSamplerBackward);
  return true;
}();

}  // namespace
}  // namespace kiln::dtensor

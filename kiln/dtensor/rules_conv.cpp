// Sharding rules of convolution and convolution_backward (Note [Convolution placements]).
#include "kiln/dtensor/dtensor.h"
#include "kiln/dtensor/rule_options.h"
#include "kiln/ops/op_list.h"

namespace kiln::dtensor {
namespace {

// Note [Convolution placements]
// A convolution treats each batch element on its own, so an input sharded along the batch (dim
// 0) with the weight and bias replicated runs locally and its output keeps Shard(0). In the
// backward, grad_output and input sharded alike along the batch give grad_input Shard(0), and
// grad_weight and grad_bias Partial(sum) (sums over the batch). Every other placement (a shard
// of channels or of a spatial dim, whose halos a local convolution would miss; a sharded
// weight; a Partial input) is gathered to Replicate first.
template <bool Backward>
void conv_rule(const ShardingCall& call, ShardingDecision& d) {
  // Stack positions of the batch-carrying tensors: forward (input), backward (grad_output,
  // input); the rest (weight, bias) stay replicated.
  const size_t n_out = Backward ? 3 : 1;
  const Placement R = Replicate(), sum = Partial(ReduceOp::Sum);
  auto batched = [&](size_t i) { return call.position(i) < (Backward ? 2u : 1u); };
  decide_by_options(call, d, n_out, [&](int64_t m) {
    RuleOptions opts;
    bool shard0 = false;
    for (size_t i = 0; i < call.num_inputs(); ++i) {
      const Placement& p = call.input(i).placement(m);
      shard0 = shard0 || (batched(i) && p.is_shard() && p.dim() == 0);
    }
    if (shard0) {
      RuleOption o;
      for (size_t i = 0; i < call.num_inputs(); ++i)
        o.in.push_back(batched(i) ? Placement(Shard(0)) : R);
      o.out =
          Backward ? std::vector<Placement>{Shard(0), sum, sum} : std::vector<Placement>{Shard(0)};
      opts.push_back(std::move(o));
    }
    opts.push_back(uniform_option(call, n_out, R));
    return opts;
  });
}

const ShardingRule kConv{"convolution (batch shards stay local)", &conv_rule<false>};
const ShardingRule kConvBackward{
    "convolution backward (batch shards: grad_input Shard(0), weight and bias Partial(sum))",
    &conv_rule<true>};

const bool g_registered = [] {
  set_sharding_rule(ops::op_convolution.def, &kConv);
  set_sharding_rule(ops::op_convolution_backward.def, &kConvBackward);
  return true;
}();

}  // namespace
}  // namespace kiln::dtensor

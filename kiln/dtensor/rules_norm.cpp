// Sharding rules of batch, group and layer norm's native ops (Note [Native norm placements]).
#include "kiln/dtensor/dtensor.h"
#include "kiln/dtensor/rule_options.h"
#include "kiln/ops/op_list.h"

namespace kiln::dtensor {
namespace {

// Note [Native norm placements]
// - batch norm (native_batch_norm_legit, its no_stats form and native_batch_norm_backward) in
//   training takes its statistics over the batch and every spatial position, so a shard of any
//   dim would normalise with its own shard's statistics (and update the running stats with them)
//   where the unsharded op uses the whole batch's: every input is gathered to Replicate first
//   and the results are replicated (no sync batch norm: an all-reduce of the per-channel sums
//   inside the op is not done). Running stats that are themselves sharded cannot be gathered in
//   place (a written input keeps its placement), so such a call has no option and raises.
// - batch norm in eval (native_batch_norm_legit_no_training) normalises each element with the
//   running stats, so a batch shard (dim 0) runs locally: out Shard(0), the empty save_mean and
//   save_rstd replicated.
// - native_layer_norm normalises each row over the trailing normalized_shape dims: a shard of a
//   leading dim runs locally and out, mean and rstd keep it (as layer_norm's rule, Note [Norm
//   placements] in rules_nn.cpp). Its backward with grad_out, input, mean and rstd sharded alike
//   along a leading dim gives grad_input that shard and grad_weight, grad_bias Partial(sum).
// - native_group_norm normalises each sample on its own, so a batch shard (dim 0) runs locally
//   with N replaced by the shard's batch size (a local argument): out, mean and rstd keep
//   Shard(0). Its backward with grad_out, input, mean and rstd batch-sharded gives grad_input
//   Shard(0) and grad_weight, grad_bias Partial(sum) (sums over the batch). Other placements
//   are gathered to Replicate.

RuleOptions replicate(const ShardingCall& call, size_t n_out) {
  return {uniform_option(call, n_out, Replicate())};
}

void batch_norm_rule(const ShardingCall& call, ShardingDecision& d) {
  decide_by_options(call, d, 3, [&](int64_t) { return replicate(call, 3); });
}

void batch_norm_eval_rule(const ShardingCall& call, ShardingDecision& d) {
  decide_by_options(call, d, 3, [&](int64_t m) {
    RuleOptions opts;
    const int64_t x = call.input_at(0);
    if (x >= 0) {
      const Placement& p = call.input(static_cast<size_t>(x)).placement(m);
      if (p.is_shard() && p.dim() == 0) {
        RuleOption o;
        for (size_t i = 0; i < call.num_inputs(); ++i)
          o.in.push_back(call.position(i) == 0 ? Placement(Shard(0)) : Placement(Replicate()));
        o.out = {Shard(0), Replicate(), Replicate()};
        opts.push_back(std::move(o));
      }
    }
    opts.push_back(uniform_option(call, 3, Replicate()));
    return opts;
  });
}

// Stack positions: forward (input 0, normalized_shape 1); backward (grad_out 0, input 1,
// normalized_shape 2, mean 3, rstd 4).
template <bool Backward>
void layer_norm_rule(const ShardingCall& call, ShardingDecision& d) {
  const size_t x_pos = Backward ? 1 : 0;
  const int64_t lead =
      call.tensor_ndim(x_pos) - static_cast<int64_t>(call.ints_arg(x_pos + 1).size());
  auto is_data = [&](size_t i) { return Backward ? call.position(i) <= 4 : call.position(i) == 0; };
  decide_by_options(call, d, 3, [&](int64_t m) {
    RuleOptions opts;
    std::vector<bool> seen(static_cast<size_t>(std::max<int64_t>(lead, 0)), false);
    for (size_t i = 0; i < call.num_inputs(); ++i) {
      if (!is_data(i)) continue;
      const Placement& p = call.input(i).placement(m);
      if (!p.is_shard() || p.dim() >= lead || seen[static_cast<size_t>(p.dim())]) continue;
      seen[static_cast<size_t>(p.dim())] = true;
      RuleOption o;
      for (size_t k = 0; k < call.num_inputs(); ++k)
        o.in.push_back(is_data(k) ? p : Placement(Replicate()));
      const Placement sum = Partial(ReduceOp::Sum);
      o.out = Backward ? std::vector<Placement>{p, sum, sum} : std::vector<Placement>{p, p, p};
      opts.push_back(std::move(o));
    }
    opts.push_back(uniform_option(call, 3, Replicate()));
    return opts;
  });
}

// Stack positions: forward (input 0, N 3); backward (grad_out 0, input 1, mean 2, rstd 3, N 5).
template <bool Backward>
void group_norm_rule(const ShardingCall& call, ShardingDecision& d) {
  const size_t x_pos = Backward ? 1 : 0, n_pos = Backward ? 5 : 3;
  auto is_data = [&](size_t i) { return call.position(i) <= (Backward ? 3u : 0u); };
  const int64_t x = call.input_at(x_pos);
  decide_by_options(call, d, 3, [&](int64_t m) {
    RuleOptions opts;
    bool batch = false;
    for (size_t i = 0; i < call.num_inputs(); ++i) {
      const Placement& p = call.input(i).placement(m);
      batch = batch || (is_data(i) && p.is_shard() && p.dim() == 0);
    }
    if (batch && x >= 0) {
      RuleOption o;
      for (size_t i = 0; i < call.num_inputs(); ++i)
        o.in.push_back(is_data(i) ? Placement(Shard(0)) : Placement(Replicate()));
      const Placement sum = Partial(ReduceOp::Sum);
      o.out = Backward ? std::vector<Placement>{Shard(0), sum, sum}
                       : std::vector<Placement>{Shard(0), Shard(0), Shard(0)};
      opts.push_back(std::move(o));
    }
    opts.push_back(uniform_option(call, 3, Replicate()));
    return opts;
  });
  if (x < 0) return;
  const Placements& xp = d.inputs[static_cast<size_t>(x)];
  bool sharded = false;
  for (const Placement& p : xp) sharded = sharded || p.is_shard();
  if (!sharded) return;
  const DTensorSpec* local = with_placements(call.input(static_cast<size_t>(x)), xp);
  d.local_args.emplace_back(n_pos, IValue(local->local_shape()[0]));
}

const ShardingRule kBatchNorm{
    "batch norm (gathered to Replicate: training statistics span the whole batch)",
    &batch_norm_rule};
const ShardingRule kBatchNormEval{"batch norm eval (batch shards stay local)",
                                  &batch_norm_eval_rule};
const ShardingRule kGroupNorm{"group norm (batch shards stay local, N the shard's)",
                              &group_norm_rule<false>};
const ShardingRule kGroupNormBackward{
    "group norm backward (batch shards: grad_input Shard(0), weight and bias Partial(sum))",
    &group_norm_rule<true>};
const ShardingRule kLayerNorm{"native_layer_norm (leading dims keep their shards)",
                              &layer_norm_rule<false>};
const ShardingRule kLayerNormBackward{
    "native_layer_norm backward (leading shards: grad_input keeps them, weight and bias "
    "Partial(sum))",
    &layer_norm_rule<true>};

const bool g_registered = [] {
  set_sharding_rule(ops::op_native_batch_norm_legit.def, &kBatchNorm);
  set_sharding_rule(ops::op_native_batch_norm_legit_no_stats.def, &kBatchNorm);
  set_sharding_rule(ops::op_native_batch_norm_backward.def, &kBatchNorm);
  set_sharding_rule(ops::op_native_batch_norm_legit_no_training.def, &kBatchNormEval);
  set_sharding_rule(ops::op_native_group_norm.def, &kGroupNorm);
  set_sharding_rule(ops::op_native_group_norm_backward.def, &kGroupNormBackward);
  set_sharding_rule(ops::op_native_layer_norm.def, &kLayerNorm);
  set_sharding_rule(ops::op_native_layer_norm_backward.def, &kLayerNormBackward);
  return true;
}();

}  // namespace
}  // namespace kiln::dtensor

// Sharding rules of embedding_dense_backward (and its out= form) and embedding_bag (Note
// [Embedding gradient placements]). embedding's own rule is in rules_nn.cpp.
#include "kiln/dtensor/dtensor.h"
#include "kiln/dtensor/rule_options.h"
#include "kiln/ops/op_list.h"

namespace kiln::dtensor {
namespace {

// Note [Embedding gradient placements]
// embedding_dense_backward(grad_output [..., D], indices [...], num_weights, padding_idx,
// scale_grad_by_freq) -> [num_weights, D] sums grad_output's rows into the rows its indices name,
// so along one mesh dim:
//   - grad_output Shard(last) (the embedding dim) with replicated indices: the result is
//     Shard(1);
//   - grad_output and indices both Shard(k) along an index dim: each rank sums its rows, and the
//     ranks' results add up to the whole: Partial(sum). Not with scale_grad_by_freq, whose counts
//     are over every rank's indices;
//   - a Partial(sum) grad_output with replicated indices: the op is linear in it, Partial(sum);
//   - else everything replicated.
// embedding_bag(weight [V, D], indices, offsets, ...): weight Shard(1) (the embedding dim) with
// the rest replicated runs locally: output Shard(1) (and max mode's max_indices [B, D]),
// offset2bag and bag_size replicated (every rank computes the same ones). Anything else is
// replicated: a shard of the indices would need the offsets rebased rank by rank.
bool is_sum(const Placement& p) { return p.is_partial() && p.reduce_op() == ReduceOp::Sum; }

void dense_backward_rule(const ShardingCall& call, ShardingDecision& d) {
  const bool out_form = call.op().kind() == OpKind::Out;
  const size_t b = out_form ? 1 : 0, n_out = out_form ? 0 : 1;
  const int64_t gx = call.input_at(b), ix = call.input_at(b + 1);
  const int64_t idx_nd = call.tensor_ndim(b + 1);
  const bool scale = call.bool_arg(b + 4);
  decide_by_options(call, d, n_out, [&](int64_t m) {
    RuleOptions opts;
    auto option = [&](const Placement& gp, const Placement& ip, const Placement& out) {
      RuleOption o;
      for (size_t i = 0; i < call.num_inputs(); ++i) {
        const bool is_out = out_form && call.position(i) == 0;
        o.in.push_back(is_out ? out : static_cast<int64_t>(i) == gx ? gp : ip);
      }
      if (n_out) o.out = {out};
      opts.push_back(std::move(o));
    };
    const Placement R = Replicate();
    const Placement gp = gx >= 0 ? call.input(static_cast<size_t>(gx)).placement(m) : R;
    if (gp.is_shard() && gp.dim() == idx_nd) option(gp, R, Shard(1));
    if (!scale && gp.is_shard() && gp.dim() < idx_nd && ix >= 0)
      option(gp, Shard(gp.dim()), Partial(ReduceOp::Sum));
    if (is_sum(gp)) option(gp, R, gp);
    option(R, R, R);
    return opts;
  });
}

void embedding_bag_rule(const ShardingCall& call, ShardingDecision& d) {
  const int64_t w = call.input_at(0);
  const bool max_mode = call.int_arg(4) == 2;
  decide_by_options(call, d, 4, [&](int64_t m) {
    RuleOptions opts;
    if (w >= 0) {
      const Placement& wp = call.input(static_cast<size_t>(w)).placement(m);
      if (wp.is_shard() && wp.dim() == 1) {
        RuleOption o;
        for (size_t i = 0; i < call.num_inputs(); ++i)
          o.in.push_back(static_cast<int64_t>(i) == w ? wp : Placement(Replicate()));
        o.out = {wp, Replicate(), Replicate(), max_mode ? wp : Placement(Replicate())};
        opts.push_back(std::move(o));
      }
    }
    opts.push_back(uniform_option(call, 4, Replicate()));
    return opts;
  });
}

const ShardingRule kDenseBackward{
    "embedding_dense_backward (embedding-dim shards, Partial(sum) of index shards)",
    &dense_backward_rule};
const ShardingRule kEmbeddingBag{"embedding_bag (embedding-dim shards of weight, else replicated)",
                                 &embedding_bag_rule};

const bool g_registered = [] {
  set_sharding_rule(ops::op_embedding_dense_backward.def, &kDenseBackward);
  set_sharding_rule(ops::op_embedding_dense_backward_out.def, &kDenseBackward);
  set_sharding_rule(ops::op_embedding_bag.def, &kEmbeddingBag);
  return true;
}();

}  // namespace
}  // namespace kiln::dtensor

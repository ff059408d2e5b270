// The sharding rule of native_dropout: each shard draws the numbers of its global positions.
// See Note [Sharded dropout].
#include "kiln/dtensor/global_positions.h"
#include "kiln/dtensor/rule_options.h"
#include "kiln/ops/op_list.h"
#include "kiln/ops/ops.h"

namespace kiln::dtensor {
namespace {

// Note [Sharded dropout]
// native_dropout(x, p, generator) draws one uniform per element of x in row-major order (4 per
// Philox block) and advances the generator by ceil(numel / 4) blocks. A sharded call gives the
// unsharded op's values and leaves every rank's generator where the unsharded op would:
//   - a shard (any placement with a Shard) runs the decision's local_run, which draws the
//     shard's global positions (Note [Global positions] in global_positions.cpp): x's shard is
//     copied into its box of a zero tensor of BoxDraw's sizes (the span of global positions, or
//     the whole global shape where the generator's state is not on the host or a trace is
//     recording), that tensor is dropped out with BoxDraw's generator, and the box read back;
//   - a Partial input keeps its kind (the mask and the scale are the same on every rank and not
//     negative, so the op commutes with sum, avg, max and min) and its mask is replicated: each
//     rank draws the whole, at the same positions;
//   - a replicated input: the op as it is, on every rank.
// Ranks agree only if their generators do (the same seed and the same draws before).

TensorPair dropout_shard(const Tensor& x, double p, Generator* gen, const detail::Box& b) {
  const detail::BoxDraw draw(b, gen, x.device(), detail::kDropoutPerBlock);
  Tensor in = zeros(draw.sizes(), x.dtype(), x.device());
  draw.view(in).copy_(x);
  auto [out, mask] = ops::op_native_dropout(in, p, draw.generator());
  return {draw.view(out).contiguous(), draw.view(mask).contiguous()};
}

void dropout_rule(const ShardingCall& call, ShardingDecision& d) {
  KILN_ASSERT(call.num_inputs() == 1, "[native_dropout] expected one DTensor input, got {}",
              call.num_inputs());
  const DTensorSpec& s = call.input(0);
  decide_by_options(call, d, 2, [&](int64_t m) {
    const Placement& p = s.placement(m);
    if (p.is_shard())
      return RuleOptions{{{p}, {p, p}}, {{Replicate()}, {Replicate(), Replicate()}}};
    if (p.is_partial()) return RuleOptions{{{p}, {p, Replicate()}}};
    return RuleOptions{{{Replicate()}, {Replicate(), Replicate()}}};
  });
  bool sharded = false;
  for (const Placement& p : d.inputs[0]) sharded = sharded || p.is_shard();
  if (!sharded) return;
  detail::Box b = detail::box_of(*with_placements(s, d.inputs[0], "native_dropout"));
  d.local_run = [b = std::move(b)](Stack& stack) {
    Tensor x = std::get<Tensor>(stack[0]);
    const double p = std::get<double>(stack[1]);
    Generator* gen = std::get<Generator*>(stack[2]);
    auto [out, mask] = dropout_shard(x, p, gen, b);
    stack.clear();
    stack.emplace_back(std::move(out));
    stack.emplace_back(std::move(mask));
  };
}

const ShardingRule kDropout{"dropout (each shard draws its global positions)", &dropout_rule};

const bool g_registered = [] {
  set_sharding_rule(ops::op_native_dropout.def, &kDropout);
  return true;
}();

}  // namespace
}  // namespace kiln::dtensor

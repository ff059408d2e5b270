// Sharding rules of the padding and upsampling ops (Note [Padding and upsampling placements]).
#include "kiln/dtensor/dtensor.h"
#include "kiln/dtensor/rule_options.h"
#include "kiln/ops/op_list.h"

namespace kiln::dtensor {
namespace {

// Note [Padding and upsampling placements]
// The pads and upsampling treat the last nd dims of their input (constant_pad_nd: the dims its
// pad list names; reflection/replication_pad{nd}d: nd; upsample_*2d: H and W) and copy or
// interpolate every slice of the leading dims on its own, so a Shard of a leading dim runs
// locally: every tensor input sharded alike along such a dim d gives the result Shard(d). The
// backward ops of the pads take grad_output and self sharded alike. A channel dim (the last
// leading dim of the reflection/replication pads and upsampling) whose shards are empty on some
// rank is gathered: the local op refuses an input without channels, as ATen's does (an empty
// batch shard is fine, and constant_pad_nd takes any empty shard). Every other placement (a
// shard of a padded or resized dim, whose sources cross shards; a Partial input) is gathered to
// Replicate first. upsample_*2d_backward carries the input's full size as an argument (its N
// and C too), so it always runs on Replicate.
void leading_shards_rule(const ShardingCall& call, ShardingDecision& d, int64_t local_dims,
                         bool channels_last) {
  decide_by_options(call, d, 1, [&](int64_t m) {
    RuleOptions opts;
    for (int64_t dim = 0; dim < local_dims; ++dim) {
      bool any = false, empty = false;
      for (size_t i = 0; i < call.num_inputs(); ++i) {
        const Placement& p = call.input(i).placement(m);
        const bool here = p.is_shard() && p.dim() == dim;
        any = any || here;
        empty = empty || (here && !no_empty_chunk(call.input(i), dim));
      }
      if (any && !(channels_last && dim == local_dims - 1 && empty))
        opts.push_back(uniform_option(call, 1, Shard(dim)));
    }
    opts.push_back(uniform_option(call, 1, Replicate()));
    return opts;
  });
}

void constant_pad_rule(const ShardingCall& call, ShardingDecision& d) {
  leading_shards_rule(
      call, d, call.tensor_ndim(0) - static_cast<int64_t>(call.ints_arg(1).size()) / 2, false);
}
template <int64_t nd>
void pad_rule(const ShardingCall& call, ShardingDecision& d) {
  // self is the first tensor of a forward op, the second of a backward op (after grad_output).
  const size_t self_pos = call.op().name().ends_with("_backward") ? 1 : 0;
  leading_shards_rule(call, d, call.tensor_ndim(self_pos) - nd, true);
}
void upsample_rule(const ShardingCall& call, ShardingDecision& d) {
  leading_shards_rule(call, d, 2, true);
}
void upsample_backward_rule(const ShardingCall& call, ShardingDecision& d) {
  leading_shards_rule(call, d, 0, false);
}

const ShardingRule kConstantPad{"constant padding (shards of unpadded dims stay local)",
                                &constant_pad_rule};
const ShardingRule kPad1d{"padding (batch and channel shards stay local)", &pad_rule<1>};
const ShardingRule kPad2d{"padding (batch and channel shards stay local)", &pad_rule<2>};
const ShardingRule kPad3d{"padding (batch and channel shards stay local)", &pad_rule<3>};
const ShardingRule kUpsample{"upsampling (batch and channel shards stay local)", &upsample_rule};
const ShardingRule kUpsampleBackward{
    "upsampling backward (replicated: input_size names the whole input)", &upsample_backward_rule};

const bool g_registered = [] {
  set_sharding_rule(ops::op_constant_pad_nd.def, &kConstantPad);
  for (const OpDef* op : {&ops::op_reflection_pad1d.def, &ops::op_reflection_pad1d_backward.def,
                          &ops::op_replication_pad1d.def, &ops::op_replication_pad1d_backward.def})
    set_sharding_rule(*op, &kPad1d);
  for (const OpDef* op : {&ops::op_reflection_pad2d.def, &ops::op_reflection_pad2d_backward.def,
                          &ops::op_replication_pad2d.def, &ops::op_replication_pad2d_backward.def})
    set_sharding_rule(*op, &kPad2d);
  for (const OpDef* op : {&ops::op_reflection_pad3d.def, &ops::op_reflection_pad3d_backward.def,
                          &ops::op_replication_pad3d.def, &ops::op_replication_pad3d_backward.def})
    set_sharding_rule(*op, &kPad3d);
  set_sharding_rule(ops::op_upsample_nearest2d.def, &kUpsample);
  set_sharding_rule(ops::op_upsample_bilinear2d.def, &kUpsample);
  set_sharding_rule(ops::op_upsample_nearest2d_backward.def, &kUpsampleBackward);
  set_sharding_rule(ops::op_upsample_bilinear2d_backward.def, &kUpsampleBackward);
  return true;
}();

}  // namespace
}  // namespace kiln::dtensor

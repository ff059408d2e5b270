// Sharding rules of the pooling ops (Note [Pooling placements]).
#include "kiln/dtensor/dtensor.h"
#include "kiln/dtensor/rule_options.h"
#include "kiln/ops/op_list.h"

namespace kiln::dtensor {
namespace {

// Note [Pooling placements]
// Pooling treats each (n, c) plane of [N, C, *spatial] (or [C, *spatial]) on its own, and max
// pooling's indices are flat within a plane, so a shard of a batch or channel dim runs locally:
// every tensor input sharded alike along such a dim d (Shard(d)) gives every result Shard(d).
// The backward ops take grad_output, self (and the indices) sharded alike and give grad_input
// Shard(d). Every other placement (a shard of a spatial dim, whose windows would cross shards; a
// Partial input, which max pooling does not commute with) is gathered to Replicate first.
template <int64_t nd, size_t n_out>
void pool_rule(const ShardingCall& call, ShardingDecision& d) {
  // self is the first tensor of a forward op, the second of a backward op (after grad_output).
  const size_t self_pos = call.op().name().ends_with("_backward") ? 1 : 0;
  const int64_t plane_dims = call.tensor_ndim(self_pos) - nd;
  decide_by_options(call, d, n_out, [&](int64_t m) {
    RuleOptions opts;
    for (int64_t dim = 0; dim < plane_dims; ++dim) {
      bool any = false;
      for (size_t i = 0; i < call.num_inputs(); ++i) {
        const Placement& p = call.input(i).placement(m);
        any = any || (p.is_shard() && p.dim() == dim);
      }
      if (any) opts.push_back(uniform_option(call, n_out, Shard(dim)));
    }
    opts.push_back(uniform_option(call, n_out, Replicate()));
    return opts;
  });
}

const ShardingRule kMaxPool2d{"max pooling (batch and channel shards stay local)",
                              &pool_rule<2, 2>};
const ShardingRule kMaxPool3d{"max pooling (batch and channel shards stay local)",
                              &pool_rule<3, 2>};
const ShardingRule kPool2d{"pooling (batch and channel shards stay local)", &pool_rule<2, 1>};
const ShardingRule kPool3d{"pooling (batch and channel shards stay local)", &pool_rule<3, 1>};

const bool g_registered = [] {
  set_sharding_rule(ops::op_max_pool2d_with_indices.def, &kMaxPool2d);
  set_sharding_rule(ops::op_max_pool3d_with_indices.def, &kMaxPool3d);
  for (const OpDef* op : {&ops::op_max_pool2d_with_indices_backward.def, &ops::op_avg_pool2d.def,
                          &ops::op_avg_pool2d_backward.def, &ops::op_adaptive_avg_pool2d.def,
                          &ops::op_adaptive_avg_pool2d_backward.def})
    set_sharding_rule(*op, &kPool2d);
  for (const OpDef* op : {&ops::op_max_pool3d_with_indices_backward.def, &ops::op_avg_pool3d.def,
                          &ops::op_avg_pool3d_backward.def, &ops::op_adaptive_avg_pool3d.def,
                          &ops::op_adaptive_avg_pool3d_backward.def})
    set_sharding_rule(*op, &kPool3d);
  return true;
}();

}  // namespace
}  // namespace kiln::dtensor

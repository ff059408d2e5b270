// Sharding rules of the pooling ops (Note [Pooling placements]).
#include <algorithm>
#include <vector>

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
// Shard(d). A channel dim whose shards would be empty on some rank is gathered (a local op
// refuses an input without channels, as ATen's does; an empty batch shard is fine). Every other
// placement (a shard of a spatial dim, whose windows would cross shards; a Partial input, which max
// pooling does not commute with) is gathered to Replicate first.

// Whether chunking `size` along each mesh dim in `dims` (nested in mesh order, chunk's rule: See
// Note [Nested shards] in spec.cpp) leaves every rank a non-empty part.
bool no_empty_part(int64_t size, const DeviceMesh& mesh, const std::vector<int64_t>& dims) {
  std::vector<int64_t> parts{size};
  for (int64_t k : dims) {
    std::vector<int64_t> next;
    const int64_t n = mesh.size(k);
    for (int64_t s : parts) {
      const int64_t c = (s + n - 1) / n;
      for (int64_t i = 0; i < n; ++i) next.push_back(std::clamp<int64_t>(s - i * c, 0, c));
    }
    parts = std::move(next);
  }
  return std::all_of(parts.begin(), parts.end(), [](int64_t p) { return p > 0; });
}

template <int64_t nd, size_t n_out>
void pool_rule(const ShardingCall& call, ShardingDecision& d) {
  // self is the first tensor of a forward op, the second of a backward op (after grad_output).
  const size_t self_pos = call.op().name().ends_with("_backward") ? 1 : 0;
  const int64_t plane_dims = call.tensor_ndim(self_pos) - nd;
  decide_by_options(call, d, n_out, [&](int64_t m) {
    RuleOptions opts;
    for (int64_t dim = 0; dim < plane_dims; ++dim) {
      // The mesh dims that shard `dim` in some input, and m: the channel dim stays sharded only
      // if chunking it over all of them leaves no rank empty.
      bool any = false;
      std::vector<int64_t> along;
      for (int64_t k = 0; k < call.mesh_ndim(); ++k) {
        bool here = false;
        for (size_t i = 0; i < call.num_inputs(); ++i) {
          const Placement& p = call.input(i).placement(k);
          here = here || (p.is_shard() && p.dim() == dim);
        }
        if (here || k == m) along.push_back(k);
        if (k == m) any = here;
      }
      const bool channels = dim == plane_dims - 1;
      if (any && (!channels || no_empty_part(call.input(0).shape()[dim], call.mesh(), along)))
        opts.push_back(uniform_option(call, n_out, Shard(dim)));
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

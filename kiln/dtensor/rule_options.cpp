#include "kiln/dtensor/rule_options.h"

#include <fmt/ranges.h>

#include <limits>

namespace kiln::dtensor {

// Note [Choosing by bytes]
// Along one mesh dim an op usually has several ways to run locally: matrix products shard rows,
// columns or the contracted dim; pointwise ops follow whichever input is sharded. Each way fixes
// the placement every input needs, and moving an input there costs the bus bytes of the
// collective that does it (redistribute_bytes: an all-gather of the local shard, an all-reduce,
// nothing for a local chunk). The cheapest way wins; among equals, the one that changes fewest
// inputs (so replicated inputs give a replicated result rather than a free local chunk), then
// the rule's order: rules list first the ways that keep results sharded. Mesh
// dims are decided one after another, each on its own: a spec's placement along one mesh dim
// never changes what another mesh dim's move costs by more than its shard factor, which is as
// good as the greedy choice needs to be.

void decide_by_options(const ShardingCall& call, ShardingDecision& d, size_t n_outputs,
                       const std::function<RuleOptions(int64_t)>& options_for) {
  const size_t n = call.num_inputs();
  const int64_t mesh_ndim = call.mesh_ndim();
  d.inputs.assign(n, Placements(static_cast<size_t>(mesh_ndim), Replicate()));
  d.outputs.assign(n_outputs, Placements(static_cast<size_t>(mesh_ndim), Replicate()));
  for (int64_t m = 0; m < mesh_ndim; ++m) {
    const RuleOptions options = options_for(m);
    const RuleOption* best = nullptr;
    double best_cost = std::numeric_limits<double>::infinity();
    size_t best_changes = 0;
    for (const RuleOption& o : options) {
      KILN_ASSERT(o.in.size() == n && o.out.size() == n_outputs,
                  "[{}] a rule option has {} input and {} result placements for {} and {}",
                  call.op().name(), o.in.size(), o.out.size(), n, n_outputs);
      double cost = 0;
      size_t changes = 0;
      bool feasible = true;
      for (size_t i = 0; i < n && feasible; ++i) {
        const bool same = call.input(i).placement(m) == o.in[i];
        if (call.written(i) && !same) feasible = false;
        changes += same ? 0 : 1;
        cost += redistribute_bytes(call.input(i), m, o.in[i]);
      }
      if (!feasible) continue;
      if (!best || cost < best_cost || (cost == best_cost && changes < best_changes))
        best = &o, best_cost = cost, best_changes = changes;
    }
    if (!best)
      throw ValueError(fmt::format(
          "[{}] cannot keep the placements of the tensor it writes along mesh dim {}: inputs {}; "
          "redistribute it first, or use the functional form",
          call.op().name(), m, inputs_str(call)));
    for (size_t i = 0; i < n; ++i) d.inputs[i][m] = best->in[i];
    for (size_t r = 0; r < n_outputs; ++r) d.outputs[r][m] = best->out[r];
  }
}

RuleOption uniform_option(const ShardingCall& call, size_t n_outputs, const Placement& p) {
  return {std::vector<Placement>(call.num_inputs(), p), std::vector<Placement>(n_outputs, p)};
}

std::string inputs_str(const ShardingCall& call) {
  std::vector<std::string> parts;
  for (size_t i = 0; i < call.num_inputs(); ++i) parts.push_back(call.input(i).str());
  return fmt::format("{}", fmt::join(parts, "; "));
}

bool no_empty_chunk(const DTensorSpec& spec, int64_t dim) {
  const DeviceMesh& mesh = spec.mesh();
  Shape coord(static_cast<size_t>(mesh.ndim()), 0);
  while (true) {
    if (spec.local_shape_at(coord)[dim] == 0) return false;
    int64_t k = mesh.ndim() - 1;
    while (k >= 0 && ++coord[k] == mesh.size(k)) coord[k--] = 0;
    if (k < 0) return true;
  }
}

}  // namespace kiln::dtensor

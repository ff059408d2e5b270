#pragma once
// How most sharding rules decide (internal to kiln/dtensor's rules): one mesh dim at a time, a
// list of options — placements for every DTensor input and every result — of which the one whose
// inputs move the fewest bytes wins (ties: the earlier option, so rules list the options that
// keep results sharded first). An option that would change a written input's placement (in-place
// self, out=) is not feasible. See Note [Choosing by bytes] in rule_options.cpp.
#include <functional>
#include <vector>

#include "kiln/dtensor/sharding_rule.h"

namespace kiln::dtensor {

struct RuleOption {
  std::vector<Placement> in;   // one per DTensor input
  std::vector<Placement> out;  // one per result
};
using RuleOptions = std::vector<RuleOption>;

// Fills `d` from the options `options_for(m)` gives for each mesh dim m (each option's `in` has
// call.num_inputs() entries, `out` n_outputs). Raises a ValueError naming the op and the inputs
// when no option is feasible along some mesh dim.
void decide_by_options(const ShardingCall& call, ShardingDecision& d, size_t n_outputs,
                       const std::function<RuleOptions(int64_t mesh_dim)>& options_for);

// Every input and result placed `p` along the mesh dim (Replicate() for "replicate everything").
RuleOption uniform_option(const ShardingCall& call, size_t n_outputs, const Placement& p);

// Whether every rank's shard of `spec` has at least one element along tensor dim `dim` (the same
// answer on every rank).
bool no_empty_chunk(const DTensorSpec& spec, int64_t dim);

// "[S(0), R]; [R, R]": the inputs' placements, for messages.
std::string inputs_str(const ShardingCall& call);

}  // namespace kiln::dtensor

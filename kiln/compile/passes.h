#pragma once
// Graph passes: dead-code and common-subexpression elimination, no-op removal, and memory
// planning. See DESIGN.md "Compile" step 3.
#include <cstddef>
#include <vector>

#include "kiln/compile/graph.h"

namespace kiln::compiler {

struct PassReport {
  int nodes_traced = 0;
  int dead_removed = 0;    // nodes whose results nobody used
  int cse_merged = 0;      // nodes equal to an earlier one on unchanged inputs
  int noops_removed = 0;   // copies of a value onto itself
  int views_resolved = 0;  // view nodes, which become fixed geometry at compile time
};

// Drops nodes without effects (writes, host reads, random draws) whose outputs are unused.
int eliminate_dead_code(Graph& g);
// Merges a side-effect-free node into an earlier identical one (same op, same attributes, same
// input values, and no write to any buffer involved in between).
int eliminate_common_subexpressions(Graph& g);
// Removes copy_(x, x)-style nodes whose source and destination are one value.
int remove_noops(Graph& g);
// All of the above, in order.
PassReport run_passes(Graph& g);

// Note [Memory planning]
// Intermediate buffers that the executable owns (not inputs, free tensors, constants, outputs,
// or buffers a kernel allocates itself) are packed into one arena. A buffer lives from the
// step that makes it to the last step that reads or writes any value in it (inclusive, so a
// step's inputs and outputs never share bytes); buffers whose lifetimes overlap get disjoint
// byte ranges, placed greedily, largest first, at the lowest offset that fits.
struct MemoryPlan {
  std::vector<size_t> offset;  // per buffer; SIZE_MAX when not in the arena
  size_t arena_bytes = 0;
  size_t sum_bytes = 0;  // what the same buffers would take without reuse
};
inline constexpr size_t kArenaAlign = 64;
// `in_arena[b]` says which buffers to place; liveness comes from the node order of `g`.
MemoryPlan plan_memory(const Graph& g, const std::vector<bool>& in_arena);

}  // namespace kiln::compiler

#pragma once
// Redistribute: moving a DTensor from one placement to another on the same mesh, planned once
// per (source spec, target spec) and cached. See Note [Redistribute plans] in redistribute.cpp.
#include <memory>
#include <vector>

#include "kiln/core/tensor.h"
#include "kiln/dtensor/spec.h"

namespace kiln::dtensor {

// What one step does along its mesh dim.
enum class StepKind : uint8_t {
  AllGather,      // Shard(d) -> Replicate
  AllReduce,      // Partial(op) -> Replicate
  ReduceScatter,  // Partial(op) -> Shard(d)
  AllToAll,       // Shard(d) -> Shard(e)
  LocalChunk,     // Replicate -> Shard(d): this rank's chunk, no communication
  LocalPartial,   // Replicate -> Partial(op): no communication
};
std::string_view step_kind_name(StepKind k);

// One step: the local tensor of `before` becomes that of `after`; the two specs differ at
// `mesh_dim` only. A backward walks a plan's steps in reverse.
struct RedistributeStep {
  StepKind kind;
  int64_t mesh_dim;
  const DTensorSpec* before;
  const DTensorSpec* after;
};

struct RedistributePlan {
  const DTensorSpec* from;
  const DTensorSpec* to;
  std::vector<RedistributeStep> steps;  // empty when from == to
};

// The plan from `from` to `to` (same mesh, shape, strides and dtype; a ValueError otherwise),
// made on the first call and cached (bounded: see Note [Redistribute plans]). Thread-safe.
std::shared_ptr<const RedistributePlan> plan_redistribute(const DTensorSpec& from,
                                                          const DTensorSpec& to);
// Runs `plan` on this rank's local tensor of plan.from; returns the local tensor of plan.to.
// Collective: every rank of the mesh runs the same plan.
Tensor run_redistribute(const Tensor& local, const RedistributePlan& plan);

// `t` (a DTensor) with `placements` on its mesh; differentiable (its backward is the identity on
// global values: Note [Gradients of DTensors] in dtensor_autograd.cpp).
Tensor redistribute(const Tensor& t, ArrayRef<Placement> placements);

// How many plans the cache holds now.
size_t redistribute_plan_cache_size();

}  // namespace kiln::dtensor

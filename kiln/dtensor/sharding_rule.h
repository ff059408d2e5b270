#pragma once
// Sharding rules: how an op's placements propagate (DESIGN.md "Distributed"; Note [The Sharded
// layer] in sharded_layer.cpp). A rule looks at the specs of a call's DTensor arguments and its
// other arguments, and decides which placements each DTensor argument must have when the local
// op runs (the layer redistributes those that differ) and which placements each result has.
// Shapes are not the rule's business: the layer gets the global result shapes from the op's meta
// function. A decision is cached per (op, input specs, the arguments that can change it: Note
// [What keys a decision]), so a rule runs once per distinct call.
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <string_view>
#include <utility>
#include <vector>

#include "kiln/dispatch/ivalue.h"
#include "kiln/dispatch/op.h"
#include "kiln/dtensor/spec.h"

namespace kiln::dtensor {

// One call as a rule sees it.
class ShardingCall {
 public:
  ShardingCall(const OpDef& op, const Stack& args, std::vector<const DTensorSpec*> inputs,
               std::vector<size_t> positions, std::vector<bool> written)
      : op_(op),
        args_(args),
        inputs_(std::move(inputs)),
        positions_(std::move(positions)),
        written_(std::move(written)) {}

  const OpDef& op() const { return op_; }
  // The call's arguments in schema order, DTensors in place.
  const Stack& args() const { return args_; }
  // The DTensor arguments, in stack order (a TensorList's elements one by one).
  size_t num_inputs() const { return inputs_.size(); }
  const DTensorSpec& input(size_t i) const { return *inputs_[i]; }
  // The stack position of DTensor input i.
  size_t position(size_t i) const { return positions_[i]; }
  // Whether the op writes input i (in-place self, out=): its placements cannot change.
  bool written(size_t i) const { return written_[i]; }
  // The DTensor input at stack position `pos` (the first element for a list), or -1.
  int64_t input_at(size_t pos) const;
  const DeviceMesh& mesh() const { return inputs_[0]->mesh(); }
  int64_t mesh_ndim() const { return mesh().ndim(); }

  // Non-tensor arguments by stack position.
  int64_t int_arg(size_t pos) const;
  bool bool_arg(size_t pos) const;
  IntArrayRef ints_arg(size_t pos) const;
  bool is_none(size_t pos) const;
  // The ndim of the tensor at `pos` (a DTensor's global ndim, or a wrapped number's 0).
  int64_t tensor_ndim(size_t pos) const;

 private:
  const OpDef& op_;
  const Stack& args_;
  std::vector<const DTensorSpec*> inputs_;
  std::vector<size_t> positions_;
  std::vector<bool> written_;
};

// What a rule decides for one call.
struct ShardingDecision {
  // The placements each DTensor input must have when the local op runs (one per input).
  std::vector<Placements> inputs;
  // The placements of each tensor result, in order (none for in-place and out= forms, whose
  // results are their written arguments).
  std::vector<Placements> outputs;
  // Non-tensor arguments the local op gets instead of the call's (global) ones, by stack
  // position: a view's size is the local shape, say.
  std::vector<std::pair<size_t, IValue>> local_args;
  // Stack positions whose argument becomes result 0's local shape (a view's `size`, expand's):
  // the layer fills them in once the result's spec is known.
  std::vector<size_t> local_shape_args;
  // When set, runs instead of the op on the local arguments (already redistributed and swapped
  // in; called below Sharded) and leaves the local results on the stack, as the op would: for
  // ops whose local form is not the op itself (a row-sharded embedding's masked lookup). It may
  // capture what the rule knew (this rank's offsets): a decision is this process's own.
  std::function<void(Stack& stack)> local_run;
};

using ShardingRuleFn = void (*)(const ShardingCall& call, ShardingDecision& d);

// Note [What keys a decision]: besides the op and its DTensors' specs, every argument that can
// change a result's shape, dtype or placements keys the cached decision: ints, int lists, bools,
// dtypes, devices, None-ness, the kind of each Scalar and the dtype of each wrapped number. A
// Scalar's or a float's value does not (add's alpha, clamp's bounds, layer_norm's eps), so a
// rule must not decide by one.
struct ShardingRule {
  std::string_view name;  // "pointwise", "mm", ...; in error messages and docs
  ShardingRuleFn fn = nullptr;
};

// Installs `rule` for `op`. Rules are registered at start-up (static initialisers), before any
// thread dispatches.
void set_sharding_rule(const OpDef& op, const ShardingRule* rule);
// The rule of `op`, or null.
const ShardingRule* sharding_rule_of(const OpDef& op);

// Why an op has no rule on purpose (collectives, factories, ...); null when it has no such
// reason. The coverage test requires every op to have a rule or a reason.
void set_sharding_exclusion(const OpDef& op, std::string_view reason);
std::string_view sharding_exclusion_of(const OpDef& op);

// The Sharded layer's decision cache (Note [The decision cache] in sharded_layer.cpp): entries
// kept, decisions made (misses), and decisions used once because the cache had no room.
struct DecisionCacheStats {
  size_t entries = 0;
  uint64_t misses = 0;
  uint64_t uncached = 0;
};
DecisionCacheStats decision_cache_stats();

// ---------------------------------------------------------------- helpers for rules

// Bytes moved by changing `spec`'s placement along `mesh_dim` to `to` (nccl-tests' bus bytes of
// the collective that does it; 0 for local steps). Changing a Shard or Partial to another
// Shard or Partial kind counts the way through Replicate. Priced on the average shard, so every
// rank gets the same number (rules must decide alike on every rank: their decisions run
// collectives).
double redistribute_bytes(const DTensorSpec& spec, int64_t mesh_dim, const Placement& to);

// `n` Replicates.
inline Placements replicated(int64_t n) { return Placements(static_cast<size_t>(n), Replicate()); }

}  // namespace kiln::dtensor

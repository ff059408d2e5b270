// Sharding rules of the foreach (multi-tensor) ops and the fused AdamW step. See Note [Foreach
// placements].
#include <cstdint>

#include <fmt/format.h>

#include "kiln/dtensor/rule_options.h"
#include "kiln/ops/op_list.h"

namespace kiln::dtensor {
namespace {

// Note [Foreach placements]
// A foreach op is a pointwise op per index k over its lists' k-th elements, which all have
// self[k]'s shape. self (the written parameters, for an in-place form) sets the placements:
// every other list's k-th element is redistributed to self[k]'s (a Partial gradient is
// reduce-scattered into a sharded parameter's placement, or all-reduced for a replicated one),
// and the local op runs once over all the local tensors. foreach_adamw_'s other written lists
// (exp_avg, exp_avg_sq) must already have their parameter's placements (the layer refuses to
// redistribute what an op writes); its step counts, lr and found_inf are 0-d and replicated.
// amp_non_finite_check_and_unscale_ is a linear foreach op (a product by a scalar) whose
// found_inf and inv_scale are 0-d and replicated: its local op sets found_inf from the local
// shards only, so the caller all-reduces it (max) to make it whole again (GradScaler does; Note
// [Loss scaling on the device] in kiln/amp/grad_scaler.cpp). amp_update_scale_ takes 0-d
// tensors only, all replicated.
// A Partial self may stay Partial only where the op is linear in its lists together
// (foreach_add_, foreach_mul_ by a scalar, foreach_lerp_) and the reduction is sum or avg; the
// other in-place forms raise (a Partial parameter is reduced first, by the caller), and
// foreach_sqrt, which writes nothing, reduces it to Replicate.
enum class Kind { Linear, InPlace, Functional };

Placements self_target(const DTensorSpec& s, Kind kind, const ShardingCall& call, size_t k) {
  Placements p(s.placements().begin(), s.placements().end());
  for (Placement& x : p) {
    if (!x.is_partial()) continue;
    const bool linear = x.reduce_op() == ReduceOp::Sum || x.reduce_op() == ReduceOp::Avg;
    if (kind == Kind::Functional) {
      x = Replicate();
    } else if (kind == Kind::InPlace || !linear) {
      throw ValueError(fmt::format(
          "[{}] self[{}] is {}: the op is not linear in a Partial tensor it writes; reduce it "
          "first (redistribute to Replicate or Shard). Inputs: {}",
          call.op().name(), k, s.str(), inputs_str(call)));
    }
  }
  return p;
}

template <Kind K>
void foreach_rule(const ShardingCall& call, ShardingDecision& d) {
  const size_t n = call.num_inputs();
  const int64_t mesh_ndim = call.mesh_ndim();
  // Input i's element index within its list (lists' elements come in order, one list after
  // another); self is the list at stack position 0.
  std::vector<size_t> elem(n);
  size_t n_self = 0;
  for (size_t i = 0; i < n; ++i) {
    elem[i] = i > 0 && call.position(i) == call.position(i - 1) ? elem[i - 1] + 1 : 0;
    if (call.position(i) == 0) ++n_self;
  }
  const std::vector<IValue>& args = call.args();
  const size_t list_len = std::get<TensorList>(args[0]).size();
  KILN_CHECK(n_self == list_len,
             "[{}] every tensor of self must be a DTensor when any argument is one (got {} of "
             "{}). Inputs: {}",
             call.op().name(), n_self, list_len, inputs_str(call));
  std::vector<Placements> self(n_self);
  for (size_t k = 0; k < n_self; ++k) self[k] = self_target(call.input(k), K, call, k);
  // Arguments from this position on are 0-d and replicated: foreach_adamw_'s step counts (4),
  // lr (5) and found_inf (10); amp_non_finite_check_and_unscale_'s found_inf and inv_scale.
  const size_t first_scalar = &call.op() == &ops::op_foreach_adamw_.def ? 4
                              : &call.op() == &ops::op_amp_non_finite_check_and_unscale_.def
                                  ? 1
                                  : SIZE_MAX;
  d.inputs.resize(n);
  for (size_t i = 0; i < n; ++i) {
    const size_t pos = call.position(i);
    const bool scalar = pos >= first_scalar;
    KILN_CHECK(scalar || elem[i] < n_self, "[{}] list {} is longer than self ({} tensors)",
               call.op().name(), pos, n_self);
    d.inputs[i] = scalar ? replicated(mesh_ndim) : self[elem[i]];
  }
  if (K == Kind::Functional) d.outputs = self;
}

const ShardingRule kLinear{"foreach (self's placements; linear in Partial self)",
                           &foreach_rule<Kind::Linear>};
const ShardingRule kInPlace{"foreach (self's placements)", &foreach_rule<Kind::InPlace>};
const ShardingRule kFunctional{"foreach (self's placements, Partial reduced)",
                               &foreach_rule<Kind::Functional>};

void replicated_rule(const ShardingCall& call, ShardingDecision& d) {
  d.inputs.assign(call.num_inputs(), replicated(call.mesh_ndim()));
}
const ShardingRule kReplicated{"0-d tensors, replicated", &replicated_rule};

const bool g_registered = [] {
  set_sharding_rule(ops::op_foreach_add_.def, &kLinear);
  set_sharding_rule(ops::op_foreach_mul_.def, &kLinear);
  set_sharding_rule(ops::op_foreach_lerp_.def, &kLinear);
  set_sharding_rule(ops::op_foreach_mul_list_.def, &kInPlace);
  set_sharding_rule(ops::op_foreach_addcmul_.def, &kInPlace);
  set_sharding_rule(ops::op_foreach_addcdiv_.def, &kInPlace);
  set_sharding_rule(ops::op_foreach_sqrt_.def, &kInPlace);
  set_sharding_rule(ops::op_foreach_adamw_.def, &kInPlace);
  set_sharding_rule(ops::op_foreach_sqrt.def, &kFunctional);
  set_sharding_rule(ops::op_amp_non_finite_check_and_unscale_.def, &kLinear);
  set_sharding_rule(ops::op_amp_update_scale_.def, &kReplicated);
  return true;
}();

}  // namespace
}  // namespace kiln::dtensor

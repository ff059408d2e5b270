#include "kiln/ops/op_list.h"

#include <algorithm>

namespace kiln::ops {

// Each form points at its siblings (Note [Op variants] in kiln/dispatch/op.h).
#define KILN_POINTWISE_VARIANTS(name) \
  { &op_##name.def, &op_##name##_.def, &op_##name##_out.def }
#define KILN_STRUCTURED_VARIANTS(name) \
  { &op_##name.def, nullptr, &op_##name##_out.def }
#define KILN_DEFINE_POINTWISE(name, ARGS, schema)                                          \
  constinit TypedOp<Tensor ARGS> op_##name{#name, schema " -> Tensor", OpKind::Functional, \
                                           KILN_POINTWISE_VARIANTS(name)};                 \
  constinit TypedOp<void ARGS> op_##name##_{#name "_", schema " -> ()", OpKind::InPlace,   \
                                            KILN_POINTWISE_VARIANTS(name)};                \
  constinit TypedOp<void(const Tensor&, KILN_EXPAND ARGS)> op_##name##_out{                \
      #name "_out", "out=" schema " -> ()", OpKind::Out, KILN_POINTWISE_VARIANTS(name)};
#define KILN_DEFINE_STRUCTURED(name, ARGS, schema)                                         \
  constinit TypedOp<Tensor ARGS> op_##name{#name, schema " -> Tensor", OpKind::Functional, \
                                           KILN_STRUCTURED_VARIANTS(name)};                \
  constinit TypedOp<void(const Tensor&, KILN_EXPAND ARGS)> op_##name##_out{                \
      #name "_out", "out=" schema " -> ()", OpKind::Out, KILN_STRUCTURED_VARIANTS(name)};
// Of the other ops, only the collectives have several forms.
constexpr OpVariants other_variants(std::string_view name) {
  if (name == "all_reduce" || name == "all_reduce_")
    return {&op_all_reduce.def, &op_all_reduce_.def, nullptr};
  if (name == "broadcast" || name == "broadcast_")
    return {&op_broadcast.def, &op_broadcast_.def, nullptr};
  if (name == "all_gather_into_tensor" || name == "all_gather_into_tensor_out")
    return {&op_all_gather_into_tensor.def, nullptr, &op_all_gather_into_tensor_out.def};
  if (name == "reduce_scatter_tensor" || name == "reduce_scatter_tensor_out")
    return {&op_reduce_scatter_tensor.def, nullptr, &op_reduce_scatter_tensor_out.def};
  if (name == "all_to_all_single" || name == "all_to_all_single_out")
    return {&op_all_to_all_single.def, nullptr, &op_all_to_all_single_out.def};
  return {};
}
#define KILN_DEFINE_OTHER(name, kind, sig, schema) \
  constinit TypedOp<sig> op_##name{#name, schema, OpKind::kind, other_variants(#name)};

KILN_FORALL_POINTWISE(KILN_DEFINE_POINTWISE)
KILN_FORALL_STRUCTURED(KILN_DEFINE_STRUCTURED)
KILN_FORALL_OTHER_OPS(KILN_DEFINE_OTHER)

std::span<OpDef* const> all_ops() {
#define KILN_LIST_POINTWISE(name, ARGS, schema) \
  &op_##name.def, &op_##name##_.def, &op_##name##_out.def,
#define KILN_LIST_STRUCTURED(name, ARGS, schema) &op_##name.def, &op_##name##_out.def,
#define KILN_LIST_OTHER(name, kind, sig, schema) &op_##name.def,
  static OpDef* const ops[] = {KILN_FORALL_POINTWISE(KILN_LIST_POINTWISE) KILN_FORALL_STRUCTURED(
      KILN_LIST_STRUCTURED) KILN_FORALL_OTHER_OPS(KILN_LIST_OTHER)};
  return ops;
}

const OpDef* find_op(std::string_view name) {
  for (OpDef* op : all_ops())
    if (op->name() == name) return op;
  return nullptr;
}

}  // namespace kiln::ops

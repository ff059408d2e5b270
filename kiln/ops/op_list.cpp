#include "kiln/ops/op_list.h"

#include <algorithm>

namespace kiln::ops {

#define KILN_DEFINE_POINTWISE(name, ARGS, schema)                                           \
  constinit TypedOp<Tensor ARGS> name##_op{#name, schema " -> Tensor", OpKind::Functional}; \
  constinit TypedOp<void ARGS> name##__op{#name "_", schema " -> ()", OpKind::InPlace};     \
  constinit TypedOp<void(const Tensor&, KILN_EXPAND ARGS)> name##_out_op{                   \
      #name "_out", "out=" schema " -> ()", OpKind::Out};
#define KILN_DEFINE_STRUCTURED(name, ARGS, schema)                                          \
  constinit TypedOp<Tensor ARGS> name##_op{#name, schema " -> Tensor", OpKind::Functional}; \
  constinit TypedOp<void(const Tensor&, KILN_EXPAND ARGS)> name##_out_op{                   \
      #name "_out", "out=" schema " -> ()", OpKind::Out};
#define KILN_DEFINE_OTHER(name, kind, sig, schema) \
  constinit TypedOp<sig> name##_op{#name, schema, OpKind::kind};

KILN_FORALL_POINTWISE(KILN_DEFINE_POINTWISE)
KILN_FORALL_STRUCTURED(KILN_DEFINE_STRUCTURED)
KILN_FORALL_OTHER_OPS(KILN_DEFINE_OTHER)

std::span<OpDef* const> all_ops() {
#define KILN_LIST_POINTWISE(name, ARGS, schema) &name##_op.def, &name##__op.def, &name##_out_op.def,
#define KILN_LIST_STRUCTURED(name, ARGS, schema) &name##_op.def, &name##_out_op.def,
#define KILN_LIST_OTHER(name, kind, sig, schema) &name##_op.def,
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

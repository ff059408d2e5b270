// How the Python module exposes each op (PythonExposure, Note [Op record fields for later
// layers] in kiln/dispatch/op.h): a rule by the op's kind and name, with the exceptions listed.
// The module (python/src/op_bindings.cpp) binds what this says; OpRecordTest.PythonExposureCoverage
// requires every op to have a value.
#include <algorithm>
#include <array>
#include <string_view>

#include "kiln/ops/op_list.h"

namespace kiln::ops {
namespace {

// Not bound: reached another way.
constexpr std::array<std::string_view, 19> kInternal = {
    // collectives take a process group's id and size: kiln.distributed binds them
    "all_reduce", "all_reduce_", "all_gather_into_tensor", "reduce_scatter_tensor", "broadcast",
    "broadcast_", "all_to_all_single", "send", "recv_", "barrier",
    // loss scaling's kernels: kiln.amp.GradScaler calls them
    "amp_non_finite_check_and_unscale_", "amp_update_scale_",
    // fused AdamW: kiln.optim.AdamW calls it
    "foreach_adamw_",
    // the product with a GELU epilogue: linear_gelu's kernel
    "addmm_gelu",
    // the dtype/direction-split forms behind div(rounding_mode=...) and squeeze(dim=[...])
    "div_trunc", "div_floor", "squeeze_dims",
    // the ATen-compatible attention kernel: scaled_dot_product_attention picks it
    "flash_attention",
    // dropout's kernel: dropout() picks it
    "native_dropout"};

// Functions only (no Tensor method): ops over lists and ops whose first tensor is not the one
// a method would be called on.
constexpr std::array<std::string_view, 3> kFunctionOnly = {"cat", "where", "embedding"};

PythonExposure exposure_of(const OpDef& op) {
  std::string_view name = op.name();
  if (op.kind() == OpKind::Out) return PythonExposure::Internal;  // reached through out=
  if (name.ends_with("_backward") || std::ranges::find(kInternal, name) != kInternal.end())
    return PythonExposure::Internal;
  if (op.kind() == OpKind::Factory || name.starts_with("foreach_") ||
      std::ranges::find(kFunctionOnly, name) != kFunctionOnly.end())
    return PythonExposure::Function;
  // An in-place pointwise form whose functional form is internal is internal too.
  if (const OpDef* f = op.functional_variant();
      f && f != &op && exposure_of(*f) == PythonExposure::Internal)
    return PythonExposure::Internal;
  return PythonExposure::FunctionAndMethod;
}

[[maybe_unused]] const bool registered = [] {
  for (OpDef* op : all_ops()) op->set_python_exposure(exposure_of(*op));
  return true;
}();

}  // namespace
}  // namespace kiln::ops

// Meta functions of the pointwise ops, and their kernels on the meta device.
#include "kiln/ops/meta.h"
#include "kiln/ops/structured.h"

namespace kiln::meta {

namespace {
TensorSpec binary_spec(const char* op, const Tensor& a, const Tensor& b, DType dtype) {
  check_defined(op, a, "self");
  check_defined(op, b, "other");
  // Fast path: same device, same sizes.
  if (a.device() == b.device() && a.dim() == b.dim()) {
    bool same = true;
    for (int64_t i = 0; i < a.dim(); ++i) same = same && a.sizes()[i] == b.sizes()[i];
    if (same) return {Shape(a.sizes()), dtype, a.device()};
  }
  Device dev = common_device(op, {&a, &b});
  return {broadcast_shapes(op, a.sizes(), b.sizes()), dtype, dev};
}
void check_alpha(const char* op, DType result, const Scalar& alpha) {
  KILN_CHECK_TYPE(result == kBool || !alpha.is_bool(),
                  "[{}] boolean alpha is only supported for boolean results", op);
  KILN_CHECK_TYPE(is_floating(result) || !alpha.is_floating(),
                  "[{}] for integral input tensors, alpha must not be a floating point number "
                  "(got {})",
                  op, alpha);
}
TensorSpec unary_spec(const char* op, const Tensor& a, DType dtype) {
  check_defined(op, a, "self");
  return {Shape(a.sizes()), dtype, a.device()};
}
TensorSpec unary_no_bool(const char* op, const Tensor& a, const char* hint) {
  check_defined(op, a, "self");
  KILN_CHECK_TYPE(a.dtype() != kBool, "[{}] not supported on bool tensors{}", op, hint);
  return unary_spec(op, a, a.dtype());
}
}  // namespace

TensorSpec add(const Tensor& a, const Tensor& b, const Scalar& alpha) {
  TensorSpec s = binary_spec("add", a, b, result_type(a, b));
  check_alpha("add", s.dtype, alpha);
  return s;
}
TensorSpec sub(const Tensor& a, const Tensor& b, const Scalar& alpha) {
  TensorSpec s = binary_spec("sub", a, b, result_type(a, b));
  KILN_CHECK_TYPE(a.dtype() != kBool && b.dtype() != kBool,
                  "[sub] subtraction with a bool tensor is not supported; use logical_xor() "
                  "instead");
  check_alpha("sub", s.dtype, alpha);
  return s;
}
TensorSpec mul(const Tensor& a, const Tensor& b) {
  return binary_spec("mul", a, b, result_type(a, b));
}
TensorSpec div(const Tensor& a, const Tensor& b) {
  return binary_spec("div", a, b, float_result(result_type(a, b)));
}
TensorSpec pow(const Tensor& a, const Tensor& b) {
  TensorSpec s = binary_spec("pow", a, b, result_type(a, b));
  KILN_CHECK_TYPE(s.dtype != kBool, "[pow] not supported for bool tensors");
  return s;
}
TensorSpec maximum(const Tensor& a, const Tensor& b) {
  return binary_spec("maximum", a, b, result_type(a, b));
}
TensorSpec minimum(const Tensor& a, const Tensor& b) {
  return binary_spec("minimum", a, b, result_type(a, b));
}
TensorSpec atan2(const Tensor& a, const Tensor& b) {
  return binary_spec("atan2", a, b, float_result(result_type(a, b)));
}
// fmod, remainder and the rounding divisions: in the promoted dtype, never bool.
#define KILN_DIVISION_META(name)                                                     \
  TensorSpec name(const Tensor& a, const Tensor& b) {                                \
    TensorSpec s = binary_spec(#name, a, b, result_type(a, b));                      \
    KILN_CHECK_TYPE(s.dtype != kBool, "[{}] not supported for bool tensors", #name); \
    return s;                                                                        \
  }
KILN_DIVISION_META(fmod)
KILN_DIVISION_META(remainder)
KILN_DIVISION_META(div_trunc)
KILN_DIVISION_META(div_floor)
#undef KILN_DIVISION_META
// The bitwise ops take bool and integer dtypes only.
#define KILN_BITWISE_META(name)                                                                \
  TensorSpec name(const Tensor& a, const Tensor& b) {                                          \
    TensorSpec s = binary_spec(#name, a, b, result_type(a, b));                                \
    KILN_CHECK_TYPE(!is_floating(s.dtype),                                                     \
                    "[{}] only bool and integer tensors are supported, got {} and {} (result " \
                    "{})",                                                                     \
                    #name, a.dtype(), b.dtype(), s.dtype);                                     \
    return s;                                                                                  \
  }
KILN_BITWISE_META(bitwise_and)
KILN_BITWISE_META(bitwise_or)
KILN_BITWISE_META(bitwise_xor)
#undef KILN_BITWISE_META
TensorSpec bitwise_not(const Tensor& a) {
  check_defined("bitwise_not", a, "self");
  KILN_CHECK_TYPE(!is_floating(a.dtype()),
                  "[bitwise_not] only bool and integer tensors are supported, got {}", a.dtype());
  return unary_spec("bitwise_not", a, a.dtype());
}
#define KILN_BOOL_BINARY_META(name) \
  TensorSpec name(const Tensor& a, const Tensor& b) { return binary_spec(#name, a, b, kBool); }
KILN_BOOL_BINARY_META(eq)
KILN_BOOL_BINARY_META(ne)
KILN_BOOL_BINARY_META(lt)
KILN_BOOL_BINARY_META(le)
KILN_BOOL_BINARY_META(gt)
KILN_BOOL_BINARY_META(ge)
KILN_BOOL_BINARY_META(logical_and)
KILN_BOOL_BINARY_META(logical_or)
KILN_BOOL_BINARY_META(logical_xor)
#undef KILN_BOOL_BINARY_META

TensorSpec neg(const Tensor& a) { return unary_no_bool("neg", a, "; use logical_not() instead"); }
TensorSpec abs(const Tensor& a) { return unary_no_bool("abs", a, ""); }
TensorSpec relu(const Tensor& a) { return unary_no_bool("relu", a, ""); }
#define KILN_FLOAT_UNARY_META(name) \
  TensorSpec name(const Tensor& a) { return unary_spec(#name, a, float_result(a.dtype())); }
KILN_FLOAT_UNARY_META(exp)
KILN_FLOAT_UNARY_META(log)
KILN_FLOAT_UNARY_META(sqrt)
KILN_FLOAT_UNARY_META(rsqrt)
KILN_FLOAT_UNARY_META(tanh)
KILN_FLOAT_UNARY_META(sigmoid)
KILN_FLOAT_UNARY_META(sin)
KILN_FLOAT_UNARY_META(cos)
KILN_FLOAT_UNARY_META(erf)
KILN_FLOAT_UNARY_META(acos)
KILN_FLOAT_UNARY_META(acosh)
KILN_FLOAT_UNARY_META(asin)
KILN_FLOAT_UNARY_META(asinh)
KILN_FLOAT_UNARY_META(atan)
KILN_FLOAT_UNARY_META(atanh)
KILN_FLOAT_UNARY_META(cosh)
KILN_FLOAT_UNARY_META(sinh)
KILN_FLOAT_UNARY_META(tan)
KILN_FLOAT_UNARY_META(expm1)
KILN_FLOAT_UNARY_META(log1p)
KILN_FLOAT_UNARY_META(log2)
KILN_FLOAT_UNARY_META(log10)
KILN_FLOAT_UNARY_META(reciprocal)
#undef KILN_FLOAT_UNARY_META
TensorSpec silu(const Tensor& a) {
  check_defined("silu", a, "self");
  KILN_CHECK_TYPE(is_floating(a.dtype()), "[silu] expected a floating-point tensor, got {}",
                  a.dtype());
  return unary_spec("silu", a, a.dtype());
}
TensorSpec gelu(const Tensor& a, bool) {
  check_defined("gelu", a, "self");
  KILN_CHECK_TYPE(is_floating(a.dtype()), "[gelu] expected a floating-point tensor, got {}",
                  a.dtype());
  return unary_spec("gelu", a, a.dtype());
}
TensorSpec logical_not(const Tensor& a) { return unary_spec("logical_not", a, kBool); }
// Note [Rounding integers]
// ceil, floor, round and trunc keep an integer tensor as it is (its values are already whole),
// as PyTorch does; bool tensors are refused, as by ATen's kernels.
TensorSpec ceil(const Tensor& a) { return unary_no_bool("ceil", a, ""); }
TensorSpec floor(const Tensor& a) { return unary_no_bool("floor", a, ""); }
TensorSpec round(const Tensor& a) { return unary_no_bool("round", a, ""); }
TensorSpec trunc(const Tensor& a) { return unary_no_bool("trunc", a, ""); }
TensorSpec sign(const Tensor& a) { return unary_spec("sign", a, a.dtype()); }
TensorSpec isnan(const Tensor& a) { return unary_spec("isnan", a, kBool); }
TensorSpec isinf(const Tensor& a) { return unary_spec("isinf", a, kBool); }
TensorSpec hardtanh(const Tensor& a, const Scalar& lo, const Scalar& hi) {
  check_defined("hardtanh", a, "self");
  KILN_CHECK_TYPE(a.dtype() != kBool, "[hardtanh] not supported on bool tensors");
  KILN_CHECK(a.dtype() != kUInt8 || (lo.to_double() >= 0 && hi.to_double() >= 0),
             "[hardtanh] cannot do hardtanh on an unsigned type with negative limits (min_val {}, "
             "max_val {})",
             lo, hi);
  return unary_spec("hardtanh", a, a.dtype());
}
TensorSpec leaky_relu(const Tensor& a, const Scalar&) {
  check_defined("leaky_relu", a, "self");
  KILN_CHECK_TYPE(is_floating(a.dtype()), "[leaky_relu] expected a floating-point tensor, got {}",
                  a.dtype());
  return unary_spec("leaky_relu", a, a.dtype());
}

TensorSpec clamp(const Tensor& a, const OptScalar& lo, const OptScalar& hi) {
  check_defined("clamp", a, "self");
  KILN_CHECK(lo || hi, "[clamp] at least one of 'min' or 'max' must be given");
  KILN_CHECK_TYPE(a.dtype() != kBool, "[clamp] not supported on bool tensors");
  DType t = a.dtype();
  // Bounds promote like wrapped numbers: a float bound makes an integer tensor float.
  for (const auto& b : {lo, hi})
    if (b && b->is_floating() && !is_floating(t)) t = default_dtype();
  return {Shape(a.sizes()), t, a.device()};
}

TensorSpec where(const Tensor& cond, const Tensor& a, const Tensor& b) {
  check_defined("where", cond, "condition");
  KILN_CHECK_TYPE(cond.dtype() == kBool, "[where] condition must be a bool tensor, got {}",
                  cond.dtype());
  TensorSpec s = binary_spec("where", a, b, result_type(a, b));
  s.device = common_device("where", {&cond, &a, &b});
  s.sizes = broadcast_shapes("where", cond.sizes(), s.sizes);
  return s;
}

}  // namespace kiln::meta

namespace kiln::detail {
namespace {
#define KILN_REGISTER_META_POINTWISE(name, ARGS, schema)                                      \
  ops::op_##name.def.set_meta_raw(reinterpret_cast<void*>(&meta::name));                      \
  ops::op_##name##_.def.set_meta_raw(reinterpret_cast<void*>(&meta::name));                   \
  ops::op_##name##_out.def.set_meta_raw(reinterpret_cast<void*>(&meta::name));                \
  {                                                                                           \
    using S = Structured<decltype(ops::op_##name)::Sig>;                                      \
    ops::op_##name.set_kernel(DispatchKey::Meta, &S::functional<&meta::name, &S::no_data>);   \
    ops::op_##name##_.set_kernel(DispatchKey::Meta,                                           \
                                 &S::inplace<ops::op_##name##_, &meta::name, &S::no_data>);   \
    ops::op_##name##_out.set_kernel(DispatchKey::Meta,                                        \
                                    &S::out<ops::op_##name##_out, &meta::name, &S::no_data>); \
  }
const bool registered = [] {
  KILN_FORALL_POINTWISE(KILN_REGISTER_META_POINTWISE)
  return true;
}();
}  // namespace
}  // namespace kiln::detail

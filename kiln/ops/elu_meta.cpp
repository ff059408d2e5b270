// Meta functions of elu and elu_backward (their meta kernels come from the op list's X-macros
// in meta_pointwise.cpp and meta_structured.cpp).
#include "kiln/ops/meta.h"

namespace kiln::meta {

TensorSpec elu(const Tensor& a, const Scalar&, const Scalar&, const Scalar&) {
  check_defined("elu", a, "self");
  KILN_CHECK_TYPE(is_floating(a.dtype()), "[elu] expected a floating-point tensor, got {}",
                  a.dtype());
  return {Shape(a.sizes()), a.dtype(), a.device()};
}

TensorSpec elu_backward(const Tensor& grad, const Scalar& alpha, const Scalar&, const Scalar&,
                        bool is_result, const Tensor& self_or_result) {
  const char* op = "elu_backward";
  check_defined(op, grad, "grad_output");
  check_defined(op, self_or_result, "self_or_result");
  KILN_CHECK_TYPE(is_floating(self_or_result.dtype()) && grad.dtype() == self_or_result.dtype(),
                  "[{}] expected floating-point grad_output and self_or_result of one dtype, got "
                  "{} and {}",
                  op, grad.dtype(), self_or_result.dtype());
  KILN_CHECK(grad.sizes() == self_or_result.sizes(),
             "[{}] grad_output has shape [{}], but self_or_result has shape [{}]", op,
             fmt::join(grad.sizes(), ", "), fmt::join(self_or_result.sizes(), ", "));
  KILN_CHECK(!is_result || alpha.to_double() >= 0,
             "[{}] the gradient from elu's result needs alpha >= 0 (got {}): pass the input "
             "instead",
             op, alpha);
  return {Shape(grad.sizes()), grad.dtype(), common_device(op, {&grad, &self_or_result})};
}

}  // namespace kiln::meta

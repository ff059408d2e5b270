#pragma once
// The CUDA backend's floating unary ops, one line each, so that adding one touches one place:
//   _(name, Enumerator, expression)
// `name` is the op in kiln/ops/op_list.h, `Enumerator` its UnaryOp (elementwise.h), and
// `expression` computes the result from `x`, the input in the accumulate type `A` (float for
// the 16-bit floats; see elementwise.cu's Unary). elementwise.h makes the enumerators,
// elementwise.cu the device code and elementwise.cpp the kernels registered for each op.
// Internal; includes nothing CUDA, so host code can expand the list too.
#define KILN_CUDA_FLOAT_UNARY_OPS(_)           \
  _(exp, Exp, exp(x))                          \
  _(log, Log, log(x))                          \
  _(sqrt, Sqrt, sqrt(x))                       \
  _(rsqrt, Rsqrt, A(1) / sqrt(x))              \
  _(tanh, Tanh, tanh(x))                       \
  _(sigmoid, Sigmoid, A(1) / (A(1) + exp(-x))) \
  _(silu, Silu, x / (A(1) + exp(-x)))          \
  _(sin, Sin, sin(x))                          \
  _(cos, Cos, cos(x))                          \
  _(erf, Erf, erf(x))                          \
  _(acos, Acos, acos(x))                       \
  _(acosh, Acosh, acosh(x))                    \
  _(asin, Asin, asin(x))                       \
  _(asinh, Asinh, asinh(x))                    \
  _(atan, Atan, atan(x))                       \
  _(atanh, Atanh, atanh(x))                    \
  _(cosh, Cosh, cosh(x))                       \
  _(sinh, Sinh, sinh(x))                       \
  _(tan, Tan, tan(x))                          \
  _(expm1, Expm1, expm1(x))                    \
  _(log1p, Log1p, log1p(x))                    \
  _(log2, Log2, log2(x))                       \
  _(log10, Log10, log10(x))                    \
  _(reciprocal, Reciprocal, A(1) / x)

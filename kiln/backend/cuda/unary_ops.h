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
  _(erf, Erf, erf(x))

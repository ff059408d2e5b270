#pragma once
// Launchers of the elementwise kernels (elementwise.cu): unary and binary pointwise ops,
// comparisons, where, clamp, casting copies. Operands are described by an Indexer over the
// output (operand 0) and Operands; every input already has the compute dtype. Internal.
#include <cuda_runtime.h>

#include <cstdint>

#include "kiln/backend/cuda/kernel_args.h"
#include "kiln/backend/cuda/unary_ops.h"

namespace kiln::cuda {

// Ops whose result has the input's (compute) dtype. Float-only ones see float dtypes only:
// gelu's two forms and those of KILN_CUDA_FLOAT_UNARY_OPS (unary_ops.h); the rounding ops and
// sign take every dtype.
#define KILN_CUDA_UNARY_ENUMERATOR(name, Enumerator, expression) Enumerator,
enum class UnaryOp {
  Neg,
  Abs,
  Relu,
  Gelu,
  GeluTanh,
  Ceil,  // ceil, floor, round and trunc keep integer values
  Floor,
  Round,
  Trunc,
  Sign,
  BitwiseNot,
  KILN_CUDA_FLOAT_UNARY_OPS(KILN_CUDA_UNARY_ENUMERATOR) NumOps  // the count, not an op
};
#undef KILN_CUDA_UNARY_ENUMERATOR
void launch_unary(UnaryOp op, Dt dtype, const Indexer<2>& ix, void* out, const Operand& a,
                  cudaStream_t stream);
// out (bool) = !a, a of dtype `in`.
void launch_logical_not(Dt in, const Indexer<2>& ix, void* out, const Operand& a,
                        cudaStream_t stream);
// out (bool) = isnan(a) or isinf(a), a of dtype `in` (false for integer and bool dtypes).
enum class FloatPredicate { IsNan, IsInf };
void launch_float_predicate(FloatPredicate op, Dt in, const Indexer<2>& ix, void* out,
                            const Operand& a, cudaStream_t stream);
// out = a > 0 ? a : a * slope, in the floating dtype `dtype`.
void launch_leaky_relu(Dt dtype, const Indexer<2>& ix, void* out, const Operand& a,
                       const Operand& slope, cudaStream_t stream);
// out = clamp(a, lo, hi) in dtype `dtype`; a bound is absent when its has_ flag is false.
void launch_clamp(Dt dtype, const Indexer<2>& ix, void* out, const Operand& a, bool has_lo,
                  const Operand& lo, bool has_hi, const Operand& hi, cudaStream_t stream);

// Ops whose result has the compute dtype; alpha scales b (add, sub).
// Integer fmod, remainder and rounding divisions by zero are not checked (as in ATen on CUDA).
enum class BinaryOp {
  Add,
  Sub,
  Mul,
  Div,
  Pow,
  Maximum,
  Minimum,
  Atan2,
  Fmod,
  Remainder,
  DivTrunc,
  DivFloor,
  BitwiseAnd,
  BitwiseOr,
  BitwiseXor,
  NumOps  // the count, not an op
};
void launch_binary(BinaryOp op, Dt dtype, const Indexer<3>& ix, void* out, const Operand& a,
                   const Operand& b, const Operand& alpha, cudaStream_t stream);
// Ops with a bool result, comparing in the compute dtype.
enum class CompareOp { Eq, Ne, Lt, Le, Gt, Ge, LogicalAnd, LogicalOr, LogicalXor };
void launch_compare(CompareOp op, Dt dtype, const Indexer<3>& ix, void* out, const Operand& a,
                    const Operand& b, cudaStream_t stream);
// out = cond ? a : b; cond is bool, a and b have dtype `dtype`.
void launch_where(Dt dtype, const Indexer<4>& ix, void* out, const Operand& cond, const Operand& a,
                  const Operand& b, cudaStream_t stream);
// out = cast(a): any dtype to any dtype (a strided, broadcast copy when both are the same).
void launch_copy(Dt out_dtype, Dt in_dtype, const Indexer<2>& ix, void* out, const Operand& a,
                 cudaStream_t stream);

}  // namespace kiln::cuda

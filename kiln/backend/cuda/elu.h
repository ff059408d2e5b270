#pragma once
// Launchers of the CUDA kernels of elu and elu_backward. Internal to kiln/backend/cuda.
#include <cuda_runtime.h>

#include "kiln/backend/cuda/kernel_args.h"

namespace kiln::cuda {

// ATen's coefficients: negcoef = alpha * scale, poscoef = scale, negiptcoef = input_scale.
struct EluCoef {
  double neg = 1, pos = 1, input = 1;
};
// out = x > 0 ? x * pos : expm1(x * input) * neg, in the floating dtype `dt`.
void launch_elu(Dt dt, const Indexer<2>& ix, void* out, const Operand& x, EluCoef c,
                cudaStream_t stream);
// out = elu's gradient times grad from x (is_result: x is elu's result), as ATen's
// elu_backward.
void launch_elu_backward(Dt dt, const Indexer<3>& ix, void* out, const Operand& grad,
                         const Operand& x, EluCoef c, bool is_result, cudaStream_t stream);

}  // namespace kiln::cuda

#pragma once
// Launch functions of the CUDA reductions (sum, mean, var, max/min with or without indices,
// all/any) and of softmax / log_softmax. Internal to kiln/backend/cuda.
#include <cuda_runtime.h>

#include <cstdint>

#include "kiln/backend/cuda/kernel_args.h"

namespace kiln::cuda {

enum class Reduce : int { Sum, Mean, Var, Max, Min, All, Any };

// One reduction: x is contiguous, viewed as (batch, len, cols) and reduced over len, so the
// results are (batch, cols), row-major. cols == 1 reduces rows (the reduced dims are last);
// cols > 1 reduces a run of leading or middle dims of a contiguous tensor in place.
struct ReduceArgs {
  Reduce op = Reduce::Sum;
  Dt dtype = Dt::Float32;  // of x and of values (Bool for All/Any)
  const void* x = nullptr;
  int64_t batch = 1, len = 1, cols = 1;
  void* values = nullptr;      // (batch, cols) results, or null (argmax, argmin)
  int64_t* indices = nullptr;  // (batch, cols) first position in len of the max/min, or null
  int64_t correction = 0;      // Var: the divisor is max(0, len - correction)
};

// Bytes of device workspace launch_reduce needs for `a` on the current device (0: none).
size_t reduce_workspace_bytes(const ReduceArgs& a);
// Computes `a` on `stream`; `workspace` holds reduce_workspace_bytes(a) bytes (or is null).
void launch_reduce(const ReduceArgs& a, void* workspace, cudaStream_t stream);

// y = softmax (or log_softmax) of x over n, both contiguous and viewed as (outer, n, inner);
// dtype is a floating type.
void launch_softmax(Dt dtype, const void* x, void* y, int64_t outer, int64_t n, int64_t inner,
                    bool log, cudaStream_t stream);

}  // namespace kiln::cuda

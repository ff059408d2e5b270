#pragma once
// Launchers of the multi-tensor (foreach) kernels: one launch updates every tensor of a table
// (contiguous tensors of one dtype on one device), a block per chunk of kForeachChunk elements
// of one tensor. Internal to kiln/backend/cuda.
#include <cuda_runtime.h>

#include <cstdint>

#include "kiln/backend/cuda/kernel_args.h"

namespace kiln::cuda {

inline constexpr int64_t kForeachChunk = 4096;  // elements per block
// Bytes a table may take as a kernel argument (CUDA 12.1+ allows up to 32764 on sm_70+; larger
// arguments cost every launch, so tables stay well below).
inline constexpr int kForeachTableBytes = 12288;

// The tensors of one launch: ptr[l][i] is list l's i-th tensor (numel[i] elements each), and
// chunk_start the prefix sum of the tensors' chunk counts (the grid is chunk_start[n] blocks).
template <int L>
struct ForeachTable {
  static constexpr int kCapacity = (kForeachTableBytes - 16) / (8 * L + 16);
  int n = 0;
  void* ptr[L][kCapacity] = {};
  int64_t numel[kCapacity] = {};
  int64_t chunk_start[kCapacity + 1] = {};
};

// The ops; lists are (self, ...) as in the op's schema, self (list 0) is written. SqrtOut
// writes list 0 = sqrt(list 1) (foreach_sqrt), without reading list 0.
enum class ForeachOp : int { Add, Mul, MulList, Lerp, Addcmul, Addcdiv, Sqrt, SqrtOut };

// The op's Scalar as the CPU converts it for each dtype: f64 for float64, f32 for float32 and
// the 16-bit floats (which compute in float), i for the integer dtypes and bool.
struct ForeachScalar {
  double f64 = 0;
  float f32 = 0;
  int64_t i = 0;
};

// Runs `op` over the table's tensors, of dtype `dt`; L is 1 (Mul, Sqrt), 2 (Add, MulList,
// Lerp, SqrtOut) or 3 (Addcmul, Addcdiv).
template <int L>
void launch_foreach(ForeachOp op, Dt dt, const ForeachTable<L>& tab, const ForeachScalar& s,
                    cudaStream_t stream);

// The step tensors (0-d float64 on the device) of one AdamW launch.
inline constexpr int kStepCapacity = 1024;
struct StepTable {
  int n = 0;
  double* step[kStepCapacity] = {};
};

struct AdamWArgs {
  const double* lr = nullptr;  // 0-d float64 on the device
  const int* flag = nullptr;   // nonzero: a check failed, nothing is written
  double beta1 = 0, beta2 = 0, eps = 0, weight_decay = 0;
};

// Checks lr (finite, >= 0) and the steps (whole numbers >= 0) on the device: `first` sets
// *flag to whether one fails, later calls only set it; a failure also sets *err (atomicCAS)
// to lr_code, or to step_code when lr is fine. A nonzero *found_inf (nullable: a GradScaler's
// skipped step) sets *flag too, without an error.
void launch_adamw_check(const StepTable& steps, const double* lr, const float* found_inf, int* flag,
                        bool first, int* err, int lr_code, int step_code, cudaStream_t stream);
// One AdamW update (PyTorch's arithmetic) of lists 0-3 = param, grad, exp_avg, exp_avg_sq,
// dtype `dt`; list 4 holds each tensor's step (double*), read, not written. Skipped if *flag.
void launch_adamw(Dt dt, const ForeachTable<5>& tab, const AdamWArgs& args, cudaStream_t stream);
// *step += 1 for every step of the table, unless *flag.
void launch_adamw_steps(const StepTable& steps, const int* flag, cudaStream_t stream);

}  // namespace kiln::cuda

#pragma once
// Launchers of the fused attention kernels (flash_attention and its backward; Note [Fused
// attention] in kiln/ops/ops.h). Internal to kiln/backend/cuda.
#include <cuda_runtime.h>

#include <cstdint>

#include "kiln/backend/cuda/kernel_args.h"

namespace kiln {
class Tensor;  // no Tensor header here: the .cu files include this one
}

namespace kiln::cuda {

inline constexpr int kMaxAttnHeadDim = 128;

// One of q, k, v, out, grad_out, viewed as [n, rows, e] with unit column stride: element
// (b, row, col) at data + (b / inner) * outer_stride + (b % inner) * inner_stride +
// row * row_stride + col (strides in elements).
struct AttnOperand {
  const void* data = nullptr;
  int64_t outer_stride = 0, inner_stride = 0, row_stride = 0;
};

struct AttnShape {
  int64_t n = 1;      // batch entries: the product of the leading dims
  int64_t inner = 1;  // the innermost leading dim's size (AttnOperand)
  int64_t l = 0;      // queries
  int64_t s = 0;      // keys
  int e = 0;          // features, 1..kMaxAttnHeadDim
  bool causal = false;
  float scale = 1;
};

// out: [n, l, e] contiguous in dt; lse: [n, l] float32. tensor_cores (float32): the products on
// TF32 tensor cores, else exact float32 FMAs; float16 and bfloat16 always use tensor cores.
void launch_flash_forward(Dt dt, bool tensor_cores, const AttnShape& sh, const AttnOperand& q,
                          const AttnOperand& k, const AttnOperand& v, void* out, float* lse,
                          cudaStream_t stream);
// dq: [n, l, e]; dk, dv: [n, s, e], contiguous in dt. delta: n * l floats of scratch. float32,
// deterministic: dq from a kernel of its own (recomputing the scores); otherwise each key tile's
// share is added into dq with atomics. The 16-bit kernels always take the first way.
void launch_flash_backward(Dt dt, bool tensor_cores, const AttnShape& sh, const AttnOperand& q,
                           const AttnOperand& k, const AttnOperand& v, const AttnOperand& out,
                           const AttnOperand& grad_out, const float* lse, float* delta,
                           bool deterministic, void* dq, void* dk, void* dv, cudaStream_t stream);

// The float16 and bfloat16 kernels (attention16.cu; Note [16-bit fused attention]), which the
// two above call. launch_flash16_backward expects delta computed.
void launch_flash16_forward(Dt dt, const AttnShape& sh, const AttnOperand& q, const AttnOperand& k,
                            const AttnOperand& v, void* out, float* lse, cudaStream_t stream);
void launch_flash16_backward(Dt dt, const AttnShape& sh, const AttnOperand& q, const AttnOperand& k,
                             const AttnOperand& v, const AttnOperand& grad_out, const float* lse,
                             const float* delta, void* dq, void* dk, void* dv, cudaStream_t stream);

// The same through cuDNN's fused attention (attention_cudnn.cpp; Note [cuDNN fused attention]):
// false when cuDNN does not take the call (then the kernels above run, and overwrite whatever a
// timing run or a failed plan may have written).
// The outputs may have any strides AttnOperand describes (out, dq, dk, dv); lse is packed.
// `like` gives the device and stream. The backward needs no delta.
bool cudnn_flash_forward(Dt dt, const AttnShape& sh, const AttnOperand& q, const AttnOperand& k,
                         const AttnOperand& v, const AttnOperand& out, float* lse,
                         const Tensor& like);
bool cudnn_flash_backward(Dt dt, const AttnShape& sh, const AttnOperand& q, const AttnOperand& k,
                          const AttnOperand& v, const AttnOperand& out, const AttnOperand& grad_out,
                          const float* lse, const AttnOperand& dq, const AttnOperand& dk,
                          const AttnOperand& dv, const Tensor& like);

}  // namespace kiln::cuda

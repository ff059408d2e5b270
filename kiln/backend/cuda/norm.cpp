// CUDA kernels of batch, group and layer norm: host glue over norm.cu's launchers, driven by
// kiln/ops/norm_meta.cpp (Note [Batch, group and layer norm]).
#include "kiln/backend/cuda/norm.h"

#include "kiln/backend/cuda/common.h"
#include "kiln/ops/norm_meta.h"

namespace kiln::cuda {
namespace {

const void* ptr(const Tensor& t) { return t.defined() ? t.impl()->data() : nullptr; }

void moments(const Tensor& x, int64_t n, int64_t c, int64_t hw, const Tensor& mean,
             const Tensor& var) {
  launch_norm_moments(dt(x.dtype()), ptr(x), n, c, hw, mean.impl()->data(), var.impl()->data(),
                      stream_for(x));
  check_launch("batch_norm");
}
void dot(const Tensor& dy, const Tensor& x, const Tensor& mean, int64_t n, int64_t c, int64_t hw,
         const Tensor& sum_dy, const Tensor& sum_dy_xmu) {
  launch_norm_dot(dt(x.dtype()), ptr(dy), ptr(x), ptr(mean), n, c, hw, sum_dy.impl()->data(),
                  sum_dy_xmu.impl()->data(), stream_for(x));
  check_launch("batch_norm_backward");
}
void apply(const Tensor& out, const Tensor& a, const Tensor& p, const Tensor& b, const Tensor& r,
           const Tensor& s, const Tensor& w, const Tensor& bias, int64_t n, int64_t c, int64_t hw,
           int64_t qi, int64_t qj) {
  launch_norm_apply(dt(out.dtype()), out.impl()->data(), ptr(a), ptr(p), ptr(b), ptr(r), ptr(s),
                    ptr(w), ptr(bias), n, c, hw, qi, qj, stream_for(out));
  check_launch("batch_norm");
}

const detail::NormKernels kCudaNorm{&moments, &dot, &apply};

}  // namespace
}  // namespace kiln::cuda

namespace kiln::cuda {
using NormOps = detail::NormOps<kCudaNorm>;
}  // namespace kiln::cuda

KILN_CUDA_KERNELS(::kiln::backend_kernel(::kiln::ops::op_native_batch_norm_legit,
                                         &::kiln::cuda::NormOps::batch_norm_legit),
                  ::kiln::backend_kernel(::kiln::ops::op_native_batch_norm_legit_no_stats,
                                         &::kiln::cuda::NormOps::batch_norm_no_stats),
                  ::kiln::backend_kernel(::kiln::ops::op_native_batch_norm_legit_no_training,
                                         &::kiln::cuda::NormOps::batch_norm_no_training),
                  ::kiln::backend_kernel(::kiln::ops::op_native_batch_norm_backward,
                                         &::kiln::cuda::NormOps::batch_norm_backward),
                  ::kiln::backend_kernel(::kiln::ops::op_native_group_norm,
                                         &::kiln::cuda::NormOps::group_norm),
                  ::kiln::backend_kernel(::kiln::ops::op_native_group_norm_backward,
                                         &::kiln::cuda::NormOps::group_norm_backward),
                  ::kiln::backend_kernel(::kiln::ops::op_native_layer_norm,
                                         &::kiln::cuda::NormOps::layer_norm),
                  ::kiln::backend_kernel(::kiln::ops::op_native_layer_norm_backward,
                                         &::kiln::cuda::NormOps::layer_norm_backward));

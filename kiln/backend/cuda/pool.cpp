// CUDA pooling kernels: host glue (Note [Pooling] in kiln/ops/pool_meta.cpp).
#include "kiln/backend/cuda/pool.h"

#include "kiln/backend/cuda/common.h"
#include "kiln/backend/cuda/plane_args.h"
#include "kiln/ops/pool_meta.h"

namespace kiln::cuda {
namespace {

using detail::PoolGeom;
using detail::PoolKind;

PoolArgs args(const PoolGeom& g) {
  PoolArgs a;
  a.kind = static_cast<int>(g.kind);
  set_planes(a, g);
  copy3(a.k, g.k);
  copy3(a.stride, g.stride);
  copy3(a.pad, g.pad);
  copy3(a.dil, g.dil);
  a.count_include_pad = g.count_include_pad;
  a.divisor = g.divisor;
  return a;
}

TensorPair forward(const Tensor& x_, const PoolGeom& g) {
  Tensor x = contiguous_as(x_, x_.dtype());
  Tensor y = empty_cuda(g.out_sizes, x.dtype(), x.device());
  Tensor idx;
  if (g.kind == PoolKind::Max) idx = empty_cuda(g.out_sizes, kInt64, x.device());
  KILN_DEBUG_ASSERT(fits_grid(y.numel()), "[pooling] {} outputs do not fit a grid", y.numel());
  launch_pool_forward(dt(x.dtype()), args(g), x.impl()->data(), y.impl()->data(),
                      idx.defined() ? static_cast<int64_t*>(idx.impl()->data()) : nullptr,
                      stream_for(x));
  check_launch("pooling");
  return {y, idx};
}

Tensor backward(const Tensor& gy_, const Tensor& indices, const PoolGeom& g) {
  // The CPU kernel's message (kiln/backend/cpu/pool.cpp), reported from the device.
  static const int kBad2d = error_code(
      "[max_pool2d_with_indices_backward] an index is out of range for its input plane (found "
      "on the device)");
  static const int kBad3d = error_code(
      "[max_pool3d_with_indices_backward] an index is out of range for its input plane (found "
      "on the device)");
  Tensor gy = contiguous_as(gy_, gy_.dtype());
  Tensor idx = indices.defined() ? contiguous_as(indices, kInt64) : Tensor();
  Tensor gx = empty_cuda(g.in_sizes, gy.dtype(), gy.device());
  KILN_DEBUG_ASSERT(fits_grid(gx.numel()), "[pooling] {} inputs do not fit a grid", gx.numel());
  launch_pool_backward(dt(gy.dtype()), args(g), gy.impl()->data(),
                       idx.defined() ? static_cast<const int64_t*>(idx.impl()->data()) : nullptr,
                       gx.impl()->data(), error_word(gy.device().index()),
                       g.nd == 2 ? kBad2d : kBad3d, stream_for(gy));
  check_launch("pooling backward");
  return gx;
}

constexpr detail::PoolKernels kKernels{&forward, &backward};

KILN_POOL_KERNEL_FUNCTIONS(kKernels)

}  // namespace
}  // namespace kiln::cuda

#define KILN_CUDA_POOL_KERNEL(name) \
  ::kiln::backend_kernel(::kiln::ops::op_##name, &::kiln::cuda::name##_kernel),
KILN_CUDA_KERNELS(KILN_POOL_FOR_EACH_KERNEL(KILN_CUDA_POOL_KERNEL));
#undef KILN_CUDA_POOL_KERNEL

// CUDA padding and upsampling kernels: host glue (Note [Padding and upsampling] in
// kiln/ops/pad_meta.cpp). constant_pad_nd is the composite every backend shares.
#include "kiln/backend/cuda/pad.h"

#include "kiln/backend/cuda/common.h"
#include "kiln/backend/cuda/plane_args.h"
#include "kiln/ops/pad_meta.h"

namespace kiln::cuda {
namespace {

using detail::PadGeom;
using detail::UpsampleGeom;

PadArgs args(const PadGeom& g) {
  PadArgs a;
  a.mode = static_cast<int>(g.mode);
  set_planes(a, g);
  copy3(a.left, g.left);
  return a;
}

UpsampleArgs args(const UpsampleGeom& g) {
  UpsampleArgs a;
  a.bilinear = g.bilinear;
  a.align_corners = g.align_corners;
  a.planes = g.planes;
  a.ih = g.ih;
  a.iw = g.iw;
  a.oh = g.oh;
  a.ow = g.ow;
  a.scale_h = g.scale_h;
  a.scale_w = g.scale_w;
  return a;
}

template <class G, class L>
Tensor run(const Tensor& in_, IntArrayRef out_sizes, const G& g, const char* what, L launch) {
  Tensor in = contiguous_as(in_, in_.dtype());
  Tensor out = empty_cuda(out_sizes, in.dtype(), in.device());
  KILN_DEBUG_ASSERT(fits_grid(in.numel()) && fits_grid(out.numel()),
                    "[{}] {} elements do not fit a grid", what, out.numel());
  launch(dt(in.dtype()), args(g), in.impl()->data(), out.impl()->data(), stream_for(in));
  check_launch(what);
  return out;
}

Tensor pad(const Tensor& x, const PadGeom& g) {
  return run(x, g.out_sizes, g, "padding", &launch_pad_forward);
}
Tensor pad_backward(const Tensor& gy, const PadGeom& g) {
  return run(gy, g.in_sizes, g, "padding backward", &launch_pad_backward);
}
Tensor upsample(const Tensor& x, const UpsampleGeom& g) {
  return run(x, g.out_sizes, g, "upsampling", &launch_upsample_forward);
}
Tensor upsample_backward(const Tensor& gy, const UpsampleGeom& g) {
  return run(gy, g.in_sizes, g, "upsampling backward", &launch_upsample_backward);
}

constexpr detail::PadKernels kKernels{&pad, &pad_backward, &upsample, &upsample_backward};

KILN_PAD_KERNEL_FUNCTIONS(kKernels)

}  // namespace
}  // namespace kiln::cuda

#define KILN_CUDA_PAD_KERNEL(name) \
  ::kiln::backend_kernel(::kiln::ops::op_##name, &::kiln::cuda::name##_kernel),
KILN_CUDA_KERNELS(KILN_PAD_FOR_EACH_KERNEL(KILN_CUDA_PAD_KERNEL));
#undef KILN_CUDA_PAD_KERNEL

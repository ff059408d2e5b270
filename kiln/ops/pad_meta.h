#pragma once
// The padding and upsampling ops (constant_pad_nd, reflection_pad1d/2d/3d, replication_pad1d/2d/3d,
// upsample_nearest2d, upsample_bilinear2d and their backward ops): their meta functions and the
// driver the backends share (Note [Padding and upsampling] in pad_meta.cpp). Internal: backends
// call these first, so validation happens before any write.
#include <array>

#include "kiln/ops/meta.h"

namespace kiln::detail {

enum class PadMode { Reflect = 0, Replicate = 1 };  // detail::pad::kReflect, kReplicate

// One reflection or replication pad after validation: `planes` planes of spatial shape x padded
// to y, `left` the padding before each dim (negative: cropped); spatial dims right-aligned in 3
// slots (2-D: [1, H, W]).
struct PadGeom {
  PadMode mode = PadMode::Reflect;
  int64_t nd = 0, planes = 0;
  std::array<int64_t, 3> x{1, 1, 1}, y{1, 1, 1}, left{0, 0, 0};
  Shape in_sizes, out_sizes;

  int64_t x_plane() const { return x[0] * x[1] * x[2]; }
  int64_t y_plane() const { return y[0] * y[1] * y[2]; }
};

// One upsample_nearest2d or upsample_bilinear2d call: `planes` (N * C) planes of [ih, iw] to
// [oh, ow]; a scale of 0 is "not given" (ATen's None, or a value <= 0).
struct UpsampleGeom {
  bool bilinear = false, align_corners = false;
  int64_t planes = 0, ih = 0, iw = 0, oh = 0, ow = 0;
  double scale_h = 0, scale_w = 0;
  Shape in_sizes, out_sizes;
};

// A backend's kernels. Inputs may be strided, of a floating dtype; results are new contiguous
// tensors: pad gives y (out_sizes) from x, pad_backward the gradient of x (in_sizes) from gy;
// the same for upsampling.
struct PadKernels {
  Tensor (*pad)(const Tensor& x, const PadGeom& g);
  Tensor (*pad_backward)(const Tensor& gy, const PadGeom& g);
  Tensor (*upsample)(const Tensor& x, const UpsampleGeom& g);
  Tensor (*upsample_backward)(const Tensor& gy, const UpsampleGeom& g);
};

// constant_pad_nd on any backend: a tensor full of `value` with self copied into its inner box
// (ATen's composite), after meta::constant_pad_nd's checks.
Tensor constant_pad_nd_impl(const Tensor& self, IntArrayRef pad, const Scalar& value);

}  // namespace kiln::detail

namespace kiln::meta {

// ATen's checks: an even pad list of at most 2 * self.dim() elements and no negative output size.
TensorSpec constant_pad_nd(const Tensor& self, IntArrayRef pad, const Scalar& value);
// reflection/replication_pad{nd}d: 2 * nd pads, a 1+nd or 2+nd dim floating input with non-empty
// non-batch dims, reflect pads less than the input size, outputs of at least one element.
detail::PadGeom pad(detail::PadMode mode, int64_t nd, const Tensor& self, IntArrayRef padding);
// The forward's checks, and grad_output of the output's shape, dtype and device.
detail::PadGeom pad_backward(detail::PadMode mode, int64_t nd, const Tensor& grad_output,
                             const Tensor& self, IntArrayRef padding);
// upsample_*2d: a 4-D floating input with non-empty planes, output_size of 2 positive sizes.
detail::UpsampleGeom upsample(bool bilinear, const Tensor& self, IntArrayRef output_size,
                              bool align_corners, const OptDouble& scales_h,
                              const OptDouble& scales_w);
// The backward: input_size of 4 sizes, grad_output of shape [N, C, *output_size].
detail::UpsampleGeom upsample_backward(bool bilinear, const Tensor& grad_output,
                                       IntArrayRef output_size, IntArrayRef input_size,
                                       bool align_corners, const OptDouble& scales_h,
                                       const OptDouble& scales_w);

}  // namespace kiln::meta

namespace kiln::detail {

// The ops over a backend's kernels, after the meta checks (Note [Padding and upsampling]).
Tensor run_pad(const PadKernels& k, PadMode mode, int64_t nd, const Tensor& self,
               IntArrayRef padding);
Tensor run_pad_backward(const PadKernels& k, PadMode mode, int64_t nd, const Tensor& grad_output,
                        const Tensor& self, IntArrayRef padding);
Tensor run_upsample(const PadKernels& k, bool bilinear, const Tensor& self, IntArrayRef output_size,
                    bool align_corners, const OptDouble& scales_h, const OptDouble& scales_w);
Tensor run_upsample_backward(const PadKernels& k, bool bilinear, const Tensor& grad_output,
                             IntArrayRef output_size, IntArrayRef input_size, bool align_corners,
                             const OptDouble& scales_h, const OptDouble& scales_w);

}  // namespace kiln::detail

// A backend's kernels with the ops' signatures over its PadKernels `k`, in the namespace where
// this is expanded: reflection_pad1d_kernel, ..._backward_kernel, upsample_nearest2d_kernel, ...
#define KILN_PAD_ND_KERNELS(k, mode, Mode, nd)                                                  \
  ::kiln::Tensor mode##_pad##nd##d_kernel(const ::kiln::Tensor& self, ::kiln::IntArrayRef p) {  \
    return ::kiln::detail::run_pad(k, ::kiln::detail::PadMode::Mode, nd, self, p);              \
  }                                                                                             \
  ::kiln::Tensor mode##_pad##nd##d_backward_kernel(                                             \
      const ::kiln::Tensor& gy, const ::kiln::Tensor& self, ::kiln::IntArrayRef p) {            \
    return ::kiln::detail::run_pad_backward(k, ::kiln::detail::PadMode::Mode, nd, gy, self, p); \
  }
#define KILN_PAD_KERNEL_FUNCTIONS(k)                                                            \
  KILN_PAD_ND_KERNELS(k, reflection, Reflect, 1)                                                \
  KILN_PAD_ND_KERNELS(k, reflection, Reflect, 2)                                                \
  KILN_PAD_ND_KERNELS(k, reflection, Reflect, 3)                                                \
  KILN_PAD_ND_KERNELS(k, replication, Replicate, 1)                                             \
  KILN_PAD_ND_KERNELS(k, replication, Replicate, 2)                                             \
  KILN_PAD_ND_KERNELS(k, replication, Replicate, 3)                                             \
  ::kiln::Tensor constant_pad_nd_kernel(const ::kiln::Tensor& self, ::kiln::IntArrayRef pad,    \
                                        const ::kiln::Scalar& value) {                          \
    return ::kiln::detail::constant_pad_nd_impl(self, pad, value);                              \
  }                                                                                             \
  ::kiln::Tensor upsample_nearest2d_kernel(const ::kiln::Tensor& self, ::kiln::IntArrayRef os,  \
                                           const ::kiln::OptDouble& sh,                         \
                                           const ::kiln::OptDouble& sw) {                       \
    return ::kiln::detail::run_upsample(k, false, self, os, false, sh, sw);                     \
  }                                                                                             \
  ::kiln::Tensor upsample_nearest2d_backward_kernel(                                            \
      const ::kiln::Tensor& gy, ::kiln::IntArrayRef os, ::kiln::IntArrayRef is,                 \
      const ::kiln::OptDouble& sh, const ::kiln::OptDouble& sw) {                               \
    return ::kiln::detail::run_upsample_backward(k, false, gy, os, is, false, sh, sw);          \
  }                                                                                             \
  ::kiln::Tensor upsample_bilinear2d_kernel(const ::kiln::Tensor& self, ::kiln::IntArrayRef os, \
                                            bool ac, const ::kiln::OptDouble& sh,               \
                                            const ::kiln::OptDouble& sw) {                      \
    return ::kiln::detail::run_upsample(k, true, self, os, ac, sh, sw);                         \
  }                                                                                             \
  ::kiln::Tensor upsample_bilinear2d_backward_kernel(                                           \
      const ::kiln::Tensor& gy, ::kiln::IntArrayRef os, ::kiln::IntArrayRef is, bool ac,        \
      const ::kiln::OptDouble& sh, const ::kiln::OptDouble& sw) {                               \
    return ::kiln::detail::run_upsample_backward(k, true, gy, os, is, ac, sh, sw);              \
  }

// Registers the kernels KILN_PAD_KERNEL_FUNCTIONS defined, through `reg(op)`.
// clang-format off
#define KILN_PAD_FOR_EACH_KERNEL(_) \
  _(constant_pad_nd) \
  _(reflection_pad1d) \
  _(reflection_pad1d_backward) \
  _(reflection_pad2d) \
  _(reflection_pad2d_backward) \
  _(reflection_pad3d) \
  _(reflection_pad3d_backward) \
  _(replication_pad1d) \
  _(replication_pad1d_backward) \
  _(replication_pad2d) \
  _(replication_pad2d_backward) \
  _(replication_pad3d) \
  _(replication_pad3d_backward) \
  _(upsample_nearest2d) \
  _(upsample_nearest2d_backward) \
  _(upsample_bilinear2d) \
  _(upsample_bilinear2d_backward)
// clang-format on

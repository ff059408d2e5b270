#pragma once
// The pooling ops (max_pool2d/3d_with_indices, avg_pool2d/3d, adaptive_avg_pool2d/3d and their
// backward ops): their meta functions and the driver the backends share (Note [Pooling] in
// pool_meta.cpp). Internal: backends call these first, so validation happens before any write.
#include <array>

#include "kiln/ops/meta.h"

namespace kiln::detail {

enum class PoolKind { Max, Avg, Adaptive };

// One pooling call after validation: `planes` (N * C) independent planes, each an input x of
// spatial shape x and an output y of shape y; spatial dims right-aligned in 3 slots (2-D:
// [1, H, W]), with size 1, stride 1, padding 0 in the unused ones.
struct PoolGeom {
  PoolKind kind = PoolKind::Max;
  int64_t nd = 0, planes = 0;
  std::array<int64_t, 3> x{1, 1, 1}, y{1, 1, 1}, k{1, 1, 1};
  std::array<int64_t, 3> stride{1, 1, 1}, pad{0, 0, 0}, dil{1, 1, 1};
  bool count_include_pad = true;
  int64_t divisor = 0;        // avg: divisor_override, 0 for none
  Shape in_sizes, out_sizes;  // the op's input and output shapes

  int64_t x_plane() const { return x[0] * x[1] * x[2]; }
  int64_t y_plane() const { return y[0] * y[1] * y[2]; }
};

// A backend's pooling kernels (Note [Pooling]). Inputs may be strided, of the op's floating
// dtype; results are new contiguous tensors: forward gives y (out_sizes) and, for Max, the int64
// indices; backward gives the gradient of x (in_sizes) from gy (out_sizes) and, for Max, the
// indices.
struct PoolKernels {
  TensorPair (*forward)(const Tensor& x, const PoolGeom& g);
  Tensor (*backward)(const Tensor& gy, const Tensor& indices, const PoolGeom& g);
};

}  // namespace kiln::detail

namespace kiln::meta {

// Each checks the op's arguments (ATen's checks: kernel, stride and dilation positive, padding
// at most half the kernel, an output of at least one element per dim, a 1+nd or 2+nd dim input
// of a floating dtype with non-empty planes) and returns the output's spec and the geometry.
TensorSpec max_pool(int64_t nd, const Tensor& self, IntArrayRef kernel_size, IntArrayRef stride,
                    IntArrayRef padding, IntArrayRef dilation, bool ceil_mode,
                    detail::PoolGeom* geom = nullptr);
TensorSpec avg_pool(int64_t nd, const Tensor& self, IntArrayRef kernel_size, IntArrayRef stride,
                    IntArrayRef padding, bool ceil_mode, bool count_include_pad,
                    const std::optional<int64_t>& divisor_override,
                    detail::PoolGeom* geom = nullptr);
TensorSpec adaptive_avg_pool(int64_t nd, const Tensor& self, IntArrayRef output_size,
                             detail::PoolGeom* geom = nullptr);
// The backward ops: the forward's checks, and grad_output (and indices: int64) of the forward
// output's shape, dtype and device. Returns the geometry; the result has self's spec.
detail::PoolGeom max_pool_backward(int64_t nd, const Tensor& grad_output, const Tensor& self,
                                   IntArrayRef kernel_size, IntArrayRef stride, IntArrayRef padding,
                                   IntArrayRef dilation, bool ceil_mode, const Tensor& indices);
detail::PoolGeom avg_pool_backward(int64_t nd, const Tensor& grad_output, const Tensor& self,
                                   IntArrayRef kernel_size, IntArrayRef stride, IntArrayRef padding,
                                   bool ceil_mode, bool count_include_pad,
                                   const std::optional<int64_t>& divisor_override);
detail::PoolGeom adaptive_avg_pool_backward(int64_t nd, const Tensor& grad_output,
                                            const Tensor& self);

}  // namespace kiln::meta

// The twelve kernels of a backend with the ops' signatures, over its PoolKernels `k`, in the
// namespace where this is expanded: max_pool2d_with_indices_kernel, ..._backward_kernel, and the
// same for max_pool3d, avg_pool2d/3d and adaptive_avg_pool2d/3d.
#define KILN_POOL_KERNEL_FUNCTIONS(k)                                                             \
  ::kiln::TensorPair max_pool2d_with_indices_kernel(                                              \
      const ::kiln::Tensor& self, ::kiln::IntArrayRef ks, ::kiln::IntArrayRef st,                 \
      ::kiln::IntArrayRef pd, ::kiln::IntArrayRef dl, bool ceil) {                                \
    return ::kiln::detail::run_max_pool(k, 2, self, ks, st, pd, dl, ceil);                        \
  }                                                                                               \
  ::kiln::TensorPair max_pool3d_with_indices_kernel(                                              \
      const ::kiln::Tensor& self, ::kiln::IntArrayRef ks, ::kiln::IntArrayRef st,                 \
      ::kiln::IntArrayRef pd, ::kiln::IntArrayRef dl, bool ceil) {                                \
    return ::kiln::detail::run_max_pool(k, 3, self, ks, st, pd, dl, ceil);                        \
  }                                                                                               \
  ::kiln::Tensor max_pool2d_with_indices_backward_kernel(                                         \
      const ::kiln::Tensor& gy, const ::kiln::Tensor& self, ::kiln::IntArrayRef ks,               \
      ::kiln::IntArrayRef st, ::kiln::IntArrayRef pd, ::kiln::IntArrayRef dl, bool ceil,          \
      const ::kiln::Tensor& idx) {                                                                \
    return ::kiln::detail::run_max_pool_backward(k, 2, gy, self, ks, st, pd, dl, ceil, idx);      \
  }                                                                                               \
  ::kiln::Tensor max_pool3d_with_indices_backward_kernel(                                         \
      const ::kiln::Tensor& gy, const ::kiln::Tensor& self, ::kiln::IntArrayRef ks,               \
      ::kiln::IntArrayRef st, ::kiln::IntArrayRef pd, ::kiln::IntArrayRef dl, bool ceil,          \
      const ::kiln::Tensor& idx) {                                                                \
    return ::kiln::detail::run_max_pool_backward(k, 3, gy, self, ks, st, pd, dl, ceil, idx);      \
  }                                                                                               \
  ::kiln::Tensor avg_pool2d_kernel(const ::kiln::Tensor& self, ::kiln::IntArrayRef ks,            \
                                   ::kiln::IntArrayRef st, ::kiln::IntArrayRef pd, bool ceil,     \
                                   bool cip, const ::std::optional<int64_t>& div) {               \
    return ::kiln::detail::run_avg_pool(k, 2, self, ks, st, pd, ceil, cip, div);                  \
  }                                                                                               \
  ::kiln::Tensor avg_pool3d_kernel(const ::kiln::Tensor& self, ::kiln::IntArrayRef ks,            \
                                   ::kiln::IntArrayRef st, ::kiln::IntArrayRef pd, bool ceil,     \
                                   bool cip, const ::std::optional<int64_t>& div) {               \
    return ::kiln::detail::run_avg_pool(k, 3, self, ks, st, pd, ceil, cip, div);                  \
  }                                                                                               \
  ::kiln::Tensor avg_pool2d_backward_kernel(const ::kiln::Tensor& gy, const ::kiln::Tensor& self, \
                                            ::kiln::IntArrayRef ks, ::kiln::IntArrayRef st,       \
                                            ::kiln::IntArrayRef pd, bool ceil, bool cip,          \
                                            const ::std::optional<int64_t>& div) {                \
    return ::kiln::detail::run_avg_pool_backward(k, 2, gy, self, ks, st, pd, ceil, cip, div);     \
  }                                                                                               \
  ::kiln::Tensor avg_pool3d_backward_kernel(const ::kiln::Tensor& gy, const ::kiln::Tensor& self, \
                                            ::kiln::IntArrayRef ks, ::kiln::IntArrayRef st,       \
                                            ::kiln::IntArrayRef pd, bool ceil, bool cip,          \
                                            const ::std::optional<int64_t>& div) {                \
    return ::kiln::detail::run_avg_pool_backward(k, 3, gy, self, ks, st, pd, ceil, cip, div);     \
  }                                                                                               \
  ::kiln::Tensor adaptive_avg_pool2d_kernel(const ::kiln::Tensor& self,                           \
                                            ::kiln::IntArrayRef output_size) {                    \
    return ::kiln::detail::run_adaptive_avg_pool(k, 2, self, output_size);                        \
  }                                                                                               \
  ::kiln::Tensor adaptive_avg_pool3d_kernel(const ::kiln::Tensor& self,                           \
                                            ::kiln::IntArrayRef output_size) {                    \
    return ::kiln::detail::run_adaptive_avg_pool(k, 3, self, output_size);                        \
  }                                                                                               \
  ::kiln::Tensor adaptive_avg_pool2d_backward_kernel(const ::kiln::Tensor& gy,                    \
                                                     const ::kiln::Tensor& self) {                \
    return ::kiln::detail::run_adaptive_avg_pool_backward(k, 2, gy, self);                        \
  }                                                                                               \
  ::kiln::Tensor adaptive_avg_pool3d_backward_kernel(const ::kiln::Tensor& gy,                    \
                                                     const ::kiln::Tensor& self) {                \
    return ::kiln::detail::run_adaptive_avg_pool_backward(k, 3, gy, self);                        \
  }

// Registers the kernels KILN_POOL_KERNEL_FUNCTIONS defined, through `reg(op, fn)`.
// clang-format off
#define KILN_POOL_FOR_EACH_KERNEL(_) \
  _(max_pool2d_with_indices) \
  _(max_pool3d_with_indices) \
  _(max_pool2d_with_indices_backward) \
  _(max_pool3d_with_indices_backward) \
  _(avg_pool2d) \
  _(avg_pool3d) \
  _(avg_pool2d_backward) \
  _(avg_pool3d_backward) \
  _(adaptive_avg_pool2d) \
  _(adaptive_avg_pool3d) \
  _(adaptive_avg_pool2d_backward) \
  _(adaptive_avg_pool3d_backward)
// clang-format on

namespace kiln::detail {

// The ops over a backend's kernels, after the meta checks (Note [Pooling]).
TensorPair run_max_pool(const PoolKernels& k, int64_t nd, const Tensor& self,
                        IntArrayRef kernel_size, IntArrayRef stride, IntArrayRef padding,
                        IntArrayRef dilation, bool ceil_mode);
Tensor run_max_pool_backward(const PoolKernels& k, int64_t nd, const Tensor& grad_output,
                             const Tensor& self, IntArrayRef kernel_size, IntArrayRef stride,
                             IntArrayRef padding, IntArrayRef dilation, bool ceil_mode,
                             const Tensor& indices);
Tensor run_avg_pool(const PoolKernels& k, int64_t nd, const Tensor& self, IntArrayRef kernel_size,
                    IntArrayRef stride, IntArrayRef padding, bool ceil_mode, bool count_include_pad,
                    const std::optional<int64_t>& divisor_override);
Tensor run_avg_pool_backward(const PoolKernels& k, int64_t nd, const Tensor& grad_output,
                             const Tensor& self, IntArrayRef kernel_size, IntArrayRef stride,
                             IntArrayRef padding, bool ceil_mode, bool count_include_pad,
                             const std::optional<int64_t>& divisor_override);
Tensor run_adaptive_avg_pool(const PoolKernels& k, int64_t nd, const Tensor& self,
                             IntArrayRef output_size);
Tensor run_adaptive_avg_pool_backward(const PoolKernels& k, int64_t nd, const Tensor& grad_output,
                                      const Tensor& self);

// Adaptive pooling's window along a dim of input size `in` and output size `out`: output o
// reads [adaptive_start(o), adaptive_end(o)).
inline int64_t adaptive_start(int64_t o, int64_t out, int64_t in) { return o * in / out; }
inline int64_t adaptive_end(int64_t o, int64_t out, int64_t in) {
  return ((o + 1) * in + out - 1) / out;
}

}  // namespace kiln::detail

#pragma once
// The index arithmetic of the padding and upsampling ops (Note [Padding and upsampling] in
// kiln/ops/pad_meta.cpp), shared by the CPU and CUDA kernels so both compute the same indices
// and weights. No Kiln and no CUDA header: nvcc defines __CUDACC__.
#include <cmath>
#include <cstdint>

#ifdef __CUDACC__
#define KILN_PAD_HD __host__ __device__
#else
#define KILN_PAD_HD
#endif

namespace kiln::detail::pad {

enum : int { kReflect = 0, kReplicate = 1 };

// The input position output j of a dim reads: t = j - left (ATen's formula for any sign of the
// pads), reflected about 0 and i - 1 or clamped to [0, in).
KILN_PAD_HD inline int64_t source(int mode, int64_t j, int64_t left, int64_t in) {
  int64_t t = j - left;
  if (mode == kReflect) {
    if (t < 0) t = -t;
    if (t > in - 1) t = 2 * (in - 1) - t;
    return t;
  }
  return t < 0 ? 0 : (t > in - 1 ? in - 1 : t);
}

// The outputs of a dim that read input i, as up to 3 ranges [lo[r], hi[r]) (empty ones have
// lo >= hi), in increasing order: reflect has the direct one and its two mirrors, replicate the
// one range (the edges take every clamped position).
KILN_PAD_HD inline void readers(int mode, int64_t i, int64_t left, int64_t in, int64_t out,
                                int64_t* lo, int64_t* hi) {
  auto clip = [&](int64_t a, int64_t b, int r) {
    lo[r] = a < 0 ? 0 : a;
    hi[r] = b > out ? out : b;
  };
  if (mode == kReflect) {
    // t = -i (i > 0), t = i, t = 2 (in - 1) - i (i < in - 1); each j = t + left.
    if (i > 0)
      clip(-i + left, -i + left + 1, 0);
    else
      clip(0, 0, 0);
    clip(i + left, i + left + 1, 1);
    if (i < in - 1)
      clip(2 * (in - 1) - i + left, 2 * (in - 1) - i + left + 1, 2);
    else
      clip(0, 0, 2);
    return;
  }
  const int64_t a = i == 0 ? 0 : i + left;
  const int64_t b = i == in - 1 ? out : i + left + 1;
  clip(a, b, 0);
  clip(0, 0, 1);
  clip(0, 0, 2);
}

// Upsampling (ATen's UpSample.h). A scale of 0 or less stands for "not given".
// The ratio from output to input positions: 1 / scale when given, else in / out.
template <class A>
KILN_PAD_HD inline A scales_value(double scale, int64_t in, int64_t out) {
  return scale > 0 ? static_cast<A>(1.0 / scale) : static_cast<A>(in) / static_cast<A>(out);
}

// Nearest: output j reads min(floor(j * scale), in - 1) in float, as ATen's nearest_idx (with its
// shortcuts for equal sizes and exact doubling).
KILN_PAD_HD inline int64_t nearest_source(int64_t j, int64_t in, int64_t out, double scale) {
  if (out == in) return j;
  if (out == 2 * in) return j >> 1;
  const float s = scales_value<float>(scale, in, out);
  const int64_t src = static_cast<int64_t>(floorf(static_cast<float>(j) * s));
  return src < in - 1 ? src : in - 1;
}

// Bilinear: area_pixel_compute_scale.
template <class A>
KILN_PAD_HD inline A linear_ratio(int64_t in, int64_t out, bool align_corners, double scale) {
  if (align_corners) return out > 1 ? static_cast<A>(in - 1) / static_cast<A>(out - 1) : A(0);
  return scales_value<A>(scale, in, out);
}

// Output j's two input taps i0 <= i1 and their weights l0 + l1 = 1 (ATen's
// compute_source_index_and_lambda with guard_index_and_lambda).
template <class A>
KILN_PAD_HD inline void linear_taps(int64_t j, int64_t in, int64_t out, bool align_corners, A ratio,
                                    int64_t& i0, int64_t& i1, A& l0, A& l1) {
  if (out == in) {
    i0 = i1 = j;
    l0 = A(1);
    l1 = A(0);
    return;
  }
  A real =
      align_corners ? ratio * static_cast<A>(j) : ratio * (static_cast<A>(j) + A(0.5)) - A(0.5);
  if (!align_corners && real < A(0)) real = A(0);
  int64_t f = static_cast<int64_t>(floor(static_cast<double>(real)));
  i0 = f < in - 1 ? f : in - 1;
  A lambda = real - static_cast<A>(i0);
  lambda = lambda < A(0) ? A(0) : (lambda > A(1) ? A(1) : lambda);
  i1 = i0 + (i0 < in - 1 ? 1 : 0);
  l1 = lambda;
  l0 = A(1) - lambda;
}

// The first output j in [0, out) whose nearest source is at least i (out when none): sources
// never decrease with j, so input i's readers are [nearest_first(i), nearest_first(i + 1)).
KILN_PAD_HD inline int64_t nearest_first(int64_t i, int64_t in, int64_t out, double scale) {
  int64_t lo = 0, hi = out;
  while (lo < hi) {
    const int64_t mid = lo + (hi - lo) / 2;
    if (nearest_source(mid, in, out, scale) >= i)
      hi = mid;
    else
      lo = mid + 1;
  }
  return lo;
}

// The first output j in [0, out) whose first tap i0 is at least i (out when none); i0 never
// decreases with j, so input i's readers lie in [linear_first(i - 1), linear_first(i + 1)).
template <class A>
KILN_PAD_HD inline int64_t linear_first(int64_t i, int64_t in, int64_t out, bool align_corners,
                                        A ratio) {
  int64_t lo = 0, hi = out;
  while (lo < hi) {
    const int64_t mid = lo + (hi - lo) / 2;
    int64_t i0, i1;
    A l0, l1;
    linear_taps<A>(mid, in, out, align_corners, ratio, i0, i1, l0, l1);
    if (i0 >= i)
      hi = mid;
    else
      lo = mid + 1;
  }
  return lo;
}

}  // namespace kiln::detail::pad

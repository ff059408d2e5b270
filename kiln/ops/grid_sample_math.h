#pragma once
// The arithmetic of grid_sampler_2d and its backward op (Note [grid_sampler_2d] in
// kiln/ops/grid_sample_meta.cpp), ATen's GridSampler.h step for step, shared by the CPU and
// CUDA kernels. A is float or double. No CUDA header: nvcc defines __CUDACC__.
#include <climits>
#include <cstdint>

#include "kiln/ops/hd_math.h"

namespace kiln::detail::grid {

enum : int { kBilinear = 0, kNearest = 1, kBicubic = 2 };
enum : int { kZeros = 0, kBorder = 1, kReflection = 2 };

// input [N, C, H, W], grid [N, OH, OW, 2], output [N, C, OH, OW]; the modes as ATen's ints.
struct Geom {
  int64_t N = 0, C = 0, H = 0, W = 0, OH = 0, OW = 0;
  int interp = kBilinear, padding = kZeros;
  bool align = false;
};

using hd::flo;
using hd::fm;
using hd::mn;
using hd::mx;
using hd::rint_even;

// [-1, 1] to pixel coordinates; *grad the derivative.
template <class A>
KILN_HD inline A unnormalize(A coord, int64_t size, bool align, A* grad) {
  if (align) {
    *grad = static_cast<A>(size - 1) / 2;
    return ((coord + 1) / 2) * static_cast<A>(size - 1);
  }
  *grad = static_cast<A>(size) / 2;
  return ((coord + 1) * static_cast<A>(size) - 1) / 2;
}
// Clipped to [0, size - 1].
template <class A>
KILN_HD inline A clip(A in, int64_t size, A* grad) {
  if (in <= A(0)) {
    *grad = 0;
    return 0;
  }
  const A hi = static_cast<A>(size - 1);
  if (in >= hi) {
    *grad = 0;
    return hi;
  }
  *grad = 1;
  return in;
}
// Reflected into [twice_low / 2, twice_high / 2].
template <class A>
KILN_HD inline A reflect(A in, int64_t twice_low, int64_t twice_high, A* grad) {
  if (twice_low == twice_high) {
    *grad = 0;
    return 0;
  }
  const A lo = static_cast<A>(twice_low) / 2, span = static_cast<A>(twice_high - twice_low) / 2;
  in = in - lo;
  A mult = 1;
  if (in < A(0)) {
    mult = -1;
    in = -in;
  }
  const A extra = fm(in, span);
  const int64_t flips = static_cast<int64_t>(flo(in / span));
  if (flips % 2 == 0) {
    *grad = mult;
    return extra + lo;
  }
  *grad = -mult;
  return span - extra + lo;
}
// A coordinate that no bounds check passes: not finite or past int's range (ATen's
// safe_downgrade_to_int_range).
template <class A>
KILN_HD inline A safe(A x) {
  if (!(x <= static_cast<A>(INT_MAX - 1) && x >= static_cast<A>(INT_MIN))) return A(-100);
  return x;
}
// The padding mode applied to a pixel coordinate; *grad multiplied by its derivative.
template <class A>
KILN_HD inline A pad_coord(A c, int64_t size, int padding, bool align, A* grad) {
  A g1 = 1, g2 = 1;
  if (padding == kBorder) {
    c = clip(c, size, &g1);
  } else if (padding == kReflection) {
    c = align ? reflect(c, 0, 2 * (size - 1), &g1) : reflect(c, -1, 2 * size - 1, &g1);
    c = clip(c, size, &g2);
  }
  *grad *= g1 * g2;
  return safe(c);
}
template <class A>
KILN_HD inline A source_index(A coord, int64_t size, int padding, bool align, A* grad) {
  coord = unnormalize(coord, size, align, grad);
  return pad_coord(coord, size, padding, align, grad);
}

KILN_HD inline bool inside(int64_t y, int64_t x, int64_t H, int64_t W) {
  return y >= 0 && y < H && x >= 0 && x < W;
}
// plane[y, x] after the padding mode, 0 outside (bicubic's taps).
template <class A>
KILN_HD inline A bounded(const A* plane, A x, A y, const Geom& g) {
  A unused = 1;
  const int64_t ix = static_cast<int64_t>(pad_coord(x, g.W, g.padding, g.align, &unused));
  const int64_t iy = static_cast<int64_t>(pad_coord(y, g.H, g.padding, g.align, &unused));
  return inside(iy, ix, g.H, g.W) ? plane[iy * g.W + ix] : A(0);
}

// Keys' cubic convolution with A = -0.75 (ATen's upsampling coefficients) and its derivative.
template <class A>
KILN_HD inline void cubic_coeffs(A c[4], A t) {
  const A a = -0.75;
  auto conv1 = [a](A x) { return ((a + 2) * x - (a + 3)) * x * x + 1; };
  auto conv2 = [a](A x) { return ((a * x - 5 * a) * x + 8 * a) * x - 4 * a; };
  c[0] = conv2(t + 1);
  c[1] = conv1(t);
  c[2] = conv1(1 - t);
  c[3] = conv2(2 - t);
}
template <class A>
KILN_HD inline void cubic_coeffs_grad(A c[4], A t) {
  const A a = -0.75;
  A x = -1 - t;
  c[0] = (-3 * a * x - 10 * a) * x - 8 * a;
  x = -t;
  c[1] = (-3 * (a + 2) * x - 2 * (a + 3)) * x;
  x = 1 - t;
  c[2] = (3 * (a + 2) * x - 2 * (a + 3)) * x;
  x = 2 - t;
  c[3] = (3 * a * x - 10 * a) * x + 8 * a;
}

// The sample of one input plane [H, W] at grid point (x, y).
template <class A>
KILN_HD inline A sample(const A* plane, const Geom& g, A x, A y) {
  A unused = 1;
  if (g.interp == kBicubic) {
    const A ix = unnormalize(x, g.W, g.align, &unused), iy = unnormalize(y, g.H, g.align, &unused);
    const A x0 = flo(ix), y0 = flo(iy);
    A cx[4], cy[4];
    cubic_coeffs(cx, ix - x0);
    cubic_coeffs(cy, iy - y0);
    A out = 0;
    for (int j = 0; j < 4; ++j) {
      A row = 0;
      for (int i = 0; i < 4; ++i) row += bounded(plane, x0 - 1 + i, y0 - 1 + j, g) * cx[i];
      out += row * cy[j];
    }
    return out;
  }
  const A ix = source_index(x, g.W, g.padding, g.align, &unused);
  const A iy = source_index(y, g.H, g.padding, g.align, &unused);
  if (g.interp == kNearest) {
    const int64_t xn = static_cast<int64_t>(rint_even(ix)),
                  yn = static_cast<int64_t>(rint_even(iy));
    return inside(yn, xn, g.H, g.W) ? plane[yn * g.W + xn] : A(0);
  }
  const int64_t xw = static_cast<int64_t>(flo(ix)), yn = static_cast<int64_t>(flo(iy));
  const A fx = ix - static_cast<A>(xw), fy = iy - static_cast<A>(yn);
  A out = 0;
  if (inside(yn, xw, g.H, g.W)) out += plane[yn * g.W + xw] * (1 - fx) * (1 - fy);
  if (inside(yn, xw + 1, g.H, g.W)) out += plane[yn * g.W + xw + 1] * fx * (1 - fy);
  if (inside(yn + 1, xw, g.H, g.W)) out += plane[(yn + 1) * g.W + xw] * (1 - fx) * fy;
  if (inside(yn + 1, xw + 1, g.H, g.W)) out += plane[(yn + 1) * g.W + xw + 1] * fx * fy;
  return out;
}

// The backward at one grid point of image n: for every channel c, grad_output go[c * OHW] is
// spread over the input gradient gin (planes [C, H, W]; null when not wanted) through
// add(pointer, value), and the grid point's gradient is returned in (*gx, *gy).
template <class A, class Add>
KILN_HD inline void backward_at(const A* go, int64_t ohw, const A* in, A* gin, const Geom& g, A x,
                                A y, A* gx, A* gy, Add add) {
  const int64_t HW = g.H * g.W;
  A mx_ = 1, my_ = 1, sx = 0, sy = 0;
  if (g.interp == kBicubic) {
    const A ix = unnormalize(x, g.W, g.align, &mx_), iy = unnormalize(y, g.H, g.align, &my_);
    const A x0 = flo(ix), y0 = flo(iy);
    A cx[4], cy[4], dx[4], dy[4];
    cubic_coeffs(cx, ix - x0);
    cubic_coeffs(cy, iy - y0);
    cubic_coeffs_grad(dx, ix - x0);
    cubic_coeffs_grad(dy, iy - y0);
    for (int64_t c = 0; c < g.C; ++c) {
      const A gout = go[c * ohw];
      const A* plane = in + c * HW;
      for (int i = 0; i < 4; ++i)
        for (int j = 0; j < 4; ++j) {
          const A px = x0 - 1 + i, py = y0 - 1 + j;
          if (gin) {
            A unused = 1;
            const int64_t tx =
                static_cast<int64_t>(pad_coord(px, g.W, g.padding, g.align, &unused));
            const int64_t ty =
                static_cast<int64_t>(pad_coord(py, g.H, g.padding, g.align, &unused));
            if (inside(ty, tx, g.H, g.W)) add(gin + c * HW + ty * g.W + tx, gout * cx[i] * cy[j]);
          }
          const A v = bounded(plane, px, py, g);
          sx -= v * dx[i] * cy[j] * gout;
          sy -= v * dy[j] * cx[i] * gout;
        }
    }
    *gx = mx_ * sx;
    *gy = my_ * sy;
    return;
  }
  const A ix = source_index(x, g.W, g.padding, g.align, &mx_);
  const A iy = source_index(y, g.H, g.padding, g.align, &my_);
  if (g.interp == kNearest) {
    const int64_t xn = static_cast<int64_t>(rint_even(ix)),
                  yn = static_cast<int64_t>(rint_even(iy));
    if (gin && inside(yn, xn, g.H, g.W))
      for (int64_t c = 0; c < g.C; ++c) add(gin + c * HW + yn * g.W + xn, go[c * ohw]);
    *gx = 0;
    *gy = 0;
    return;
  }
  const int64_t xw = static_cast<int64_t>(flo(ix)), yn = static_cast<int64_t>(flo(iy));
  const A fx = ix - static_cast<A>(xw), fy = iy - static_cast<A>(yn);
  const bool in_nw = inside(yn, xw, g.H, g.W), in_ne = inside(yn, xw + 1, g.H, g.W);
  const bool in_sw = inside(yn + 1, xw, g.H, g.W), in_se = inside(yn + 1, xw + 1, g.H, g.W);
  const int64_t nw = yn * g.W + xw;
  for (int64_t c = 0; c < g.C; ++c) {
    const A gout = go[c * ohw];
    const A* plane = in + c * HW;
    A* gp = gin ? gin + c * HW : nullptr;
    if (in_nw) {
      if (gp) add(gp + nw, (1 - fx) * (1 - fy) * gout);
      sx -= plane[nw] * (1 - fy) * gout;
      sy -= plane[nw] * (1 - fx) * gout;
    }
    if (in_ne) {
      if (gp) add(gp + nw + 1, fx * (1 - fy) * gout);
      sx += plane[nw + 1] * (1 - fy) * gout;
      sy -= plane[nw + 1] * fx * gout;
    }
    if (in_sw) {
      if (gp) add(gp + nw + g.W, (1 - fx) * fy * gout);
      sx -= plane[nw + g.W] * fy * gout;
      sy += plane[nw + g.W] * (1 - fx) * gout;
    }
    if (in_se) {
      if (gp) add(gp + nw + g.W + 1, fx * fy * gout);
      sx += plane[nw + g.W + 1] * fy * gout;
      sy += plane[nw + g.W + 1] * fx * gout;
    }
  }
  *gx = mx_ * sx;
  *gy = my_ * sy;
}

}  // namespace kiln::detail::grid

// CPU pooling kernels (Note [Pooling] in kiln/ops/pool_meta.cpp): one loop nest over 3 spatial
// slots serves 2-D and 3-D, planes split across OpenMP threads. Sums in acc_t (float for the
// 16-bit floats).
#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>
#include <type_traits>
#include <vector>

#include "kiln/backend/cpu/loops.h"
#include "kiln/ops/pool_meta.h"
#include "kiln/ops/structured.h"

namespace kiln::cpu {
namespace {

using detail::PoolGeom;
using detail::PoolKind;

// Planes per thread below which the loop stays on one thread.
bool parallel_worth(const PoolGeom& g, int64_t per_plane) {
  return g.planes > 1 && g.planes * per_plane > kGrainSize;
}

// The input range [lo, hi) window o of a dim reads, for avg (padded extent in `padded`) and
// adaptive pooling.
struct Range {
  int64_t lo, hi, padded;
};
Range avg_range(const PoolGeom& g, size_t j, int64_t o) {
  int64_t lo = o * g.stride[j] - g.pad[j];
  int64_t hi = std::min(lo + g.k[j], g.x[j] + g.pad[j]);
  int64_t padded = hi - lo;
  return {std::max<int64_t>(lo, 0), std::min(hi, g.x[j]), padded};
}
Range adaptive_range(const PoolGeom& g, size_t j, int64_t o) {
  int64_t lo = detail::adaptive_start(o, g.y[j], g.x[j]);
  int64_t hi = detail::adaptive_end(o, g.y[j], g.x[j]);
  return {lo, hi, hi - lo};
}
Range window(const PoolGeom& g, size_t j, int64_t o) {
  return g.kind == PoolKind::Adaptive ? adaptive_range(g, j, o) : avg_range(g, j, o);
}
// The divisor of an avg or adaptive window.
template <class A>
A divisor(const PoolGeom& g, const Range& r0, const Range& r1, const Range& r2) {
  if (g.kind == PoolKind::Avg && g.divisor != 0) return static_cast<A>(g.divisor);
  if (g.kind == PoolKind::Avg && g.count_include_pad)
    return static_cast<A>(r0.padded * r1.padded * r2.padded);
  return static_cast<A>((r0.hi - r0.lo) * (r1.hi - r1.lo) * (r2.hi - r2.lo));
}

// Per dim j and output o: the first input position window o reads inside [0, x) (a multiple of
// the dilation past its start) and the end of its reads; the same for every plane.
struct Taps {
  std::vector<int64_t> first[3], end[3];
  explicit Taps(const PoolGeom& g) {
    for (size_t j = 0; j < 3; ++j)
      for (int64_t o = 0; o < g.y[j]; ++o) {
        int64_t s = o * g.stride[j] - g.pad[j];
        end[j].push_back(std::min(s + (g.k[j] - 1) * g.dil[j] + 1, g.x[j]));
        while (s < 0) s += g.dil[j];
        first[j].push_back(s);
      }
  }
};

// x is one plane [x0, x1, x2], y and idx one plane [y0, y1, y2].
template <class T>
void max_plane(const T* x, T* y, int64_t* idx, const PoolGeom& g, const Taps& t) {
  using A = acc_t<T>;
  const int64_t d0 = g.dil[0], d1 = g.dil[1], d2 = g.dil[2], x1 = g.x[1], x2 = g.x[2];
  int64_t out = 0;
  for (int64_t o0 = 0; o0 < g.y[0]; ++o0) {
    const int64_t s0 = t.first[0][o0], e0 = t.end[0][o0];
    for (int64_t o1 = 0; o1 < g.y[1]; ++o1) {
      const int64_t s1 = t.first[1][o1], e1 = t.end[1][o1];
      for (int64_t o2 = 0; o2 < g.y[2]; ++o2, ++out) {
        const int64_t s2 = t.first[2][o2], e2 = t.end[2][o2];
        int64_t best = (s0 * x1 + s1) * x2 + s2;
        A m = -std::numeric_limits<A>::infinity();
        for (int64_t i0 = s0; i0 < e0; i0 += d0)
          for (int64_t i1 = s1; i1 < e1; i1 += d1) {
            const int64_t row = (i0 * x1 + i1) * x2;
            for (int64_t i2 = s2; i2 < e2; i2 += d2) {
              A v = static_cast<A>(x[row + i2]);
              if (v > m || std::isnan(v)) {
                m = v;
                best = row + i2;
              }
            }
          }
        y[out] = static_cast<T>(m);
        idx[out] = best;
      }
    }
  }
}

// Note [2x2 max pooling]
// Most nets pool 2-D planes in 2x2 windows at stride 2 (the Fashion-MNIST CNN twice per step).
// The general loop above spends most of its time on window bounds there, so such windows, when
// every one lies inside the plane, take this loop: four loads per output, compared in the
// general loop's order (row by row, `>` or NaN), so ties and NaNs pick the same index.
bool is_2x2_stride_2(const PoolGeom& g) {
  return g.x[0] == 1 && g.k == std::array<int64_t, 3>{1, 2, 2} && g.stride[1] == 2 &&
         g.stride[2] == 2 && g.pad[1] == 0 && g.pad[2] == 0 && g.dil[1] == 1 && g.dil[2] == 1 &&
         2 * g.y[1] <= g.x[1] && 2 * g.y[2] <= g.x[2];
}
template <class T>
void max_plane_2x2(const T* x, T* y, int64_t* idx, const PoolGeom& g) {
  using A = acc_t<T>;
  const int64_t w = g.x[2], yw = g.y[2];
  for (int64_t o1 = 0; o1 < g.y[1]; ++o1) {
    const int64_t row0 = 2 * o1 * w, row1 = row0 + w;
    for (int64_t o2 = 0; o2 < yw; ++o2) {
      int64_t best = row0 + 2 * o2;
      A m = static_cast<A>(x[best]);
      for (int64_t at : {best + 1, row1 + 2 * o2, row1 + 2 * o2 + 1}) {
        const A v = static_cast<A>(x[at]);
        const bool take = v > m || std::isnan(v);
        m = take ? v : m;
        best = take ? at : best;
      }
      y[o1 * yw + o2] = static_cast<T>(m);
      idx[o1 * yw + o2] = best;
    }
  }
}

template <class T>
void mean_plane(const T* x, T* y, const PoolGeom& g) {
  using A = acc_t<T>;
  for (int64_t o0 = 0; o0 < g.y[0]; ++o0) {
    Range r0 = window(g, 0, o0);
    for (int64_t o1 = 0; o1 < g.y[1]; ++o1) {
      Range r1 = window(g, 1, o1);
      for (int64_t o2 = 0; o2 < g.y[2]; ++o2) {
        Range r2 = window(g, 2, o2);
        int64_t out = (o0 * g.y[1] + o1) * g.y[2] + o2;
        if (r0.lo >= r0.hi || r1.lo >= r1.hi || r2.lo >= r2.hi) {
          y[out] = T(0);
          continue;
        }
        A sum = 0;
        for (int64_t i0 = r0.lo; i0 < r0.hi; ++i0)
          for (int64_t i1 = r1.lo; i1 < r1.hi; ++i1)
            for (int64_t i2 = r2.lo; i2 < r2.hi; ++i2)
              sum += static_cast<A>(x[(i0 * g.x[1] + i1) * g.x[2] + i2]);
        y[out] = static_cast<T>(sum / divisor<A>(g, r0, r1, r2));
      }
    }
  }
}

// One plane's gradient: acc (the plane [x0, x1, x2], zeroed) gets each output's gy / divisor
// added over its window, outputs in order.
template <class T, class A>
void mean_backward_plane(const T* gy, A* acc, const PoolGeom& g) {
  for (int64_t o0 = 0; o0 < g.y[0]; ++o0) {
    Range r0 = window(g, 0, o0);
    for (int64_t o1 = 0; o1 < g.y[1]; ++o1) {
      Range r1 = window(g, 1, o1);
      for (int64_t o2 = 0; o2 < g.y[2]; ++o2) {
        Range r2 = window(g, 2, o2);
        A v = static_cast<A>(gy[(o0 * g.y[1] + o1) * g.y[2] + o2]) / divisor<A>(g, r0, r1, r2);
        for (int64_t i0 = r0.lo; i0 < r0.hi; ++i0)
          for (int64_t i1 = r1.lo; i1 < r1.hi; ++i1) {
            A* row = acc + (i0 * g.x[1] + i1) * g.x[2];
            for (int64_t i2 = r2.lo; i2 < r2.hi; ++i2) row[i2] += v;
          }
      }
    }
  }
}

// Every plane of x [planes, *x] into y [planes, *y] (and idx for max), planes across threads.
template <class T>
void forward_planes(const T* x, T* y, int64_t* idx, const PoolGeom& g) {
  const int64_t xp = g.x_plane(), yp = g.y_plane();
  const int64_t work = g.kind == PoolKind::Adaptive ? xp : yp * g.k[0] * g.k[1] * g.k[2];
  const Taps taps(g);
  const bool max_2x2 = g.kind == PoolKind::Max && is_2x2_stride_2(g);
#pragma omp parallel for if (parallel_worth(g, work))
  for (int64_t p = 0; p < g.planes; ++p) {
    if (max_2x2)
      max_plane_2x2<T>(x + p * xp, y + p * yp, idx + p * yp, g);
    else if (g.kind == PoolKind::Max)
      max_plane<T>(x + p * xp, y + p * yp, idx + p * yp, g, taps);
    else
      mean_plane<T>(x + p * xp, y + p * yp, g);
  }
}

// gx from gy, plane by plane on one thread each (Note [Pooling]): max adds each gy at its index
// (ATen's order), avg and adaptive spread gy / divisor over the window, into an acc_t buffer
// rounded once. An index outside the plane is skipped and put in *bad (which stays empty when
// none is).
template <class T>
void backward_planes(const T* gy, const int64_t* idx, T* gx, const PoolGeom& g,
                     std::optional<int64_t>* bad) {
  using A = acc_t<T>;
  // float32 and float64 sum in the plane of gx itself; the 16-bit floats in a float buffer.
  constexpr bool in_place = std::is_same_v<A, T>;
  const int64_t xp = g.x_plane(), yp = g.y_plane();
#pragma omp parallel if (parallel_worth(g, xp + yp))
  {
    std::vector<A> buffer(in_place ? 0 : static_cast<size_t>(xp));
#pragma omp for
    for (int64_t p = 0; p < g.planes; ++p) {
      A* acc = in_place ? reinterpret_cast<A*>(gx + p * xp) : buffer.data();
      std::fill(acc, acc + xp, A(0));
      if (g.kind == PoolKind::Max) {
        for (int64_t o = p * yp; o < (p + 1) * yp; ++o) {
          if (idx[o] < 0 || idx[o] >= xp) {
#pragma omp critical(kiln_pool_bad_index)
            *bad = idx[o];
            continue;
          }
          acc[idx[o]] += static_cast<A>(gy[o]);
        }
      } else {
        mean_backward_plane<T, A>(gy + p * yp, acc, g);
      }
      if (!in_place)
        for (int64_t i = 0; i < xp; ++i) gx[p * xp + i] = static_cast<T>(acc[i]);
    }
  }
}

TensorPair forward(const Tensor& x_, const PoolGeom& g) {
  Tensor x = contiguous_as(x_, x_.dtype());
  Tensor y = detail::empty_tensor(g.out_sizes, x.dtype(), Device(kCPU));
  Tensor idx;
  if (g.kind == PoolKind::Max) idx = detail::empty_tensor(g.out_sizes, kInt64, Device(kCPU));
  KILN_DISPATCH_FLOAT_TYPES(x.dtype(), "pooling", [&] {
    forward_planes<scalar_t>(
        static_cast<const scalar_t*>(x.impl()->data()), static_cast<scalar_t*>(y.impl()->data()),
        idx.defined() ? static_cast<int64_t*>(idx.impl()->data()) : nullptr, g);
  });
  return {y, idx};
}

Tensor backward(const Tensor& gy_, const Tensor& indices, const PoolGeom& g) {
  Tensor gy = contiguous_as(gy_, gy_.dtype());
  Tensor idx = indices.defined() ? contiguous_as(indices, kInt64) : Tensor();
  Tensor gx = detail::empty_tensor(g.in_sizes, gy.dtype(), Device(kCPU));
  std::optional<int64_t> bad;
  KILN_DISPATCH_FLOAT_TYPES(gy.dtype(), "pooling backward", [&] {
    backward_planes<scalar_t>(
        static_cast<const scalar_t*>(gy.impl()->data()),
        idx.defined() ? static_cast<const int64_t*>(idx.impl()->data()) : nullptr,
        static_cast<scalar_t*>(gx.impl()->data()), g, &bad);
  });
  // gx is the kernel's own, so raising after the loop leaves nothing of the caller's written.
  KILN_CHECK_INDEX(
      !bad, "[{}] index {} is out of range for a plane of size {}",
      g.nd == 2 ? "max_pool2d_with_indices_backward" : "max_pool3d_with_indices_backward",
      bad.value_or(0), g.x_plane());
  return gx;
}

constexpr detail::PoolKernels kKernels{&forward, &backward};

KILN_POOL_KERNEL_FUNCTIONS(kKernels)

const bool registered = [] {
#define KILN_REG(name) ops::op_##name.set_kernel(DispatchKey::CPU, &name##_kernel);
  KILN_POOL_FOR_EACH_KERNEL(KILN_REG)
#undef KILN_REG
  return true;
}();

}  // namespace
}  // namespace kiln::cpu

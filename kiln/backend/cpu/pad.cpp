// CPU padding and upsampling kernels (Note [Padding and upsampling] in kiln/ops/pad_meta.cpp):
// planes split across OpenMP threads; the backward ops add each output's gradient into its
// sources in output order, into an acc_t buffer for the 16-bit floats.
#include <algorithm>
#include <type_traits>
#include <vector>

#include "kiln/backend/cpu/loops.h"
#include "kiln/ops/pad_math.h"
#include "kiln/ops/pad_meta.h"
#include "kiln/ops/structured.h"

namespace kiln::cpu {
namespace {

using detail::PadGeom;
using detail::UpsampleGeom;
namespace pm = detail::pad;

bool parallel_worth(int64_t planes, int64_t per_plane) {
  return planes > 1 && planes * per_plane > kGrainSize;
}

// Per spatial slot j, the source of every output position (the same for every plane).
struct PadSources {
  std::vector<int64_t> src[3];
  explicit PadSources(const PadGeom& g) {
    for (size_t j = 0; j < 3; ++j)
      for (int64_t o = 0; o < g.y[j]; ++o)
        src[j].push_back(pm::source(static_cast<int>(g.mode), o, g.left[j], g.x[j]));
  }
};

template <class T>
void pad_planes(const T* x, T* y, const PadGeom& g) {
  const int64_t xp = g.x_plane(), yp = g.y_plane();
  const PadSources s(g);
#pragma omp parallel for if (parallel_worth(g.planes, yp))
  for (int64_t p = 0; p < g.planes; ++p) {
    const T* xs = x + p * xp;
    T* ys = y + p * yp;
    for (int64_t o0 = 0; o0 < g.y[0]; ++o0)
      for (int64_t o1 = 0; o1 < g.y[1]; ++o1) {
        const T* row = xs + (s.src[0][o0] * g.x[1] + s.src[1][o1]) * g.x[2];
        T* out = ys + (o0 * g.y[1] + o1) * g.y[2];
        for (int64_t o2 = 0; o2 < g.y[2]; ++o2) out[o2] = row[s.src[2][o2]];
      }
  }
}

template <class T>
void pad_backward_planes(const T* gy, T* gx, const PadGeom& g) {
  using A = acc_t<T>;
  constexpr bool in_place = std::is_same_v<A, T>;
  const int64_t xp = g.x_plane(), yp = g.y_plane();
  const PadSources s(g);
#pragma omp parallel if (parallel_worth(g.planes, xp + yp))
  {
    std::vector<A> buffer(in_place ? 0 : static_cast<size_t>(xp));
#pragma omp for
    for (int64_t p = 0; p < g.planes; ++p) {
      A* acc = in_place ? reinterpret_cast<A*>(gx + p * xp) : buffer.data();
      std::fill(acc, acc + xp, A(0));
      const T* gs = gy + p * yp;
      for (int64_t o0 = 0; o0 < g.y[0]; ++o0)
        for (int64_t o1 = 0; o1 < g.y[1]; ++o1) {
          A* row = acc + (s.src[0][o0] * g.x[1] + s.src[1][o1]) * g.x[2];
          const T* in = gs + (o0 * g.y[1] + o1) * g.y[2];
          for (int64_t o2 = 0; o2 < g.y[2]; ++o2) row[s.src[2][o2]] += static_cast<A>(in[o2]);
        }
      if (!in_place)
        for (int64_t i = 0; i < xp; ++i) gx[p * xp + i] = static_cast<T>(acc[i]);
    }
  }
}

// One dim's taps for every output position of an upsampling (nearest: i1 = i0, l0 = 1, l1 = 0).
template <class A>
struct Taps {
  std::vector<int64_t> i0, i1;
  std::vector<A> l0, l1;
  Taps(const UpsampleGeom& g, int64_t in, int64_t out, double scale) {
    const A ratio = pm::linear_ratio<A>(in, out, g.align_corners, scale);
    for (int64_t j = 0; j < out; ++j) {
      int64_t a = 0, b = 0;
      A la = 1, lb = 0;
      if (g.bilinear)
        pm::linear_taps<A>(j, in, out, g.align_corners, ratio, a, b, la, lb);
      else
        a = b = pm::nearest_source(j, in, out, scale);
      i0.push_back(a);
      i1.push_back(b);
      l0.push_back(la);
      l1.push_back(lb);
    }
  }
};

template <class T>
void upsample_planes(const T* x, T* y, const UpsampleGeom& g) {
  using A = acc_t<T>;
  const int64_t xp = g.ih * g.iw, yp = g.oh * g.ow;
  const Taps<A> th(g, g.ih, g.oh, g.scale_h), tw(g, g.iw, g.ow, g.scale_w);
#pragma omp parallel for if (parallel_worth(g.planes, yp))
  for (int64_t p = 0; p < g.planes; ++p) {
    const T* xs = x + p * xp;
    T* ys = y + p * yp;
    for (int64_t oh = 0; oh < g.oh; ++oh) {
      const T* r0 = xs + th.i0[oh] * g.iw;
      const T* r1 = xs + th.i1[oh] * g.iw;
      for (int64_t ow = 0; ow < g.ow; ++ow) {
        if (!g.bilinear) {
          ys[oh * g.ow + ow] = r0[tw.i0[ow]];
          continue;
        }
        const int64_t a = tw.i0[ow], b = tw.i1[ow];
        const A v =
            th.l0[oh] * (tw.l0[ow] * static_cast<A>(r0[a]) + tw.l1[ow] * static_cast<A>(r0[b])) +
            th.l1[oh] * (tw.l0[ow] * static_cast<A>(r1[a]) + tw.l1[ow] * static_cast<A>(r1[b]));
        ys[oh * g.ow + ow] = static_cast<T>(v);
      }
    }
  }
}

template <class T>
void upsample_backward_planes(const T* gy, T* gx, const UpsampleGeom& g) {
  using A = acc_t<T>;
  constexpr bool in_place = std::is_same_v<A, T>;
  const int64_t xp = g.ih * g.iw, yp = g.oh * g.ow;
  const Taps<A> th(g, g.ih, g.oh, g.scale_h), tw(g, g.iw, g.ow, g.scale_w);
#pragma omp parallel if (parallel_worth(g.planes, xp + yp))
  {
    std::vector<A> buffer(in_place ? 0 : static_cast<size_t>(xp));
#pragma omp for
    for (int64_t p = 0; p < g.planes; ++p) {
      A* acc = in_place ? reinterpret_cast<A*>(gx + p * xp) : buffer.data();
      std::fill(acc, acc + xp, A(0));
      const T* gs = gy + p * yp;
      for (int64_t oh = 0; oh < g.oh; ++oh) {
        A* r0 = acc + th.i0[oh] * g.iw;
        A* r1 = acc + th.i1[oh] * g.iw;
        for (int64_t ow = 0; ow < g.ow; ++ow) {
          const A v = static_cast<A>(gs[oh * g.ow + ow]);
          if (!g.bilinear) {
            r0[tw.i0[ow]] += v;
            continue;
          }
          const int64_t a = tw.i0[ow], b = tw.i1[ow];
          r0[a] += th.l0[oh] * tw.l0[ow] * v;
          r0[b] += th.l0[oh] * tw.l1[ow] * v;
          r1[a] += th.l1[oh] * tw.l0[ow] * v;
          r1[b] += th.l1[oh] * tw.l1[ow] * v;
        }
      }
      if (!in_place)
        for (int64_t i = 0; i < xp; ++i) gx[p * xp + i] = static_cast<T>(acc[i]);
    }
  }
}

template <class G, class F>
Tensor run(const Tensor& in_, IntArrayRef out_sizes, const G& g, const char* what, F f) {
  Tensor in = contiguous_as(in_, in_.dtype());
  Tensor out = detail::empty_tensor(out_sizes, in.dtype(), Device(kCPU));
  KILN_DISPATCH_FLOAT_TYPES(in.dtype(), what, [&] {
    f(static_cast<const scalar_t*>(in.impl()->data()), static_cast<scalar_t*>(out.impl()->data()),
      g);
  });
  return out;
}

Tensor pad(const Tensor& x, const PadGeom& g) {
  return run(x, g.out_sizes, g, "padding",
             [](auto* a, auto* b, const PadGeom& geom) { pad_planes(a, b, geom); });
}
Tensor pad_backward(const Tensor& gy, const PadGeom& g) {
  return run(gy, g.in_sizes, g, "padding backward",
             [](auto* a, auto* b, const PadGeom& geom) { pad_backward_planes(a, b, geom); });
}
Tensor upsample(const Tensor& x, const UpsampleGeom& g) {
  return run(x, g.out_sizes, g, "upsampling",
             [](auto* a, auto* b, const UpsampleGeom& geom) { upsample_planes(a, b, geom); });
}
Tensor upsample_backward(const Tensor& gy, const UpsampleGeom& g) {
  return run(
      gy, g.in_sizes, g, "upsampling backward",
      [](auto* a, auto* b, const UpsampleGeom& geom) { upsample_backward_planes(a, b, geom); });
}

constexpr detail::PadKernels kKernels{&pad, &pad_backward, &upsample, &upsample_backward};

KILN_PAD_KERNEL_FUNCTIONS(kKernels)

const bool registered = [] {
#define KILN_REG(name) ops::op_##name.set_kernel(DispatchKey::CPU, &name##_kernel);
  KILN_PAD_FOR_EACH_KERNEL(KILN_REG)
#undef KILN_REG
  return true;
}();

}  // namespace
}  // namespace kiln::cpu

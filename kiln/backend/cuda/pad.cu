// CUDA padding and upsampling kernels (Note [Padding and upsampling] in kiln/ops/pad_meta.cpp):
// the forward takes one thread per output element, the backward one per input element gathering
// from the outputs that read it (kiln/ops/pad_math.h finds them), so no two threads write one
// element. Arithmetic in acc_t (float for the 16-bit floats).
#include "kiln/backend/cuda/loops.cuh"
#include "kiln/backend/cuda/pad.h"
#include "kiln/ops/pad_math.h"

namespace kiln::cuda {
namespace {

namespace pm = kiln::detail::pad;

template <class T>
__global__ void pad_forward_kernel(PadArgs a, const T* x, T* y, int64_t n) {
  int64_t t = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (t >= n) return;
  const int64_t yp = a.y[0] * a.y[1] * a.y[2], xp = a.x[0] * a.x[1] * a.x[2];
  const int64_t p = t / yp, r = t % yp;
  const int64_t o[3] = {r / (a.y[1] * a.y[2]), r / a.y[2] % a.y[1], r % a.y[2]};
  int64_t s[3];
  for (int j = 0; j < 3; ++j) s[j] = pm::source(a.mode, o[j], a.left[j], a.x[j]);
  y[t] = x[p * xp + (s[0] * a.x[1] + s[1]) * a.x[2] + s[2]];
}

template <class T>
__global__ void pad_backward_kernel(PadArgs a, const T* gy, T* gx, int64_t n) {
  using A = acc_t<T>;
  int64_t t = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (t >= n) return;
  const int64_t yp = a.y[0] * a.y[1] * a.y[2], xp = a.x[0] * a.x[1] * a.x[2];
  const int64_t p = t / xp, r = t % xp;
  const int64_t i[3] = {r / (a.x[1] * a.x[2]), r / a.x[2] % a.x[1], r % a.x[2]};
  int64_t lo[3][3], hi[3][3];
  for (int j = 0; j < 3; ++j) pm::readers(a.mode, i[j], a.left[j], a.x[j], a.y[j], lo[j], hi[j]);
  const T* g = gy + p * yp;
  A sum = 0;
  for (int r0 = 0; r0 < 3; ++r0)
    for (int64_t o0 = lo[0][r0]; o0 < hi[0][r0]; ++o0)
      for (int r1 = 0; r1 < 3; ++r1)
        for (int64_t o1 = lo[1][r1]; o1 < hi[1][r1]; ++o1) {
          const T* row = g + (o0 * a.y[1] + o1) * a.y[2];
          for (int r2 = 0; r2 < 3; ++r2)
            for (int64_t o2 = lo[2][r2]; o2 < hi[2][r2]; ++o2) sum += cvt<A>(row[o2]);
        }
  gx[t] = cvt<T>(sum);
}

template <class T>
__global__ void upsample_forward_kernel(UpsampleArgs a, const T* x, T* y, int64_t n) {
  using A = acc_t<T>;
  int64_t t = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (t >= n) return;
  const int64_t yp = a.oh * a.ow, p = t / yp, oh = t % yp / a.ow, ow = t % a.ow;
  const T* xs = x + p * a.ih * a.iw;
  if (!a.bilinear) {
    y[t] = xs[pm::nearest_source(oh, a.ih, a.oh, a.scale_h) * a.iw +
              pm::nearest_source(ow, a.iw, a.ow, a.scale_w)];
    return;
  }
  int64_t h0, h1, w0, w1;
  A lh0, lh1, lw0, lw1;
  pm::linear_taps<A>(oh, a.ih, a.oh, a.align_corners,
                     pm::linear_ratio<A>(a.ih, a.oh, a.align_corners, a.scale_h), h0, h1, lh0, lh1);
  pm::linear_taps<A>(ow, a.iw, a.ow, a.align_corners,
                     pm::linear_ratio<A>(a.iw, a.ow, a.align_corners, a.scale_w), w0, w1, lw0, lw1);
  const T* r0 = xs + h0 * a.iw;
  const T* r1 = xs + h1 * a.iw;
  const A v = lh0 * (lw0 * cvt<A>(r0[w0]) + lw1 * cvt<A>(r0[w1])) +
              lh1 * (lw0 * cvt<A>(r1[w0]) + lw1 * cvt<A>(r1[w1]));
  y[t] = cvt<T>(v);
}

// The weight input i gets from output j along one dim (bilinear: the sum of the taps at i).
template <class A>
__device__ __forceinline__ A tap_weight(int64_t j, int64_t i, int64_t in, int64_t out,
                                        bool align_corners, A ratio) {
  int64_t i0, i1;
  A l0, l1;
  pm::linear_taps<A>(j, in, out, align_corners, ratio, i0, i1, l0, l1);
  return (i0 == i ? l0 : A(0)) + (i1 == i ? l1 : A(0));
}

template <class T>
__global__ void upsample_backward_kernel(UpsampleArgs a, const T* gy, T* gx, int64_t n) {
  using A = acc_t<T>;
  int64_t t = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (t >= n) return;
  const int64_t xp = a.ih * a.iw, p = t / xp, ih = t % xp / a.iw, iw = t % a.iw;
  const T* g = gy + p * a.oh * a.ow;
  A sum = 0;
  if (!a.bilinear) {
    const int64_t h_lo = pm::nearest_first(ih, a.ih, a.oh, a.scale_h);
    const int64_t h_hi = pm::nearest_first(ih + 1, a.ih, a.oh, a.scale_h);
    const int64_t w_lo = pm::nearest_first(iw, a.iw, a.ow, a.scale_w);
    const int64_t w_hi = pm::nearest_first(iw + 1, a.iw, a.ow, a.scale_w);
    for (int64_t oh = h_lo; oh < h_hi; ++oh)
      for (int64_t ow = w_lo; ow < w_hi; ++ow) sum += cvt<A>(g[oh * a.ow + ow]);
    gx[t] = cvt<T>(sum);
    return;
  }
  const A rh = pm::linear_ratio<A>(a.ih, a.oh, a.align_corners, a.scale_h);
  const A rw = pm::linear_ratio<A>(a.iw, a.ow, a.align_corners, a.scale_w);
  const int64_t h_lo = pm::linear_first<A>(ih - 1, a.ih, a.oh, a.align_corners, rh);
  const int64_t h_hi = pm::linear_first<A>(ih + 1, a.ih, a.oh, a.align_corners, rh);
  const int64_t w_lo = pm::linear_first<A>(iw - 1, a.iw, a.ow, a.align_corners, rw);
  const int64_t w_hi = pm::linear_first<A>(iw + 1, a.iw, a.ow, a.align_corners, rw);
  for (int64_t oh = h_lo; oh < h_hi; ++oh) {
    const A wh = tap_weight<A>(oh, ih, a.ih, a.oh, a.align_corners, rh);
    if (wh == A(0)) continue;
    for (int64_t ow = w_lo; ow < w_hi; ++ow) {
      const A ww = tap_weight<A>(ow, iw, a.iw, a.ow, a.align_corners, rw);
      sum += wh * ww * cvt<A>(g[oh * a.ow + ow]);
    }
  }
  gx[t] = cvt<T>(sum);
}

unsigned blocks(int64_t n) { return static_cast<unsigned>((n + kBlock - 1) / kBlock); }

}  // namespace

void launch_pad_forward(Dt dt, const PadArgs& a, const void* x, void* y, cudaStream_t stream) {
  const int64_t n = a.planes * a.y[0] * a.y[1] * a.y[2];
  if (n == 0) return;
  KILN_CUDA_DISPATCH_FLOAT(dt, [&] {
    pad_forward_kernel<scalar_t><<<blocks(n), kBlock, 0, stream>>>(
        a, static_cast<const scalar_t*>(x), static_cast<scalar_t*>(y), n);
  });
}

void launch_pad_backward(Dt dt, const PadArgs& a, const void* gy, void* gx, cudaStream_t stream) {
  const int64_t n = a.planes * a.x[0] * a.x[1] * a.x[2];
  if (n == 0) return;
  KILN_CUDA_DISPATCH_FLOAT(dt, [&] {
    pad_backward_kernel<scalar_t><<<blocks(n), kBlock, 0, stream>>>(
        a, static_cast<const scalar_t*>(gy), static_cast<scalar_t*>(gx), n);
  });
}

void launch_upsample_forward(Dt dt, const UpsampleArgs& a, const void* x, void* y,
                             cudaStream_t stream) {
  const int64_t n = a.planes * a.oh * a.ow;
  if (n == 0) return;
  KILN_CUDA_DISPATCH_FLOAT(dt, [&] {
    upsample_forward_kernel<scalar_t><<<blocks(n), kBlock, 0, stream>>>(
        a, static_cast<const scalar_t*>(x), static_cast<scalar_t*>(y), n);
  });
}

void launch_upsample_backward(Dt dt, const UpsampleArgs& a, const void* gy, void* gx,
                              cudaStream_t stream) {
  const int64_t n = a.planes * a.ih * a.iw;
  if (n == 0) return;
  KILN_CUDA_DISPATCH_FLOAT(dt, [&] {
    upsample_backward_kernel<scalar_t><<<blocks(n), kBlock, 0, stream>>>(
        a, static_cast<const scalar_t*>(gy), static_cast<scalar_t*>(gx), n);
  });
}

}  // namespace kiln::cuda

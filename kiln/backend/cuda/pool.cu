// CUDA pooling kernels (Note [Pooling] in kiln/ops/pool_meta.cpp): the forward takes one thread
// per output element, the backward one per input element gathering from the windows that cover
// it, so no two threads write one element. Arithmetic in acc_t (float for the 16-bit floats).
#include <cmath>

#include "kiln/backend/cuda/loops.cuh"
#include "kiln/backend/cuda/pool.h"

namespace kiln::cuda {
namespace {

constexpr int kMax = 0, kAvg = 1, kAdaptive = 2;

struct Range {
  int64_t lo, hi, padded;
};

// The input range window o of dim j reads (avg: the padded extent in `padded`).
__device__ __forceinline__ Range window(const PoolArgs& a, int j, int64_t o) {
  if (a.kind == kAdaptive) {
    int64_t lo = o * a.x[j] / a.y[j], hi = ((o + 1) * a.x[j] + a.y[j] - 1) / a.y[j];
    return {lo, hi, hi - lo};
  }
  int64_t lo = o * a.stride[j] - a.pad[j];
  int64_t hi = min(lo + a.k[j], a.x[j] + a.pad[j]);
  return {max(lo, int64_t{0}), min(hi, a.x[j]), hi - lo};
}

template <class A>
__device__ __forceinline__ A divisor(const PoolArgs& a, const Range* r) {
  if (a.kind == kAvg && a.divisor != 0) return static_cast<A>(a.divisor);
  if (a.kind == kAvg && a.count_include_pad)
    return static_cast<A>(r[0].padded * r[1].padded * r[2].padded);
  return static_cast<A>((r[0].hi - r[0].lo) * (r[1].hi - r[1].lo) * (r[2].hi - r[2].lo));
}

template <class T>
__global__ void pool_forward_kernel(PoolArgs a, const T* x, T* y, int64_t* indices, int64_t n) {
  using A = acc_t<T>;
  int64_t t = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (t >= n) return;
  const int64_t yp = a.y[0] * a.y[1] * a.y[2], xp = a.x[0] * a.x[1] * a.x[2];
  const int64_t p = t / yp, r = t % yp;
  const int64_t o[3] = {r / (a.y[1] * a.y[2]), r / a.y[2] % a.y[1], r % a.y[2]};
  const T* xs = x + p * xp;
  if (a.kind == kMax) {
    int64_t s[3], e[3];
    for (int j = 0; j < 3; ++j) {
      s[j] = o[j] * a.stride[j] - a.pad[j];
      e[j] = min(s[j] + (a.k[j] - 1) * a.dil[j] + 1, a.x[j]);
      while (s[j] < 0) s[j] += a.dil[j];
    }
    int64_t best = (s[0] * a.x[1] + s[1]) * a.x[2] + s[2];
    A m = -INFINITY;
    for (int64_t i0 = s[0]; i0 < e[0]; i0 += a.dil[0])
      for (int64_t i1 = s[1]; i1 < e[1]; i1 += a.dil[1])
        for (int64_t i2 = s[2]; i2 < e[2]; i2 += a.dil[2]) {
          int64_t at = (i0 * a.x[1] + i1) * a.x[2] + i2;
          A v = cvt<A>(xs[at]);
          if (v > m || isnan(v)) {
            m = v;
            best = at;
          }
        }
    y[t] = cvt<T>(m);
    indices[t] = best;
    return;
  }
  Range w[3] = {window(a, 0, o[0]), window(a, 1, o[1]), window(a, 2, o[2])};
  if (w[0].lo >= w[0].hi || w[1].lo >= w[1].hi || w[2].lo >= w[2].hi) {
    y[t] = cvt<T>(A(0));
    return;
  }
  A sum = 0;
  for (int64_t i0 = w[0].lo; i0 < w[0].hi; ++i0)
    for (int64_t i1 = w[1].lo; i1 < w[1].hi; ++i1)
      for (int64_t i2 = w[2].lo; i2 < w[2].hi; ++i2)
        sum += cvt<A>(xs[(i0 * a.x[1] + i1) * a.x[2] + i2]);
  y[t] = cvt<T>(sum / divisor<A>(a, w));
}

// The output windows of dim j that may cover input position i: [lo, hi).
__device__ __forceinline__ void covering(const PoolArgs& a, int j, int64_t i, int64_t& lo,
                                         int64_t& hi) {
  if (a.kind == kAdaptive) {
    lo = max(int64_t{0}, i * a.y[j] / a.x[j] - 1);
    hi = min(a.y[j], (i + 1) * a.y[j] / a.x[j] + 2);
    return;
  }
  int64_t span = (a.k[j] - 1) * a.dil[j] + 1;
  int64_t num = i + a.pad[j] - span + 1;
  lo = num <= 0 ? 0 : (num + a.stride[j] - 1) / a.stride[j];
  hi = min(a.y[j], (i + a.pad[j]) / a.stride[j] + 1);
}

template <class T>
__global__ void pool_backward_kernel(PoolArgs a, const T* gy, const int64_t* indices, T* gx,
                                     int64_t n) {
  using A = acc_t<T>;
  int64_t t = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (t >= n) return;
  const int64_t yp = a.y[0] * a.y[1] * a.y[2], xp = a.x[0] * a.x[1] * a.x[2];
  const int64_t p = t / xp, r = t % xp;
  const int64_t i[3] = {r / (a.x[1] * a.x[2]), r / a.x[2] % a.x[1], r % a.x[2]};
  int64_t lo[3], hi[3];
  for (int j = 0; j < 3; ++j) covering(a, j, i[j], lo[j], hi[j]);
  const T* g = gy + p * yp;
  A sum = 0;
  if (a.kind == kMax) {
    const int64_t* idx = indices + p * yp;
    for (int64_t o0 = lo[0]; o0 < hi[0]; ++o0)
      for (int64_t o1 = lo[1]; o1 < hi[1]; ++o1)
        for (int64_t o2 = lo[2]; o2 < hi[2]; ++o2) {
          int64_t at = (o0 * a.y[1] + o1) * a.y[2] + o2;
          if (idx[at] == r) sum += cvt<A>(g[at]);
        }
  } else {
    for (int64_t o0 = lo[0]; o0 < hi[0]; ++o0) {
      Range w0 = window(a, 0, o0);
      if (i[0] < w0.lo || i[0] >= w0.hi) continue;
      for (int64_t o1 = lo[1]; o1 < hi[1]; ++o1) {
        Range w1 = window(a, 1, o1);
        if (i[1] < w1.lo || i[1] >= w1.hi) continue;
        for (int64_t o2 = lo[2]; o2 < hi[2]; ++o2) {
          Range w[3] = {w0, w1, window(a, 2, o2)};
          if (i[2] < w[2].lo || i[2] >= w[2].hi) continue;
          sum += cvt<A>(g[(o0 * a.y[1] + o1) * a.y[2] + o2]) / divisor<A>(a, w);
        }
      }
    }
  }
  gx[t] = cvt<T>(sum);
}

// indices [planes, *y]: an index outside its plane [0, xp) sets the device's error word (the
// CPU kernel's check; the backward kernel above never matches such an index, so without this
// check the gradient it was meant for would be dropped without a word).
__global__ void pool_check_indices_kernel(const int64_t* indices, int64_t xp, int64_t n, int* err,
                                          int code) {
  int64_t t = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (t >= n) return;
  if (indices[t] < 0 || indices[t] >= xp) atomicCAS(err, 0, code);
}

unsigned blocks(int64_t n) { return static_cast<unsigned>((n + kBlock - 1) / kBlock); }

}  // namespace

void launch_pool_forward(Dt dt, const PoolArgs& a, const void* x, void* y, int64_t* indices,
                         cudaStream_t stream) {
  const int64_t n = a.planes * a.y[0] * a.y[1] * a.y[2];
  if (n == 0) return;
  KILN_CUDA_DISPATCH_FLOAT(dt, [&] {
    pool_forward_kernel<scalar_t><<<blocks(n), kBlock, 0, stream>>>(
        a, static_cast<const scalar_t*>(x), static_cast<scalar_t*>(y), indices, n);
  });
}

void launch_pool_backward(Dt dt, const PoolArgs& a, const void* gy, const int64_t* indices,
                          void* gx, int* err, int code, cudaStream_t stream) {
  const int64_t xp = a.x[0] * a.x[1] * a.x[2], n = a.planes * xp;
  const int64_t n_out = a.planes * a.y[0] * a.y[1] * a.y[2];
  if (a.kind == kMax && n_out > 0)
    pool_check_indices_kernel<<<blocks(n_out), kBlock, 0, stream>>>(indices, xp, n_out, err, code);
  if (n == 0) return;
  KILN_CUDA_DISPATCH_FLOAT(dt, [&] {
    pool_backward_kernel<scalar_t><<<blocks(n), kBlock, 0, stream>>>(
        a, static_cast<const scalar_t*>(gy), indices, static_cast<scalar_t*>(gx), n);
  });
}

}  // namespace kiln::cuda

// CUDA kernels of batch, group and layer norm: per-channel moments and sums (a block per
// channel, the channel's n * hw elements strided over its threads, a block reduction in acc_t),
// and one elementwise pass. Arithmetic in acc_t (float for the 16-bit floats).
#include <algorithm>

#include "kiln/backend/cuda/loops.cuh"
#include "kiln/backend/cuda/norm.h"

namespace kiln::cuda {
namespace {

inline constexpr int kThreads = 512;

// The sum of v over the block, given to every thread; every thread calls it.
template <class A>
__device__ A block_sum(A v, A* shm) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_down_sync(0xffffffffu, v, o);
  const int warps = static_cast<int>(blockDim.x) / 32, lane = threadIdx.x % 32;
  if (lane == 0) shm[threadIdx.x / 32] = v;
  __syncthreads();
  A t = 0;
  for (int i = 0; i < warps; ++i) t += shm[i];
  __syncthreads();  // shm is reused by the next call
  return t;
}

// The e-th element (of n * hw) of channel j.
__device__ __forceinline__ int64_t channel_off(int64_t e, int64_t j, int64_t c, int64_t hw) {
  const int64_t i = e / hw, k = e - i * hw;
  return (i * c + j) * hw + k;
}

template <class T>
__global__ void __launch_bounds__(kThreads)
    moments_kernel(const T* x, int64_t n, int64_t c, int64_t hw, acc_t<T>* mean, acc_t<T>* var) {
  using A = acc_t<T>;
  __shared__ A shm[kThreads / 32];
  const int64_t j = blockIdx.x, count = n * hw;
  A s = 0;
  for (int64_t e = threadIdx.x; e < count; e += blockDim.x)
    s += cvt<A>(x[channel_off(e, j, c, hw)]);
  const A m = block_sum(s, shm) / static_cast<A>(count);
  A sq = 0;
  for (int64_t e = threadIdx.x; e < count; e += blockDim.x) {
    const A d = cvt<A>(x[channel_off(e, j, c, hw)]) - m;
    sq += d * d;
  }
  sq = block_sum(sq, shm);
  if (threadIdx.x == 0) {
    mean[j] = m;
    var[j] = sq / static_cast<A>(count);
  }
}

template <class T>
__global__ void __launch_bounds__(kThreads)
    dot_kernel(const T* dy, const T* x, const acc_t<T>* mean, int64_t n, int64_t c, int64_t hw,
               acc_t<T>* sum_dy, acc_t<T>* sum_dy_xmu) {
  using A = acc_t<T>;
  __shared__ A shm[kThreads / 32];
  const int64_t j = blockIdx.x, count = n * hw;
  const A m = mean ? mean[j] : A(0);
  A s = 0, d = 0;
  for (int64_t e = threadIdx.x; e < count; e += blockDim.x) {
    const int64_t off = channel_off(e, j, c, hw);
    const A g = cvt<A>(dy[off]);
    s += g;
    d += g * (cvt<A>(x[off]) - m);
  }
  s = block_sum(s, shm);
  d = block_sum(d, shm);
  if (threadIdx.x == 0) {
    sum_dy[j] = s;
    sum_dy_xmu[j] = d;
  }
}

template <class T>
__global__ void apply_kernel(T* out, const T* a, const acc_t<T>* p, const T* b, const acc_t<T>* r,
                             const acc_t<T>* s, const acc_t<T>* w, const acc_t<T>* bias, int64_t n,
                             int64_t c, int64_t hw, int64_t qi, int64_t qj) {
  using A = acc_t<T>;
  const int64_t total = n * c * hw;
  for (int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; e < total;
       e += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t ij = e / hw, k = e - ij * hw, i = ij / c, j = ij - i * c;
    const int64_t q = i * qi + j * qj;
    A v = cvt<A>(a[e]) * p[q];
    if (s) v += s[q];
    if (b) v += cvt<A>(b[e]) * r[q];
    if (w) v *= w[k];
    if (bias) v += bias[k];
    out[e] = cvt<T>(v);
  }
}

int threads_for(int64_t count) {
  return static_cast<int>(std::clamp<int64_t>((count + 31) / 32 * 32, 32, kThreads));
}

}  // namespace

void launch_norm_moments(Dt dt, const void* x, int64_t n, int64_t c, int64_t hw, void* mean,
                         void* var, cudaStream_t stream) {
  if (c == 0) return;
  KILN_CUDA_DISPATCH_FLOAT(dt, [&] {
    using T = scalar_t;
    using A = acc_t<T>;
    moments_kernel<T><<<static_cast<unsigned>(c), threads_for(n * hw), 0, stream>>>(
        static_cast<const T*>(x), n, c, hw, static_cast<A*>(mean), static_cast<A*>(var));
  });
}

void launch_norm_dot(Dt dt, const void* dy, const void* x, const void* mean, int64_t n, int64_t c,
                     int64_t hw, void* sum_dy, void* sum_dy_xmu, cudaStream_t stream) {
  if (c == 0) return;
  KILN_CUDA_DISPATCH_FLOAT(dt, [&] {
    using T = scalar_t;
    using A = acc_t<T>;
    dot_kernel<T><<<static_cast<unsigned>(c), threads_for(n * hw), 0, stream>>>(
        static_cast<const T*>(dy), static_cast<const T*>(x), static_cast<const A*>(mean), n, c, hw,
        static_cast<A*>(sum_dy), static_cast<A*>(sum_dy_xmu));
  });
}

void launch_norm_apply(Dt dt, void* out, const void* a, const void* p, const void* b, const void* r,
                       const void* s, const void* w, const void* bias, int64_t n, int64_t c,
                       int64_t hw, int64_t qi, int64_t qj, cudaStream_t stream) {
  const int64_t total = n * c * hw;
  if (total == 0) return;
  const int threads = 256;
  const unsigned blocks =
      static_cast<unsigned>(std::min<int64_t>((total + threads - 1) / threads, 65536));
  KILN_CUDA_DISPATCH_FLOAT(dt, [&] {
    using T = scalar_t;
    using A = acc_t<T>;
    apply_kernel<T><<<blocks, threads, 0, stream>>>(
        static_cast<T*>(out), static_cast<const T*>(a), static_cast<const A*>(p),
        static_cast<const T*>(b), static_cast<const A*>(r), static_cast<const A*>(s),
        static_cast<const A*>(w), static_cast<const A*>(bias), n, c, hw, qi, qj);
  });
}

}  // namespace kiln::cuda

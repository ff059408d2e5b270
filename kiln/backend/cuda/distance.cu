// CUDA kernels of cdist and pdist and their backward ops (Note [cdist and pdist] in
// kiln/ops/distance_meta.cpp): one thread per result element, the arithmetic of
// kiln/ops/distance_math.h (the CPU kernels' own), in float or double.
#include <cmath>

#include "kiln/backend/cuda/distance.h"
#include "kiln/backend/cuda/kernel_args.h"
#include "kiln/ops/distance_math.h"

namespace kiln::cuda {
namespace {

namespace dist = kiln::detail::dist;

int blocks(int64_t n) { return static_cast<int>((n + kBlock - 1) / kBlock); }

template <class A>
__global__ void cdist_forward_kernel(const A* x1, const A* x2, A* out, int64_t total, int64_t P,
                                     int64_t R, int64_t M, int kind, A p) {
  int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (e >= total) return;
  const int64_t bi = e / R, j = e % R, bb = bi / P;
  const A* u = x1 + bi * M;
  const A* v = x2 + (bb * R + j) * M;
  A sum = 0;
  for (int64_t k = 0; k < M; ++k) sum = dist::step(kind, sum, u[k] - v[k], p);
  out[e] = dist::finish(kind, sum, p);
}

template <class A>
__global__ void cdist_backward_kernel(const A* grad, const A* x1, const A* x2, const A* d, A* gx1,
                                      int64_t total, int64_t P, int64_t R, int64_t M, int kind,
                                      A p) {
  int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (e >= total) return;
  const int64_t bi = e / M, k = e % M, bb = bi / P;
  const A a = x1[e];
  A sum = 0;
  for (int64_t j = 0; j < R; ++j)
    sum += grad[bi * R + j] * dist::grad(kind, a - x2[(bb * R + j) * M + k], d[bi * R + j], p);
  gx1[e] = sum;
}

// Pair q's rows (i, j), i < j: i from the quadratic formula in double, then corrected by one
// step where rounding put it off.
__device__ void pair_rows(int64_t q, int64_t n, int64_t& i, int64_t& j) {
  double nd = static_cast<double>(n);
  double disc = (2 * nd - 1) * (2 * nd - 1) - 8 * static_cast<double>(q);
  i = static_cast<int64_t>(floor(((2 * nd - 1) - sqrt(disc)) / 2));
  if (i < 0) i = 0;
  while (i > 0 && dist::pair_index(i, i + 1, n) > q) --i;
  while (i + 1 < n - 1 && dist::pair_index(i + 1, i + 2, n) <= q) ++i;
  j = q - dist::pair_index(i, i + 1, n) + i + 1;
}

template <class A>
__global__ void pdist_forward_kernel(const A* x, A* out, int64_t pairs, int64_t N, int64_t M,
                                     int kind, A p) {
  int64_t q = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (q >= pairs) return;
  int64_t i, j;
  pair_rows(q, N, i, j);
  A sum = 0;
  for (int64_t k = 0; k < M; ++k) sum = dist::step(kind, sum, x[i * M + k] - x[j * M + k], p);
  out[q] = dist::finish(kind, sum, p);
}

template <class A>
__global__ void pdist_backward_kernel(const A* grad, const A* x, const A* d, A* gx, int64_t total,
                                      int64_t N, int64_t M, int kind, A p) {
  int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (e >= total) return;
  const int64_t i = e / M, k = e % M;
  const A a = x[e];
  A sum = 0;
  for (int64_t j = 0; j < N; ++j) {
    if (j == i) continue;
    const int64_t q = i < j ? dist::pair_index(i, j, N) : dist::pair_index(j, i, N);
    sum += grad[q] * dist::grad(kind, a - x[j * M + k], d[q], p);
  }
  gx[e] = sum;
}

}  // namespace

void launch_cdist_forward(bool f64, const void* x1, const void* x2, void* out, int64_t B, int64_t P,
                          int64_t R, int64_t M, int kind, double p, cudaStream_t stream) {
  const int64_t n = B * P * R;
  if (n == 0) return;
  if (f64)
    cdist_forward_kernel<double><<<blocks(n), kBlock, 0, stream>>>(
        static_cast<const double*>(x1), static_cast<const double*>(x2), static_cast<double*>(out),
        n, P, R, M, kind, p);
  else
    cdist_forward_kernel<float><<<blocks(n), kBlock, 0, stream>>>(
        static_cast<const float*>(x1), static_cast<const float*>(x2), static_cast<float*>(out), n,
        P, R, M, kind, static_cast<float>(p));
}

void launch_cdist_backward(bool f64, const void* grad, const void* x1, const void* x2,
                           const void* cdist, void* gx1, int64_t B, int64_t P, int64_t R, int64_t M,
                           int kind, double p, cudaStream_t stream) {
  const int64_t n = B * P * M;
  if (n == 0) return;
  if (f64)
    cdist_backward_kernel<double><<<blocks(n), kBlock, 0, stream>>>(
        static_cast<const double*>(grad), static_cast<const double*>(x1),
        static_cast<const double*>(x2), static_cast<const double*>(cdist),
        static_cast<double*>(gx1), n, P, R, M, kind, p);
  else
    cdist_backward_kernel<float><<<blocks(n), kBlock, 0, stream>>>(
        static_cast<const float*>(grad), static_cast<const float*>(x1),
        static_cast<const float*>(x2), static_cast<const float*>(cdist), static_cast<float*>(gx1),
        n, P, R, M, kind, static_cast<float>(p));
}

void launch_pdist_forward(bool f64, const void* x, void* out, int64_t N, int64_t M, int kind,
                          double p, cudaStream_t stream) {
  const int64_t n = N > 1 ? N * (N - 1) / 2 : 0;
  if (n == 0) return;
  if (f64)
    pdist_forward_kernel<double><<<blocks(n), kBlock, 0, stream>>>(
        static_cast<const double*>(x), static_cast<double*>(out), n, N, M, kind, p);
  else
    pdist_forward_kernel<float><<<blocks(n), kBlock, 0, stream>>>(static_cast<const float*>(x),
                                                                  static_cast<float*>(out), n, N, M,
                                                                  kind, static_cast<float>(p));
}

void launch_pdist_backward(bool f64, const void* grad, const void* x, const void* pdist, void* gx,
                           int64_t N, int64_t M, int kind, double p, cudaStream_t stream) {
  const int64_t n = N * M;
  if (n == 0) return;
  if (f64)
    pdist_backward_kernel<double><<<blocks(n), kBlock, 0, stream>>>(
        static_cast<const double*>(grad), static_cast<const double*>(x),
        static_cast<const double*>(pdist), static_cast<double*>(gx), n, N, M, kind, p);
  else
    pdist_backward_kernel<float><<<blocks(n), kBlock, 0, stream>>>(
        static_cast<const float*>(grad), static_cast<const float*>(x),
        static_cast<const float*>(pdist), static_cast<float*>(gx), n, N, M, kind,
        static_cast<float>(p));
}

}  // namespace kiln::cuda

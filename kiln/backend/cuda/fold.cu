// CUDA kernels of im2col and col2im (Note [im2col and col2im] in kiln/ops/fold_meta.cpp): one
// thread per result element, the arithmetic of kiln/ops/fold_math.h (the CPU kernels' own), in
// float or double.
#include "kiln/backend/cuda/fold.h"
#include "kiln/backend/cuda/kernel_args.h"

namespace kiln::cuda {
namespace {

using detail::FoldDims;

int blocks(int64_t n) { return static_cast<int>((n + kBlock - 1) / kBlock); }

template <class A>
__global__ void im2col_kernel(const A* im, A* col, int64_t total, FoldDims g) {
  int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (e >= total) return;
  const int64_t L = g.blocks(), per = g.rows() * L, n = e / per, r = e % per;
  col[e] = detail::im2col_at(im + n * g.C * g.H * g.W, g, r / L, r % L);
}

template <class A>
__global__ void col2im_kernel(const A* col, A* im, int64_t total, FoldDims g) {
  int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (e >= total) return;
  const int64_t per = g.C * g.H * g.W, n = e / per, r = e % per;
  im[e] = detail::col2im_at(col + n * g.rows() * g.blocks(), g, r / (g.H * g.W), (r / g.W) % g.H,
                            r % g.W);
}

}  // namespace

void launch_im2col(bool f64, const void* im, void* cols, int64_t N, const FoldDims& g,
                   cudaStream_t stream) {
  const int64_t n = N * g.rows() * g.blocks();
  if (n == 0) return;
  if (f64)
    im2col_kernel<double><<<blocks(n), kBlock, 0, stream>>>(static_cast<const double*>(im),
                                                            static_cast<double*>(cols), n, g);
  else
    im2col_kernel<float><<<blocks(n), kBlock, 0, stream>>>(static_cast<const float*>(im),
                                                           static_cast<float*>(cols), n, g);
}

void launch_col2im(bool f64, const void* cols, void* im, int64_t N, const FoldDims& g,
                   cudaStream_t stream) {
  const int64_t n = N * g.C * g.H * g.W;
  if (n == 0) return;
  if (f64)
    col2im_kernel<double><<<blocks(n), kBlock, 0, stream>>>(static_cast<const double*>(cols),
                                                            static_cast<double*>(im), n, g);
  else
    col2im_kernel<float><<<blocks(n), kBlock, 0, stream>>>(static_cast<const float*>(cols),
                                                           static_cast<float*>(im), n, g);
}

}  // namespace kiln::cuda

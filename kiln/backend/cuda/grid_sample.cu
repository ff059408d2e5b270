// CUDA kernels of grid_sampler_2d and its backward op (Note [grid_sampler_2d] in
// kiln/ops/grid_sample_meta.cpp): the arithmetic of kiln/ops/grid_sample_math.h (the CPU
// kernels' own), in float or double.
#include "kiln/backend/cuda/grid_sample.h"
#include "kiln/backend/cuda/kernel_args.h"

namespace kiln::cuda {
namespace {

namespace grid = detail::grid;

int blocks(int64_t n) { return static_cast<int>((n + kBlock - 1) / kBlock); }

template <class A>
__global__ void forward_kernel(const A* in, const A* gp, A* out, int64_t total, grid::Geom g) {
  int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (e >= total) return;
  const int64_t ohw = g.OH * g.OW, nc = e / ohw, p = e % ohw, n = nc / g.C;
  const A* xy = gp + (n * ohw + p) * 2;
  out[e] = grid::sample(in + nc * g.H * g.W, g, xy[0], xy[1]);
}

// Several grid points add into one input pixel (See Note [grid_sampler_2d]).
template <class A>
struct AtomicAdd {
  __host__ __device__ void operator()(A* p, A v) const {
#ifdef __CUDA_ARCH__
    atomicAdd(p, v);
#else
    *p += v;
#endif
  }
};

template <class A>
__global__ void backward_kernel(const A* go, const A* in, const A* gp, A* gin, A* gg, int64_t total,
                                grid::Geom g) {
  int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (e >= total) return;
  const int64_t ohw = g.OH * g.OW, n = e / ohw, p = e % ohw, image = g.C * g.H * g.W;
  const A* xy = gp + e * 2;
  grid::backward_at(go + n * g.C * ohw + p, ohw, in + n * image, gin ? gin + n * image : gin, g,
                    xy[0], xy[1], gg + e * 2, gg + e * 2 + 1, AtomicAdd<A>{});
}

}  // namespace

void launch_grid_sampler_2d(bool f64, const void* input, const void* grid, void* out,
                            const grid::Geom& g, cudaStream_t stream) {
  const int64_t n = g.N * g.C * g.OH * g.OW;
  if (n == 0) return;
  if (f64)
    forward_kernel<double><<<blocks(n), kBlock, 0, stream>>>(static_cast<const double*>(input),
                                                             static_cast<const double*>(grid),
                                                             static_cast<double*>(out), n, g);
  else
    forward_kernel<float><<<blocks(n), kBlock, 0, stream>>>(static_cast<const float*>(input),
                                                            static_cast<const float*>(grid),
                                                            static_cast<float*>(out), n, g);
}

void launch_grid_sampler_2d_backward(bool f64, const void* grad_output, const void* input,
                                     const void* grid, void* grad_input, void* grad_grid,
                                     const grid::Geom& g, cudaStream_t stream) {
  const int64_t n = g.N * g.OH * g.OW;
  if (n == 0) return;
  if (f64)
    backward_kernel<double><<<blocks(n), kBlock, 0, stream>>>(
        static_cast<const double*>(grad_output), static_cast<const double*>(input),
        static_cast<const double*>(grid), static_cast<double*>(grad_input),
        static_cast<double*>(grad_grid), n, g);
  else
    backward_kernel<float><<<blocks(n), kBlock, 0, stream>>>(
        static_cast<const float*>(grad_output), static_cast<const float*>(input),
        static_cast<const float*>(grid), static_cast<float*>(grad_input),
        static_cast<float*>(grad_grid), n, g);
}

}  // namespace kiln::cuda

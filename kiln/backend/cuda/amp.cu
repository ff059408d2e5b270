// Loss-scaling kernels; the arithmetic is the CPU's (kiln/backend/cpu/amp.cpp).
#include <algorithm>

#include "kiln/backend/cuda/amp.h"
#include "kiln/backend/cuda/loops.cuh"

namespace kiln::cuda {
namespace {

template <class T>
__global__ void __launch_bounds__(kBlock)
    unscale_kernel(T* data, int64_t n, float* found_inf, const float* inv_scale) {
  using C = acc_t<T>;
  const float inv = *inv_scale;
  bool bad = false;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const C x = cvt<C>(data[i]);
    bad = bad || !isfinite(x);
    data[i] = cvt<T>(inv == 1.f ? x : static_cast<C>(x * static_cast<C>(inv)));
  }
  if (__syncthreads_or(bad) && threadIdx.x == 0) *found_inf = 1.f;
}

__global__ void update_scale_kernel(float* scale, int32_t* tracker, const float* found_inf,
                                    double growth_factor, double backoff_factor,
                                    int64_t growth_interval) {
  if (*found_inf != 0.f) {
    *scale = static_cast<float>(*scale * backoff_factor);
    *tracker = 0;
  } else if (static_cast<int64_t>(*tracker) + 1 >= growth_interval) {
    const auto grown = static_cast<float>(*scale * growth_factor);
    if (isfinite(grown)) *scale = grown;
    *tracker = 0;
  } else {
    *tracker += 1;
  }
}

}  // namespace

void launch_amp_unscale(Dt dt, void* data, int64_t n, float* found_inf, const float* inv_scale,
                        cudaStream_t stream) {
  if (n == 0) return;
  const int64_t blocks = std::min<int64_t>((n + kBlock - 1) / kBlock, 65535);
  KILN_CUDA_DISPATCH_FLOAT(dt, [&] {
    unscale_kernel<scalar_t><<<static_cast<unsigned>(blocks), kBlock, 0, stream>>>(
        static_cast<scalar_t*>(data), n, found_inf, inv_scale);
  })
}

void launch_amp_update_scale(float* scale, int32_t* growth_tracker, const float* found_inf,
                             double growth_factor, double backoff_factor, int64_t growth_interval,
                             cudaStream_t stream) {
  update_scale_kernel<<<1, 1, 0, stream>>>(scale, growth_tracker, found_inf, growth_factor,
                                           backoff_factor, growth_interval);
}

}  // namespace kiln::cuda

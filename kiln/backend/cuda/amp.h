#pragma once
// Launchers of the loss-scaling kernels (PyTorch's _amp_foreach_non_finite_check_and_unscale_
// and _amp_update_scale_): every value is read on the device. Internal to kiln/backend/cuda.
#include <cuda_runtime.h>

#include <cstdint>

#include "kiln/backend/cuda/kernel_args.h"

namespace kiln::cuda {

// data[0..n) *= *inv_scale (in float for the 16-bit types), *found_inf = 1 when any element is
// inf or NaN (never reset). data is contiguous of dtype `dt`.
void launch_amp_unscale(Dt dt, void* data, int64_t n, float* found_inf, const float* inv_scale,
                        cudaStream_t stream);
// One thread: PyTorch's _amp_update_scale_ arithmetic on the device.
void launch_amp_update_scale(float* scale, int32_t* growth_tracker, const float* found_inf,
                             double growth_factor, double backoff_factor, int64_t growth_interval,
                             cudaStream_t stream);

}  // namespace kiln::cuda

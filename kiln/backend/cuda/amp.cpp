// CUDA loss-scaling ops: host glue. Validation first, then launches that read scale, inv_scale
// and found_inf on the device (no host read, so they capture into device graphs).
#include "kiln/backend/cuda/amp.h"

#include <vector>

#include "kiln/backend/cuda/common.h"
#include "kiln/ops/amp_meta.h"
#include "kiln/ops/meta.h"
#include "kiln/ops/op_list.h"

namespace kiln::cuda {
namespace {

void unscale_(const TensorList& self, const Tensor& found_inf, const Tensor& inv_scale) {
  const char* op = "amp_non_finite_check_and_unscale_";
  meta::amp_non_finite_check_and_unscale(self, found_inf, inv_scale);
  KILN_CHECK_DEVICE(found_inf.device().type() == kCUDA, "[{}] found_inf is on {}, expected cuda",
                    op, found_inf.device());
  for (size_t i = 0; i < self.size(); ++i) {
    const Tensor& t = self[i];
    TensorSpec spec{Shape(t.sizes()), t.dtype(), t.device()};
    const Tensor* ins[] = {&found_inf, &inv_scale};
    meta::check_inplace(op, t, spec, ArrayRef<const Tensor*>(ins, 2));
  }
  cudaStream_t stream = stream_for(found_inf);
  auto* found = static_cast<float*>(found_inf.impl()->data());
  const auto* inv = static_cast<const float*>(inv_scale.impl()->data());
  for (const Tensor& t : self) {
    if (t.numel() == 0) continue;
    Tensor c = contiguous_as(t, t.dtype());
    launch_amp_unscale(dt(t.dtype()), c.impl()->data(), c.numel(), found, inv, stream);
    check_launch(op);
    if (!t.is_contiguous()) copy_kernel(t, c);
    t.impl()->storage()->bump_version();
  }
  found_inf.impl()->storage()->bump_version();
}

void update_scale_(const Tensor& scale, const Tensor& tracker, const Tensor& found_inf,
                   double growth_factor, double backoff_factor, int64_t growth_interval) {
  meta::amp_update_scale(scale, tracker, found_inf, growth_factor, backoff_factor, growth_interval);
  KILN_CHECK_DEVICE(scale.device().type() == kCUDA,
                    "[amp_update_scale_] self is on {}, expected cuda", scale.device());
  launch_amp_update_scale(static_cast<float*>(scale.impl()->data()),
                          static_cast<int32_t*>(tracker.impl()->data()),
                          static_cast<const float*>(found_inf.impl()->data()), growth_factor,
                          backoff_factor, growth_interval, stream_for(scale));
  check_launch("amp_update_scale_");
  scale.impl()->storage()->bump_version();
  tracker.impl()->storage()->bump_version();
}

KILN_CUDA_KERNELS(::kiln::backend_kernel(ops::op_amp_non_finite_check_and_unscale_, &unscale_),
                  ::kiln::backend_kernel(ops::op_amp_update_scale_, &update_scale_));

}  // namespace
}  // namespace kiln::cuda

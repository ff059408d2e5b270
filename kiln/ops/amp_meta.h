#pragma once
// Meta functions of the loss-scaling ops (amp_non_finite_check_and_unscale_, amp_update_scale_)
// and the check of foreach_adamw_'s found_inf. See Note [Loss scaling on the device] in
// kiln/amp/grad_scaler.cpp.
#include "kiln/core/tensor.h"

namespace kiln::meta {

// found_inf is a 0-d float32 tensor on `device` (`arg` names it in the message).
void check_found_inf(const char* op, const Tensor& found_inf, Device device,
                     const char* arg = "found_inf");
// amp_non_finite_check_and_unscale_: found_inf and inv_scale 0-d float32, every self[i] of a
// floating dtype and on found_inf's device.
void amp_non_finite_check_and_unscale(const TensorList& self, const Tensor& found_inf,
                                      const Tensor& inv_scale);
// amp_update_scale_: self 0-d float32, growth_tracker 0-d int32, found_inf 0-d float32, all on
// one device; growth_factor and backoff_factor finite and > 0, growth_interval >= 1.
void amp_update_scale(const Tensor& self, const Tensor& growth_tracker, const Tensor& found_inf,
                      double growth_factor, double backoff_factor, int64_t growth_interval);

}  // namespace kiln::meta

// CPU kernels of the loss-scaling ops (PyTorch's _amp_foreach_non_finite_check_and_unscale_ and
// _amp_update_scale_). See Note [Loss scaling on the device] in kiln/amp/grad_scaler.cpp.
#include <cmath>
#include <cstdint>

#include "kiln/backend/cpu/loops.h"
#include "kiln/ops/amp_meta.h"
#include "kiln/ops/structured.h"

namespace kiln::cpu {
namespace {

// data[0..n) *= inv in the 16-bit types' float (ATen's opmath); whether any element was inf or
// NaN before the product.
template <class T>
bool unscale_tensor(T* data, int64_t n, float inv) {
  using C = acc_t<T>;
  bool bad = false;
#pragma omp parallel for if (n > 65536) schedule(static) reduction(|| : bad)
  for (int64_t k = 0; k < n; ++k) {
    const C x = static_cast<C>(data[k]);
    bad = bad || !std::isfinite(x);
    data[k] = static_cast<T>(inv == 1.f ? x : x * static_cast<C>(inv));
  }
  return bad;
}

// self[i] *= inv_scale, found_inf = 1 when any element was inf or NaN (never reset).
void unscale_(const TensorList& self, const Tensor& found_inf, const Tensor& inv_scale) {
  const char* op = "amp_non_finite_check_and_unscale_";
  meta::amp_non_finite_check_and_unscale(self, found_inf, inv_scale);
  KILN_CHECK_DEVICE(found_inf.device().is_cpu(), "[{}] found_inf is on {}, expected cpu", op,
                    found_inf.device());
  for (size_t i = 0; i < self.size(); ++i) {
    const Tensor& t = self[i];
    TensorSpec spec{Shape(t.sizes()), t.dtype(), t.device()};
    const Tensor* ins[] = {&found_inf, &inv_scale};
    meta::check_inplace(op, t, spec, ArrayRef<const Tensor*>(ins, 2));
  }
  const float inv = *static_cast<const float*>(inv_scale.impl()->data());
  bool bad = false;
  for (const Tensor& t : self) {
    if (t.numel() == 0) continue;
    const bool direct = t.is_contiguous();
    Tensor c = direct ? t : t.contiguous();
    KILN_DISPATCH_FLOAT_TYPES(
        t.dtype(), op, [&] { bad = unscale_tensor(c.data<scalar_t>(), c.numel(), inv) || bad; });
    if (!direct) Tensor(t).copy_(c);
    t.impl()->storage()->bump_version();
  }
  if (bad) {
    *static_cast<float*>(found_inf.impl()->data()) = 1.f;
    found_inf.impl()->storage()->bump_version();
  }
}

void update_scale_(const Tensor& scale, const Tensor& tracker, const Tensor& found_inf,
                   double growth_factor, double backoff_factor, int64_t growth_interval) {
  meta::amp_update_scale(scale, tracker, found_inf, growth_factor, backoff_factor, growth_interval);
  KILN_CHECK_DEVICE(scale.device().is_cpu(), "[amp_update_scale_] self is on {}, expected cpu",
                    scale.device());
  float& s = *static_cast<float*>(scale.impl()->data());
  int32_t& count = *static_cast<int32_t*>(tracker.impl()->data());
  if (*static_cast<const float*>(found_inf.impl()->data()) != 0) {
    s = static_cast<float>(s * backoff_factor);
    count = 0;
  } else if (static_cast<int64_t>(count) + 1 >= growth_interval) {
    const auto grown = static_cast<float>(s * growth_factor);
    if (std::isfinite(grown)) s = grown;
    count = 0;
  } else {
    count += 1;
  }
  scale.impl()->storage()->bump_version();
  tracker.impl()->storage()->bump_version();
}

const bool registered = [] {
  constexpr auto K = DispatchKey::CPU;
  ops::op_amp_non_finite_check_and_unscale_.set_kernel(K, &unscale_);
  ops::op_amp_update_scale_.set_kernel(K, &update_scale_);
  return true;
}();

}  // namespace
}  // namespace kiln::cpu

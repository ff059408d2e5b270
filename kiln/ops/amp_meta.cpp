// Meta functions and meta-device kernels of the loss-scaling ops.
#include "kiln/ops/amp_meta.h"

#include <cmath>

#include <fmt/format.h>

#include "kiln/ops/meta.h"
#include "kiln/ops/op_list.h"

namespace kiln::meta {

namespace {
void check_0d(const char* op, const Tensor& t, const char* arg, DType dtype) {
  check_defined(op, t, arg);
  KILN_CHECK_TYPE(t.dim() == 0 && t.dtype() == dtype,
                  "[{}] {} must be a 0-d {} tensor, got [{}] {}", op, arg, name(dtype),
                  fmt::join(t.sizes(), ", "), name(t.dtype()));
}
}  // namespace

void check_found_inf(const char* op, const Tensor& found_inf, Device device, const char* arg) {
  check_0d(op, found_inf, arg, kFloat32);
  KILN_CHECK_DEVICE(found_inf.device() == device, "[{}] {} is on {}, expected {}", op, arg,
                    found_inf.device(), device);
}

void amp_non_finite_check_and_unscale(const TensorList& self, const Tensor& found_inf,
                                      const Tensor& inv_scale) {
  const char* op = "amp_non_finite_check_and_unscale_";
  check_0d(op, found_inf, "found_inf", kFloat32);
  check_found_inf(op, inv_scale, found_inf.device(), "inv_scale");
  for (size_t i = 0; i < self.size(); ++i) {
    check_defined(op, self[i], "self");
    KILN_CHECK_TYPE(is_floating(self[i].dtype()),
                    "[{}] expected floating-point tensors, self[{}] is {}", op, i,
                    name(self[i].dtype()));
    KILN_CHECK_DEVICE(self[i].device() == found_inf.device(),
                      "[{}] self[{}] is on {}, but found_inf is on {}", op, i, self[i].device(),
                      found_inf.device());
  }
}

void amp_update_scale(const Tensor& self, const Tensor& growth_tracker, const Tensor& found_inf,
                      double growth_factor, double backoff_factor, int64_t growth_interval) {
  const char* op = "amp_update_scale_";
  check_0d(op, self, "self", kFloat32);
  check_0d(op, growth_tracker, "growth_tracker", kInt32);
  check_found_inf(op, found_inf, self.device());
  KILN_CHECK_DEVICE(growth_tracker.device() == self.device(),
                    "[{}] growth_tracker is on {}, but self is on {}", op, growth_tracker.device(),
                    self.device());
  KILN_CHECK(std::isfinite(growth_factor) && growth_factor > 0 && std::isfinite(backoff_factor) &&
                 backoff_factor > 0,
             "[{}] growth_factor and backoff_factor must be finite and > 0, got {} and {}", op,
             growth_factor, backoff_factor);
  KILN_CHECK(growth_interval >= 1, "[{}] growth_interval must be >= 1, got {}", op,
             growth_interval);
}

}  // namespace kiln::meta

namespace kiln {
namespace {
void meta_unscale(const TensorList& self, const Tensor& found_inf, const Tensor& inv_scale) {
  meta::amp_non_finite_check_and_unscale(self, found_inf, inv_scale);
}
void meta_update_scale(const Tensor& self, const Tensor& tracker, const Tensor& found_inf,
                       double growth, double backoff, int64_t interval) {
  meta::amp_update_scale(self, tracker, found_inf, growth, backoff, interval);
}
template <class Sig>
void reg(TypedOp<Sig>& op, Sig* fn) {
  op.def.set_meta_raw(reinterpret_cast<void*>(fn));
  op.set_kernel(DispatchKey::Meta, fn);
}
const bool registered = [] {
  reg(ops::op_amp_non_finite_check_and_unscale_, &meta_unscale);
  reg(ops::op_amp_update_scale_, &meta_update_scale);
  return true;
}();
}  // namespace
}  // namespace kiln

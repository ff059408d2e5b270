#include "kiln/amp/grad_scaler.h"

#include <algorithm>
#include <cmath>
#include <set>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "kiln/autograd/grad_mode.h"
#include "kiln/core/error.h"
#include "kiln/distributed/collectives.h"
#include "kiln/distributed/init.h"
#include "kiln/dtensor/dtensor.h"
#include "kiln/dtensor/factories.h"
#include "kiln/ops/ops.h"

namespace kiln::amp {

// Note [Loss scaling on the device]
// float16 has 5 exponent bits: gradients below 2^-24 flush to zero and above 65504 overflow.
// GradScaler multiplies the loss by a scale S (2^16 to start), so backward produces S * g, and
// divides the gradients by S before the optimizer reads them (PyTorch's recipe). Every value
// that steers this lives on the device, never read by the host:
//   - scale: a 0-d float32 tensor; scale(loss) is one product with it.
//   - unscale_: amp_non_finite_check_and_unscale_(grads, found_inf, 1 / S) multiplies every
//     gradient by 1 / S (computed in float64, then rounded, as PyTorch) and sets found_inf to 1
//     when any gradient holds an inf or NaN. Gradients are grouped as optimizers group their
//     parameters (a DTensor group gets a replicated found_inf and inv_scale on its mesh); the
//     groups' flags are combined with maximum. Under several ranks each rank checked only its
//     own gradients (FSDP and tensor-parallel shards differ), so found_inf is all-reduced with
//     max over the world: every rank then skips the same steps and parameters stay in step.
//   - step: optimizer.step(found_inf) skips on the device (AdamW's fused kernel reads the flag,
//     SGD selects old values: Note [Skipped SGD steps] in kiln/optim/optimizer.cpp).
//   - update: amp_update_scale_ halves S on an overflow and doubles it after growth_interval
//     clean steps, counting in a 0-d int32 tracker.
// The host keeps only which optimizers were unscaled or stepped since the last update, which is
// the same on every call of a compiled step: so a step built of these calls traces once, and a
// replay with an overflowing batch skips and backs off by itself.

namespace {

// Where a gradient lives, for grouping: its mesh (DTensor) or null, and its device.
struct Home {
  const dtensor::DeviceMesh* mesh;
  Device device;
  bool operator==(const Home&) const = default;
};
Home home_of(const Tensor& t) {
  return {dtensor::is_dtensor(t) ? &dtensor::spec_of(t)->mesh() : nullptr, t.device()};
}

// `t` (a plain 0-d tensor) beside `like`: on its device, replicated on its mesh when a DTensor.
Tensor beside(const Tensor& t, const Tensor& like) {
  Tensor local = t.to(like.device());
  if (!dtensor::is_dtensor(like)) return local;
  const dtensor::DeviceMesh& mesh = dtensor::spec_of(like)->mesh();
  return dtensor::from_local(
      local, mesh, dtensor::Placements(static_cast<size_t>(mesh.ndim()), dtensor::Replicate()));
}

void check_options(const GradScalerOptions& o) {
  KILN_CHECK(o.init_scale > 0 && std::isfinite(o.init_scale) &&
                 std::isfinite(static_cast<float>(o.init_scale)),
             "[GradScaler] init_scale must be finite (in float32) and > 0, got {}", o.init_scale);
  KILN_CHECK(o.growth_factor > 1 && std::isfinite(o.growth_factor),
             "[GradScaler] growth_factor must be finite and > 1, got {}", o.growth_factor);
  KILN_CHECK(o.backoff_factor > 0 && o.backoff_factor < 1,
             "[GradScaler] backoff_factor must be in (0, 1), got {}", o.backoff_factor);
  KILN_CHECK(o.growth_interval >= 1 && o.growth_interval <= INT32_MAX,
             "[GradScaler] growth_interval must be in [1, 2^31 - 1], got {}", o.growth_interval);
}

}  // namespace

GradScaler::GradScaler(Device device, const GradScalerOptions& options)
    : device_(device), options_(options) {
  check_options(options_);
  if (!options_.enabled) return;
  autograd::NoGradGuard no_grad;
  scale_ = full({}, options_.init_scale, kFloat32, device_);
  growth_tracker_ = zeros({}, kInt32, device_);
}

Tensor GradScaler::scale(const Tensor& loss) const {
  if (!options_.enabled) return loss;
  KILN_CHECK(loss.defined(), "[GradScaler] scale: the loss is an undefined tensor");
  KILN_CHECK_TYPE(is_floating(loss.dtype()),
                  "[GradScaler] scale: the loss must be floating-point, got {}",
                  name(loss.dtype()));
  return mul(loss, beside(scale_, loss));
}

void GradScaler::unscale_(optim::Optimizer& optimizer) {
  if (!options_.enabled) return;
  PerOptimizer& state = per_optimizer_[&optimizer];
  KILN_CHECK(state.stage != Stage::Unscaled,
             "[GradScaler] unscale_() has already been called on this optimizer since the last "
             "update()");
  KILN_CHECK(state.stage != Stage::Stepped,
             "[GradScaler] unscale_() is being called after step() (before update())");
  autograd::NoGradGuard no_grad;
  TensorList grads;
  for (const Tensor& p : optimizer.params())
    if (p.grad().defined()) grads.push_back(p.grad());
  // 1 / scale in float64, rounded to float32 (PyTorch's scale.double().reciprocal().float()).
  const Tensor inv_scale = reciprocal(scale_.to(kFloat64)).to(kFloat32);
  std::vector<Home> homes;
  std::vector<TensorList> groups;
  for (const Tensor& g : grads) {
    const Home h = home_of(g);
    auto it = std::find(homes.begin(), homes.end(), h);
    if (it == homes.end()) {
      homes.push_back(h);
      groups.emplace_back();
      it = homes.end() - 1;
    }
    groups[static_cast<size_t>(it - homes.begin())].push_back(g);
  }
  Tensor found;
  for (const TensorList& group : groups) {
    // A DTensor group's flag is a replicated DTensor whose local tensor is `local`.
    Tensor flag = dtensor::scalar_beside(group.front(), 0.0, kFloat32);
    amp_non_finite_check_and_unscale_(group, flag, beside(inv_scale, group.front()));
    Tensor local = dtensor::is_dtensor(flag) ? dtensor::to_local(flag) : flag;
    found = found.defined() ? maximum(found, local.to(found.device())) : local;
  }
  if (!found.defined()) found = zeros({}, kFloat32, device_);  // no gradient at all
  if (distributed::world_size() > 1) distributed::all_reduce_(found, distributed::ReduceOp::Max);
  state.found_inf = found;
  state.stage = Stage::Unscaled;
}

void GradScaler::step(optim::Optimizer& optimizer) {
  if (!options_.enabled) {
    optimizer.step();
    return;
  }
  auto it = per_optimizer_.find(&optimizer);
  KILN_CHECK(it == per_optimizer_.end() || it->second.stage != Stage::Stepped,
             "[GradScaler] step() has already been called on this optimizer since the last "
             "update()");
  if (it == per_optimizer_.end() || it->second.stage == Stage::Ready) unscale_(optimizer);
  PerOptimizer& state = per_optimizer_[&optimizer];
  optimizer.step(state.found_inf);
  state.stage = Stage::Stepped;
}

void GradScaler::update() {
  if (!options_.enabled) return;
  KILN_CHECK(!per_optimizer_.empty(),
             "[GradScaler] update(): no inf checks were recorded since the last update (call "
             "unscale_() or step() first)");
  autograd::NoGradGuard no_grad;
  Tensor found;
  for (const auto& [opt, state] : per_optimizer_) {
    Tensor f = state.found_inf.to(device_);
    found = found.defined() ? add(found, f) : f;
  }
  amp_update_scale_(scale_, growth_tracker_, found, options_.growth_factor, options_.backoff_factor,
                    options_.growth_interval);
  per_optimizer_.clear();
}

double GradScaler::get_scale() const {
  return options_.enabled ? static_cast<double>(scale_.item<float>()) : 1.0;
}

optim::StateDict GradScaler::state_dict() const {
  if (!options_.enabled) return {};
  return {{"scale", scale_.detach().clone()},
          {"growth_tracker", growth_tracker_.detach().clone()},
          {"growth_factor", scalar_tensor(options_.growth_factor, kFloat64)},
          {"backoff_factor", scalar_tensor(options_.backoff_factor, kFloat64)},
          {"growth_interval", scalar_tensor(options_.growth_interval, kInt64)}};
}

void GradScaler::load_state_dict(const optim::StateDict& state) {
  if (!options_.enabled) return;
  KILN_CHECK(!state.empty(),
             "[GradScaler] load_state_dict: the state dict is empty (saved from a disabled "
             "GradScaler?)");
  static const std::vector<std::string> kKeys = {"scale", "growth_tracker", "growth_factor",
                                                 "backoff_factor", "growth_interval"};
  std::map<std::string, Tensor> given;
  std::vector<std::string> missing, unexpected, duplicate;
  for (const auto& [name, t] : state) {
    if (std::find(kKeys.begin(), kKeys.end(), name) == kKeys.end())
      unexpected.push_back(name);
    else if (!given.emplace(name, t).second)
      duplicate.push_back(name);
  }
  for (const std::string& k : kKeys)
    if (!given.count(k)) missing.push_back(k);
  KILN_CHECK(missing.empty() && unexpected.empty() && duplicate.empty(),
             "[GradScaler] load_state_dict: missing keys [{}]; unexpected keys [{}]; duplicate "
             "keys [{}]",
             fmt::join(missing, ", "), fmt::join(unexpected, ", "), fmt::join(duplicate, ", "));
  for (const auto& [name, t] : given)
    KILN_CHECK(t.defined() && t.dim() == 0,
               "[GradScaler] load_state_dict: '{}' must be a 0-d tensor, got {}", name,
               t.defined() ? fmt::format("[{}]", fmt::join(t.sizes(), ", ")) : "undefined");
  const double scale = given["scale"].item<double>();
  const double tracker = given["growth_tracker"].item<double>();
  const double interval = given["growth_interval"].item<double>();
  GradScalerOptions o = options_;
  o.init_scale = scale;
  o.growth_factor = given["growth_factor"].item<double>();
  o.backoff_factor = given["backoff_factor"].item<double>();
  KILN_CHECK(interval == std::floor(interval) && interval >= 1 && interval <= INT32_MAX,
             "[GradScaler] load_state_dict: growth_interval must be a whole number >= 1, got {}",
             interval);
  o.growth_interval = static_cast<int64_t>(interval);
  check_options(o);  // the scale as init_scale: finite and > 0
  KILN_CHECK(tracker == std::floor(tracker) && tracker >= 0 && tracker <= INT32_MAX,
             "[GradScaler] load_state_dict: growth_tracker must be a whole number >= 0, got {}",
             tracker);
  autograd::NoGradGuard no_grad;
  scale_.fill_(scale);
  growth_tracker_.fill_(static_cast<int64_t>(tracker));
  options_.growth_factor = o.growth_factor;
  options_.backoff_factor = o.backoff_factor;
  options_.growth_interval = o.growth_interval;
}

}  // namespace kiln::amp

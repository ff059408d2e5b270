#include "kiln/optim/optimizer.h"

#include "kiln/dtensor/dtensor.h"
#include "kiln/dtensor/factories.h"

#include <algorithm>
#include <array>
#include <charconv>
#include <cmath>
#include <map>
#include <numbers>
#include <set>

#include <fmt/format.h>

#include "kiln/autograd/grad_mode.h"
#include "kiln/core/error.h"
#include "kiln/ops/ops.h"

namespace kiln::optim {

// Note [Parameter groups]
// A multi-tensor op takes tensors of one kind per call: the Sharded layer refuses plain
// tensors beside DTensors and DTensors of two meshes in one call, and a plain kernel wants its
// 0-d rate on the parameters' device. Under tensor parallel a model has both kinds (sharded
// Linear and Embedding weights; LayerNorms and position embeddings stay plain), so an optimizer
// splits its parameters into groups by where they live: plain tensors by device, DTensors by
// mesh (their device is the mesh's). Each group keeps its own rate tensor (a replicated DTensor
// on the group's mesh, or a plain one on its device; set_lr fills all of them), and a step runs
// the multi-tensor ops once per group. Per-parameter state is made beside each parameter as
// before (zeros_like, scalar_beside), and the update of a parameter is the same arithmetic in
// whichever group it is, so a mixed list steps exactly as one optimizer per kind would.
// clip_grad_norm_ groups the gradients the same way: each group's sum of squares is made whole
// (a DTensor group's is its global value on every rank; a plain group's is taken as the
// replicated parameters' and counted once), they are added on the first gradient's device, and
// the one scale goes back beside each group (a replicated DTensor for a DTensor group).
namespace {

// Where a tensor lives, for grouping: its mesh when it is a DTensor (null otherwise) and its
// (local) device.
struct Home {
  const dtensor::DeviceMesh* mesh;
  Device device;
  bool operator==(const Home&) const = default;
};
Home home_of(const Tensor& t) {
  return {dtensor::is_dtensor(t) ? &dtensor::spec_of(t)->mesh() : nullptr, t.device()};
}

// The positions of `ts` grouped by home, each group in order, groups in order of their first.
std::vector<std::vector<size_t>> group_by_home(const TensorList& ts) {
  std::vector<Home> homes;
  std::vector<std::vector<size_t>> groups;
  for (size_t i = 0; i < ts.size(); ++i) {
    const Home h = home_of(ts[i]);
    const size_t g = static_cast<size_t>(std::find(homes.begin(), homes.end(), h) - homes.begin());
    if (g == homes.size()) {
      homes.push_back(h);
      groups.emplace_back();
    }
    groups[g].push_back(i);
  }
  return groups;
}

// found_inf (a GradScaler's) beside parameter `like`: on its device, and a replicated DTensor
// on its mesh when it is a DTensor (the multi-tensor ops take one kind per call).
Tensor found_inf_beside(const Tensor& found_inf, const Tensor& like) {
  KILN_CHECK_TYPE(found_inf.dim() == 0 && found_inf.dtype() == kFloat32,
                  "[optimizer] found_inf must be a 0-d float32 tensor, got [{}] {}",
                  fmt::join(found_inf.sizes(), ", "), name(found_inf.dtype()));
  Tensor f = dtensor::is_dtensor(found_inf) ? dtensor::to_local(found_inf) : found_inf;
  f = f.to(like.device());
  if (!dtensor::is_dtensor(like)) return f;
  const dtensor::DeviceMesh& mesh = dtensor::spec_of(like)->mesh();
  return dtensor::from_local(
      f, mesh, dtensor::Placements(static_cast<size_t>(mesh.ndim()), dtensor::Replicate()));
}

}  // namespace

Optimizer::Optimizer(TensorList params, double lr) : params_(std::move(params)), lr_(lr) {
  KILN_CHECK(!params_.empty(), "[optimizer] got an empty parameter list");
  for (size_t i = 0; i < params_.size(); ++i) {
    const Tensor& p = params_[i];
    KILN_CHECK(p.defined(), "[optimizer] parameter {} is undefined", i);
    KILN_CHECK(p.is_leaf() && p.requires_grad(),
               "[optimizer] parameter {} must be a leaf that requires grad", i);
    for (size_t j = 0; j < i; ++j)
      KILN_CHECK(!params_[j].is_same(p), "[optimizer] parameter {} appears twice (also {})", i, j);
  }
  // See Note [Parameter groups].
  for (std::vector<size_t>& members : group_by_home(params_)) {
    Tensor rate = dtensor::scalar_beside(params_[members.front()], 0.0, kFloat64);
    groups_.push_back({std::move(members), std::move(rate)});
  }
  set_lr(lr);
}

void Optimizer::set_lr(double lr) {
  KILN_CHECK(lr >= 0 && std::isfinite(lr), "[optimizer] invalid learning rate {}", lr);
  lr_ = lr;
  autograd::NoGradGuard no_grad;
  for (Group& g : groups_) g.lr.fill_(lr);
}

void Optimizer::zero_grad(bool set_to_none) {
  autograd::NoGradGuard no_grad;
  for (const Tensor& p : params_) {
    if (!p.grad().defined()) continue;
    if (set_to_none)
      p.set_grad(Tensor());
    else
      Tensor(p.grad()).zero_();
  }
}

// Note [Optimizer state dicts]
// A checkpoint must let a run continue bitwise as if it had never stopped, so the state dict
// holds everything a step reads besides the parameters and gradients: the learning rate, the
// update count and the optimizer's own tensors. The rate is saved as a value read from the
// 0-d tensor the kernels read (which is what a compiled step replays with), and restored with
// set_lr, which fills that same tensor. Loading copies into the existing tensors instead of
// replacing them: a compiled step holds its free tensors by identity, and a replay after a
// load must read the loaded values. Everything is checked before the first copy, so a bad
// state dict leaves the optimizer as it was.
StateDict Optimizer::state_dict() const {
  StateDict out = {{"lr", scalar_tensor(lr_, kFloat64)}, {"steps", scalar_tensor(steps_, kInt64)}};
  for (const auto& [name, t] : named_state()) out.emplace_back(name, t.detach());
  return out;
}

void Optimizer::load_state_dict(const StateDict& state) {
  std::map<std::string, Tensor> given;
  std::vector<std::string> duplicate, missing, unexpected, mismatched;
  for (const auto& [name, t] : state) {
    KILN_CHECK(t.defined(), "[optimizer] load_state_dict: entry '{}' is undefined", name);
    if (!given.emplace(name, t).second) duplicate.push_back(name);
  }
  KILN_CHECK(duplicate.empty(), "[optimizer] load_state_dict: duplicate entries [{}]",
             fmt::join(duplicate, ", "));
  std::set<std::string> expected;
  // The entry `name`, when present with the given sizes; an undefined tensor otherwise.
  auto take = [&](const std::string& name, IntArrayRef sizes) {
    expected.insert(name);
    auto it = given.find(name);
    if (it == given.end()) {
      missing.push_back(name);
      return Tensor();
    }
    if (it->second.sizes() != sizes) {
      mismatched.push_back(fmt::format("{}: state dict has [{}], optimizer has [{}]", name,
                                       fmt::join(it->second.sizes(), ", "),
                                       fmt::join(sizes, ", ")));
      return Tensor();
    }
    return it->second;
  };
  Tensor lr = take("lr", {}), steps = take("steps", {});
  std::vector<std::pair<Tensor, Tensor>> copies;  // (destination, source)
  for (const auto& [name, dst] : named_state())
    if (Tensor src = take(name, dst.sizes()); src.defined()) copies.emplace_back(dst, src);
  for (const auto& [name, t] : state)
    if (!expected.count(name)) unexpected.push_back(name);
  KILN_CHECK(missing.empty() && unexpected.empty(),
             "[optimizer] load_state_dict: missing keys [{}]; unexpected keys [{}]",
             fmt::join(missing, ", "), fmt::join(unexpected, ", "));
  KILN_CHECK(mismatched.empty(), "[optimizer] load_state_dict: size mismatch for {}",
             fmt::join(mismatched, "; "));
  const double lr_value = lr.item<double>(), steps_value = steps.item<double>();
  KILN_CHECK(lr_value >= 0 && std::isfinite(lr_value),
             "[optimizer] load_state_dict: invalid learning rate {}", lr_value);
  KILN_CHECK(steps_value >= 0 && steps_value == std::floor(steps_value) && steps_value < 0x1p62,
             "[optimizer] load_state_dict: 'steps' must be a count >= 0, got {}", steps_value);
  for (auto& [dst, src] : copies) dtensor::copy_whole_into(dst, src);  // a DTensor: its piece
  set_lr(lr_value);
  steps_ = static_cast<int64_t>(steps_value);
}

SGD::SGD(TensorList params, const SGDOptions& o) : Optimizer(std::move(params), o.lr), o_(o) {
  KILN_CHECK(o.momentum >= 0 && o.weight_decay >= 0,
             "[SGD] momentum and weight_decay must be >= 0, got {} and {}", o.momentum,
             o.weight_decay);
  KILN_CHECK(!o.nesterov || (o.momentum > 0 && o.dampening == 0),
             "[SGD] nesterov needs momentum > 0 and dampening 0");
  buffers_.resize(params_.size());
}

// Note [SGD in a compiled step]
// A compiled step replays the ops its trace recorded with the attributes they had, so a rate
// passed as a number would stay the traced one after set_lr. The rate is read from
// lr_tensor_ instead (0-d float64 on the parameters' device, filled in place by set_lr), as
// AdamW's kernel does: p -= (d * lr), one product per parameter, then one multi-tensor add.
// The product is in the parameter's dtype (PyTorch's rule for a 0-d operand), so for float16
// and bfloat16 parameters the rate is rounded to that dtype first, as in PyTorch's SGD with a
// tensor rate. Momentum, dampening, weight decay and Nesterov stay numbers in the trace: they
// are fixed when the optimizer is made (there is no setter), so they cannot differ between a
// trace and a later call, and need no guard (See Note [Host values steer traces] in
// kiln/compile/host_guard.cpp).
//
// Note [Skipped SGD steps]
// SGD has no fused kernel that could read GradScaler's found_inf, so a step given one computes
// the update as always and then selects, per tensor, the old or the new value on the device:
// p = where(found_inf != 0, p_old, p_new), the same for momentum buffers, from clones taken
// before the update (two extra reads and writes per tensor; only when a found_inf is given).
// No arithmetic on the update could undo it instead: an inf gradient makes inf * 0 = NaN. A
// momentum buffer first made on a skipped step is left at zero, so the next step gives it
// (1 - dampening) d where PyTorch (which never ran the skipped step) starts it at d: the same
// for the default dampening 0.
void SGD::step(const Tensor& found_inf) {
  autograd::NoGradGuard no_grad;
  bool stepped = false;
  for (const Group& group : groups_) {  // See Note [Parameter groups].
    Tensor skip;                        // 0-d bool beside the group: found_inf != 0
    if (found_inf.defined())
      skip = ne(found_inf_beside(found_inf, params_[group.params.front()]), 0);
    TensorList ps, ds, bufs;
    std::vector<size_t> fresh;  // parameters whose momentum buffer starts this step
    for (size_t i : group.params) {
      const Tensor& g = params_[i].grad();
      if (!g.defined()) continue;
      ps.push_back(params_[i]);
      ds.push_back(o_.weight_decay != 0 ? add(g, params_[i], o_.weight_decay) : g);
      if (o_.momentum != 0) {
        if (!buffers_[i].defined()) {
          buffers_[i] = ds.back().clone();  // PyTorch: the first buffer is the gradient itself
          fresh.push_back(bufs.size());
        }
        bufs.push_back(buffers_[i]);
      }
    }
    if (ps.empty()) continue;
    stepped = true;
    TensorList old_ps, old_bufs;  // See Note [Skipped SGD steps].
    if (skip.defined()) {
      for (const Tensor& p : ps) old_ps.push_back(p.clone());
      for (size_t k = 0; k < bufs.size(); ++k) {
        const bool made_now = std::find(fresh.begin(), fresh.end(), k) != fresh.end();
        old_bufs.push_back(made_now ? zeros_like(bufs[k]) : bufs[k].clone());
      }
    }
    if (o_.momentum != 0) {
      // buf = momentum * buf + (1 - dampening) * d, except for buffers made this step.
      TensorList old_bufs, old_ds;
      for (size_t k = 0; k < bufs.size(); ++k) {
        if (std::find(fresh.begin(), fresh.end(), k) != fresh.end()) continue;
        old_bufs.push_back(bufs[k]);
        old_ds.push_back(ds[k]);
      }
      if (!old_bufs.empty()) {
        foreach_mul_(old_bufs, o_.momentum);
        foreach_add_(old_bufs, old_ds, 1.0 - o_.dampening);
      }
      if (o_.nesterov) {
        for (size_t k = 0; k < ds.size(); ++k) ds[k] = add(ds[k], bufs[k], o_.momentum);
      } else {
        ds = bufs;
      }
    }
    // p -= lr * d with lr read from the device (See Note [SGD in a compiled step]).
    for (Tensor& d : ds) d = mul(d, group.lr);
    foreach_add_(ps, ds, -1.0);
    if (skip.defined()) {
      for (size_t k = 0; k < ps.size(); ++k) Tensor(ps[k]).copy_(where(skip, old_ps[k], ps[k]));
      for (size_t k = 0; k < bufs.size(); ++k)
        Tensor(bufs[k]).copy_(where(skip, old_bufs[k], bufs[k]));
    }
  }
  if (stepped) ++steps_;
}

StateDict SGD::state_dict() const {
  StateDict out = Optimizer::state_dict();
  for (size_t i = 0; i < buffers_.size(); ++i)
    if (buffers_[i].defined())
      out.emplace_back(fmt::format("momentum_buffer.{}", i), buffers_[i].detach());
  return out;
}

void SGD::load_state_dict(const StateDict& state) {
  // The buffers are made on the first step, so which exist varies: they are checked here and
  // the rest by Optimizer::load_state_dict, before anything changes.
  constexpr std::string_view kPrefix = "momentum_buffer.";
  StateDict rest;
  std::vector<Tensor> loaded(params_.size());
  for (const auto& [name, t] : state) {
    if (!name.starts_with(kPrefix)) {
      rest.emplace_back(name, t);
      continue;
    }
    const std::string index = name.substr(kPrefix.size());
    size_t i = 0;
    auto [ptr, ec] = std::from_chars(index.data(), index.data() + index.size(), i);
    KILN_CHECK(ec == std::errc() && ptr == index.data() + index.size() && i < params_.size(),
               "[optimizer] load_state_dict: unexpected key {} ({} parameters)", name,
               params_.size());
    KILN_CHECK(!loaded[i].defined(), "[optimizer] load_state_dict: duplicate entries [{}]", name);
    KILN_CHECK(t.defined(), "[optimizer] load_state_dict: entry '{}' is undefined", name);
    KILN_CHECK(t.sizes() == params_[i].sizes(),
               "[optimizer] load_state_dict: size mismatch for {}: state dict has [{}], "
               "optimizer has [{}]",
               name, fmt::join(t.sizes(), ", "), fmt::join(params_[i].sizes(), ", "));
    loaded[i] = t;
  }
  Optimizer::load_state_dict(rest);
  autograd::NoGradGuard no_grad;
  for (size_t i = 0; i < params_.size(); ++i) {
    if (!loaded[i].defined())
      buffers_[i] = Tensor();
    else if (buffers_[i].defined())
      dtensor::copy_whole_into(buffers_[i], loaded[i]);
    else if (dtensor::is_dtensor(params_[i]))  // a buffer beside its parameter, its piece
      dtensor::copy_whole_into(buffers_[i] = zeros_like(params_[i]), loaded[i]);
    else
      buffers_[i] = loaded[i].to(params_[i].dtype()).to(params_[i].device(), /*copy=*/true);
  }
}

AdamW::AdamW(TensorList params, const AdamWOptions& o) : Optimizer(std::move(params), o.lr), o_(o) {
  KILN_CHECK(o.beta1 >= 0 && o.beta1 < 1 && o.beta2 >= 0 && o.beta2 < 1,
             "[AdamW] betas must be in [0, 1), got {} and {}", o.beta1, o.beta2);
  KILN_CHECK(o.eps >= 0 && o.weight_decay >= 0,
             "[AdamW] eps and weight_decay must be >= 0, got {} and {}", o.eps, o.weight_decay);
  autograd::NoGradGuard no_grad;
  for (const Tensor& p : params_) {
    m_.push_back(zeros_like(p));
    v_.push_back(zeros_like(p));
    step_counts_.push_back(dtensor::scalar_beside(p, 0.0, kFloat64));
  }
}

void AdamW::step(const Tensor& found_inf) {
  autograd::NoGradGuard no_grad;
  // Bias correction counts each parameter's own updates (a parameter without a gradient is
  // not stepped); the counts live on the device, so one call serves every parameter.
  bool stepped = false;
  for (const Group& group : groups_) {  // See Note [Parameter groups].
    TensorList p, g, m, v, steps;
    for (size_t i : group.params) {
      const Tensor& grad = params_[i].grad();
      if (!grad.defined()) continue;
      p.push_back(params_[i]);
      g.push_back(grad);
      m.push_back(m_[i]);
      v.push_back(v_[i]);
      steps.push_back(step_counts_[i]);
    }
    if (p.empty()) continue;
    stepped = true;
    foreach_adamw_(p, g, m, v, steps, group.lr, o_.beta1, o_.beta2, o_.eps, o_.weight_decay,
                   found_inf.defined() ? found_inf_beside(found_inf, p.front()) : Tensor());
  }
  if (stepped) ++steps_;
}

StateDict AdamW::named_state() const {
  StateDict out;
  for (size_t i = 0; i < params_.size(); ++i) {
    out.emplace_back(fmt::format("exp_avg.{}", i), m_[i]);
    out.emplace_back(fmt::format("exp_avg_sq.{}", i), v_[i]);
    out.emplace_back(fmt::format("step.{}", i), step_counts_[i]);
  }
  return out;
}

Tensor clip_grad_norm_(const TensorList& params, double max_norm) {
  KILN_CHECK(max_norm > 0, "[clip_grad_norm_] max_norm must be > 0, got {}", max_norm);
  autograd::NoGradGuard no_grad;
  TensorList grads;
  for (const Tensor& p : params)
    if (p.grad().defined()) grads.push_back(p.grad());
  KILN_CHECK(!grads.empty(), "[clip_grad_norm_] no parameter has a gradient");
  // See Note [Parameter groups].
  const std::vector<std::vector<size_t>> groups = group_by_home(grads);
  auto sum_of_squares = [&](const std::vector<size_t>& group) {
    TensorList squares;
    for (size_t i : group) squares.push_back(sum(mul(grads[i], grads[i]), {}, false, kFloat32));
    return sum(stack(squares));
  };
  // scale = min(1, max_norm / (norm + 1e-6)), applied on the device: no host read.
  // full_like: over DTensor gradients the norm is a (replicated) DTensor, the global norm.
  auto scale_of = [&](const Tensor& norm) {
    return clamp(div(full_like(norm, max_norm), add(norm, 1e-6)), std::nullopt, 1.0);
  };
  if (groups.size() == 1) {
    Tensor norm = sqrt(sum_of_squares(groups[0]));
    Tensor scale = scale_of(norm);
    for (Tensor& g : grads) mul_(g, scale);
    return norm;
  }
  const Device device = grads[0].device();
  Tensor total;
  for (const std::vector<size_t>& group : groups) {
    Tensor s = sum_of_squares(group);
    if (dtensor::is_dtensor(s)) s = dtensor::full_tensor(s);
    s = s.to(device);
    total = total.defined() ? add(total, s) : s;
  }
  Tensor norm = sqrt(total);
  Tensor scale = scale_of(norm);
  for (const std::vector<size_t>& group : groups) {
    const Tensor& first = grads[group.front()];
    Tensor s = scale.to(first.device());
    if (dtensor::is_dtensor(first)) {
      const dtensor::DeviceMesh& mesh = dtensor::spec_of(first)->mesh();
      s = dtensor::from_local(
          s, mesh, dtensor::Placements(static_cast<size_t>(mesh.ndim()), dtensor::Replicate()));
    }
    for (size_t i : group) mul_(grads[i], s);
  }
  return norm;
}

double WarmupCosineLR::operator()(int64_t step) const {
  if (warmup > 0 && step < warmup)
    return max_lr * static_cast<double>(step + 1) / static_cast<double>(warmup);
  if (step >= total) return min_lr;
  double progress = static_cast<double>(step - warmup) /
                    static_cast<double>(std::max<int64_t>(1, total - warmup));
  return min_lr + 0.5 * (max_lr - min_lr) * (1 + std::cos(std::numbers::pi * progress));
}

}  // namespace kiln::optim

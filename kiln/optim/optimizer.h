#pragma once
// Optimizers over a list of parameters: SGD (momentum, weight decay, Nesterov) and AdamW.
// Steps run under NoGradGuard on multi-tensor (foreach) kernels; parameters without a
// gradient are skipped, as in PyTorch.
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "kiln/core/tensor.h"

namespace kiln::optim {

// Named tensors, in order: the same type as io::StateDict, so a state dict saves as is.
using StateDict = std::vector<std::pair<std::string, Tensor>>;

class Optimizer {
 public:
  Optimizer(TensorList params, double lr);
  virtual ~Optimizer() = default;
  void step() { step(Tensor()); }
  // A step that is skipped on the device when `found_inf` (0-d float32, GradScaler's; on any
  // device, plain or a DTensor) is nonzero: parameters and state are left bitwise as they were,
  // with no host read, so it captures into a compiled step. Undefined: an ordinary step.
  // steps() counts the call either way (the host cannot know without a read; AdamW's device
  // step counts, which bias correction reads, do not count a skipped step).
  virtual void step(const Tensor& found_inf) = 0;
  // Zeroes the gradients in place (their addresses stay stable) or drops them.
  void zero_grad(bool set_to_none = false);
  double lr() const { return lr_; }
  // Sets the learning rate. It is also written into the device tensors that SGD's and AdamW's
  // steps read, so a compiled step replays with the current rate without a recompile: call
  // set_lr outside the compiled function.
  void set_lr(double lr);
  // The learning rate as a 0-d float64 tensor beside parameter 0: on its device, or a
  // replicated DTensor on its mesh. Parameters that live elsewhere (plain tensors beside
  // DTensors, another mesh or device) read their own group's copy (Note [Parameter groups]).
  const Tensor& lr_tensor() const { return groups_.front().lr; }
  const TensorList& params() const { return params_; }
  int64_t steps() const { return steps_; }

  // What a resumed run needs to continue bitwise as if never stopped: "lr" (0-d float64, the
  // rate's value), "steps" (0-d int64, the updates taken) and the optimizer's own tensors
  // (AdamW: "exp_avg.i", "exp_avg_sq.i", "step.i" for parameter i), detached: they share
  // storage with the optimizer's. See Note [Optimizer state dicts].
  virtual StateDict state_dict() const;
  // Copies `state` (as state_dict() wrote it, from any device) into the optimizer in place,
  // so a compiled step holding its tensors stays valid. Missing, unexpected or duplicate
  // names, mismatched shapes and a bad lr or step count raise ValueError listing them, before
  // anything changes.
  virtual void load_state_dict(const StateDict& state);

 protected:
  // The optimizer's own state tensors, live (not copies), by name; empty for none.
  virtual StateDict named_state() const { return {}; }

  // Parameters that live alike: plain tensors on one device, or DTensors on one mesh. The
  // multi-tensor ops take one kind per call, so a step runs them once per group, each with
  // the rate (and state) beside its parameters. See Note [Parameter groups] in optimizer.cpp.
  struct Group {
    std::vector<size_t> params;  // indices into params_, in order
    Tensor lr;                   // 0-d float64 beside them (dtensor::scalar_beside)
  };

  TensorList params_;
  double lr_;
  std::vector<Group> groups_;  // in order of each group's first parameter
  int64_t steps_ = 0;
};

struct SGDOptions {
  double lr = 1e-2;
  double momentum = 0.0;
  double dampening = 0.0;
  double weight_decay = 0.0;
  bool nesterov = false;
};

// p -= lr * d, where d = g + wd p, and with momentum buf = momentum buf + (1 - dampening) d,
// d = buf (or d + momentum buf with Nesterov). PyTorch's SGD. The rate is read from
// lr_tensor() (See Note [SGD in a compiled step] in optimizer.cpp); the other options are fixed at
// construction.
class SGD : public Optimizer {
 public:
  SGD(TensorList params, const SGDOptions& options);
  using Optimizer::step;
  // See Note [Skipped SGD steps] in optimizer.cpp.
  void step(const Tensor& found_inf) override;
  const TensorList& momentum_buffers() const { return buffers_; }
  // Adds "momentum_buffer.i" for each buffer made so far; loading one makes or overwrites it
  // (in place when it exists) and leaves the others unmade, as in the saved optimizer.
  StateDict state_dict() const override;
  void load_state_dict(const StateDict& state) override;

 private:
  SGDOptions o_;
  TensorList buffers_;  // per parameter; created on the first step
};

struct AdamWOptions {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 1e-2;
};

// Adam with decoupled weight decay (PyTorch's AdamW): one fused multi-tensor kernel per step
// that reads p, g, m, v and writes p, m, v once.
class AdamW : public Optimizer {
 public:
  AdamW(TensorList params, const AdamWOptions& options);
  using Optimizer::step;
  void step(const Tensor& found_inf) override;
  const TensorList& exp_avg() const { return m_; }
  const TensorList& exp_avg_sq() const { return v_; }
  // Per parameter: the updates taken (0-d float64 on the device; bias correction reads them).
  const TensorList& step_counts() const { return step_counts_; }

 protected:
  StateDict named_state() const override;

 private:
  AdamWOptions o_;
  TensorList m_, v_;  // per parameter, zero-initialised
  TensorList step_counts_;
};

// Scales gradients so that their global L2 norm is at most max_norm, without reading the norm
// on the host (the scale is a device tensor). Returns the norm before clipping (0-d, float32):
// a replicated DTensor when every gradient is a DTensor of one mesh, else a plain tensor on the
// first gradient's device. The list may mix plain and DTensor gradients, meshes and devices:
// a DTensor's part of the norm is over its global value; a plain gradient is taken to be the
// same on every rank (a replicated parameter's) and counted once. See Note [Parameter groups].
Tensor clip_grad_norm_(const TensorList& params, double max_norm);

// Learning-rate schedules: the rate to use at `step` (0-based).
struct ConstantLR {
  double lr;
  double operator()(int64_t) const { return lr; }
};
// Linear warm-up over `warmup` steps (step s gets max_lr (s + 1) / warmup), then cosine decay
// from max_lr to min_lr at `total`; min_lr after.
struct WarmupCosineLR {
  double max_lr;
  double min_lr;
  int64_t warmup;
  int64_t total;
  double operator()(int64_t step) const;
};

}  // namespace kiln::optim

#pragma once
// Loss scaling for float16 training (PyTorch's torch.amp.GradScaler): the loss is multiplied by
// a scale so that small float16 gradients do not flush to zero; before the optimizer steps, the
// gradients are divided by it and checked for inf and NaN, and a step whose gradients overflowed
// is skipped. The scale grows after growth_interval clean steps and backs off after an overflow.
// Everything happens on the device: no host read, so a compiled step with scale, unscale_, step
// and update traces once and replays. See Note [Loss scaling on the device] in grad_scaler.cpp.
#include <cstdint>
#include <map>

#include "kiln/core/tensor.h"
#include "kiln/optim/optimizer.h"

namespace kiln::amp {

struct GradScalerOptions {
  double init_scale = 65536.0;  // > 0 and finite
  double growth_factor = 2.0;   // > 1
  double backoff_factor = 0.5;  // in (0, 1)
  int64_t growth_interval = 2000;
  bool enabled = true;  // false: every method is a pass-through
};

class GradScaler {
 public:
  // The scale (0-d float32) and its growth tracker (0-d int32) live on `device`. Bad options
  // raise ValueError.
  explicit GradScaler(Device device, const GradScalerOptions& options = {});

  // loss * scale (loss itself when disabled). A DTensor loss is scaled by a replicated scale.
  Tensor scale(const Tensor& loss) const;
  // Divides the optimizer's gradients by the scale in place and records on the device whether
  // any was inf or NaN (all-reduced with max over the world when it has several ranks, so every
  // rank skips alike). Once per optimizer between update()s; clip gradients after it.
  void unscale_(optim::Optimizer& optimizer);
  // unscale_ unless done, then optimizer.step(found_inf): skipped on the device on an overflow.
  void step(optim::Optimizer& optimizer);
  // Grows or backs off the scale from this step's checks (amp_update_scale_), and starts the
  // next step. Raises when no optimizer was unscaled since the last update.
  void update();

  // The current scale, read on the host (for logging); 1 when disabled.
  double get_scale() const;
  const Tensor& scale_tensor() const { return scale_; }
  const Tensor& growth_tracker() const { return growth_tracker_; }
  bool is_enabled() const { return options_.enabled; }
  const GradScalerOptions& options() const { return options_; }

  // "scale" (0-d float32), "growth_tracker" (0-d int32), "growth_factor", "backoff_factor"
  // (0-d float64) and "growth_interval" (0-d int64), as copies; empty when disabled.
  optim::StateDict state_dict() const;
  // Loads what state_dict wrote (from any device): the scale and tracker are copied in place
  // (a compiled step holding them stays valid), the options replaced. An empty state dict (a
  // disabled scaler's), missing or unexpected keys and bad values raise ValueError before
  // anything changes. Does nothing when disabled. Load before compiling a step: the options
  // are numbers in a trace.
  void load_state_dict(const optim::StateDict& state);

 private:
  enum class Stage { Ready, Unscaled, Stepped };
  struct PerOptimizer {
    Stage stage = Stage::Ready;
    Tensor found_inf;  // 0-d float32 on the optimizer's first device
  };

  Device device_;
  GradScalerOptions options_;
  Tensor scale_, growth_tracker_;
  std::map<const optim::Optimizer*, PerOptimizer> per_optimizer_;  // this step's
};

}  // namespace kiln::amp

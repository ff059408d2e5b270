#pragma once
// Grad modes (thread-local, RAII) and anomaly mode. Grad mode is off exactly when the thread
// excludes DispatchKey::Autograd, so an op under NoGradGuard skips the autograd layer entirely.
#include "kiln/dispatch/op.h"

namespace kiln::autograd {

// Whether ops on this thread record gradients.
bool is_grad_enabled();
void set_grad_enabled(bool enabled);

// Sets grad mode for a scope and restores the previous mode on exit.
class GradModeGuard {
 public:
  explicit GradModeGuard(bool enabled) : prev_(is_grad_enabled()) { set_grad_enabled(enabled); }
  ~GradModeGuard() { set_grad_enabled(prev_); }
  GradModeGuard(const GradModeGuard&) = delete;
  GradModeGuard& operator=(const GradModeGuard&) = delete;

 private:
  bool prev_;
};

// Ops in scope record nothing (optimizer updates, evaluation).
class NoGradGuard : public GradModeGuard {
 public:
  NoGradGuard() : GradModeGuard(false) {}
};
// Re-enables recording inside a NoGradGuard.
class EnableGradGuard : public GradModeGuard {
 public:
  EnableGradGuard() : GradModeGuard(true) {}
};

// No grad, and every tensor made in scope is an inference tensor: it can never be saved for
// backward (using one in a recorded op that needs it raises). For inference-only code.
class InferenceModeGuard {
 public:
  InferenceModeGuard();
  ~InferenceModeGuard();
  InferenceModeGuard(const InferenceModeGuard&) = delete;
  InferenceModeGuard& operator=(const InferenceModeGuard&) = delete;

 private:
  GradModeGuard grad_;
  bool prev_;
};
bool is_inference_mode_enabled();

// Anomaly mode (process-wide): backward checks every gradient a node returns for NaN/Inf and
// raises naming the node. Costs a host read per gradient; for debugging.
bool is_anomaly_enabled();
void set_anomaly_enabled(bool enabled);
class AnomalyModeGuard {
 public:
  explicit AnomalyModeGuard(bool enabled = true) : prev_(is_anomaly_enabled()) {
    set_anomaly_enabled(enabled);
  }
  ~AnomalyModeGuard() { set_anomaly_enabled(prev_); }
  AnomalyModeGuard(const AnomalyModeGuard&) = delete;
  AnomalyModeGuard& operator=(const AnomalyModeGuard&) = delete;

 private:
  bool prev_;
};

}  // namespace kiln::autograd

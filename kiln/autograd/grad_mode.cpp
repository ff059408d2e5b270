#include "kiln/autograd/grad_mode.h"

#include <atomic>

namespace kiln::autograd {

bool is_grad_enabled() { return !local_dispatch_state().excluded.has(DispatchKey::Autograd); }

void set_grad_enabled(bool enabled) {
  LocalDispatchState& s = local_dispatch_state();
  s.excluded =
      enabled ? s.excluded.remove(DispatchKey::Autograd) : s.excluded.add(DispatchKey::Autograd);
}

InferenceModeGuard::InferenceModeGuard() : grad_(false), prev_(kiln::detail::tls_inference_mode) {
  kiln::detail::tls_inference_mode = true;
}
InferenceModeGuard::~InferenceModeGuard() { kiln::detail::tls_inference_mode = prev_; }
bool is_inference_mode_enabled() { return kiln::detail::tls_inference_mode; }

namespace {
std::atomic<bool> g_anomaly{false};
}
bool is_anomaly_enabled() { return g_anomaly.load(std::memory_order_relaxed); }
void set_anomaly_enabled(bool enabled) { g_anomaly.store(enabled, std::memory_order_relaxed); }

}  // namespace kiln::autograd

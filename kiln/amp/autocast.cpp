#include "kiln/amp/autocast.h"

#include <algorithm>

#include "kiln/compile/host_guard.h"
#include "kiln/core/error.h"
#include "kiln/dispatch/op.h"
#include "kiln/ops/ops.h"

namespace kiln::amp {

// Note [Autocast]
// AutocastGuard includes the Autocast key on its thread (so with autocast off no op pays
// anything) and sets the thread's device type and dtype. The key's boxed fallback looks at the
// op's policy: functional ops only (in-place and out= forms keep their written tensor's dtype,
// views and factories have nothing to cast, as in PyTorch); for LowerPrecision every float32
// tensor argument on the autocast device type becomes the autocast dtype (float64 stays: it
// was asked for), for Float32 every float16/bfloat16 one becomes float32, for Promote all
// floating ones become the widest among them; then the op runs below Autocast. The casts are
// ordinary `to` calls, so Autograd below records them and a float32 parameter's gradient comes
// back float32 through the cast's backward. The engine excludes Autocast while it runs a
// backward pass, so backward formulas compute in the dtypes their forward saved. A trace reads
// the autocast state when it starts (Tracer::Scope), which makes it a guard of the compiled
// entry: calling it under another state traces again.

namespace {

thread_local DeviceType t_device = kCPU;
thread_local DType t_dtype = kBFloat16;

bool autocast_on() { return local_dispatch_state().included.has(DispatchKey::Autocast); }

// The cast `policy` asks of tensor `t`, or nullopt to leave it. `widest` is Promote's target.
// Numbers wrapped as 0-d tensors (`mul(x, 0.5)`) are never cast, nor counted by Promote: type
// promotion treats them as weak, and a cast would make them ordinary float64 tensors.
bool castable(const Tensor& t) {
  return t.defined() && is_floating(t.dtype()) && t.device().type() == t_device &&
         !t.impl()->is_wrapped_number();
}

std::optional<DType> cast_for(AutocastPolicy policy, const Tensor& t, DType widest) {
  if (!castable(t)) return {};
  const DType d = t.dtype();
  switch (policy) {
    case AutocastPolicy::LowerPrecision:
      if (d == kFloat32 || ((d == kFloat16 || d == kBFloat16) && d != t_dtype)) return t_dtype;
      return {};
    case AutocastPolicy::Float32:
      if (d == kFloat16 || d == kBFloat16) return kFloat32;
      return {};
    case AutocastPolicy::Promote:
      if (d != widest) return widest;
      return {};
    default:
      return {};
  }
}

// The widest floating dtype among the arguments on the autocast device type (Promote).
DType widest_floating(const Stack& stack) {
  DType w = DType::Bool;
  auto see = [&](const Tensor& t) {
    if (!castable(t)) return;
    if (w == DType::Bool || promote_types(w, t.dtype()) == t.dtype()) w = t.dtype();
  };
  for (const IValue& v : stack) {
    if (auto* t = std::get_if<Tensor>(&v)) see(*t);
    if (auto* l = std::get_if<TensorList>(&v))
      for (const Tensor& t : *l) see(t);
  }
  return w;
}

void autocast_fallback(const OpDef& op, DispatchKey, Stack& stack) {
  ExcludeKeyGuard below(DispatchKey::Autocast);
  const AutocastPolicy policy = op.autocast_policy();
  const bool casts = op.kind() == OpKind::Functional &&
                     (policy == AutocastPolicy::LowerPrecision ||
                      policy == AutocastPolicy::Float32 || policy == AutocastPolicy::Promote);
  if (casts) {
    const DType widest = policy == AutocastPolicy::Promote ? widest_floating(stack) : kFloat32;
    for (IValue& v : stack) {
      if (auto* t = std::get_if<Tensor>(&v)) {
        if (auto d = cast_for(policy, *t, widest)) *t = cast_in_memory_order(*t, *d);
      } else if (auto* l = std::get_if<TensorList>(&v)) {
        for (Tensor& x : *l)
          if (auto d = cast_for(policy, x, widest)) x = cast_in_memory_order(x, *d);
      }
    }
  }
  op.call_boxed(stack);
}

const bool g_registered = [] {
  register_fallback(DispatchKey::Autocast, &autocast_fallback);
  return true;
}();

}  // namespace

namespace {
// The whole state as one guard value: 0 when off, else enabled | device type | dtype.
compiler::HostValue read_state() {
  if (!autocast_on()) return compiler::HostValue(int64_t{0});
  return compiler::HostValue(int64_t{1} << 16 | int64_t{t_device} << 8 |
                             static_cast<int64_t>(t_dtype));
}
constexpr compiler::HostReader kAutocastState{"autocast state", &read_state};
}  // namespace

AutocastGuard::AutocastGuard(Device device, DType dtype, bool enabled)
    : saved_enabled_(autocast_on()), saved_device_(t_device), saved_dtype_(t_dtype) {
  KILN_CHECK(!enabled || dtype == kFloat16 || dtype == kBFloat16,
             "[autocast] the autocast dtype must be float16 or bfloat16, got {}", dtype);
  compiler::host_value_changing(kAutocastState);
  LocalDispatchState& s = local_dispatch_state();
  s.included =
      enabled ? s.included.add(DispatchKey::Autocast) : s.included.remove(DispatchKey::Autocast);
  if (enabled) {
    t_device = device.type();
    t_dtype = dtype;
  }
}

AutocastGuard::~AutocastGuard() {
  compiler::host_value_changing(kAutocastState);
  LocalDispatchState& s = local_dispatch_state();
  s.included = saved_enabled_ ? s.included.add(DispatchKey::Autocast)
                              : s.included.remove(DispatchKey::Autocast);
  t_device = saved_device_;
  t_dtype = saved_dtype_;
}

void guard_autocast_state() { compiler::guard_host_value(kAutocastState); }

bool autocast_enabled() { return autocast_on(); }
DeviceType autocast_device_type() { return t_device; }
DType autocast_dtype() { return t_dtype; }

// Note [Casts in memory order]
// `t` cast to `d` with the same memory order when t is a permutation of a contiguous tensor (a
// Linear's weight arrives as w.t()): the cast reads and writes flat (16-byte loads) instead of
// transposing through the strided kernel, and the product takes the transposed view as it took
// the float32 one. gpt_large under bf16 autocast cast its 48 weights this way at 16 us each on
// the H200 (run Q12). Other layouts (gaps, overlaps, broadcasts) cast to contiguous.
Tensor cast_in_memory_order(const Tensor& t, DType d) {
  const int64_t n = t.dim();
  if (n < 2 || t.is_contiguous()) return t.to(d);
  Shape perm(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) perm[static_cast<size_t>(i)] = i;
  IntArrayRef st = t.strides();
  std::stable_sort(perm.begin(), perm.end(), [&](int64_t a, int64_t b) { return st[a] > st[b]; });
  Tensor dense = permute(t, perm);
  if (!dense.is_contiguous()) return t.to(d);
  Shape inverse(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) inverse[static_cast<size_t>(perm[static_cast<size_t>(i)])] = i;
  return permute(dense.to(d), inverse);
}

}  // namespace kiln::amp

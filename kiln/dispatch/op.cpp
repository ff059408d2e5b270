#include "kiln/dispatch/op.h"

namespace kiln {

namespace {
BoxedKernel g_fallbacks[kNumDispatchKeys] = {};

bool is_backend_key(DispatchKey k) { return k >= DispatchKey::CPU && k <= DispatchKey::Meta; }
}  // namespace

namespace detail {
// Two words of static TLS; trivially constructible, so no guard on access.
thread_local LocalDispatchState tls_dispatch_state __attribute__((tls_model("initial-exec")));
}  // namespace detail

ExcludeKeyGuard::ExcludeKeyGuard(DispatchKey k)
    : state_(local_dispatch_state()), saved_(state_.excluded) {
  state_.excluded = state_.excluded.add(k);
}
ExcludeKeyGuard::~ExcludeKeyGuard() { state_.excluded = saved_; }

IncludeKeyGuard::IncludeKeyGuard(DispatchKey k)
    : state_(local_dispatch_state()), saved_(state_.included) {
  state_.included = state_.included.add(k);
}
IncludeKeyGuard::~IncludeKeyGuard() { state_.included = saved_; }

void register_fallback(DispatchKey key, BoxedKernel fn) { g_fallbacks[static_cast<int>(key)] = fn; }
BoxedKernel fallback_for(DispatchKey key) { return g_fallbacks[static_cast<int>(key)]; }

void OpDef::set_kernel_raw(DispatchKey k, void* fn) {
  KILN_ASSERT(k != DispatchKey::Undefined && k != DispatchKey::NumKeys);
  unboxed_[static_cast<int>(k)] = fn;
}

DispatchKey OpDef::resolve_slow(DispatchKeySet ks, BoxedKernel* fallback) const {
  while (true) {
    DispatchKey k = ks.highest();
    if (k == DispatchKey::Undefined)
      KILN_THROW(Value, "[{}] no tensor argument and no default device to dispatch on", name_);
    if (unboxed_[static_cast<int>(k)]) return k;
    if (BoxedKernel f = g_fallbacks[static_cast<int>(k)]) {
      *fallback = f;
      return k;
    }
    if (is_backend_key(k)) detail::throw_no_kernel(*this, k);
    ks = ks.remove(k);  // layers above the backends fall through
  }
}

void OpDef::call_boxed_at(DispatchKey key, Stack& stack) const {
  if (void* fn = unboxed_[static_cast<int>(key)]) return caller_(fn, stack);
  if (BoxedKernel f = g_fallbacks[static_cast<int>(key)]) return f(*this, key, stack);
  detail::throw_no_kernel(*this, key);
}

namespace {
// A boxed fallback bound to its arguments (a backend served by one, such as sim): each run
// hands the fallback a copy of the stack.
struct BoundFallback final : BoundCall {
  BoundFallback(const OpDef& op, DispatchKey key, BoxedKernel fn, Stack args)
      : op(op), key(key), fn(fn), args(std::move(args)) {}
  void run() override {
    results = args;
    fn(op, key, results);
  }
  const OpDef& op;
  DispatchKey key;
  BoxedKernel fn;
  Stack args;
};
}  // namespace

std::unique_ptr<BoundCall> OpDef::bind(DispatchKey key, Stack& stack) const {
  if (void* fn = unboxed_[static_cast<int>(key)]) return binder_(fn, stack);
  if (BoxedKernel f = g_fallbacks[static_cast<int>(key)])
    return std::make_unique<BoundFallback>(*this, key, f, stack);
  detail::throw_no_kernel(*this, key);
}

void OpDef::call_boxed(Stack& stack) const {
  const LocalDispatchState& tls = local_dispatch_state();
  DispatchKeySet ks = (detail::key_set_of_stack(stack) | tls.included) - tls.excluded;
  BoxedKernel fallback = nullptr;
  DispatchKey k = resolve_slow(ks, &fallback);
  if (!fallback) return caller_(unboxed_[static_cast<int>(k)], stack);
  fallback(*this, k, stack);
}

namespace detail {
void throw_no_kernel(const OpDef& op, DispatchKey key) {
  int type = device_type_for_key(key);
  std::string why = type < 0 ? "no backend is registered with this key"
                    : key >= DispatchKey::PrivateUse1 && key <= DispatchKey::PrivateUse3
                        ? fmt::format(
                              "device '{}': its backend has no kernel for this op and its CPU "
                              "fallback is off",
                              device_type_name(static_cast<DeviceType>(type)))
                        : fmt::format("the op is not supported on device '{}'",
                                      device_type_name(static_cast<DeviceType>(type)));
  throw NotImplementedError(
      fmt::format("[{}] no kernel for dispatch key {} ({})", op.name(), key_name(key), why));
}
}  // namespace detail

}  // namespace kiln

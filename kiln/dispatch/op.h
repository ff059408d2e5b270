#pragma once
// Op definitions and the dispatcher. See DESIGN.md "Dispatch".
//
// Note [Dispatch key order]
// A call unions the key sets of its tensor arguments, adds the thread-local included keys,
// removes the excluded ones, and runs the kernel of the highest key left. A layer above the
// backends (Autograd, Trace, ...) does its work and calls the op again with its own key
// excluded (ExcludeKeyGuard). A key with neither a kernel nor a boxed fallback is skipped for
// the layers above the backends; for a backend key it is a NotImplementedError.
#include <memory>
#include <span>
#include <string_view>
#include <utility>

#include "kiln/core/dispatch_key.h"
#include "kiln/core/error.h"
#include "kiln/dispatch/ivalue.h"

namespace kiln {

class OpDef;

// A kernel that takes its arguments as a Stack and leaves its results there.
using BoxedKernel = void (*)(const OpDef& op, DispatchKey key, Stack& stack);

// Thread-local included / excluded keys.
struct LocalDispatchState {
  DispatchKeySet included;
  DispatchKeySet excluded;
};
namespace detail {
// Initial-exec TLS: one instruction to reach, even from the shared library. See op.cpp.
extern thread_local LocalDispatchState tls_dispatch_state
    __attribute__((tls_model("initial-exec")));
}  // namespace detail
inline LocalDispatchState& local_dispatch_state() { return detail::tls_dispatch_state; }

// RAII: excludes a key for the current thread (how a layer redispatches below itself).
class ExcludeKeyGuard {
 public:
  explicit ExcludeKeyGuard(DispatchKey k);
  ~ExcludeKeyGuard();
  ExcludeKeyGuard(const ExcludeKeyGuard&) = delete;
  ExcludeKeyGuard& operator=(const ExcludeKeyGuard&) = delete;

 private:
  LocalDispatchState& state_;
  DispatchKeySet saved_;
};
// RAII: includes a key for the current thread (e.g. Trace while tracing).
class IncludeKeyGuard {
 public:
  explicit IncludeKeyGuard(DispatchKey k);
  ~IncludeKeyGuard();
  IncludeKeyGuard(const IncludeKeyGuard&) = delete;
  IncludeKeyGuard& operator=(const IncludeKeyGuard&) = delete;

 private:
  LocalDispatchState& state_;
  DispatchKeySet saved_;
};

// Registration (kernels, fallbacks, device types) is not synchronised with dispatch: finish it
// before other threads call ops, as static initialisers and backend loading at start-up do.
//
// Installs a boxed fallback that handles every op at `key` without a kernel of its own.
void register_fallback(DispatchKey key, BoxedKernel fn);
BoxedKernel fallback_for(DispatchKey key);

// What an op's outputs are, for layers that need to know (views alias, in-place mutates).
enum class OpKind : uint8_t { Functional, InPlace, Out, View, Factory };

// A kernel call with its arguments bound once and run many times: compile's executables
// replay steps this way, with no dispatch, boxing or allocation (a value-returning kernel
// leaves its results in `results`, whose capacity is kept).
class BoundCall {
 public:
  virtual ~BoundCall() = default;
  virtual void run() = 0;
  Stack results;
};

// Note [Op variants]
// A pointwise op such as `add` is three ops: `add` (returns a new tensor), `add_` (in place on
// its first argument) and `add_out` (writes into a given `out`, its first argument); a
// structured op such as `sum` has `sum` and `sum_out`. Each form knows the others through
// pointers fixed at compile time by the X-macros of kiln/ops/op_list.cpp, so a layer that
// lowers one form to another (compile's executable, sim's graph nodes, autograd's formulas)
// follows a pointer, never a name. Ops outside those families have no variants (all null).
struct OpVariants {
  const OpDef* functional = nullptr;
  const OpDef* inplace = nullptr;
  const OpDef* out = nullptr;
};

// Note [Op record fields for later layers]
// Besides its schema, meta function, kernels and backward formula, every op will carry a
// sharding rule (kiln/dtensor: how placements propagate), a mixed-precision policy (the
// Autocast key: how inputs are cast) and how it is exposed to Python (the bindings and .pyi
// stubs are generated from the op list). The fields exist now, unset, each with a coverage
// test in tests/ops/op_registry_test.cpp (OpCoverage.*) that requires every op to set the field
// (or be listed as exempt, with a reason) from the first op that sets it on.
//
// How autocast treats an op's floating inputs (DESIGN.md "Mixed precision").
enum class AutocastPolicy : uint8_t {
  Unset,           // not decided yet
  LowerPrecision,  // cast to the autocast dtype (products, convolutions, attention)
  Float32,         // cast 16-bit inputs up to float32 (reductions, norms, softmax, losses)
  Promote,         // cast every input to their widest floating dtype (cat, where, ...)
  Passthrough,     // leave inputs as they are (views, copies, factories, integer ops)
};
// How the Python module exposes an op.
enum class PythonExposure : uint8_t {
  Unset,              // not decided yet
  FunctionAndMethod,  // kiln.name(t, ...) and t.name(...)
  Function,           // kiln.name(...) only (factories, ops over lists)
  Internal,           // not bound (backward helpers reached only through autograd)
};

// One op: its schema, its meta function, and its kernels per dispatch key.
class OpDef {
 public:
  // Calls a kernel given unboxed argument pointers; generated per signature.
  using BoxedCaller = void (*)(void* fn, Stack& stack);
  // Binds a kernel of this op's signature to boxed arguments; generated per signature.
  using Binder = std::unique_ptr<BoundCall> (*)(void* fn, Stack& stack);

  constexpr OpDef(std::string_view name, std::string_view schema, OpKind kind, BoxedCaller caller,
                  Binder binder, OpVariants variants = {})
      : name_(name),
        schema_(schema),
        kind_(kind),
        caller_(caller),
        binder_(binder),
        variants_(variants) {}

  std::string_view name() const { return name_; }
  std::string_view schema() const { return schema_; }
  OpKind kind() const { return kind_; }
  // The op's other forms (Note [Op variants]); null where there is none.
  const OpDef* functional_variant() const { return variants_.functional; }
  const OpDef* inplace_variant() const { return variants_.inplace; }
  const OpDef* out_variant() const { return variants_.out; }
  bool has_kernel(DispatchKey k) const { return unboxed_[static_cast<int>(k)] != nullptr; }
  bool has_meta() const { return meta_ != nullptr; }
  void* unboxed(DispatchKey k) const { return unboxed_[static_cast<int>(k)]; }

  // Runs the op from boxed arguments, dispatching on the tensors in the stack.
  void call_boxed(Stack& stack) const;
  // Runs the kernel at exactly `key` (or the key's fallback) from boxed arguments.
  void call_boxed_at(DispatchKey key, Stack& stack) const;
  // Binds the unboxed kernel at `key` (or the key's boxed fallback) to `stack`'s arguments
  // (copied); throws if the key has neither.
  std::unique_ptr<BoundCall> bind(DispatchKey key, Stack& stack) const;

  void set_kernel_raw(DispatchKey k, void* fn);
  void set_meta_raw(void* fn) { meta_ = fn; }
  void* meta_raw() const { return meta_; }
  // The op's backward formula (a kiln::autograd::Derivative, owned by kiln/autograd).
  void set_derivative(const void* d) { derivative_ = d; }
  const void* derivative() const { return derivative_; }
  // Reserved for the layers to come (Note [Op record fields for later layers]).
  // The op's sharding rule (a kiln::dtensor rule, owned by kiln/dtensor).
  void set_sharding_rule(const void* r) { sharding_rule_ = r; }
  const void* sharding_rule() const { return sharding_rule_; }
  void set_autocast_policy(AutocastPolicy p) { autocast_ = p; }
  AutocastPolicy autocast_policy() const { return autocast_; }
  void set_python_exposure(PythonExposure e) { python_ = e; }
  PythonExposure python_exposure() const { return python_; }
  // Whether a call does something beyond its outputs and written arguments (a collective
  // talks to other processes): compile never drops, merges or reorders such a call.
  void set_side_effects(bool on) { side_effects_ = on; }
  bool side_effects() const { return side_effects_; }
  // Whether the op's result is memory left uninitialised (empty, empty_strided): compile gives
  // it a buffer and no step, sim launches nothing for it.
  void set_uninitialized(bool on) { uninitialized_ = on; }
  bool uninitialized() const { return uninitialized_; }

  // Where the fast path found no kernel: walks down `ks` to the first key with a kernel or a
  // boxed fallback (layers above the backends fall through; a backend without either throws).
  // Returns that key; `*fallback` is set when the key is served by its fallback.
  DispatchKey resolve_slow(DispatchKeySet ks, BoxedKernel* fallback) const;

 private:
  std::string_view name_;
  std::string_view schema_;
  OpKind kind_;
  BoxedCaller caller_;
  Binder binder_;
  OpVariants variants_;
  void* meta_ = nullptr;
  const void* derivative_ = nullptr;
  const void* sharding_rule_ = nullptr;
  AutocastPolicy autocast_ = AutocastPolicy::Unset;
  PythonExposure python_ = PythonExposure::Unset;
  bool side_effects_ = false;
  bool uninitialized_ = false;
  void* unboxed_[kNumDispatchKeys] = {};
};

namespace detail {

inline DispatchKeySet key_set_of(const Tensor& t) { return t.key_set(); }
inline DispatchKeySet key_set_of(const TensorList& ts) {
  DispatchKeySet s;
  for (const auto& t : ts) s = s | t.key_set();
  return s;
}
inline DispatchKeySet key_set_of(Device d) { return DispatchKeySet(d.dispatch_key()); }
template <class T>
DispatchKeySet key_set_of(const T&) {
  return {};
}

inline DispatchKeySet key_set_of_stack(const Stack& stack) {
  DispatchKeySet s;
  for (const auto& v : stack) {
    if (auto* t = std::get_if<Tensor>(&v))
      s = s | t->key_set();
    else if (auto* l = std::get_if<TensorList>(&v))
      s = s | key_set_of(*l);
    else if (auto* d = std::get_if<Device>(&v))
      s = s | key_set_of(*d);
  }
  return s;
}

template <class Sig>
struct BoxedCallerFor;
template <class R, class... A>
struct BoxedCallerFor<R(A...)> {
  static void call(void* fn, Stack& stack) {
    KILN_ASSERT(stack.size() == sizeof...(A), "boxed call expected {} arguments, got {}",
                sizeof...(A), stack.size());
    call_impl(fn, stack, std::index_sequence_for<A...>{});
  }
  template <size_t... I>
  static void call_impl(void* fn, Stack& stack, std::index_sequence<I...>) {
    auto f = reinterpret_cast<R (*)(A...)>(fn);
    if constexpr (std::is_void_v<R>) {
      f(from_ivalue<A>(stack[I])...);
      stack.clear();
    } else {
      R r = f(from_ivalue<A>(stack[I])...);
      stack.clear();
      push_result(stack, std::move(r));
    }
  }
};

// How a bound call keeps an argument of type A (an owning copy) and hands it back.
template <class A>
struct Bound {
  using type = std::remove_cvref_t<A>;
  static const type& pass(const type& v) { return v; }
};
template <>
struct Bound<IntArrayRef> {
  using type = Shape;
  static IntArrayRef pass(const Shape& v) { return v.span(); }
};

template <class Sig>
struct BinderFor;
template <class R, class... A>
struct BinderFor<R(A...)> {
  struct Call final : BoundCall {
    R (*fn)(A...);
    std::tuple<typename Bound<A>::type...> args;
    void run() override { run_impl(std::index_sequence_for<A...>{}); }
    template <size_t... I>
    void run_impl(std::index_sequence<I...>) {
      if constexpr (std::is_void_v<R>) {
        fn(Bound<A>::pass(std::get<I>(args))...);
      } else {
        results.clear();
        push_result(results, fn(Bound<A>::pass(std::get<I>(args))...));
      }
    }
  };
  static std::unique_ptr<BoundCall> bind(void* fn, Stack& stack) {
    KILN_ASSERT(stack.size() == sizeof...(A), "bind expected {} arguments, got {}", sizeof...(A),
                stack.size());
    return bind_impl(fn, stack, std::index_sequence_for<A...>{});
  }
  template <size_t... I>
  static std::unique_ptr<BoundCall> bind_impl(void* fn, Stack& stack, std::index_sequence<I...>) {
    auto c = std::make_unique<Call>();
    c->fn = reinterpret_cast<R (*)(A...)>(fn);
    c->args = std::tuple<typename Bound<A>::type...>(
        typename Bound<A>::type(from_ivalue<A>(stack[I]))...);
    return c;
  }
};

[[noreturn]] void throw_no_kernel(const OpDef& op, DispatchKey key);

}  // namespace detail

// A typed handle: calling it dispatches. One per op, defined in kiln/ops/op_list.cpp.
template <class Sig>
class TypedOp;
template <class R, class... A>
class TypedOp<R(A...)> {
 public:
  using Sig = R(A...);
  constexpr TypedOp(std::string_view name, std::string_view schema, OpKind kind,
                    OpVariants variants = {})
      : def(name, schema, kind, &detail::BoxedCallerFor<Sig>::call, &detail::BinderFor<Sig>::bind,
            variants) {}

  R operator()(A... args) const {
    const LocalDispatchState& tls = local_dispatch_state();
    DispatchKeySet ks =
        ((detail::key_set_of(args) | ... | DispatchKeySet()) | tls.included) - tls.excluded;
    void* fn = def.unboxed(ks.highest());
    if (__builtin_expect(fn != nullptr, 1))
      return reinterpret_cast<R (*)(A...)>(fn)(std::forward<A>(args)...);
    return call_slow(ks, std::forward<A>(args)...);
  }

  // Calls the kernel at `key` directly (no key computation): for layers that redispatch.
  R call_at(DispatchKey key, A... args) const {
    void* fn = def.unboxed(key);
    if (!fn) detail::throw_no_kernel(def, key);
    return reinterpret_cast<R (*)(A...)>(fn)(std::forward<A>(args)...);
  }

  void set_kernel(DispatchKey k, R (*fn)(A...)) {
    def.set_kernel_raw(k, reinterpret_cast<void*>(fn));
  }

  OpDef def;

 private:
  R call_slow(DispatchKeySet ks, A... args) const {
    BoxedKernel fallback = nullptr;
    DispatchKey k = def.resolve_slow(ks, &fallback);
    if (!fallback) return reinterpret_cast<R (*)(A...)>(def.unboxed(k))(std::forward<A>(args)...);
    Stack stack;
    stack.reserve(sizeof...(A));
    (stack.push_back(detail::to_ivalue(args)), ...);
    fallback(def, k, stack);
    if constexpr (!std::is_void_v<R>) return detail::PopResult<R>::get(stack);
  }
};

}  // namespace kiln

#pragma once
// kiln::compile: trace a function of tensors once, guard it, cache it, replay it without the
// dispatcher. See DESIGN.md "Compile" and the README's "Compile" section.
//
//   auto step = kiln::compile([&](std::span<const Tensor> in) -> TensorList {
//     opt.zero_grad();
//     Tensor loss = cross_entropy(model(in[0]), in[1]);
//     loss.backward();
//     opt.step();
//     return {loss};
//   }, {.name = "train_step"});
//   Tensor loss = step({x, y})[0];
#include <functional>
#include <initializer_list>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "kiln/core/error.h"
#include "kiln/core/tensor.h"

namespace kiln {

// What a call does when its function already has `recompile_limit` cache entries and none
// fits: raise a CompileError naming the reason, or run eagerly after one warning naming it.
enum class RecompileLimitAction : uint8_t { Error, Eager };

struct DynamicDim {
  int input;
  int dim;
};

struct CompileOptions {
  std::string name = "compiled";  // used in logs, errors and profiles
  int recompile_limit = 8;
  RecompileLimitAction at_limit = RecompileLimitAction::Error;
  // Host reads (item(), to_vector(), printing) split the step into segments run between them,
  // instead of raising a CompileError. See README "Graph breaks".
  bool piecewise = false;
  // Dims whose size may change between calls without a recompile (also: mark_dynamic).
  std::vector<DynamicDim> dynamic = {};
  // Inputs whose storage is usually the same at every call. On a device with graphs they are
  // baked into the graph by address instead of copied into a static buffer; when one's storage
  // changes the graph is updated (not a cache miss).
  std::vector<int> static_inputs = {};
  // Names of the inputs, for messages ("input 0 ('x') ...").
  std::vector<std::string> input_names = {};
  // On a device with graphs (sim, CUDA), replays launch device graphs captured after one
  // warm-up replay (README "Device graphs"). Off: the steps are launched one by one.
  bool capture = true;
};

namespace compiler {
// Note [Wrapped tensors in compiled functions] (compile.cpp): tensors that wrap a local tensor
// of their own (kiln/dtensor's DTensors) cross a compiled function's boundary as their local
// tensors plus a layout (an immortal pointer, compared by address), installed by the layer that
// owns them.
struct WrappedTensors {
  bool (*is_wrapped)(const Tensor& t);
  Tensor (*unwrap)(const Tensor& t, const void** layout);  // the local tensor and its layout
  Tensor (*wrap)(const Tensor& local, const void* layout);
  std::string (*describe)(const void* layout);
};
void set_wrapped_tensors(const WrappedTensors* w);
}  // namespace compiler

// Marks `dim` of `t` dynamic for the compiled functions it is passed to.
void mark_dynamic(const Tensor& t, int64_t dim);

// One cache entry, as explain() reports it.
struct CacheEntryInfo {
  int index = 0;
  int64_t hits = 0;
  std::string reason;     // why it was compiled ("first call", or the miss that caused it)
  double compile_ms = 0;  // trace, passes and lowering
  double trace_ms = 0;    // of which the traced call (it runs the real ops)
  double lower_ms = 0;    // of which classifying, passes, planning, binding and guards
  int nodes_traced = 0;
  int steps = 0;
  int segments = 1;
  size_t arena_bytes = 0;       // planned peak of intermediates
  size_t eager_peak_bytes = 0;  // peak memory of the traced (eager) call
  int dead_removed = 0, cse_merged = 0, noops_removed = 0, views_resolved = 0;
  int size_specializations = 1;  // executables for distinct sizes of dynamic dims
  int sizes_derived = 0;         // of which derived from two traces without tracing
  bool device_graphs = false;    // replays launch captured device graphs
  int captures = 0;              // captures of the steps (first and after an address change)
  int graph_updates = 0;         // of which applied by updating the executable graph
  // Collectives on the executable's communication stream, overlapping the steps after them
  // (those on free tensors only: DDP's buckets; Note [Collectives on a stream of their own] in
  // kiln/compile/comm_stream.cpp).
  int comm_stream_steps = 0;
  std::string guards;
};

// Calls from several threads are serialised (one replay at a time per compiled function).
class CompiledFunction {
 public:
  using Fn = std::function<TensorList(std::span<const Tensor>)>;
  CompiledFunction(Fn fn, CompileOptions options);
  ~CompiledFunction();
  CompiledFunction(CompiledFunction&&) noexcept;
  CompiledFunction& operator=(CompiledFunction&&) noexcept;

  TensorList operator()(std::span<const Tensor> inputs);
  TensorList operator()(std::initializer_list<Tensor> inputs);
  // Same, writing into `outputs` (its capacity is reused: no allocation on a cache hit).
  void call(std::span<const Tensor> inputs, TensorList& outputs);

  // Cache entries, hit counts, guards and the reasons for every miss, as text.
  std::string explain() const;
  std::vector<CacheEntryInfo> entries() const;
  // Reasons of every cache miss so far, oldest first.
  std::vector<std::string> miss_reasons() const;
  int64_t eager_calls() const;  // calls run eagerly (warm-up, or past the limit with Eager)
  // The graph (text) and the step list of entry `i`.
  std::string graph_str(int i = 0) const;
  std::string graph_dot(int i = 0) const;
  std::string steps_str(int i = 0) const;

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

// Compiles `fn`, a callable taking a span of tensors (or 0 to 4 tensors) and returning a
// TensorList (or one Tensor). Nothing is traced until the first call.
CompiledFunction compile(CompiledFunction::Fn fn, CompileOptions options = {});

template <class F>
requires(!std::is_convertible_v<F, CompiledFunction::Fn>) CompiledFunction
    compile(F f, CompileOptions options = {}) {
  static constexpr int arity =
      std::is_invocable_v<F&, std::span<const Tensor>>                       ? -1
      : std::is_invocable_v<F&>                                              ? 0
      : std::is_invocable_v<F&, const Tensor&>                               ? 1
      : std::is_invocable_v<F&, const Tensor&, const Tensor&>                ? 2
      : std::is_invocable_v<F&, const Tensor&, const Tensor&, const Tensor&> ? 3
                                                                             : 4;
  auto wrap = [](auto r) -> TensorList {
    if constexpr (std::is_same_v<decltype(r), Tensor>)
      return {r};
    else
      return r;
  };
  return compile(
      [f = std::move(f), wrap](std::span<const Tensor> in) -> TensorList {
        KILN_CHECK(arity < 0 || in.size() == static_cast<size_t>(arity),
                   "[compile] the function takes {} tensors, got {}", arity, in.size());
        if constexpr (std::is_invocable_v<F&, std::span<const Tensor>>)
          return wrap(f(in));
        else if constexpr (std::is_invocable_v<F&>)
          return wrap(f());
        else if constexpr (std::is_invocable_v<F&, const Tensor&>)
          return wrap(f(in[0]));
        else if constexpr (std::is_invocable_v<F&, const Tensor&, const Tensor&>)
          return wrap(f(in[0], in[1]));
        else if constexpr (std::is_invocable_v<F&, const Tensor&, const Tensor&, const Tensor&>)
          return wrap(f(in[0], in[1], in[2]));
        else
          return wrap(f(in[0], in[1], in[2], in[3]));
      },
      std::move(options));
}

}  // namespace kiln

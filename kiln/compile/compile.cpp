// kiln::compile: the cache of traced entries and what happens on a miss. See compile.h.
#include "kiln/compile/compile.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <mutex>
#include <string_view>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "kiln/compile/dynamic.h"
#include "kiln/compile/executable.h"
#include "kiln/compile/guards.h"
#include "kiln/compile/trace.h"
#include "kiln/profiler/profiler.h"

namespace kiln {

using namespace compiler;  // NOLINT

void mark_dynamic(const Tensor& t, int64_t dim) {
  KILN_CHECK(t.defined(), "[mark_dynamic] the tensor is undefined");
  int64_t d = wrap_dim(dim, t.dim(), "mark_dynamic");
  KILN_CHECK(d < 32, "[mark_dynamic] only the first 32 dims can be dynamic, got dim {}", d);
  t.impl()->set_dynamic_dims(t.impl()->dynamic_dims() | (1u << d));
}

namespace {

// KILN_LOGS=recompiles,guards,graph (or "all"): what compile prints to stderr.
bool log_enabled(std::string_view what) {
  const char* env = std::getenv("KILN_LOGS");
  if (!env) return false;
  std::string_view s(env);
  if (s == "all") return true;
  size_t start = 0;
  while (start <= s.size()) {
    size_t end = s.find(',', start);
    if (end == std::string_view::npos) end = s.size();
    if (s.substr(start, end - start) == what) return true;
    start = end + 1;
  }
  return false;
}

std::string bytes_str(size_t n) {
  if (n >= (1u << 20)) return fmt::format("{:.1f} MiB", static_cast<double>(n) / (1 << 20));
  if (n >= (1u << 10)) return fmt::format("{:.1f} KiB", static_cast<double>(n) / (1 << 10));
  return fmt::format("{} B", n);
}

[[noreturn]] void compile_error(const std::string& msg) { throw CompileError(msg); }

const compiler::WrappedTensors* g_wrapped = nullptr;

}  // namespace

// Note [Wrapped tensors in compiled functions]
// A DTensor's data is its local tensor; the DTensor itself holds no bytes. Traced as it is, a
// compiled function would see the local tensor of its DTensor input as a tensor it reached but
// was not given, hold it by identity, and replay on it even when called with another DTensor.
// So a call unwraps: the executable's inputs are the local tensors, each input's layout (its
// interned spec) is part of the cache entry's key (an entry fits only calls whose layouts are
// the same pointers), and the traced function gets DTensors rebuilt around the very tensors the
// tracer registered as inputs. Its results are unwrapped the same way and wrapped again with the
// layouts the trace saw, on every replay, whatever the inputs: a function of plain tensors may
// make DTensors (a tensor-parallel step gets plain token ids and from_local makes them
// DTensors) and return one, and returned wrapped, its local tensor would be an intermediate
// held by the wrapper alone, which the escape check reads as made inside and kept. Wrapped
// tensors the function reaches without being given (DTensor parameters) need nothing: their
// local tensors are held by identity like any free tensor, and in-place updates keep them.
void compiler::set_wrapped_tensors(const WrappedTensors* w) { g_wrapped = w; }

struct CompiledFunction::Impl {
  // One executable per distinct set of sizes of the dynamic dims (Note [Dynamic dims]).
  struct Spec {
    std::vector<int64_t> sizes;
    std::unique_ptr<Executable> exe;
  };
  struct Entry {
    std::unique_ptr<Guards> guards;
    std::vector<Spec> specs;
    CacheEntryInfo info;
    std::vector<bool> is_static;
    std::optional<SizeTemplate> sizes;  // derives graphs for new dynamic sizes
    std::string no_template;            // why there is none (after two traces)
    // Note [Wrapped tensors in compiled functions]: null where the tensor is plain.
    std::vector<const void*> in_layouts, out_layouts;
  };
  struct Traced {
    std::unique_ptr<Guards> guards;
    std::unique_ptr<Executable> exe;
    CacheEntryInfo info;
    std::vector<bool> is_static;
  };
  static constexpr size_t kMaxSpecs = 64;

  Fn fn;
  CompileOptions o;
  std::vector<std::unique_ptr<Entry>> entries;
  std::vector<std::string> misses;
  int64_t calls = 0;
  int64_t eager_calls = 0;
  bool warned_limit = false;
  bool warmed_up = false;    // a call already ran as warm-up (see Note [Warm-up])
  std::vector<int64_t> key;  // scratch: the dynamic sizes of a call
  // The layouts of the call in progress and of its results (Note [Wrapped tensors in compiled
  // functions]); all null for plain tensors.
  std::vector<const void*> in_layouts, out_layouts;
  // One call at a time: a replay re-binds the executable's buffers. Recursive, because the
  // traced function may call this compiled function again (it then runs eagerly).
  std::recursive_mutex mu;

  void call(std::span<const Tensor> inputs, TensorList& outputs);
  void call_local(std::span<const Tensor> inputs, TensorList& outputs);
  // The function, on local tensors: wraps them in their layouts first, unwraps the results.
  TensorList run_fn(std::span<const Tensor> inputs);
  void miss(std::span<const Tensor> inputs, const ModeState& modes, TensorList& outputs);
  std::unique_ptr<Traced> trace(std::span<const Tensor> inputs, const ModeState& modes,
                                const std::string& reason, TensorList& outputs);
  void run_entry(Entry& e, std::span<const Tensor> inputs, const ModeState& modes,
                 TensorList& outputs);
  // An executable for the current dynamic sizes `key` derived without tracing, or nullptr.
  Executable* derive(Entry& e, std::span<const Tensor> inputs);
  const Entry& entry(int i) const {
    KILN_CHECK(i >= 0 && static_cast<size_t>(i) < entries.size(),
               "[compile] '{}' has {} cache entries, no entry {}", o.name, entries.size(), i);
    return *entries[i];
  }
};

void CompiledFunction::Impl::call(std::span<const Tensor> inputs, TensorList& outputs) {
  std::lock_guard<std::recursive_mutex> lock(mu);
  in_layouts.assign(inputs.size(), nullptr);
  bool wrapped = false;
  if (g_wrapped)
    for (const Tensor& t : inputs) wrapped = wrapped || (t.defined() && g_wrapped->is_wrapped(t));
  if (!wrapped) {
    call_local(inputs, outputs);
  } else {
    // Note [Wrapped tensors in compiled functions]
    std::vector<Tensor> locals(inputs.size());
    for (size_t i = 0; i < inputs.size(); ++i)
      locals[i] = inputs[i].defined() && g_wrapped->is_wrapped(inputs[i])
                      ? g_wrapped->unwrap(inputs[i], &in_layouts[i])
                      : inputs[i];
    call_local(locals, outputs);
  }
  // Results are wrapped whatever the inputs were: a function of plain tensors may return
  // DTensors it made (empty for results that are all plain).
  for (size_t r = 0; r < outputs.size() && r < out_layouts.size(); ++r)
    if (out_layouts[r]) outputs[r] = g_wrapped->wrap(outputs[r], out_layouts[r]);
}

TensorList CompiledFunction::Impl::run_fn(std::span<const Tensor> inputs) {
  bool wrapped = false;
  for (const void* l : in_layouts) wrapped = wrapped || l;
  out_layouts.clear();
  TensorList out;
  if (!wrapped) {
    out = fn(inputs);
  } else {
    std::vector<Tensor> args(inputs.begin(), inputs.end());
    for (size_t i = 0; i < args.size(); ++i)
      if (in_layouts[i]) args[i] = g_wrapped->wrap(args[i], in_layouts[i]);
    out = fn(args);
  }
  if (!g_wrapped) return out;
  for (size_t r = 0; r < out.size(); ++r)
    if (out[r].defined() && g_wrapped->is_wrapped(out[r])) {
      out_layouts.resize(out.size(), nullptr);
      out[r] = g_wrapped->unwrap(out[r], &out_layouts[r]);
    }
  return out;
}

void CompiledFunction::Impl::call_local(std::span<const Tensor> inputs, TensorList& outputs) {
  ++calls;
  outputs.clear();  // the caller's previous outputs, if it holds them nowhere else, are free
  // Called from inside another function's trace: run the ops for real so that the outer trace
  // records them (a replay would run kernels it never sees).
  if (Tracer* outer = current_tracer(); outer && outer->tracing()) {
    ++eager_calls;
    outputs = run_fn(inputs);
    return;
  }
  const ModeState modes = ModeState::current();
  for (const auto& e : entries) {
    if (e->in_layouts != in_layouts || !e->guards->check(inputs, modes)) continue;
    out_layouts = e->out_layouts;
    return run_entry(*e, inputs, modes, outputs);
  }
  miss(inputs, modes, outputs);
}

// Note [Dynamic dims]
// Dims marked dynamic are left out of the guards, so calls that differ only in those sizes
// share one cache entry and never count against the recompile limit. An executable, its
// memory plan and every size-dependent attribute (view shapes, expand sizes, a mean's
// divisor) are concrete, so the entry keeps one executable per distinct set of dynamic sizes
// (a *size specialisation*, at most kMaxSpecs). The first two sizes are traced. From those
// two graphs a SizeTemplate fits every integer as a + b * t of the dynamic size t (all dynamic
// dims of a call must then have one size, e.g. a batch dim shared by inputs and targets); a
// new size is then *derived* without tracing: instantiated, checked by running every node's
// meta function on shape-only tensors of the derived geometry, and planned. Graphs whose two
// traces differ otherwise (a float attribute that depends on the size, a different op
// sequence), and sizes whose derived graph fails the check, are traced instead, with the
// reason logged under KILN_LOGS=recompiles.
Executable* CompiledFunction::Impl::derive(Entry& e, std::span<const Tensor> inputs) {
  if (e.specs.size() < 2 || key.empty()) return nullptr;
  auto one_size = [](const std::vector<int64_t>& k) {
    for (int64_t s : k)
      if (s != k[0]) return false;
    return true;
  };
  if (!one_size(key)) return nullptr;
  if (!e.sizes && e.no_template.empty()) {
    const Spec* a = nullptr;
    const Spec* b = nullptr;
    for (const Spec& sp : e.specs) {
      if (!one_size(sp.sizes)) continue;
      if (!a)
        a = &sp;
      else if (!b && sp.sizes[0] != a->sizes[0])
        b = &sp;
    }
    if (!a || !b) return nullptr;
    e.sizes = SizeTemplate::fit(a->exe->graph(), a->sizes[0], b->exe->graph(), b->sizes[0],
                                e.no_template);
    if (e.sizes) {
      const SizeTemplate* tmpl = &*e.sizes;
      e.guards->add_held([tmpl](const TensorImpl* p) { return tmpl->refs_to(p); });
    }
    if (!e.sizes && log_enabled("recompiles"))
      fmt::print(stderr, "[compile] '{}' entry {}: new dynamic sizes will be traced: {}\n", o.name,
                 e.info.index, e.no_template);
  }
  if (!e.sizes || e.specs.size() >= kMaxSpecs) return nullptr;
  std::string why;
  const int64_t t0 = profiler::now_ns();
  std::optional<Graph> g = e.sizes->instantiate(key[0], why);
  for (size_t i = 0; g && i < inputs.size(); ++i) {
    const Value& v = g->values[g->inputs[i]];
    if (inputs[i].sizes() != v.sizes.span() || inputs[i].strides() != v.strides.span()) {
      why =
          fmt::format("input {} is [{}] strides [{}], the derived graph expects [{}] strides [{}]",
                      i, fmt::join(inputs[i].sizes(), ", "), fmt::join(inputs[i].strides(), ", "),
                      fmt::join(v.sizes, ", "), fmt::join(v.strides, ", "));
      g.reset();
    }
  }
  if (!g) {
    if (log_enabled("recompiles"))
      fmt::print(stderr, "[compile] '{}' entry {}: cannot derive size {}: {}\n", o.name,
                 e.info.index, key[0], why);
    return nullptr;
  }
  e.specs.push_back(
      {key, std::make_unique<Executable>(std::move(*g), e.is_static,
                                         GraphOptions{o.capture, o.piecewise, o.name})});
  const Executable* added = e.specs.back().exe.get();
  e.guards->add_held([added](const TensorImpl* p) { return added->refs_to(p); });
  e.info.size_specializations = static_cast<int>(e.specs.size());
  ++e.info.sizes_derived;
  if (log_enabled("recompiles"))
    fmt::print(stderr, "[compile] '{}' entry {}: derived the graph for size {} without tracing\n",
               o.name, e.info.index, key[0]);
  profiler::record(fmt::format("derive {}", o.name), "compile", t0, profiler::now_ns(),
                   {{"size", std::to_string(key[0])}});
  return e.specs.back().exe.get();
}
void CompiledFunction::Impl::run_entry(Entry& e, std::span<const Tensor> inputs,
                                       const ModeState& modes, TensorList& outputs) {
  Executable* exe = e.specs.front().exe.get();
  if (e.guards->has_dynamic()) {
    e.guards->dynamic_sizes(inputs, key);
    exe = nullptr;
    for (const Spec& sp : e.specs)
      if (sp.sizes == key) exe = sp.exe.get();
    if (!exe) exe = derive(e, inputs);
    if (!exe) {
      KILN_CHECK(e.specs.size() < kMaxSpecs,
                 "[compile] '{}': entry {} already holds {} size specialisations; sizes [{}] "
                 "would be one more",
                 o.name, e.info.index, e.specs.size(), fmt::join(key, ", "));
      std::string reason = fmt::format("new sizes [{}] of the dynamic dims", fmt::join(key, ", "));
      if (log_enabled("recompiles"))
        fmt::print(stderr, "[compile] '{}' entry {}: {}\n", o.name, e.info.index, reason);
      std::unique_ptr<Traced> t = trace(inputs, modes, reason, outputs);
      if (t) {
        const Executable* added = t->exe.get();
        e.guards->add_held([added](const TensorImpl* p) { return added->refs_to(p); });
        e.specs.push_back({key, std::move(t->exe)});
        e.info.size_specializations = static_cast<int>(e.specs.size());
      }
      return;
    }
  }
  ++e.info.hits;
  if (profiler::enabled()) {
    int64_t t0 = profiler::now_ns();
    exe->run(inputs, outputs);
    profiler::record(o.name, "replay", t0, profiler::now_ns(),
                     {{"entry", std::to_string(e.info.index)}});
    return;
  }
  exe->run(inputs, outputs);
}

void CompiledFunction::Impl::miss(std::span<const Tensor> inputs, const ModeState& modes,
                                  TensorList& outputs) {
  for (size_t i = 0; i < inputs.size(); ++i)
    KILN_CHECK(inputs[i].defined(), "[compile] '{}': {} is an undefined tensor", o.name,
               input_label(i, o.input_names));
  std::string reason;
  if (entries.empty()) {
    reason = "first call";
  } else {
    std::vector<std::string> whys;
    auto why = [&](const Entry& e) {
      for (size_t i = 0; i < in_layouts.size() && i < e.in_layouts.size(); ++i)
        if (in_layouts[i] != e.in_layouts[i]) {
          auto layout = [](const void* l) {
            return l ? g_wrapped->describe(l) : std::string("a plain tensor");
          };
          return fmt::format("{} is laid out as {}, expected {}", input_label(i, o.input_names),
                             layout(in_layouts[i]), layout(e.in_layouts[i]));
        }
      return e.guards->why(inputs, modes, o.input_names);
    };
    for (const auto& e : entries)
      whys.push_back(entries.size() == 1 ? why(*e)
                                         : fmt::format("entry {}: {}", e->info.index, why(*e)));
    reason = fmt::format("{}", fmt::join(whys, "; "));
    misses.push_back(reason);
    const int64_t now = profiler::now_ns();
    profiler::record("guard miss", "guard", now, now, {{"function", o.name}, {"reason", reason}});
    if (log_enabled("recompiles"))
      fmt::print(stderr, "[compile] '{}' cache miss: {}\n", o.name, reason);
  }
  if (static_cast<int>(entries.size()) >= o.recompile_limit) {
    std::string msg = fmt::format(
        "[compile] '{}' reached its recompile limit ({} cache entries) and none fits: {}. Mark the "
        "sizes that vary dynamic (mark_dynamic or CompileOptions::dynamic), raise "
        "recompile_limit, or set at_limit = RecompileLimitAction::Eager",
        o.name, o.recompile_limit, reason);
    if (o.at_limit == RecompileLimitAction::Error) compile_error(msg);
    if (!warned_limit) {
      fmt::print(stderr, "kiln: warning: {}; running eagerly from now on when no entry fits\n",
                 msg);
      warned_limit = true;
    }
    ++eager_calls;
    outputs = run_fn(inputs);
    return;
  }
  std::unique_ptr<Traced> t = trace(inputs, modes, reason, outputs);
  if (!t) return;
  auto e = std::make_unique<Entry>();
  e->info = t->info;
  e->info.index = static_cast<int>(entries.size());
  e->guards = std::move(t->guards);
  e->is_static = t->is_static;
  e->in_layouts = in_layouts;
  e->out_layouts = out_layouts;
  std::vector<int64_t> sizes;
  e->guards->dynamic_sizes(inputs, sizes);
  e->specs.push_back({std::move(sizes), std::move(t->exe)});
  if (log_enabled("guards"))
    fmt::print(stderr, "[compile] '{}' entry {} guards:\n{}", o.name, e->info.index,
               e->info.guards);
  entries.push_back(std::move(e));
}

// Note [Warm-up]
// A training step's first call usually creates state as a side effect: .grad tensors made by
// the first backward, optimizer state made on the first step. Such tensors outlive the call
// without being returned, and a replay could never update them (the trace "escapes"). So a
// trace with escapes is not kept: that call counts as a warm-up (its eager results stand, as
// in every traced call) and the next call traces again. If that trace escapes too, the
// function keeps making new state on every call, and compiling it is a CompileError that
// names the op whose result escaped.
std::unique_ptr<CompiledFunction::Impl::Traced> CompiledFunction::Impl::trace(
    std::span<const Tensor> inputs, const ModeState& modes, const std::string& reason,
    TensorList& outputs) {
  std::vector<uint32_t> dynamic(inputs.size(), 0);
  for (const DynamicDim& d : o.dynamic) {
    KILN_CHECK(d.input >= 0 && static_cast<size_t>(d.input) < inputs.size(),
               "[compile] '{}': a dynamic dim names input {}, but the call has {} inputs", o.name,
               d.input, inputs.size());
    KILN_CHECK(d.dim >= 0 && d.dim < inputs[d.input].dim() && d.dim < 32,
               "[compile] '{}': dynamic dim {} of {} is out of range (it has {} dims)", o.name,
               d.dim, input_label(d.input, o.input_names), inputs[d.input].dim());
    dynamic[d.input] |= 1u << d.dim;
  }
  for (size_t i = 0; i < inputs.size(); ++i) dynamic[i] |= inputs[i].impl()->dynamic_dims();
  const int64_t t0 = profiler::now_ns();
  Tracer tracer(inputs);
  size_t eager_peak = 0;
  {
    struct Peak {  // closed on every path, an exception from fn included
      size_t* out;
      Peak(size_t* o) : out(o) { begin_cpu_peak(); }
      ~Peak() { *out = end_cpu_peak(); }
    } peak{&eager_peak};
    Tracer::Scope scope(tracer);
    outputs = run_fn(inputs);
  }
  const int64_t t_traced = profiler::now_ns();
  TraceProblems problems;
  Graph graph = tracer.finish(outputs, problems);

  auto fail = [&](std::string_view what, const std::vector<std::string>& items,
                  std::string_view advice) {
    compile_error(
        fmt::format("[compile] '{}': {}: {}. {}", o.name, what, fmt::join(items, "; "), advice));
  };
  if (!problems.outputs_with_history.empty())
    fail("outputs carry autograd history, which replays do not record",
         problems.outputs_with_history,
         "Compile the whole training step (call backward inside the function), or detach the "
         "outputs, or call it under NoGradGuard");
  if (!problems.written_constants.empty())
    fail("tensors made inside the function without an op are written by ops",
         problems.written_constants, "Make them with an op (zeros, empty, full) instead");
  if (!problems.host_changes.empty())
    fail("the function changed host values that steer its trace and did not restore them",
         problems.host_changes,
         "A replay runs no host code, so it would leave them as they were: change them outside "
         "the compiled function (e.g. call model.train() or model.eval() before calling it)");
  if (!problems.shape_reads.empty())
    fail("graph break: a result's size depends on tensor values", problems.shape_reads,
         "Compiled steps replay the traced sizes, piecewise ones too; move it out of the function "
         "(index with int64 positions computed outside it, or use where/masked_fill, whose sizes "
         "are fixed)");
  if (!problems.host_reads.empty() && !o.piecewise)
    fail("graph break: the function reads tensor values on the host", problems.host_reads,
         "A compiled step cannot run host code between its ops; set CompileOptions::piecewise "
         "to run the reads between compiled segments, or move them out of the function");
  if (!problems.escapes.empty()) {
    if (!warmed_up) {
      warmed_up = true;
      ++eager_calls;
      if (log_enabled("recompiles"))
        fmt::print(stderr,
                   "[compile] '{}' warm-up: tensors made by the call outlived it ({}); tracing "
                   "again on the next call\n",
                   o.name, fmt::join(problems.escapes, "; "));
      return nullptr;
    }
    fail(
        "tensors made by the function outlive the call without being returned (kept in "
        "optimizer state, .grad or a module), on two calls in a row",
        problems.escapes,
        "A replay cannot update them. Create such state before compiling, keep gradients "
        "in place (zero_grad(false)), or return the tensors");
  }

  auto e = std::make_unique<Traced>();
  PassReport report = run_passes(graph);
  if (log_enabled("graph"))
    fmt::print(stderr, "[compile] '{}' entry {} graph ({} nodes traced):\n{}", o.name,
               entries.size(), report.nodes_traced, graph.str());
  std::vector<bool> is_static(inputs.size(), false);
  for (int i : o.static_inputs) {
    KILN_CHECK(i >= 0 && static_cast<size_t>(i) < inputs.size(),
               "[compile] '{}': static input {} is out of range (the call has {} inputs)", o.name,
               i, inputs.size());
    is_static[i] = true;
  }
  e->exe = std::make_unique<Executable>(std::move(graph), is_static,
                                        GraphOptions{o.capture, o.piecewise, o.name});
  e->is_static = is_static;
  const Executable* exe = e->exe.get();
  e->guards = std::make_unique<Guards>(
      e->exe->graph(), inputs, modes, dynamic,
      [exe](const TensorImpl* t) { return exe->refs_to(t); }, tracer.host_guards().guards());
  const int64_t t1 = profiler::now_ns();

  CacheEntryInfo& info = e->info;
  info.reason = reason;
  info.compile_ms = static_cast<double>(t1 - t0) / 1e6;
  info.trace_ms = static_cast<double>(t_traced - t0) / 1e6;
  info.lower_ms = static_cast<double>(t1 - t_traced) / 1e6;
  info.nodes_traced = report.nodes_traced;
  info.steps = e->exe->stats().steps;
  info.segments = e->exe->stats().segments;
  info.arena_bytes = e->exe->stats().arena_bytes;
  info.eager_peak_bytes = eager_peak;
  info.guards = e->guards->str(o.input_names);
  info.dead_removed = report.dead_removed;
  info.cse_merged = report.cse_merged;
  info.noops_removed = report.noops_removed;
  info.views_resolved = report.views_resolved;
  if (log_enabled("recompiles"))
    fmt::print(stderr, "[compile] '{}' compiled in {:.1f} ms ({}): {} steps\n", o.name,
               info.compile_ms, reason, info.steps);
  profiler::record(fmt::format("compile {}", o.name), "compile", t0, t1,
                   {{"reason", reason}, {"steps", std::to_string(info.steps)}});
  return e;
}

CompiledFunction::CompiledFunction(Fn fn, CompileOptions options)
    : impl_(std::make_unique<Impl>()) {
  KILN_CHECK(static_cast<bool>(fn), "[compile] the function is empty");
  KILN_CHECK(options.recompile_limit >= 1, "[compile] '{}': recompile_limit must be >= 1, got {}",
             options.name, options.recompile_limit);
  impl_->fn = std::move(fn);
  impl_->o = std::move(options);
}
CompiledFunction::~CompiledFunction() = default;
CompiledFunction::CompiledFunction(CompiledFunction&&) noexcept = default;
CompiledFunction& CompiledFunction::operator=(CompiledFunction&&) noexcept = default;

void CompiledFunction::call(std::span<const Tensor> inputs, TensorList& outputs) {
  impl_->call(inputs, outputs);
}
TensorList CompiledFunction::operator()(std::span<const Tensor> inputs) {
  TensorList out;
  impl_->call(inputs, out);
  return out;
}
TensorList CompiledFunction::operator()(std::initializer_list<Tensor> inputs) {
  return (*this)(std::span<const Tensor>(inputs.begin(), inputs.size()));
}

std::vector<CacheEntryInfo> CompiledFunction::entries() const {
  std::vector<CacheEntryInfo> out;
  for (const auto& e : impl_->entries) {
    out.push_back(e->info);
    for (const auto& sp : e->specs) {
      const ExecutableStats& st = sp.exe->stats();
      out.back().device_graphs = out.back().device_graphs || st.device_graphs;
      out.back().captures += st.captures;
      out.back().graph_updates += st.graph_updates;
      out.back().comm_stream_steps = std::max(out.back().comm_stream_steps, st.comm_stream_steps);
    }
  }
  return out;
}
std::vector<std::string> CompiledFunction::miss_reasons() const { return impl_->misses; }
int64_t CompiledFunction::eager_calls() const { return impl_->eager_calls; }
std::string CompiledFunction::graph_str(int i) const {
  return impl_->entry(i).specs.front().exe->graph().str();
}
std::string CompiledFunction::graph_dot(int i) const {
  return impl_->entry(i).specs.front().exe->graph().dot();
}
std::string CompiledFunction::steps_str(int i) const {
  return impl_->entry(i).specs.front().exe->str();
}

std::string CompiledFunction::explain() const {
  const Impl& m = *impl_;
  std::string s =
      fmt::format("compiled function '{}': {} cache entr{}, {} calls, {} eager\n", m.o.name,
                  m.entries.size(), m.entries.size() == 1 ? "y" : "ies", m.calls, m.eager_calls);
  for (const auto& e : m.entries) {
    const CacheEntryInfo& i = e->info;
    const ExecutableStats& st = e->specs.front().exe->stats();
    s += fmt::format(
        "entry {}: {} hits; compiled in {:.1f} ms (traced call {:.1f} ms, lowering {:.1f} ms) "
        "because: {}\n",
        i.index, i.hits, i.compile_ms, i.trace_ms, i.lower_ms, i.reason);
    s += fmt::format(
        "  {} nodes traced; passes removed {} dead, merged {} common, dropped {} no-op copies; {} "
        "views resolved at compile time\n",
        i.nodes_traced, i.dead_removed, i.cse_merged, i.noops_removed, i.views_resolved);
    if (e->guards->has_dynamic())
      s += fmt::format("  dynamic dims: {} size specialisation{} ({} derived without tracing){}\n",
                       e->specs.size(), e->specs.size() == 1 ? "" : "s", i.sizes_derived,
                       e->no_template.empty() ? "" : "; new sizes are traced: " + e->no_template);
    s += fmt::format("  {} steps ({} allocate their result), {} segment{}\n", st.steps,
                     st.allocating_steps, st.segments, st.segments == 1 ? "" : "s");
    if (st.device_graphs)
      s += fmt::format(
          "  device graphs: {} per replay, {} kernel launches recorded; captured {} time{} ({} "
          "by updating the graph)\n",
          st.graph_segments, st.graph_nodes, st.captures, st.captures == 1 ? "" : "s",
          st.graph_updates);
    else if (!st.no_graphs.empty())
      s += fmt::format("  device graphs: none, because {}\n", st.no_graphs);
    if (st.comm_stream_steps > 0)
      s += fmt::format(
          "  collectives: {} on a stream of their own, overlapping the steps after them\n",
          st.comm_stream_steps);
    s += fmt::format(
        "  memory: intermediates planned into {} (without reuse {}); outputs {}; eager peak of "
        "the traced call {}\n",
        bytes_str(st.arena_bytes), bytes_str(st.unplanned_bytes), bytes_str(st.output_bytes),
        bytes_str(i.eager_peak_bytes));
    s += "  guards:\n";
    std::string_view g = i.guards;
    while (!g.empty()) {
      size_t nl = g.find('\n');
      s += fmt::format("    {}\n", g.substr(0, nl));
      g = nl == std::string_view::npos ? std::string_view() : g.substr(nl + 1);
    }
  }
  if (!m.misses.empty()) {
    s += "misses:\n";
    for (const std::string& r : m.misses) s += fmt::format("  {}\n", r);
  }
  return s;
}

CompiledFunction compile(CompiledFunction::Fn fn, CompileOptions options) {
  return CompiledFunction(std::move(fn), std::move(options));
}

}  // namespace kiln

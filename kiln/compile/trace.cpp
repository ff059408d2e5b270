// The Trace layer: one boxed fallback records every op. See trace.h.
#include "kiln/compile/trace.h"

#include "kiln/amp/autocast.h"

#include "kiln/autograd/node.h"

#include <algorithm>
#include <mutex>

#include <fmt/format.h>
#include <fmt/ranges.h>

namespace kiln::compiler {

namespace {

thread_local Tracer* tls_tracer = nullptr;

// Only reads made by the traced function itself count: kernels run with Trace excluded.
bool tracing_here() {
  const LocalDispatchState& s = local_dispatch_state();
  return s.included.has(DispatchKey::Trace) && !s.excluded.has(DispatchKey::Trace);
}

void on_host_read(const TensorImpl& t, const char* what) {
  if (tls_tracer && tracing_here()) tls_tracer->host_read(t, what);
}
void on_release(const void* p) {
  if (tls_tracer) tls_tracer->released(p);
}

void trace_fallback(const OpDef& op, DispatchKey, Stack& stack) {
  if (Tracer* t = tls_tracer) return t->record(op, stack);
  ExcludeKeyGuard guard(DispatchKey::Trace);
  op.call_boxed(stack);
}

const bool registered = [] {
  register_fallback(DispatchKey::Trace, &trace_fallback);
  return true;
}();

// Splits "name(T a, T b=1) -> R" into its argument declarations.
std::vector<std::string_view> schema_args(std::string_view schema) {
  std::vector<std::string_view> out;
  size_t open = schema.find('(');
  if (open == std::string_view::npos) return out;
  int depth = 0;
  size_t start = open + 1;
  for (size_t i = open; i < schema.size(); ++i) {
    char c = schema[i];
    if (c == '(') {
      ++depth;
    } else if (c == ')' && --depth == 0) {
      if (i > start) out.push_back(schema.substr(start, i - start));
      break;
    } else if (c == ',' && depth == 1) {
      out.push_back(schema.substr(start, i - start));
      start = i + 1;
    }
  }
  return out;
}

}  // namespace

const std::vector<bool>& written_args(const OpDef& op) {
  static std::mutex mu;
  static std::unordered_map<const OpDef*, std::vector<bool>> cache;
  std::lock_guard<std::mutex> lock(mu);
  auto it = cache.find(&op);
  if (it != cache.end()) return it->second;
  std::vector<bool> w;
  bool any = false;
  for (std::string_view a : schema_args(op.schema())) {
    w.push_back(a.find('!') != std::string_view::npos);
    any = any || w.back();
  }
  // Pointwise `name_` ops share their functional schema: they write their first argument.
  if (op.kind() == OpKind::InPlace && !any && !w.empty()) w[0] = true;
  // out= schemas ("out=add(...)") list the op's own arguments; `out` comes first.
  if (op.kind() == OpKind::Out) w.insert(w.begin(), true);
  return cache.emplace(&op, std::move(w)).first->second;
}

Tracer* current_tracer() { return tls_tracer; }

bool Tracer::tracing() const { return tls_tracer == this && tracing_here(); }

Tracer::Tracer(std::span<const Tensor> inputs) {
  for (size_t i = 0; i < inputs.size(); ++i) {
    const Tensor& t = inputs[i];
    KILN_CHECK(t.defined(), "[compile] input {} is an undefined tensor", i);
    auto known = value_of_.find(t.impl());
    if (known != value_of_.end()) {  // the same tensor passed twice
      g_.inputs.push_back(known->second);
      continue;
    }
    auto b = buffer_of_.find(t.impl()->storage());
    int buffer;
    if (b != buffer_of_.end()) {
      buffer = b->second;  // a view of an earlier input: same buffer
    } else {
      buffer = new_buffer(t, BufferKind::Input, -1);
      g_.buffers[buffer].input = static_cast<int>(i);
    }
    int v = new_value(t, buffer, -1);
    g_.values[v].input = static_cast<int>(i);
    g_.inputs.push_back(v);
  }
}

Tracer::~Tracer() = default;

Tracer::Scope::Scope(Tracer& t)
    : saved_(tls_tracer),
      include_(DispatchKey::Trace),
      saved_hook_(detail::tls_host_read_hook),
      saved_release_(detail::tls_release_hook),
      host_guards_(t.host_guards_) {
  tls_tracer = &t;
  detail::tls_host_read_hook = &on_host_read;
  detail::tls_release_hook = &on_release;
  amp::guard_autocast_state();  // every op traced depends on it (Note [Autocast])
}
Tracer::Scope::~Scope() {
  tls_tracer = saved_;
  detail::tls_host_read_hook = saved_hook_;
  detail::tls_release_hook = saved_release_;
}

void Tracer::released(const void* p) {
  value_of_.erase(static_cast<const TensorImpl*>(p));
  buffer_of_.erase(static_cast<const StorageImpl*>(p));
}

int Tracer::new_buffer(const Tensor& t, BufferKind kind, int producer) {
  int b = static_cast<int>(g_.buffers.size());
  Buffer buf{kind, t.device(), t.impl()->storage()->nbytes(), -1, producer, {}};
  if (kind != BufferKind::Intermediate) buf.storage = t.impl()->storage_ref();
  g_.buffers.push_back(std::move(buf));
  buffer_of_[t.impl()->storage()] = b;
  return b;
}

int Tracer::new_value(const Tensor& t, int buffer, int producer) {
  Value v;
  v.dtype = t.dtype();
  v.device = t.device();
  v.sizes = t.sizes();
  v.strides = t.strides();
  v.offset = t.storage_offset();
  v.buffer = buffer;
  v.producer = producer;
  if (producer < 0) v.traced = t;
  int id = static_cast<int>(g_.values.size());
  g_.values.push_back(std::move(v));
  value_of_[t.impl()] = id;
  return id;
}

// A tensor seen for the first time is a view of a known buffer, or else a free tensor (made
// outside the call, or inside it without an op: finish() tells which).
int Tracer::value_for(const Tensor& t) {
  auto it = value_of_.find(t.impl());
  if (it != value_of_.end()) return it->second;
  StorageImpl* s = t.impl()->storage();
  auto b = buffer_of_.find(s);
  int buffer = b != buffer_of_.end() ? b->second : new_buffer(t, BufferKind::Free, -1);
  return new_value(t, buffer, -1);
}

void Tracer::record(const OpDef& op, Stack& stack) {
  Node n;
  n.op = &op;
  n.communicates = op.side_effects();
  n.args.reserve(stack.size());
  for (const IValue& v : stack) {
    Arg a;
    if (auto* t = std::get_if<Tensor>(&v)) {
      a.kind = Arg::Kind::Value;
      a.value = t->defined() ? value_for(*t) : -1;
    } else if (auto* l = std::get_if<TensorList>(&v)) {
      a.kind = Arg::Kind::List;
      // An undefined element (None in a Tensor?[] list) is -1, as an undefined Tensor arg.
      for (const Tensor& x : *l) a.values.push_back(x.defined() ? value_for(x) : -1);
    } else {
      a.attr = v;
      n.random = n.random || std::holds_alternative<Generator*>(v);
    }
    n.args.push_back(std::move(a));
  }
  const std::vector<bool>& w = written_args(op);
  for (size_t i = 0; i < n.args.size() && i < w.size(); ++i) {
    if (!w[i]) continue;
    auto add = [&](int v) {
      int b = g_.values[v].buffer;
      if (std::find(n.writes.begin(), n.writes.end(), b) == n.writes.end()) n.writes.push_back(b);
    };
    if (n.args[i].kind == Arg::Kind::Value && n.args[i].value >= 0) add(n.args[i].value);
    for (int v : n.args[i].values)
      if (v >= 0) add(v);
  }

  {
    ExcludeKeyGuard guard(DispatchKey::Trace);
    op.call_boxed(stack);
  }

  const int node = static_cast<int>(g_.nodes.size());
  auto result = [&](const Tensor& t) {
    if (!t.defined()) return;
    if (value_of_.count(t.impl())) {  // a kernel handed back a tensor it was given
      n.outputs.push_back(value_of_[t.impl()]);
      return;
    }
    StorageImpl* s = t.impl()->storage();
    auto b = buffer_of_.find(s);
    const int buffer =
        b != buffer_of_.end() ? b->second : new_buffer(t, BufferKind::Intermediate, node);
    n.outputs.push_back(new_value(t, buffer, node));
  };
  for (const IValue& v : stack) {
    if (auto* t = std::get_if<Tensor>(&v)) result(*t);
    if (auto* l = std::get_if<TensorList>(&v))
      for (const Tensor& x : *l) result(x);
  }
  g_.nodes.push_back(std::move(n));
}

void Tracer::host_read(const TensorImpl& impl, const char* what) {
  Tensor t(Ref<TensorImpl>(const_cast<TensorImpl*>(&impl)));
  Node n;
  n.host_read = what;
  Arg a;
  a.kind = Arg::Kind::Value;
  a.value = value_for(t);
  n.args.push_back(std::move(a));
  g_.nodes.push_back(std::move(n));
}

Graph Tracer::finish(std::span<const Tensor> outputs, TraceProblems& problems) {
  problems.host_changes = host_guards_.unrestored();
  host_guards_.forget_released();
  for (const Tensor& t : outputs) {
    KILN_CHECK(t.defined(), "[compile] the function returned an undefined tensor");
    g_.outputs.push_back(value_for(t));
  }
  auto describe = [&](int v) {
    const Value& x = g_.values[v];
    return fmt::format("%{} [{}] {}", v, fmt::join(x.sizes, ", "), name(x.dtype));
  };
  for (size_t k = 0; k < outputs.size(); ++k) {
    if (outputs[k].requires_grad() && !outputs[k].is_leaf())
      problems.outputs_with_history.push_back(fmt::format(
          "output {} ({}) was made by {}", k, describe(g_.outputs[k]), outputs[k].grad_fn_name()));
  }
  for (size_t i = 0; i < g_.nodes.size(); ++i) {
    const Node& n = g_.nodes[i];
    if (!n.host_read) continue;
    std::string after = i > 0 ? fmt::format(" after n{} '{}'", i - 1, g_.nodes[i - 1].name())
                              : std::string(" before any op");
    problems.host_reads.push_back(
        fmt::format("{}() of {}{}", n.host_read, describe(n.args[0].value), after));
    if (std::string_view(n.host_read) == "nonzero")
      problems.shape_reads.push_back(problems.host_reads.back());
  }

  // Held by the graph: inputs', free tensors' and constants' storages and impls (once each),
  // and nothing made by nodes. An intermediate buffer still alive now is held by someone: the
  // outputs (each output impl holds its storage once) or, beyond them, an escape.
  std::vector<int> held_impls(g_.buffers.size(), 0);
  for (const Value& v : g_.values)
    if (v.traced.defined()) ++held_impls[v.buffer];
  std::unordered_map<const TensorImpl*, int> returned;
  for (const Tensor& t : outputs) ++returned[t.impl()];
  for (const Value& v : g_.values) {
    const autograd::AutogradMeta* m = autograd::meta_of(v.traced);
    if (m && m->view_base.defined() && value_of_.count(m->view_base.impl()))
      ++returned[m->view_base.impl()];
  }
  for (Value& v : g_.values)
    if (v.traced.defined())
      v.outside_refs = v.traced.impl()->use_count() - 1 - returned[v.traced.impl()];
  std::vector<bool> written(g_.buffers.size(), false);
  for (const Node& n : g_.nodes)
    for (int b : n.writes) written[b] = true;

  for (size_t b = 0; b < g_.buffers.size(); ++b) {
    Buffer& buf = g_.buffers[b];
    if (buf.kind != BufferKind::Free) continue;
    if (buf.storage->use_count() > 1 + held_impls[b]) continue;  // held outside
    bool impl_outside = false;
    for (const Value& v : g_.values)
      if (v.buffer == static_cast<int>(b) && v.traced.defined() && v.outside_refs > 0)
        impl_outside = true;
    if (impl_outside) continue;
    buf.kind = BufferKind::Constant;  // made during the call, without an op
    if (!written[b]) continue;
    for (size_t v = 0; v < g_.values.size(); ++v)
      if (g_.values[v].buffer == static_cast<int>(b)) {
        problems.written_constants.push_back(describe(static_cast<int>(v)));
        break;
      }
  }
  // Intermediate storages alive now, and the output impls on each.
  std::unordered_map<const StorageImpl*, int> output_impls;
  for (const auto& [impl, count] : returned) output_impls[impl->storage()] += 1;
  for (const auto& [storage, b] : buffer_of_) {
    const Buffer& buf = g_.buffers[b];
    if (buf.kind != BufferKind::Intermediate) continue;
    auto o = output_impls.find(storage);
    bool escaped = o == output_impls.end() || storage->use_count() > o->second;
    for (size_t k = 0; !escaped && k < outputs.size(); ++k)
      escaped = outputs[k].impl()->storage() == storage &&
                outputs[k].impl()->use_count() > returned[outputs[k].impl()];
    if (!escaped) continue;
    int v = -1;
    for (size_t x = 0; x < g_.values.size() && v < 0; ++x)
      if (g_.values[x].buffer == b) v = static_cast<int>(x);
    problems.escapes.push_back(
        fmt::format("n{} '{}' made {}", buf.producer, g_.nodes[buf.producer].name(), describe(v)));
  }
  return std::move(g_);
}

}  // namespace kiln::compiler

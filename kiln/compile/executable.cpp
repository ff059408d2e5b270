// Note [Replay]
// Every value of the graph gets a *slot*: a tensor over its buffer with the value's geometry,
// made once. Views are slots too, so they cost nothing at replay. Each node becomes a step: a
// kernel of its backend bound to slots and attributes (OpDef::bind), so a replay is a loop of
// indirect calls with no dispatch, no boxing, no autograd and no allocation:
//   - functional ops with an out= variant run that variant into their planned buffer; `full`
//     becomes fill_, `to_copy` becomes copy_, `empty` needs no step;
//   - in-place and out= ops run as they are, on the slots they were traced with;
//   - ops without an out= variant (random factories, dropout, max_dim, ...) run their own
//     kernel, which allocates; the slots of their buffer are then pointed at the result
//     (counted in ExecutableStats::allocating_steps);
//   - host reads (piecewise graph breaks) read the value again between segments.
// Buffers are bound per call: inputs to the caller's storage (no copy), free tensors to their
// own storage (by identity), planned intermediates to the arena (Note [Memory planning]), and
// outputs to buffers handed to the caller: when the caller still holds the previous call's
// output, a new buffer is allocated rather than overwriting it, so outputs are always tensors
// the caller owns.
//
// Note [Device graphs]
// On a device whose interface has graphs (sim, CUDA), the first replay runs the steps as above
// (the warm-up: kernels that allocate on first use do so outside any capture). The second
// captures them on a side stream, in a memory pool of the executable's own, one graph per
// segment (segments end at host reads, and with `piecewise` at copies through the host, which
// run eagerly between the graphs). From then on a replay is: copy each non-static input into
// its static buffer (the address the graph was captured with), launch the graphs, copy inputs
// the step wrote back to the caller's tensors, and copy the outputs out of the graph's buffers
// into tensors the caller owns. Static inputs and free tensors are baked in by address: when
// one's address has changed the steps are captured again and the executable graph updated in
// place (update(), which keeps the instantiation) or, when the device refuses, re-instantiated.
// A capture that fails (an op that synchronises or copies to the host) is a CompileError
// naming the step's op; the executable then stays uncaptured and tries again on the next call.
// A step whose kernel runs on the cpu cannot be in a graph at all (capturing would run it once
// and never again): with `piecewise` it runs between graphs, without it capture refuses it.
#include "kiln/compile/executable.h"

#include <algorithm>
#include <optional>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "kiln/ops/op_list.h"
#include "kiln/profiler/profiler.h"

namespace kiln::compiler {

struct Executable::Step {
  enum class Kind : uint8_t { Call, Result, HostRead } kind = Kind::Call;
  std::unique_ptr<BoundCall> call;
  int node = -1;
  int read_value = -1;                       // HostRead
  std::vector<int> result_buffers;           // Result: buffer of each result, in order
  std::string_view name;                     // the kernel's op name
  DispatchKey key = DispatchKey::Undefined;  // the backend its kernel runs on
};

namespace {

Allocator* allocator_for(Device d) {
  if (d.is_cpu()) return cpu_allocator();
  DeviceInterface* iface = device_interface(d.type());
  KILN_CHECK_DEVICE(iface != nullptr, "[compile] no backend is loaded for device {}", d);
  return iface->allocator(d.index());
}

DispatchKey backend_key(const Stack& stack) {
  DispatchKey k = (detail::key_set_of_stack(stack) & kBackendKeys).highest();
  KILN_ASSERT(k != DispatchKey::Undefined, "compile: a step has no device to run on");
  return k;
}

}  // namespace

struct Executable::Graphs {
  DeviceInterface* iface = nullptr;
  Device device;
  uint64_t stream = 0, pool = 0;
  // The replay, in order: captured segments of steps, and steps run between them.
  struct Item {
    size_t begin = 0, end = 0;  // steps [begin, end)
    bool eager = false;         // one step run as it is (a host read, a copy through the host)
    uint64_t exec = 0;          // a captured segment's executable graph
  };
  std::vector<Item> schedule;
  int host_step = -1;  // a step on the cpu, which no graph can hold (without piecewise)
  bool captured = false;
  int runs = 0;
  std::vector<int> copy_in;                                  // inputs copied into static buffers
  std::vector<int> copy_back;                                // of those, the ones the steps write
  std::vector<std::pair<const Tensor*, const void*>> baked;  // free tensors' captured addresses

  void drop_execs() {
    for (Item& s : schedule) {
      if (s.exec) iface->destroy_exec(device.index(), s.exec);
      s.exec = 0;
    }
    captured = false;
  }
  ~Graphs() {
    try {
      drop_execs();
      if (stream) iface->destroy_stream(device.index(), stream);
      if (pool) iface->release_pool(device.index(), pool);
    } catch (...) {  // NOLINT: destructors never throw; a failed kernel was reported already
    }
  }
};

Executable::Executable(Graph graph, std::vector<bool> is_static, GraphOptions graphs)
    : graph_(std::move(graph)),
      is_static_(std::move(is_static)),
      graph_options_(std::move(graphs)) {
  build();
  setup_graphs();
}
Executable::~Executable() {
  // Graphs go first: queued launches must not outlive the buffers they use.
  if (graphs_) {
    try {
      graphs_->iface->synchronize(graphs_->device.index());
    } catch (...) {  // NOLINT: destructors never throw; a failed kernel was reported already
    }
  }
  graphs_.reset();
}

void Executable::setup_graphs() {
  const Graph& g = graph_;
  // The device: the one non-cpu device of the graph's buffers, if its interface has graphs.
  std::optional<Device> dev;
  bool mixed = false;
  for (const Buffer& b : g.buffers) {
    if (b.device.is_cpu()) continue;
    if (dev && *dev != b.device) mixed = true;
    dev = dev.value_or(b.device);
  }
  if (!dev) return;
  DeviceInterface* iface = device_interface(dev->type());
  if (iface && !mixed) order_ = StreamOrder{iface, *dev};
  if (!iface || !iface->caps().graphs) return;
  auto refuse = [&](std::string why) { stats_.no_graphs = std::move(why); };
  if (!graph_options_.capture) return refuse("CompileOptions::capture is off");
  if (mixed) return refuse(fmt::format("the graph uses two devices ({} and more)", *dev));
  for (size_t b = 0; b < g.buffers.size(); ++b) {
    const Buffer& buf = g.buffers[b];
    if (!buf.device.is_cpu()) continue;
    if (buf.kind == BufferKind::Input)
      return refuse("an input is a cpu tensor (a graph would keep its value of the capture)");
    if (buf.kind == BufferKind::Free)
      return refuse("a free tensor is on the cpu (a graph would keep its value of the capture)");
  }
  std::vector<int> inputs_of(g.buffers.size(), 0);
  for (int v : g.inputs) ++inputs_of[g.values[v].buffer];
  for (int n : inputs_of)
    if (n > 1) return refuse("two inputs share a buffer");

  auto gr = std::make_unique<Graphs>();
  gr->iface = iface;
  gr->device = *dev;
  const DispatchKey device_key = dev->dispatch_key();
  size_t begin = 0;
  for (size_t i = 0; i <= steps_.size(); ++i) {
    bool eager = false;
    if (i < steps_.size()) {
      const Step& st = *steps_[i];
      // A host read runs between graphs. So do, with piecewise, a copy through the host and a
      // kernel on the cpu; without it the copy fails its capture (the device says why) and a
      // cpu kernel is refused at capture (it would run once, while capturing, never again).
      bool host_copy = false;
      if (const OpDef* op = g.nodes[st.node].op;
          op == &ops::op_copy_.def || op == &ops::op_to_copy.def) {
        for (const Arg& a : g.nodes[st.node].args)
          if (a.kind == Arg::Kind::Value && a.value >= 0)
            host_copy = host_copy || g.values[a.value].device.is_cpu();
        for (int o : g.nodes[st.node].outputs) host_copy = host_copy || g.values[o].device.is_cpu();
      }
      const bool on_host = st.kind != Step::Kind::HostRead && st.key != device_key;
      // A device kernel reading a cpu value made in the step would keep its value of the
      // capture (a launch takes host values by value).
      if (!on_host && !host_copy && st.kind != Step::Kind::HostRead)
        for (const Arg& a : g.nodes[st.node].args)
          if (a.kind == Arg::Kind::Value && a.value >= 0 && g.values[a.value].device.is_cpu() &&
              g.buffers[g.values[a.value].buffer].kind != BufferKind::Constant)
            return refuse(fmt::format(
                "step {} ({}) reads a cpu value made in the step (a graph would keep its value "
                "of the capture)",
                i, st.name));
      if (on_host && !graph_options_.piecewise && gr->host_step < 0)
        gr->host_step = static_cast<int>(i);
      eager =
          st.kind == Step::Kind::HostRead || (graph_options_.piecewise && (host_copy || on_host));
      if (!eager) continue;
    }
    if (i > begin) gr->schedule.push_back({begin, i, false, 0});
    if (eager) gr->schedule.push_back({i, i + 1, true, 0});
    begin = i + 1;
  }
  // Inputs the steps write go back to the caller after each replay.
  std::vector<bool> written(g.buffers.size(), false);
  for (const Node& n : g.nodes)
    for (int b : n.writes) written[b] = true;
  for (size_t i = 0; i < g.inputs.size(); ++i) {
    if (input_buffers_[i] < 0 || (i < is_static_.size() && is_static_[i])) continue;
    gr->copy_in.push_back(static_cast<int>(i));
    if (written[input_buffers_[i]]) gr->copy_back.push_back(static_cast<int>(i));
  }
  graphs_ = std::move(gr);
  stats_.device_graphs = true;
  stats_.graph_segments =
      static_cast<int>(std::count_if(graphs_->schedule.begin(), graphs_->schedule.end(),
                                     [](const Graphs::Item& s) { return !s.eager; }));
}

void Executable::build() {
  Graph& g = graph_;
  const size_t nb = g.buffers.size(), nv = g.values.size();
  in_buffer_.assign(nb, {});
  for (size_t v = 0; v < nv; ++v) in_buffer_[g.values[v].buffer].push_back(static_cast<int>(v));

  // How each node runs decides which buffers its kernel fills in place.
  enum class Lowering : uint8_t { Skip, Same, Out, Fill, Copy, Result, HostRead };
  std::vector<Lowering> how(g.nodes.size());
  std::vector<const OpDef*> out_op(g.nodes.size(), nullptr);
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    const Node& n = g.nodes[i];
    if (n.host_read) {
      how[i] = Lowering::HostRead;
      continue;
    }
    switch (n.op->kind()) {
      case OpKind::View:
        how[i] = Lowering::Skip;
        break;
      case OpKind::InPlace:
      case OpKind::Out:
        how[i] = Lowering::Same;
        break;
      case OpKind::Functional:
      case OpKind::Factory: {
        bool own_buffers = true;  // a kernel may hand back a view of what it was given
        for (int o : n.outputs)
          own_buffers =
              own_buffers && g.buffers[g.values[o].buffer].producer == static_cast<int>(i);
        if (!own_buffers) {
          how[i] = Lowering::Skip;
        } else if (n.op == &ops::op_empty.def) {
          how[i] = Lowering::Skip;
        } else if (n.op == &ops::op_full.def) {
          how[i] = Lowering::Fill;
        } else if (n.op == &ops::op_to_copy.def) {
          how[i] = Lowering::Copy;
        } else if (const OpDef* o = n.random ? nullptr : n.op->out_variant()) {
          how[i] = Lowering::Out;
          out_op[i] = o;
        } else {
          how[i] = Lowering::Result;
        }
        break;
      }
    }
  }

  // Buffers: which are outputs, which the arena holds.
  std::vector<bool> is_output(nb, false);
  for (int v : g.outputs) is_output[g.values[v].buffer] = true;
  std::vector<bool> in_arena(nb, false);
  std::optional<Device> arena_device;  // one arena, on the device of the first planned buffer
  for (size_t b = 0; b < nb; ++b) {
    const Buffer& buf = g.buffers[b];
    if (buf.kind != BufferKind::Intermediate || is_output[b] || buf.producer < 0) continue;
    if (!arena_device) arena_device = buf.device;
    if (buf.device != *arena_device) continue;
    Lowering l = how[buf.producer];
    in_arena[b] = l == Lowering::Out || l == Lowering::Fill || l == Lowering::Copy ||
                  (l == Lowering::Skip && g.nodes[buf.producer].op->kind() != OpKind::View);
  }
  MemoryPlan plan = plan_memory(g, in_arena);
  stats_.arena_bytes = plan.arena_bytes;
  stats_.unplanned_bytes = plan.sum_bytes;

  // Storage per buffer.
  storage_.assign(nb, Ref<StorageImpl>());
  if (plan.arena_bytes > 0)
    arena_ = make_ref<StorageImpl>(plan.arena_bytes, *arena_device, allocator_for(*arena_device));
  for (size_t b = 0; b < nb; ++b) {
    const Buffer& buf = g.buffers[b];
    if (plan.offset[b] != SIZE_MAX) {
      storage_[b] = make_ref<StorageImpl>(static_cast<char*>(arena_->data()) + plan.offset[b],
                                          buf.nbytes, buf.device);
    } else if (buf.kind == BufferKind::Intermediate && buf.producer >= 0 &&
               how[buf.producer] != Lowering::Result) {
      // Outputs, and intermediates on a second device: buffers of their own.
      storage_[b] = make_ref<StorageImpl>(buf.nbytes, buf.device, allocator_for(buf.device));
      if (is_output[b]) {
        owned_outputs_.push_back(static_cast<int>(b));
        stats_.output_bytes += buf.nbytes;
      }
    } else if (buf.kind == BufferKind::Intermediate && buf.producer >= 0) {
      // Filled by a kernel that allocates (a Result step); a placeholder until the first run.
      storage_[b] = make_ref<StorageImpl>(buf.nbytes, buf.device, allocator_for(buf.device));
    } else if (buf.kind == BufferKind::Input && !buf.storage) {
      // A derived graph (Note [Dynamic dims]) has no traced input: bound at the first run.
      storage_[b] = make_ref<StorageImpl>(nullptr, buf.nbytes, buf.device);
    } else {
      storage_[b] = buf.storage;  // inputs (rebound per call), free tensors, constants
    }
  }
  // Slots: free tensors and constants are themselves; everything else is a fresh impl.
  slots_.assign(nv, Tensor());
  for (size_t v = 0; v < nv; ++v) {
    const Value& x = g.values[v];
    BufferKind k = g.buffers[x.buffer].kind;
    if ((k == BufferKind::Free || k == BufferKind::Constant) && x.producer < 0) {
      slots_[v] = x.traced;
    } else if (!storage_[x.buffer]) {
      continue;  // made by a node the passes removed
    } else {
      slots_[v] = Tensor(make_ref<TensorImpl>(storage_[x.buffer], x.dtype, x.sizes.span(),
                                              x.strides.span(), x.offset));
    }
  }
  // Inputs: the first input of each buffer binds it.
  input_buffers_.assign(g.inputs.size(), -1);
  bound_offset_.assign(nb, 0);
  for (size_t i = 0; i < g.inputs.size(); ++i) {
    const Value& x = g.values[g.inputs[i]];
    if (g.buffers[x.buffer].input == static_cast<int>(i)) input_buffers_[i] = x.buffer;
  }
  // The graph no longer needs what it saw while tracing, except free tensors and constants.
  for (Value& x : g.values) {
    BufferKind k = g.buffers[x.buffer].kind;
    if (k != BufferKind::Free && k != BufferKind::Constant) x.traced = Tensor();
  }
  for (size_t b = 0; b < nb; ++b) {
    const Buffer& buf = g.buffers[b];
    bool keep = buf.kind == BufferKind::Input && buf.input >= 0 &&
                static_cast<size_t>(buf.input) < is_static_.size() && is_static_[buf.input];
    if (buf.kind == BufferKind::Input && !keep) g.buffers[b].storage = Ref<StorageImpl>();
  }

  // Steps.
  auto slot_args = [&](const Node& n) { return node_args(n, slots_); };
  // Binds a stack, counting the tensor handles the bound call keeps.
  DispatchKey last_key = DispatchKey::Undefined;
  auto bind = [&](const OpDef& op, Stack& s) {
    for (const IValue& v : s) {
      if (auto* t = std::get_if<Tensor>(&v); t && t->defined()) ++bound_refs_[t->impl()];
      if (auto* l = std::get_if<TensorList>(&v))
        for (const Tensor& x : *l) ++bound_refs_[x.impl()];
    }
    last_key = backend_key(s);
    return op.bind(last_key, s);
  };
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    const Node& n = g.nodes[i];
    auto step = std::make_unique<Step>();
    step->node = static_cast<int>(i);
    switch (how[i]) {
      case Lowering::Skip:
        continue;
      case Lowering::HostRead:
        step->kind = Step::Kind::HostRead;
        step->read_value = n.args[0].value;
        step->name = n.host_read;
        ++stats_.host_reads;
        ++stats_.segments;
        break;
      case Lowering::Same: {
        Stack s = slot_args(n);
        step->call = bind(*n.op, s);
        step->name = n.op->name();
        break;
      }
      case Lowering::Out: {
        Stack s = slot_args(n);
        s.insert(s.begin(), slots_[n.outputs.at(0)]);
        step->call = bind(*out_op[i], s);
        step->name = out_op[i]->name();
        break;
      }
      case Lowering::Fill: {
        // full(size, value, dtype, device) -> fill_(out, value)
        Stack s{slots_[n.outputs.at(0)], n.args.at(1).attr};
        step->call = bind(ops::op_fill_.def, s);
        step->name = "fill_";
        break;
      }
      case Lowering::Copy: {
        Stack s{slots_[n.outputs.at(0)], slots_[n.args.at(0).value]};
        step->call = bind(ops::op_copy_.def, s);
        step->name = "copy_";
        break;
      }
      case Lowering::Result: {
        Stack s = slot_args(n);
        step->kind = Step::Kind::Result;
        step->call = bind(*n.op, s);
        step->name = n.op->name();
        for (int o : n.outputs) step->result_buffers.push_back(g.values[o].buffer);
        ++stats_.allocating_steps;
        break;
      }
    }
    step->key = last_key;
    last_key = DispatchKey::Undefined;
    steps_.push_back(std::move(step));
  }
  stats_.steps = static_cast<int>(steps_.size());
}

int Executable::refs_to(const TensorImpl* t) const {
  int n = 0;
  for (size_t v = 0; v < graph_.values.size(); ++v) {
    n += graph_.values[v].traced.impl() == t;
    n += slots_[v].impl() == t;
  }
  auto it = bound_refs_.find(t);
  return n + (it == bound_refs_.end() ? 0 : it->second);
}

void Executable::rebind(int buffer, Ref<StorageImpl> storage, int64_t delta_bytes) {
  for (int v : in_buffer_[buffer]) {
    const Value& x = graph_.values[v];
    TensorImpl* impl = slots_[v].impl();
    int64_t item = static_cast<int64_t>(itemsize(x.dtype));
    impl->rebind_storage(storage, x.offset + delta_bytes / item);
  }
  storage_[buffer] = std::move(storage);
}

bool Executable::bind_input(size_t i, const Tensor& input) {
  int b = input_buffers_[i];
  if (b < 0) return false;
  const Value& x = graph_.values[graph_.inputs[i]];
  const TensorImpl* in = input.impl();
  int64_t delta = (in->storage_offset() - x.offset) * static_cast<int64_t>(itemsize(x.dtype));
  if (in->storage() == storage_[b].get() && delta == bound_offset_[b]) return false;
  rebind(b, in->storage_ref(), delta);
  bound_offset_[b] = delta;
  return true;
}

void Executable::bind_inputs(std::span<const Tensor> inputs) {
  for (size_t i = 0; i < inputs.size(); ++i) bind_input(i, inputs[i]);
}

Tensor Executable::output(int v, std::span<const Tensor> inputs) const {
  const Value& x = graph_.values[v];
  const Buffer& buf = graph_.buffers[x.buffer];
  if (x.input >= 0) return inputs[x.input];
  if ((buf.kind == BufferKind::Free) && x.producer < 0) return slots_[v];
  if (buf.kind == BufferKind::Constant) return slots_[v].clone();
  // A tensor of its own over the buffer, so later rebinding of the slot never moves it.
  const TensorImpl* s = slots_[v].impl();
  return Tensor(make_ref<TensorImpl>(s->storage_ref(), s->dtype(), s->sizes(), s->strides(),
                                     s->storage_offset()));
}

void Executable::StreamOrder::follow() {
  const int index = device.index();
  const uint64_t stream = iface->current_stream(index);
  if (last && *last != stream) {
    const uint64_t e = iface->create_event(index);
    try {
      iface->record_event(index, e, *last);
      iface->stream_wait_event(index, stream, e);
    } catch (const DeviceError&) {  // that stream is gone, so its work is done
    }
    iface->destroy_event(index, e);
  }
  last = stream;
}

void Executable::run(std::span<const Tensor> inputs, TensorList& outputs) {
  if (order_) order_->follow();
  if (graphs_ && graphs_->runs++ > 0) return run_graphs(inputs, outputs);
  bind_inputs(inputs);
  // Outputs the caller still holds from an earlier call get a new buffer.
  for (int b : owned_outputs_) {
    const int own = 1 + static_cast<int>(in_buffer_[b].size());
    if (storage_[b]->use_count() > own) {
      const Buffer& buf = graph_.buffers[b];
      rebind(b, make_ref<StorageImpl>(buf.nbytes, buf.device, allocator_for(buf.device)), 0);
    }
  }
  run_steps(0, steps_.size());
  outputs.clear();
  for (int v : graph_.outputs) outputs.push_back(output(v, inputs));
}

void Executable::run_steps(size_t begin, size_t end) {
  const bool profiling = profiler::enabled();
  for (size_t i = begin; i < end; ++i) {
    const auto& step = steps_[i];
    int64_t t0 = profiling ? profiler::now_ns() : 0;
    switch (step->kind) {
      case Step::Kind::Call:
        step->call->run();
        // What an in-place kernel returns is its argument: holding it would count as a
        // reference from outside in the free-tensor guards.
        step->call->results.clear();
        break;
      case Step::Kind::Result: {
        step->call->run();
        size_t k = 0;
        for (const IValue& r : step->call->results) {
          if (auto* t = std::get_if<Tensor>(&r)) {
            rebind(step->result_buffers.at(k++), t->impl()->storage_ref(), 0);
          } else if (auto* l = std::get_if<TensorList>(&r)) {
            for (const Tensor& x : *l)
              rebind(step->result_buffers.at(k++), x.impl()->storage_ref(), 0);
          }
        }
        step->call->results.clear();
        break;
      }
      case Step::Kind::HostRead: {
        // What the traced read did: bring the value to the host (a no-op copy on the CPU).
        const Tensor& t = slots_[step->read_value];
        if (!t.device().is_cpu()) (void)t.to(Device(kCPU), true);
        break;
      }
    }
    if (profiling) profiler::record(step->name, "replay", t0, profiler::now_ns());
  }
}

void Executable::capture(bool update) {
  Graphs& gr = *graphs_;
  const int index = gr.device.index();
  DeviceInterface* iface = gr.iface;
  if (gr.host_step >= 0) {
    const Step& st = *steps_[gr.host_step];
    throw CompileError(fmt::format(
        "[compile] '{}': step {} ({}, op '{}') runs on the cpu, outside the graph on {}: a "
        "capture would run it once and never again. Run it between graphs with "
        "CompileOptions::piecewise, or compile with capture = false",
        graph_options_.name, gr.host_step, st.name, graph_.nodes[st.node].name(), gr.device));
  }
  const uint64_t previous = iface->current_stream(index);
  std::vector<uint64_t> graphs;
  size_t at = steps_.size();
  try {
    if (!gr.stream) gr.stream = iface->create_stream(index);
    if (!gr.pool) gr.pool = iface->create_pool(index);
    // The side stream starts after everything queued so far on the caller's stream.
    const uint64_t ready = iface->create_event(index);
    iface->record_event(index, ready, previous);
    iface->stream_wait_event(index, gr.stream, ready);
    iface->destroy_event(index, ready);
    iface->set_current_stream(index, gr.stream);
    for (const Graphs::Item& s : gr.schedule) {
      if (s.eager) continue;
      iface->begin_capture(index, gr.stream, gr.pool);
      try {
        for (at = s.begin; at < s.end; ++at) run_steps(at, at + 1);
      } catch (...) {
        try {
          (void)iface->end_capture(index, gr.stream);
        } catch (...) {  // NOLINT: the step's own error is the one to report
        }
        throw;
      }
      at = steps_.size();  // an error now is the capture's, not a step's
      graphs.push_back(iface->end_capture(index, gr.stream));
    }
  } catch (...) {
    // Nothing half-done stays: the next call captures again from scratch.
    iface->set_current_stream(index, previous);
    for (uint64_t g : graphs) iface->destroy_graph(index, g);
    gr.drop_execs();
    std::string why;
    try {
      throw;
    } catch (const Error& e) {
      why = e.what();
    }  // anything else goes on as it is
    std::string where = "the capture";
    if (at < steps_.size()) {
      const Step& st = *steps_[at];
      where = fmt::format("step {} ({}, op '{}')", at, st.name, graph_.nodes[st.node].name());
    }
    throw CompileError(fmt::format(
        "[compile] '{}': {} cannot be captured into a graph on {}: {}. Run it between graphs "
        "with CompileOptions::piecewise (copies through the host), or compile with capture = "
        "false",
        graph_options_.name, where, gr.device, why));
  }
  iface->set_current_stream(index, previous);
  int nodes = 0;
  size_t k = 0;
  for (Graphs::Item& s : gr.schedule) {
    if (s.eager) continue;
    nodes += iface->graph_nodes(index, graphs[k]);
    if (update && s.exec && iface->update(index, s.exec, graphs[k])) {
      ++stats_.graph_updates;
    } else {
      if (s.exec) iface->destroy_exec(index, s.exec);
      s.exec = iface->instantiate(index, graphs[k]);
    }
    iface->destroy_graph(index, graphs[k]);
    ++k;
  }
  ++stats_.captures;
  stats_.graph_nodes = nodes;
  gr.captured = true;
  // Free tensors are baked in by address (static inputs are checked against their buffers).
  gr.baked.clear();
  for (size_t v = 0; v < graph_.values.size(); ++v) {
    const Value& x = graph_.values[v];
    if (graph_.buffers[x.buffer].kind == BufferKind::Free && x.producer < 0 && slots_[v].defined())
      gr.baked.push_back({&slots_[v], slots_[v].impl()->storage()->data()});
  }
}

void Executable::run_graphs(std::span<const Tensor> inputs, TensorList& outputs) {
  Graphs& gr = *graphs_;
  const int index = gr.device.index();
  if (!gr.captured) {
    // Static buffers for the inputs copied in: the addresses the graphs are captured with.
    for (int i : gr.copy_in) {
      int b = input_buffers_[i];
      const Buffer& buf = graph_.buffers[b];
      rebind(b, make_ref<StorageImpl>(buf.nbytes, buf.device, allocator_for(buf.device)), 0);
      bound_offset_[b] = 0;
    }
    // Output buffers become the graph's: the warm-up's outputs stay the caller's.
    for (int b : owned_outputs_) {
      const Buffer& buf = graph_.buffers[b];
      rebind(b, make_ref<StorageImpl>(buf.nbytes, buf.device, allocator_for(buf.device)), 0);
    }
  }
  // Static inputs: bound by address, like free tensors.
  bool moved = false;
  for (size_t i = 0; i < inputs.size() && i < is_static_.size(); ++i)
    if (is_static_[i] && bind_input(i, inputs[i])) moved = true;
  for (const auto& [t, data] : gr.baked) moved = moved || t->impl()->storage()->data() != data;
  for (int i : gr.copy_in) slots_[graph_.inputs[i]].copy_(inputs[i]);
  if (!gr.captured || moved) capture(gr.captured);
  const bool profiling = profiler::enabled();
  for (const Graphs::Item& s : gr.schedule) {
    if (s.eager) {
      run_steps(s.begin, s.end);
      continue;
    }
    int64_t t0 = profiling ? profiler::now_ns() : 0;
    gr.iface->launch(index, s.exec, gr.iface->current_stream(index));
    if (profiling) profiler::record("graph launch", "replay", t0, profiler::now_ns());
  }
  for (int i : gr.copy_back) ops::op_copy_(inputs[i], slots_[graph_.inputs[i]]);
  outputs.clear();
  for (int v : graph_.outputs) {
    const Value& x = graph_.values[v];
    const int b = x.buffer;
    const BufferKind k = graph_.buffers[b].kind;
    const auto in = std::find(input_buffers_.begin(), input_buffers_.end(), b);
    if (k == BufferKind::Input && x.input < 0 && in != input_buffers_.end()) {
      // A view of an input: over the caller's storage, as without graphs.
      const Tensor& src = inputs[in - input_buffers_.begin()];
      const Value& iv = graph_.values[graph_.inputs[in - input_buffers_.begin()]];
      outputs.push_back(Tensor(
          make_ref<TensorImpl>(src.impl()->storage_ref(), x.dtype, x.sizes.span(), x.strides.span(),
                               x.offset + src.impl()->storage_offset() - iv.offset)));
    } else if (x.input >= 0 || k == BufferKind::Free || k == BufferKind::Constant) {
      outputs.push_back(output(v, inputs));
    } else {
      outputs.push_back(slots_[v].clone());  // out of the graph's buffer, into the caller's
    }
  }
}

std::string Executable::str() const {
  std::string s;
  for (size_t i = 0; i < steps_.size(); ++i) {
    const Step& st = *steps_[i];
    const Node& n = graph_.nodes[st.node];
    const char* kind = st.kind == Step::Kind::Result     ? " (allocates)"
                       : st.kind == Step::Kind::HostRead ? " (host read: segment break)"
                                                         : "";
    std::vector<std::string> outs;
    for (int o : n.outputs) outs.push_back(fmt::format("%{}", o));
    s += fmt::format("{}: {} <- n{} {}{}{}\n", i, st.name, st.node, n.name(),
                     outs.empty() ? "" : fmt::format(" -> {}", fmt::join(outs, ", ")), kind);
  }
  return s;
}

}  // namespace kiln::compiler

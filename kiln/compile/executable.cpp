// Note [Replay]
// Every value of the graph gets a *slot*: a tensor over its buffer with the value's geometry,
// made once. Views are slots too, so they cost nothing at replay. Each node becomes a step: a
// kernel of its backend bound to slots and attributes (OpDef::bind), so a replay is a loop of
// indirect calls with no dispatch, no boxing, no autograd and no allocation:
//   - functional ops with an out= variant run that variant into their planned buffer; `full`
//     becomes fill_, `to_copy` becomes copy_, `empty` and `empty_strided` (OpDef::uninitialized)
//     need no step;
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
// Note [Errors during a replay]
// A kernel that raises during a replay (a value only the kernel sees: an index or a target out
// of range) raises its own exception, unchanged, to the caller of the compiled function:
// nothing between the caller and the kernel catches it, and no destructor on the way throws.
// The steps before it have run and their writes stand (free tensors, inputs written in place),
// as the ops before a failing op stand in eager code; the steps after it have not, and the
// call returns no outputs. The executable stays valid and the entry stays in the cache: every
// buffer is bound anew at the start of each call and a bound call keeps no state between
// calls, so the next call replays the same entry (no recompile). A failure in the warm-up run
// of a device-graph executable leaves it uncaptured, and the next call captures. On a device
// (sim, CUDA) a kernel's error is reported by the device at the next synchronisation, which
// may be in a later call; a CUDA device-side assert leaves the whole context unusable, which
// no replay can repair. Tests: CompileReplayErrors.* (cpu), SimCompile.AKernelError* (sim).
#include "kiln/compile/executable.h"

#include <algorithm>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "kiln/compile/executable_impl.h"
#include "kiln/profiler/profiler.h"

// The executable's files: this one (the class and replay), executable_build.cpp (a Graph
// lowered to steps) and device_graphs.cpp (capture and graph replay).
namespace kiln::compiler {

Executable::Executable(Graph graph, std::vector<bool> is_static, GraphOptions graphs)
    : graph_(std::move(graph)),
      is_static_(std::move(is_static)),
      graph_options_(std::move(graphs)) {
  build();
  setup_graphs();
  plan_comm_stream();
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
  join_comm_stream();
  outputs.clear();
  for (int v : graph_.outputs) outputs.push_back(output(v, inputs));
}

void Executable::run_steps(size_t begin, size_t end) {
  try {
    run_steps_in_order(begin, end);
  } catch (...) {
    // What already runs on the communication stream is waited for: the next call's steps may
    // write what it reads (in a failed capture the wait may fail too; capture() then forgets
    // it with the capture).
    try {
      join_comm_stream();
    } catch (...) {  // NOLINT: the step's own error is the one to report
    }
    throw;
  }
}

void Executable::run_steps_in_order(size_t begin, size_t end) {
  const bool profiling = profiler::enabled();
  for (size_t i = begin; i < end; ++i) {
    const auto& step = steps_[i];
    int64_t t0 = profiling ? profiler::now_ns() : 0;
    if (step->join_comm_before) join_comm_stream();
    switch (step->kind) {
      case Step::Kind::Call:
        if (step->on_comm_stream) {
          comm_->run(*step->call);
        } else {
          step->call->run();
        }
        // What an in-place kernel returns is its argument: holding it would count as a
        // reference from outside in the free-tensor guards.
        step->call->results.clear();
        break;
      case Step::Kind::Result: {
        step->call->run();
        // Undefined results (convolution_backward's masked-off gradients) had no value in the
        // trace either, so result_buffers lists the defined ones only.
        size_t k = 0;
        for (const IValue& r : step->call->results) {
          if (auto* t = std::get_if<Tensor>(&r)) {
            if (t->defined()) rebind(step->result_buffers.at(k++), t->impl()->storage_ref(), 0);
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

std::string Executable::str() const {
  std::string s;
  for (size_t i = 0; i < steps_.size(); ++i) {
    const Step& st = *steps_[i];
    const Node& n = graph_.nodes[st.node];
    const char* kind = st.kind == Step::Kind::Result     ? " (allocates)"
                       : st.kind == Step::Kind::HostRead ? " (host read: segment break)"
                       : st.on_comm_stream               ? " (on the communication stream)"
                                                         : "";
    std::vector<std::string> outs;
    for (int o : n.outputs) outs.push_back(fmt::format("%{}", o));
    if (st.join_comm_before) s += "   (waits for the communication stream)\n";
    s += fmt::format("{}: {} <- n{} {}{}{}\n", i, st.name, st.node, n.name(),
                     outs.empty() ? "" : fmt::format(" -> {}", fmt::join(outs, ", ")), kind);
  }
  return s;
}

}  // namespace kiln::compiler

// The executable's device graphs: which steps a graph can hold, capture, and graph replay.
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
#include <algorithm>
#include <optional>

#include <fmt/format.h>

#include "kiln/compile/executable_impl.h"
#include "kiln/ops/op_list.h"
#include "kiln/profiler/profiler.h"

namespace kiln::compiler {

void Executable::Graphs::drop_execs() {
  for (Item& s : schedule) {
    if (s.exec) iface->destroy_exec(device.index(), s.exec);
    s.exec = 0;
  }
  captured = false;
}

Executable::Graphs::~Graphs() {
  try {
    drop_execs();
    if (stream) iface->destroy_stream(device.index(), stream);
    if (pool) iface->release_pool(device.index(), pool);
  } catch (...) {  // NOLINT: destructors never throw; a failed kernel was reported already
  }
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
        at = steps_.size();  // an error now is the capture's, not a step's
        join_comm_stream();  // a capture ends with its forks joined
      } catch (...) {
        try {
          (void)iface->end_capture(index, gr.stream);
        } catch (...) {  // NOLINT: the step's own error is the one to report
        }
        throw;
      }
      graphs.push_back(iface->end_capture(index, gr.stream));
    }
  } catch (...) {
    // Nothing half-done stays: the next call captures again from scratch.
    iface->set_current_stream(index, previous);
    if (comm_) comm_->pending = false;  // its events belong to the dropped capture
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
      s.exec = 0;  // a failed instantiation must leave no destroyed handle behind
      try {
        s.exec = iface->instantiate(index, graphs[k]);
      } catch (...) {
        for (size_t j = k; j < graphs.size(); ++j) iface->destroy_graph(index, graphs[j]);
        throw;
      }
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
      join_comm_stream();
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

}  // namespace kiln::compiler

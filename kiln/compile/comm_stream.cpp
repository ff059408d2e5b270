// Note [Collectives on a stream of their own]
// On a device with streams (sim, CUDA), an executable runs collectives on a communication
// stream (one a device and thread, shared by the executables), so that communication
// overlaps the kernels after it: DDP's bucketed all-reduces run while backward computes the
// gradients of the next buckets, as they do in eager DDP (Note [When a bucket is reduced] in
// kiln/parallel/ddp.cpp), instead of in line with it.
// - Which: an in-place or out= collective (a Call step) whose every buffer holds free tensors
//   (DDP's buckets, a module's state). Free buffers are never reused by the memory plan, so
//   nothing but a step that touches them can conflict with the collective. One touching an
//   intermediate (the arena reuses its bytes once its last reader has run) or an input (the
//   caller's) would have to be waited for at the very next step, which gains nothing, so it
//   runs in line, as does a collective whose kernel allocates its result (a Result step:
//   allocations stay on one stream). Tensor parallelism's all-reduces are of that kind.
// - Fork: before each such collective, an event recorded on the current stream (the caller's,
//   or the capturing stream) makes the communication stream wait for everything queued so far;
//   the collective then runs with the communication stream as the current stream, and an event
//   is recorded after it. One stream keeps those collectives in trace order.
// - Join: the current stream waits for the communication stream's last event before the first
//   later step that touches (reads, writes or views) a buffer a pending collective touches,
//   before a host read, before a collective that runs in line (so that every rank's
//   collectives stay in one order, which NCCL and the custom all-reduce need per group), and
//   at the end of every replay and of every captured segment (a capture must end joined).
// Captured, the fork and the join are edges of the graph, so a replay overlaps too. On the cpu
// (no streams) nothing changes. ExecutableStats::comm_stream_steps counts the collectives on the
// stream; tests: DDP.CompiledOnSimIsADeviceGraphEqualToEager, CollectiveCompile.* (tests/
// distributed), SimGraphs.AStreamForkedFromACapture* (sim's forks and joins), NcclCompile.* (CUDA).
#include <algorithm>
#include <map>
#include <utility>

#include "kiln/compile/executable_impl.h"

namespace kiln::compiler {

namespace {

// The calling thread's communication stream on device (iface, index): shared by the
// executables the thread runs, never destroyed. A stream may carry state of the process groups
// that issue on it (on sim and the cpu, an MPI communicator and a shared-memory channel each,
// Note [One communicator per stream] in kiln/distributed/process_group.cpp), made the first time
// it issues: one stream keeps that to one more per group, however many executables there are.
// One a thread, because two threads running compiled steps at once must not share one: on
// CUDA, a stream joined to one thread's capture would take the other thread's work into it,
// and a stream's collectives must come from one thread to stay in one order on every rank.
uint64_t communication_stream(DeviceInterface* iface, int index) {
  thread_local std::map<std::pair<const DeviceInterface*, int>, uint64_t> streams;
  auto [it, fresh] = streams.try_emplace({iface, index}, 0);
  if (fresh) {
    try {
      it->second = iface->create_stream(index);
    } catch (...) {
      streams.erase(it);
      throw;
    }
  }
  return it->second;
}

}  // namespace

Executable::CommStream::CommStream(DeviceInterface* i, int idx) : iface(i), index(idx) {
  forked = iface->create_event(index);
  try {
    done = iface->create_event(index);
  } catch (...) {
    iface->destroy_event(index, forked);
    throw;
  }
}

Executable::CommStream::~CommStream() {
  try {
    iface->destroy_event(index, forked);
    iface->destroy_event(index, done);
  } catch (...) {  // NOLINT: destructors never throw; a failed kernel was reported already
  }
}

void Executable::CommStream::run(BoundCall& call) {
  const uint64_t current = iface->current_stream(index);
  const uint64_t stream = communication_stream(iface, index);  // the running thread's
  iface->record_event(index, forked, current);
  iface->stream_wait_event(index, stream, forked);
  iface->set_current_stream(index, stream);
  try {
    call.run();
  } catch (...) {
    iface->set_current_stream(index, current);
    // What the call queued before it failed is waited for like a collective's (run_steps
    // joins on an error); a capture then ends joined, whatever its own error.
    try {
      iface->record_event(index, done, stream);
      pending = true;
    } catch (...) {  // NOLINT: the call's own error is the one to report
    }
    throw;
  }
  iface->set_current_stream(index, current);
  iface->record_event(index, done, stream);
  pending = true;
}

void Executable::CommStream::join() {
  iface->stream_wait_event(index, iface->current_stream(index), done);
  pending = false;
}

void Executable::join_comm_stream() {
  if (comm_ && comm_->pending) comm_->join();
}

void Executable::plan_comm_stream() {
  const Graph& g = graph_;
  if (!order_ || !order_->iface->caps().async) return;
  const DispatchKey device_key = order_->device.dispatch_key();
  // The buffers a step touches: its arguments', its outputs' and those it writes.
  auto touched_by = [&](const Node& n) {
    std::vector<int> touched;
    for (const Arg& a : n.args) {
      if (a.kind == Arg::Kind::Value && a.value >= 0) touched.push_back(g.values[a.value].buffer);
      if (a.kind == Arg::Kind::List)
        for (int v : a.values)
          if (v >= 0) touched.push_back(g.values[v].buffer);
    }
    for (int o : n.outputs) touched.push_back(g.values[o].buffer);
    touched.insert(touched.end(), n.writes.begin(), n.writes.end());
    return touched;
  };
  auto on_stream = [&](const Step& st, const std::vector<int>& touched) {
    return st.kind == Step::Kind::Call && st.key == device_key && g.nodes[st.node].communicates &&
           !touched.empty() && std::all_of(touched.begin(), touched.end(), [&](int b) {
             return g.buffers[b].kind == BufferKind::Free;
           });
  };
  if (std::none_of(steps_.begin(), steps_.end(),
                   [&](const auto& st) { return on_stream(*st, touched_by(g.nodes[st->node])); }))
    return;
  comm_ = std::make_unique<CommStream>(order_->iface, order_->device.index());

  std::vector<char> pending(g.buffers.size(), 0);  // touched by a collective not yet joined
  bool any = false;
  for (auto& st : steps_) {
    const Node& n = g.nodes[st->node];
    const std::vector<int> touched = touched_by(n);
    const bool collective = on_stream(*st, touched);
    bool join = st->kind == Step::Kind::HostRead || (n.communicates && !collective);
    for (int b : touched) join = join || pending[b];
    if (any && join) {
      st->join_comm_before = true;
      std::fill(pending.begin(), pending.end(), 0);
      any = false;
    }
    if (!collective) continue;
    st->on_comm_stream = true;
    ++stats_.comm_stream_steps;
    for (int b : touched) pending[b] = 1;
    any = true;
  }
}

}  // namespace kiln::compiler

// Note [Collectives on a stream of their own]
// On a device with streams (sim, CUDA), an executable runs its collectives on a stream of its
// own, so that communication overlaps the kernels after it: DDP's bucketed all-reduces run
// while backward computes the gradients of the next buckets, as they do in eager DDP (Note
// [When a bucket is reduced] in kiln/parallel/ddp.cpp), instead of in line with it.
// - Fork: before each collective, an event recorded on the current stream (the caller's, or
//   the capturing stream) makes the communication stream wait for everything queued so far;
//   the collective then runs with the communication stream as the current stream, and an event
//   is recorded after it. One stream keeps every collective in trace order, which is the order
//   every rank issues them in (NCCL and the custom all-reduce need one order per group).
// - Join: the current stream waits for the communication stream's last event before the first
//   later step that touches (reads, writes or views) a buffer a pending collective touches,
//   before a host read, before a collective that stays on the current stream, and at the end
//   of every replay and of every captured segment (a capture must end with its forks joined).
// - Only a collective whose every buffer holds free tensors (DDP's buckets, a module's state)
//   is left pending past the next step. An intermediate lives in the planned arena, whose bytes
//   later values reuse once its last reader has run, and an input's buffer is the caller's: a
//   collective touching either is joined before the very next step, so no step can write those
//   bytes while it runs. Free buffers are never reused by the plan.
// - A collective whose kernel allocates its result (a Result step) stays on the current stream,
//   after the communication stream's work is joined: allocations stay on one stream.
// Captured, the fork and the join are edges of the graph, so a replay overlaps too. On the cpu
// (no streams) nothing changes. ExecutableStats counts the collectives on the stream and those
// left pending (`overlapped_collectives`); tests: DDP.CompiledOnSimIsADeviceGraphEqualToEager,
// CollectiveCompile.* (tests/distributed), SimCapture.* (sim's forks and joins).
#include <algorithm>

#include "kiln/compile/executable_impl.h"

namespace kiln::compiler {

Executable::CommStream::CommStream(DeviceInterface* i, int idx) : iface(i), index(idx) {
  stream = iface->create_stream(index);
  forked = iface->create_event(index);
  done = iface->create_event(index);
}

Executable::CommStream::~CommStream() {
  try {
    iface->destroy_event(index, forked);
    iface->destroy_event(index, done);
    iface->destroy_stream(index, stream);
  } catch (...) {  // NOLINT: destructors never throw; a failed kernel was reported already
  }
}

void Executable::CommStream::run(BoundCall& call) {
  const uint64_t current = iface->current_stream(index);
  iface->record_event(index, forked, current);
  iface->stream_wait_event(index, stream, forked);
  iface->set_current_stream(index, stream);
  try {
    call.run();
  } catch (...) {
    iface->set_current_stream(index, current);
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
  auto on_stream = [&](const Step& st) {
    return st.kind == Step::Kind::Call && st.key == device_key && g.nodes[st.node].communicates;
  };
  if (std::none_of(steps_.begin(), steps_.end(), [&](const auto& st) { return on_stream(*st); }))
    return;
  comm_ = std::make_unique<CommStream>(order_->iface, order_->device.index());

  std::vector<char> pending(g.buffers.size(), 0);  // touched by a collective not yet joined
  bool any = false, join_next = false;
  std::vector<int> touched;
  for (auto& st : steps_) {
    const Node& n = g.nodes[st->node];
    touched.clear();
    for (const Arg& a : n.args) {
      if (a.kind == Arg::Kind::Value && a.value >= 0) touched.push_back(g.values[a.value].buffer);
      if (a.kind == Arg::Kind::List)
        for (int v : a.values)
          if (v >= 0) touched.push_back(g.values[v].buffer);
    }
    for (int o : n.outputs) touched.push_back(g.values[o].buffer);
    touched.insert(touched.end(), n.writes.begin(), n.writes.end());

    const bool collective = on_stream(*st);
    bool join = join_next || st->kind == Step::Kind::HostRead || (n.communicates && !collective);
    for (int b : touched) join = join || pending[b];
    if (any && join) {
      st->join_comm_before = true;
      std::fill(pending.begin(), pending.end(), 0);
      any = false;
    }
    join_next = false;
    if (!collective) continue;
    st->on_comm_stream = true;
    ++stats_.comm_stream_steps;
    for (int b : touched) pending[b] = 1;
    any = true;
    if (std::all_of(touched.begin(), touched.end(),
                    [&](int b) { return g.buffers[b].kind == BufferKind::Free; }))
      ++stats_.overlapped_collectives;
    else
      join_next = true;
  }
}

}  // namespace kiln::compiler

#include "kiln/distributed/collectives.h"

#include <map>
#include <mutex>

#include "kiln/core/stream.h"
#include "kiln/core/tensor_impl.h"
#include "kiln/dispatch/op.h"
#include "kiln/distributed/mpi_comm.h"
#include "kiln/ops/op_list.h"

namespace kiln::distributed {
namespace {

const ProcessGroup& resolve(const ProcessGroup* g) { return g ? *g : world(); }
int64_t id(const ProcessGroup* g) { return resolve(g).id(); }
int64_t as_int(ReduceOp op) { return static_cast<int64_t>(op); }

thread_local std::chrono::milliseconds tls_timeout{0};

}  // namespace

class Work::Impl {
 public:
  virtual ~Impl() = default;
  virtual void wait() = 0;
  virtual bool is_completed() = 0;
};

namespace {

// Already done (a synchronous fallback: tracing, a world of one).
class DoneWork final : public Work::Impl {
 public:
  void wait() override {}
  bool is_completed() override { return true; }
};

// Non-blocking MPI calls over CPU tensors (Note [Non-blocking collectives] in mpi_comm.cpp);
// holds the tensors until they complete.
class CpuWork final : public Work::Impl {
 public:
  CpuWork(std::vector<std::unique_ptr<MpiComm::Request>> r, std::vector<Tensor> t)
      : reqs_(std::move(r)), t_(std::move(t)) {}
  void wait() override {
    for (auto& r : reqs_) r->wait();
  }
  bool is_completed() override {
    bool all = true;
    for (auto& r : reqs_) all = r->test() && all;  // tests every one: each may progress
    return all;
  }

 private:
  std::vector<std::unique_ptr<MpiComm::Request>> reqs_;
  std::vector<Tensor> t_;
};

// A collective queued on a communication stream: wait() makes the waiting thread's current
// stream wait for it (a stream dependency, not a host wait).
class StreamWork final : public Work::Impl {
 public:
  StreamWork(Device d, std::vector<Tensor> t) : done_(d), t_(std::move(t)) {}
  Event& done() { return done_; }
  void wait() override {
    done_.wait(Stream::current(done_.device()));
    waited_ = true;
  }
  bool is_completed() override { return done_.query(); }
  // An unwaited work still orders later frees of its tensor after the collective.
  ~StreamWork() override {
    if (!waited_) {
      try {
        done_.wait(Stream::current(done_.device()));
      } catch (...) {  // destructors never throw
      }
    }
  }

 private:
  Event done_;
  std::vector<Tensor> t_;
  bool waited_ = false;
};

// The communication stream of (group, device): made on first use, kept for good.
Stream comm_stream(const ProcessGroup& g, Device d) {
  static std::mutex mu;
  static std::map<std::pair<int64_t, std::pair<int, int>>, Stream> streams;
  std::lock_guard<std::mutex> lock(mu);
  auto key = std::make_pair(g.id(), std::make_pair(static_cast<int>(d.type()), d.index()));
  auto it = streams.find(key);
  if (it == streams.end()) it = streams.emplace(key, Stream::create(d)).first;
  return it->second;
}

bool tracing() { return local_dispatch_state().included.has(DispatchKey::Trace); }

}  // namespace

void Work::wait() {
  if (impl_) impl_->wait();
}
bool Work::is_completed() { return !impl_ || impl_->is_completed(); }

Tensor all_reduce(const Tensor& t, ReduceOp op, const ProcessGroup* group) {
  return ops::op_all_reduce(t, as_int(op), id(group));
}
void all_reduce_(const Tensor& t, ReduceOp op, const ProcessGroup* group) {
  ops::op_all_reduce_(t, as_int(op), id(group));
}
Tensor all_gather_into_tensor(const Tensor& t, const ProcessGroup* group) {
  const ProcessGroup& g = resolve(group);
  return ops::op_all_gather_into_tensor(t, g.size(), g.id());
}
void all_gather_into_tensor_out(const Tensor& out, const Tensor& t, const ProcessGroup* group) {
  const ProcessGroup& g = resolve(group);
  ops::op_all_gather_into_tensor_out(out, t, g.size(), g.id());
}
Tensor reduce_scatter_tensor(const Tensor& t, ReduceOp op, const ProcessGroup* group) {
  const ProcessGroup& g = resolve(group);
  return ops::op_reduce_scatter_tensor(t, as_int(op), g.size(), g.id());
}
void reduce_scatter_tensor_out(const Tensor& out, const Tensor& t, ReduceOp op,
                               const ProcessGroup* group) {
  const ProcessGroup& g = resolve(group);
  ops::op_reduce_scatter_tensor_out(out, t, as_int(op), g.size(), g.id());
}
Tensor broadcast(const Tensor& t, int src, const ProcessGroup* group) {
  return ops::op_broadcast(t, src, id(group));
}
void broadcast_(const Tensor& t, int src, const ProcessGroup* group) {
  ops::op_broadcast_(t, src, id(group));
}
Tensor all_to_all_single(const Tensor& t, const std::vector<int64_t>& out_splits,
                         const std::vector<int64_t>& in_splits, const ProcessGroup* group) {
  return ops::op_all_to_all_single(t, out_splits, in_splits, id(group));
}
void send(const Tensor& t, int dst, const ProcessGroup* group) { ops::op_send(t, dst, id(group)); }
void recv_(const Tensor& t, int src, const ProcessGroup* group) {
  ops::op_recv_(t, src, id(group));
}
void barrier(const ProcessGroup* group, Device device) { ops::op_barrier(device, id(group)); }

namespace {

// Note [Asynchronous collectives]
// An async form runs the blocking op itself, so the op's kernel validates it exactly as the
// blocking form's (raising at the call, before anything is sent), but changes where it runs:
// - on a device with streams, on the group's communication stream, after an event from the
//   current stream, and wait() makes the current stream wait for the collective's event;
// - on the CPU, inside a NonBlocking scope, so the MPI backend starts the call (MPI_I...) and
//   the Work completes it; a path that completes at once (a world of one, the shared-memory
//   pieces of a large all-reduce) leaves nothing to wait for.
// Traced, differentiated or meta calls, and groups of one, are the blocking op, which records,
// differentiates and captures like any op. The Work holds the tensors until the collective is
// done and, for a stream, until the current stream has waited for it, so their memory cannot be
// reused under it (the caching allocators reuse a block only once the stream that freed it
// reaches the free; PyTorch's NCCL groups now hold tensors the same way instead of
// record_stream).
template <class Blocking>
Work start_async(const ProcessGroup& g, Device d, std::vector<Tensor> keep, Blocking&& blocking) {
  bool now = tracing() || d.type() == kMeta || g.size() == 1;
  for (const Tensor& t : keep) now = now || !t.defined() || t.requires_grad();
  if (now) {
    blocking();
    return Work(std::make_shared<DoneWork>());
  }
  if (d.type() == kCPU) {
    NonBlocking scope;
    blocking();
    auto started = scope.take();
    if (started.empty()) return Work(std::make_shared<DoneWork>());
    return Work(std::make_shared<CpuWork>(std::move(started), std::move(keep)));
  }
  Stream s = comm_stream(g, d);
  auto w = std::make_shared<StreamWork>(d, std::move(keep));
  Event ready(d);
  ready.record(Stream::current(d));
  ready.wait(s);
  StreamGuard on(s);
  blocking();
  w->done().record(s);
  return Work(w);
}

Device device_of(const Tensor& t) { return t.defined() ? t.device() : Device(kCPU); }

}  // namespace

Work all_reduce_async(const Tensor& t, ReduceOp op, const ProcessGroup* group) {
  const ProcessGroup& g = resolve(group);
  return start_async(g, device_of(t), {t}, [&] { all_reduce_(t, op, &g); });
}
Work all_gather_into_tensor_async(const Tensor& out, const Tensor& t, const ProcessGroup* group) {
  const ProcessGroup& g = resolve(group);
  return start_async(g, device_of(t), {out, t}, [&] { all_gather_into_tensor_out(out, t, &g); });
}
Work reduce_scatter_tensor_async(const Tensor& out, const Tensor& t, ReduceOp op,
                                 const ProcessGroup* group) {
  const ProcessGroup& g = resolve(group);
  return start_async(g, device_of(t), {out, t}, [&] { reduce_scatter_tensor_out(out, t, op, &g); });
}
Work broadcast_async(const Tensor& t, int src, const ProcessGroup* group) {
  const ProcessGroup& g = resolve(group);
  return start_async(g, device_of(t), {t}, [&] { broadcast_(t, src, &g); });
}
Work all_to_all_single_async(const Tensor& out, const Tensor& t,
                             const std::vector<int64_t>& out_splits,
                             const std::vector<int64_t>& in_splits, const ProcessGroup* group) {
  const ProcessGroup& g = resolve(group);
  return start_async(g, device_of(t), {out, t},
                     [&] { ops::op_all_to_all_single_out(out, t, out_splits, in_splits, g.id()); });
}
Work send_async(const Tensor& t, int dst, const ProcessGroup* group) {
  const ProcessGroup& g = resolve(group);
  return start_async(g, device_of(t), {t}, [&] { send(t, dst, &g); });
}
Work recv_async(const Tensor& t, int src, const ProcessGroup* group) {
  const ProcessGroup& g = resolve(group);
  return start_async(g, device_of(t), {t}, [&] { recv_(t, src, &g); });
}
Work barrier_async(const ProcessGroup* group, Device device) {
  const ProcessGroup& g = resolve(group);
  return start_async(g, device, {}, [&] { barrier(&g, device); });
}

TimeoutGuard::TimeoutGuard(std::chrono::milliseconds timeout) : previous_(tls_timeout) {
  KILN_CHECK(timeout.count() > 0, "[TimeoutGuard] the timeout must be positive, got {} ms",
             timeout.count());
  tls_timeout = timeout;
}
TimeoutGuard::~TimeoutGuard() { tls_timeout = previous_; }

std::chrono::milliseconds timeout_for(const ProcessGroup& group) {
  return tls_timeout.count() > 0 ? tls_timeout : group.timeout();
}

}  // namespace kiln::distributed

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

// A non-blocking MPI all-reduce over a CPU tensor; holds the tensor until it completes.
class CpuWork final : public Work::Impl {
 public:
  CpuWork(std::unique_ptr<MpiComm::Request> r, Tensor t) : req_(std::move(r)), t_(std::move(t)) {}
  void wait() override { req_->wait(); }
  bool is_completed() override { return req_->test(); }

 private:
  std::unique_ptr<MpiComm::Request> req_;
  Tensor t_;
};

// A collective queued on a communication stream: wait() makes the waiting thread's current
// stream wait for it (a stream dependency, not a host wait).
class StreamWork final : public Work::Impl {
 public:
  StreamWork(Device d, Tensor t) : done_(d), t_(std::move(t)) {}
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
  Tensor t_;
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

Work all_reduce_async(const Tensor& t, ReduceOp op, const ProcessGroup* group) {
  const ProcessGroup& g = resolve(group);
  // Traced, differentiated or on the meta device: the synchronous op, which records and
  // differentiates like any op.
  if (tracing() || t.requires_grad() || !t.defined() || t.device().type() == kMeta ||
      g.size() == 1) {
    all_reduce_(t, op, &g);
    return Work(std::make_shared<DoneWork>());
  }
  if (t.device().type() == kCPU) {
    // The op's kernel validates; the MPI call itself is started here without waiting.
    ops::op_all_reduce_.call_at(DispatchKey::Meta, t, as_int(op), g.id());  // argument checks
    KILN_CHECK(t.is_contiguous(), "[all_reduce_] self must be contiguous, got strides {}",
               t.strides());
    CallInfo info{"all_reduce_", &g, t.dtype(), t.numel(), op, -1};
    MpiComm* comm = g.comm(stream_key(t.device()));
    return Work(
        std::make_shared<CpuWork>(comm->start_all_reduce(t.impl()->data(), t.numel(), info), t));
  }
  Device d = t.device();
  Stream s = comm_stream(g, d);
  auto w = std::make_shared<StreamWork>(d, t);
  {
    Event ready(d);
    ready.record(Stream::current(d));
    ready.wait(s);
    StreamGuard on(s);
    all_reduce_(t, op, &g);
    w->done().record(s);
  }
  return Work(w);
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

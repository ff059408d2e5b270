// The collective backend of cuda tensors, over NCCL (kiln/distributed/collective_backend.h):
// every process group gets an NCCL communicator when it is made, and every collective is queued
// on the current stream of its tensors' device, so a capturing stream records it into its graph
// like any kernel. Registered for "cuda" when libkiln_cuda loads.
//
// Note [NCCL communicators]
// One communicator per group, made eagerly by the group's factory, never inside a capture
// (NCCL's set-up is itself collective, and talks over sockets): group rank 0 makes the unique
// id, MPI broadcasts it over the group's own communicator (as nccl-tests do), and every rank
// joins with its one device, nccl_device(). A mutex serialises the calls on one communicator:
// NCCL forbids two threads using one at once, and the watchdog's abort must not race a call.
// Communicators are never destroyed:
// groups live until exit, and at exit ncclCommDestroy would wait for peers that may be gone,
// with a CUDA runtime that may already be shut down. The process's end frees them.
//
// Note [Blocking communicators]
// Communicators are blocking (config.blocking = 1), as PyTorch's are. A non-blocking one queues
// every call from a thread NCCL starts for it and returns ncclInProgress, to be polled: that
// cost 40-90 us an eager call on two H200s (an 8 B all-reduce took 82 us instead of 20, a 64 MiB
// one 378 instead of 269; bench/gpu_runs.md, S4). Blocking calls must then not wait for a peer
// on the host:
// - set-up waits for every rank, so it runs on a thread of its own and the caller waits for it
//   until the group's deadline; past it the caller raises (a rank did not join), and the thread,
//   should it finish later, aborts the communicator it made;
// - NCCL connects peers lazily by default, inside the first call that needs a connection, which
//   would then wait for the peer on the host: unless the user set NCCL_RUNTIME_CONNECT, Kiln sets
//   it to 0 when the plugin loads, so collectives' connections are made during set-up. Send and
//   recv (and all_to_all, made of them) still connect to a peer at their first call with it: a
//   peer that never posts its side of a first exchange leaves the caller waiting in NCCL, with no
//   deadline (not fixed; the non-blocking communicators timed it out);
// - after that a call only queues kernels, and a peer that never joins a collective is caught
//   by its deadline on the device (Note [NCCL deadlines]).
// NCCL_COMM_BLOCKING=0 in the environment overrides config.blocking; set-up and calls then poll
// ncclInProgress as they did before.
//
// Note [NCCL deadlines]
// A call returns once its collective is queued, long before it completes, so its deadline
// cannot be a scope on the caller's stack as the MPI backend's is (Note [Deadlines] in
// kiln/distributed/mpi_comm.cpp). Completion is observed instead: after an eager collective the
// backend records an event on the stream and arms the process's watchdog
// (kiln/distributed/watchdog.h) with the call's deadline (timeout_for its group). Each later
// call on the communicator first retires, in issue order, the calls whose events have completed
// (cudaEventQuery): their deadlines are disarmed and their flight-recorder entries finished.
// If a deadline passes first, the watchdog thread queries the event once more; if the
// collective is still not done it marks the communicator aborted, writes the flight recorder,
// prints the DistributedError (op, group, sequence number, sizes), posts it to the device
// (post_device_error: the next synchronize or copy to the host of that device raises it, so a
// caller waiting on the stream never takes the unfinished result for a real one) and then
// calls ncclCommAbort, which ends the collective's kernels so that the stream drains instead
// of hanging. Every later call on the communicator raises a DistributedError saying it was
// aborted and why. An error NCCL reports asynchronously (ncclCommGetAsyncError: a peer failed)
// is checked at each call and at expiry, and aborts the same way.
//
// A collective recorded into a graph (a capturing stream) gets no event and no deadline: it
// runs when the graph is replayed, and the replay is where a hang would show. Replays are not
// watched per collective; the eager warm-up before the capture is, with the same arguments.
#include "kiln/backend/cuda/nccl.h"

#include <algorithm>

#include "kiln/backend/cuda/cuda.h"

#ifdef KILN_HAVE_NCCL
#include <cuda_runtime.h>
#include <nccl.h>

#include <atomic>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "kiln/backend/cuda/common.h"
#include "kiln/backend/cuda/custom_allreduce.h"
#include "kiln/core/error.h"
#include "kiln/core/tensor_impl.h"
#include "kiln/distributed/collective_backend.h"
#include "kiln/distributed/collectives.h"
#include "kiln/distributed/flight_recorder.h"
#include "kiln/distributed/init.h"
#include "kiln/distributed/mpi_comm.h"
#include "kiln/distributed/watchdog.h"
#endif

namespace kiln::cuda {

int nccl_device() { return distributed::local_rank() % std::max(1, device_count()); }

#ifndef KILN_HAVE_NCCL

int nccl_version() { return 0; }

#else

int nccl_version() {
  int v = 0;
  return ncclGetVersion(&v) == ncclSuccess ? v : 0;
}

namespace {

namespace dist = kiln::distributed;
using dist::CallState;
using dist::Clock;
using dist::FlightRecorder;

ncclDataType_t nccl_type(DType t) {
  switch (t) {
    case DType::Bool:
    case DType::UInt8:
      return ncclUint8;
    case DType::Int32:
      return ncclInt32;
    case DType::Int64:
      return ncclInt64;
    case DType::Float16:
      return ncclFloat16;
    case DType::BFloat16:
      return ncclBfloat16;
    case DType::Float32:
      return ncclFloat32;
    case DType::Float64:
      return ncclFloat64;
  }
  return ncclUint8;
}

ncclRedOp_t nccl_op(dist::ReduceOp op, DType t) {
  if (t == DType::Bool)  // bools are 0 or 1: sum and max are "any", min and product "all"
    return op == dist::ReduceOp::Sum || op == dist::ReduceOp::Max ? ncclMax : ncclMin;
  switch (op) {
    case dist::ReduceOp::Sum:
      return ncclSum;
    case dist::ReduceOp::Avg:
      return ncclAvg;
    case dist::ReduceOp::Max:
      return ncclMax;
    case dist::ReduceOp::Min:
      return ncclMin;
    case dist::ReduceOp::Product:
      return ncclProd;
  }
  return ncclSum;
}

// A call in flight whose completion the backend has not seen yet (Note [NCCL deadlines]).
struct Pending {
  uint64_t seq = 0;
  cudaEvent_t event = nullptr;
  uint64_t slot = 0;      // flight recorder
  uint64_t deadline = 0;  // watchdog handle
};

// One group's communicator and what is in flight on it; shared with the watchdog's expiry
// actions, which may outlive the backend.
struct Comm {
  std::mutex mu;
  ncclComm_t nccl = nullptr;  // null once aborted
  std::atomic<bool> aborted{false};
  std::string abort_reason;  // under mu
  int device = 0;
  std::string group;
  int rank = 0, size = 1;
  uint64_t seq = 0;  // collectives issued
  std::deque<Pending> pending;
  std::vector<cudaEvent_t> spare_events;
  float* barrier_buf = nullptr;  // one float in device memory
};

// What one call is, for errors, the flight recorder and the debug check.
struct CallDesc {
  std::string_view op;
  int64_t numel = 0;  // elements this rank contributes
  DType dtype = DType::Float32;
  dist::ReduceOp reduce = dist::ReduceOp::Sum;
  int peer = -1;
};

std::string describe(const Comm& c, const CallDesc& d, uint64_t seq) {
  std::string peer = d.peer >= 0 ? fmt::format(", peer {}", d.peer) : "";
  return fmt::format(
      "group {} (rank {} of {}), collective {} of its NCCL communicator, {} {} elements on "
      "cuda:{}{}",
      c.group, c.rank, c.size, seq, d.numel, name(d.dtype), c.device, peer);
}

std::string nccl_error(ncclResult_t r, ncclComm_t comm) {
  const char* last = ncclGetLastError(comm);
  return fmt::format("{}{}{}", ncclGetErrorString(r), last && *last ? ": " : "", last ? last : "");
}

// Makes a blocking communicator (Note [Blocking communicators]) on a thread of its own, waiting
// for it until `timeout` has passed: NCCL's result, or nothing when the time ran out (the thread
// then stays blocked in NCCL, on state it shares with nobody).
std::optional<ncclResult_t> init_blocking(ncclComm_t& out, int device, int size, ncclUniqueId id,
                                          int rank, std::string name,
                                          std::chrono::milliseconds timeout) {
  struct Init {
    std::mutex mu;
    std::condition_variable cv;
    bool done = false;
    bool abandoned = false;  // the caller stopped waiting: the thread aborts what it made
    ncclResult_t result = ncclSuccess;
    ncclComm_t comm = nullptr;
    std::string name;
  };
  auto init = std::make_shared<Init>();
  init->name = std::move(name);
  std::thread([init, device, size, id, rank] {
    ncclComm_t comm = nullptr;
    ncclResult_t result = ncclUnhandledCudaError;
    if (cudaSetDevice(device) == cudaSuccess) {
      ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
      config.blocking = 1;
      config.commName = init->name.c_str();
      result = ncclCommInitRankConfig(&comm, size, id, rank, &config);
      // NCCL_COMM_BLOCKING=0 in the environment overrides config.blocking: then poll.
      while (result == ncclInProgress) {
        std::this_thread::yield();
        ncclCommGetAsyncError(comm, &result);
      }
    }
    std::unique_lock<std::mutex> lock(init->mu);
    if (init->abandoned) {
      lock.unlock();
      if (comm) ncclCommAbort(comm);  // a peer that finished set-up meets its own deadline
      return;
    }
    init->done = true;
    init->result = result;
    init->comm = comm;
    init->cv.notify_all();
  }).detach();
  std::unique_lock<std::mutex> lock(init->mu);
  if (!init->cv.wait_for(lock, timeout, [&] { return init->done; })) {
    init->abandoned = true;
    return std::nullopt;
  }
  out = init->comm;
  return init->result;
}

// Raises the error of a call on an aborted communicator (under c.mu).
[[noreturn]] void raise_aborted(const Comm& c, std::string_view op) {
  throw DistributedError(
      fmt::format("[{}] the NCCL communicator of group {} (rank {} of {}) was aborted: {}. Its "
                  "collectives cannot go on; make a new group",
                  op, c.group, c.rank, c.size, c.abort_reason));
}

// Marks `c` aborted with `why` (under c.mu): its calls in flight fail, and with `post` the
// device's next synchronize raises `why` (for a failure the caller has not seen). Returns the
// communicator for the caller to ncclCommAbort after releasing the lock.
ncclComm_t mark_aborted(Comm& c, const std::string& why, bool post) {
  ncclComm_t n = c.nccl;
  c.nccl = nullptr;
  c.aborted = true;
  c.abort_reason = why;
  for (Pending& p : c.pending) {
    dist::watchdog_disarm(p.deadline);
    FlightRecorder::get().finish(p.slot, CallState::Failed);
    cudaEventDestroy(p.event);  // released once the stream passes it
  }
  c.pending.clear();
  if (post) post_device_error(c.device, std::make_exception_ptr(DistributedError(why)));
  return n;
}

// The watchdog's action for call `seq` of `w` (Note [NCCL deadlines]).
void on_expiry(const std::weak_ptr<Comm>& w, uint64_t seq, cudaEvent_t event,
               const std::string& what) {
  std::shared_ptr<Comm> c = w.lock();
  if (!c) return;
  ncclComm_t doomed = nullptr;
  std::string message;
  {
    std::lock_guard<std::mutex> lock(c->mu);
    if (c->aborted) return;
    bool in_flight = std::any_of(c->pending.begin(), c->pending.end(),
                                 [seq](const Pending& p) { return p.seq == seq; });
    if (!in_flight) return;  // retired while this action waited for the lock
    cudaSetDevice(c->device);
    cudaError_t q = cudaEventQuery(event);
    if (q == cudaSuccess) return;  // done; the next call retires it
    cudaGetLastError();
    std::string path = FlightRecorder::get().dump(dist::rank());
    message = fmt::format(
        "{}; its NCCL communicator was aborted (ncclCommAbort) and the result is not valid; "
        "flight recorder written to {}",
        what, path.empty() ? "(could not write)" : path);
    doomed = mark_aborted(*c, message, true);
  }
  fmt::print(stderr, "kiln: DistributedError: {}\n", message);
  std::fflush(stderr);
  if (doomed) ncclCommAbort(doomed);
}

// Retires the calls in flight that have completed, oldest first (under c.mu).
void retire(Comm& c) {
  while (!c.pending.empty()) {
    Pending& p = c.pending.front();
    cudaError_t q = cudaEventQuery(p.event);
    if (q == cudaErrorNotReady) {
      cudaGetLastError();
      return;
    }
    KILN_CUDA_CHECK(q);
    dist::watchdog_disarm(p.deadline);
    FlightRecorder::get().finish(p.slot, CallState::Completed);
    c.spare_events.push_back(p.event);
    c.pending.pop_front();
  }
}

// Under KILN_DIST_DEBUG=detail: every rank all-gathers what it is about to call, over the
// group's MPI communicator for this stream, and all raise when the calls differ (as the MPI
// backend does, Note [Debug checks] in kiln/distributed/mpi_comm.cpp). Skipped for send and
// recv, which only two ranks call. `seq` is the number the call will have on its path (the
// NCCL communicator's or the custom all-reduce's), as the flight recorder and a timeout name it.
void debug_check(const dist::ProcessGroup& g, Device device, const CallDesc& d, uint64_t seq) {
  if (d.op == "send" || d.op == "recv_") return;
  dist::MpiComm* comm = g.comm(dist::stream_key(device));
  if (!comm || comm->size() == 1) return;
  dist::check_same_call(*comm, dist::CallInfo{d.op, &g, d.dtype, d.numel, d.reduce, d.peer}, seq,
                        dist::timeout_for(g));
}

class NcclBackend final : public dist::CollectiveBackend {
 public:
  explicit NcclBackend(dist::ProcessGroup& g);
  std::string_view name() const override { return "nccl"; }

  void all_reduce(const Tensor& in, const Tensor& out, const dist::Collective& c) override {
    // Note [Custom all-reduce on CUDA]. A tensor on another device goes on to issue(), which
    // names the communicator's device: the custom path would name its own.
    if (custom_ && in.device().index() == comm_->device && custom_->eligible(in, c.reduce)) {
      if (dist::debug_detail())
        debug_check(*c.group, in.device(), {c.op, in.numel(), in.dtype(), c.reduce},
                    custom_->calls() + 1);
      return custom_->all_reduce(in, out, c);
    }
    const void* src = in.impl()->data();
    void* dst = out.impl()->data();
    const size_t n = static_cast<size_t>(in.numel());
    const ncclDataType_t type = nccl_type(in.dtype());
    const ncclRedOp_t op = nccl_op(c.reduce, in.dtype());
    issue(c, in.device(), {c.op, in.numel(), in.dtype(), c.reduce}, n == 0,
          [&](ncclComm_t comm, cudaStream_t s) {
            return ncclAllReduce(src, dst, n, type, op, comm, s);
          });
  }
  void all_gather(const Tensor& in, const Tensor& out, const dist::Collective& c) override {
    const void* src = in.impl()->data();
    void* dst = out.impl()->data();
    const size_t n = static_cast<size_t>(in.numel());
    const ncclDataType_t type = nccl_type(in.dtype());
    issue(
        c, in.device(), {c.op, in.numel(), in.dtype()}, n == 0,
        [&](ncclComm_t comm, cudaStream_t s) { return ncclAllGather(src, dst, n, type, comm, s); });
  }
  void reduce_scatter(const Tensor& in, const Tensor& out, const dist::Collective& c) override {
    const void* src = in.impl()->data();
    void* dst = out.impl()->data();
    const size_t n = static_cast<size_t>(out.numel());
    const ncclDataType_t type = nccl_type(in.dtype());
    const ncclRedOp_t op = nccl_op(c.reduce, in.dtype());
    issue(c, in.device(), {c.op, in.numel(), in.dtype(), c.reduce}, n == 0,
          [&](ncclComm_t comm, cudaStream_t s) {
            return ncclReduceScatter(src, dst, n, type, op, comm, s);
          });
  }
  void broadcast(const Tensor& t, const dist::Collective& c) override {
    void* buf = t.impl()->data();
    const size_t n = static_cast<size_t>(t.numel());
    const ncclDataType_t type = nccl_type(t.dtype());
    const int root = c.peer;
    issue(c, t.device(), {c.op, t.numel(), t.dtype(), c.reduce, root}, n == 0,
          [&](ncclComm_t comm, cudaStream_t s) {
            return ncclBroadcast(buf, buf, n, type, root, comm, s);
          });
  }
  void all_to_all(const Tensor& in, const Tensor& out, const dist::Collective& c) override {
    const char* src = static_cast<const char*>(in.impl()->data());
    char* dst = static_cast<char*>(out.impl()->data());
    const size_t isz = in.itemsize();
    const ncclDataType_t type = nccl_type(in.dtype());
    std::span<const int64_t> sc = c.send_counts, rc = c.recv_counts;
    const bool empty = in.numel() == 0 && out.numel() == 0;
    issue(c, in.device(), {c.op, in.numel(), in.dtype()}, empty,
          [&](ncclComm_t comm, cudaStream_t s) {
            ncclResult_t r = ncclGroupStart();
            size_t so = 0, ro = 0;
            for (size_t p = 0; p < sc.size() && r == ncclSuccess; ++p) {
              const auto ns = static_cast<size_t>(sc[p]), nr = static_cast<size_t>(rc[p]);
              const int peer = static_cast<int>(p);
              if (ns) r = ncclSend(src + so * isz, ns, type, peer, comm, s);
              if (nr && r == ncclSuccess) r = ncclRecv(dst + ro * isz, nr, type, peer, comm, s);
              so += ns;
              ro += nr;
            }
            ncclResult_t end = ncclGroupEnd();
            return r != ncclSuccess ? r : end;
          });
  }
  void send(const Tensor& t, const dist::Collective& c) override {
    const void* buf = t.impl()->data();
    const size_t n = static_cast<size_t>(t.numel());
    const ncclDataType_t type = nccl_type(t.dtype());
    const int peer = c.peer;
    issue(c, t.device(), {c.op, t.numel(), t.dtype(), c.reduce, peer}, n == 0,
          [&](ncclComm_t comm, cudaStream_t s) { return ncclSend(buf, n, type, peer, comm, s); });
  }
  void recv(const Tensor& t, const dist::Collective& c) override {
    void* buf = t.impl()->data();
    const size_t n = static_cast<size_t>(t.numel());
    const ncclDataType_t type = nccl_type(t.dtype());
    const int peer = c.peer;
    issue(c, t.device(), {c.op, t.numel(), t.dtype(), c.reduce, peer}, n == 0,
          [&](ncclComm_t comm, cudaStream_t s) { return ncclRecv(buf, n, type, peer, comm, s); });
  }
  void barrier(Device device, const dist::Collective& c) override {
    float* buf = comm_->barrier_buf;
    issue(c, device, {c.op, 1, DType::Float32}, false, [&](ncclComm_t comm, cudaStream_t s) {
      return ncclAllReduce(buf, buf, 1, ncclFloat32, ncclSum, comm, s);
    });
  }

 private:
  // Runs `enqueue(comm, stream)` (the NCCL calls of one collective) on the current stream of
  // `device`, with its sequence number, flight-recorder entry and deadline (Note [NCCL
  // deadlines]). `empty`: nothing to move (every rank agrees), so nothing is queued.
  template <class F>
  void issue(const dist::Collective& call, Device device, CallDesc d, bool empty, F&& enqueue);

  std::shared_ptr<Comm> comm_;
  std::unique_ptr<CustomAllReduce> custom_;  // small all-reduces within a host; may be null
};

NcclBackend::NcclBackend(dist::ProcessGroup& g) : comm_(std::make_shared<Comm>()) {
  Comm& c = *comm_;
  c.device = nccl_device();
  c.group = g.name();
  c.rank = g.rank();
  c.size = g.size();
  // Rank 0's id, or its failure, reaches every rank: no rank waits for an id that never comes.
  struct {
    int ok = 1;
    ncclUniqueId id{};
  } boot;
  std::string id_error;
  if (g.rank() == 0) {
    ncclResult_t r = ncclGetUniqueId(&boot.id);
    if (r != ncclSuccess) {
      boot.ok = 0;
      id_error = nccl_error(r, nullptr);
    }
  }
  g.base_comm()->broadcast_bytes(&boot, sizeof boot, 0);
  if (!boot.ok)
    throw DistributedError(fmt::format("[nccl] group {} (rank {} of {}): ncclGetUniqueId failed{}",
                                       c.group, c.rank, c.size,
                                       id_error.empty() ? " on rank 0" : ": " + id_error));
  current_stream(c.device);  // makes c.device this thread's CUDA device
  const std::chrono::milliseconds timeout = dist::timeout_for(g);
  std::optional<ncclResult_t> r =
      init_blocking(c.nccl, c.device, c.size, boot.id, c.rank, "kiln:" + c.group, timeout);
  if (!r || *r != ncclSuccess) {
    std::string why = !r ? fmt::format("timed out after {} ms (a rank of the group did not join)",
                                       timeout.count())
                         : nccl_error(*r, c.nccl);
    if (r && c.nccl) ncclCommAbort(c.nccl);
    c.nccl = nullptr;
    throw DistributedError(fmt::format(
        "[nccl] making the NCCL communicator of group {} (rank {} of {}) on cuda:{} failed: {}",
        c.group, c.rank, c.size, c.device, why));
  }
  KILN_CUDA_CHECK(cudaMalloc(&c.barrier_buf, sizeof(float)));
  KILN_CUDA_CHECK(cudaMemset(c.barrier_buf, 0, sizeof(float)));
  custom_ = CustomAllReduce::make(g, c.device);
}

template <class F>
void NcclBackend::issue(const dist::Collective& call, Device device, CallDesc d, bool empty,
                        F&& enqueue) {
  Comm& c = *comm_;
  KILN_CHECK_DEVICE(device.index() == c.device,
                    "[{}] the tensor is on {} but the NCCL communicator of group {} (rank {} of "
                    "{}) serves cuda:{}: each process runs its collectives on one device, its "
                    "local rank modulo the {} devices present",
                    d.op, device, c.group, c.rank, c.size, c.device, device_count());
  if (c.aborted) {
    std::lock_guard<std::mutex> lock(c.mu);
    raise_aborted(c, d.op);
  }
  cudaStream_t stream = current_stream(c.device);
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  KILN_CUDA_CHECK(cudaStreamIsCapturing(stream, &capture));
  if (dist::debug_detail()) {
    uint64_t next = 0;
    {
      std::lock_guard<std::mutex> lock(c.mu);
      next = c.seq + 1;
    }
    debug_check(*call.group, device, d, next);
  }
  if (empty) return;
  const std::chrono::milliseconds timeout = dist::timeout_for(*call.group);
  const Clock::time_point deadline = Clock::now() + timeout;
  FlightRecorder& fr = FlightRecorder::get();
  ncclComm_t doomed = nullptr;
  std::string failure;
  {
    std::lock_guard<std::mutex> lock(c.mu);
    if (c.aborted) raise_aborted(c, d.op);
    // A capturing thread may not query events (cudaErrorStreamCaptureUnsupported would end its
    // capture); the next eager call retires what finished meanwhile.
    if (capture == cudaStreamCaptureStatusNone) retire(c);
    ncclResult_t async = ncclSuccess;
    ncclCommGetAsyncError(c.nccl, &async);
    const uint64_t seq = ++c.seq;
    const uint64_t slot = fr.start(d.op, c.group, seq, d.numel, d.dtype, d.peer);
    // A blocking call only queues kernels (Note [Blocking communicators]); with
    // NCCL_COMM_BLOCKING=0 in the environment it may return ncclInProgress, polled to the deadline.
    ncclResult_t r = async == ncclSuccess ? enqueue(c.nccl, stream) : async;
    while (r == ncclInProgress && Clock::now() < deadline) {
      std::this_thread::yield();
      ncclCommGetAsyncError(c.nccl, &r);
    }
    if (r == ncclSuccess && capture != cudaStreamCaptureStatusNone) {
      fr.finish(slot, CallState::Completed);  // recorded into the graph; runs at each replay
      return;
    }
    if (r == ncclSuccess) {
      cudaEvent_t event = nullptr;
      if (!c.spare_events.empty()) {
        event = c.spare_events.back();
        c.spare_events.pop_back();
      } else {
        KILN_CUDA_CHECK(cudaEventCreateWithFlags(&event, cudaEventDisableTiming));
      }
      KILN_CUDA_CHECK(cudaEventRecord(event, stream));
      std::string what = fmt::format("[{}] timed out after {} ms on {}", d.op, timeout.count(),
                                     describe(c, d, seq));
      std::weak_ptr<Comm> w = comm_;
      uint64_t handle =
          dist::watchdog_arm(deadline, [w, seq, event, what] { on_expiry(w, seq, event, what); });
      c.pending.push_back({seq, event, slot, handle});
      return;
    }
    fr.finish(slot, CallState::Failed);
    failure = r == ncclInProgress
                  ? fmt::format("[{}] timed out after {} ms queueing on {}", d.op, timeout.count(),
                                describe(c, d, seq))
                  : fmt::format("[{}] NCCL failed{} on {}: {}", d.op,
                                async != ncclSuccess ? " earlier (an asynchronous error)" : "",
                                describe(c, d, seq), nccl_error(r, c.nccl));
    doomed = mark_aborted(c, failure, false);
  }
  if (doomed) ncclCommAbort(doomed);
  throw DistributedError(failure);
}

}  // namespace

void register_collective_backends() {
  // Note [Blocking communicators]: peers connect during set-up. Set here, when the plugin
  // loads, before any communicator (NCCL reads it once) and before NCCL starts threads.
  setenv("NCCL_RUNTIME_CONNECT", "0", /*overwrite=*/0);
  dist::register_collective_backend("cuda", [](dist::ProcessGroup& g) {
    if (!nccl_enabled()) return make_custom_only_backend(g);  // KILN_NCCL=0
    return std::unique_ptr<dist::CollectiveBackend>(new NcclBackend(g));
  });
}

#endif  // KILN_HAVE_NCCL

}  // namespace kiln::cuda

#include "kiln/distributed/mpi_comm.h"

#include <algorithm>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "kiln/core/error.h"
#include "kiln/core/half.h"
#include "kiln/distributed/collectives.h"
#include "kiln/distributed/flight_recorder.h"
#include "kiln/distributed/init.h"
#include "kiln/distributed/watchdog.h"

#ifdef KILN_HAVE_MPI
#include <mpi.h>
#endif

// Note [Deadlines]
// Every collective gets a deadline (its group's timeout, or a TimeoutGuard's). The call runs
// as the plain blocking MPI call, as fast as a bare MPI loop, while the process's watchdog
// thread (watchdog.h) holds the deadline: when it passes, the watchdog writes the flight
// recorder, prints a DistributedError naming the op, the group, the call's sequence number
// and its sizes, and ends the job with MPI_Abort. Nothing else can end it: MPI offers no way to
// cancel a collective, and MPI_Finalize hangs when a peer is dead. Errors MPI reports
// (MPI_ERRORS_RETURN on every communicator) raise a DistributedError in the caller. The
// bootstrap calls (MPI_Comm_dup, MPI_Comm_split and the byte exchanges that set up groups and
// device backends) have a deadline too, their group's timeout (the default one while a group
// is being made, before set_timeout can reach it): a thread's communicator for a group is made
// at its first collective there (Note [One communicator per stream] in process_group.cpp), so a
// rank that fails before its first collective would otherwise leave the others in MPI_Comm_dup
// for ever (tests/distributed/fault_test.cpp, scenario throw_first).
//
// Note [Debug checks]
// With KILN_DIST_DEBUG=detail every collective (not send/recv) first all-gathers a fingerprint
// of the call (op, sizes, dtype, reduction, root, sequence number) over the same communicator
// and compares: ranks that call different collectives, or the same one with other sizes, all
// raise the same DistributedError listing what each rank called, instead of hanging or
// reducing garbage. A rank that skips a collective is caught the same way by its next one (or
// by the deadline).
namespace kiln::distributed {
namespace {

// "group world (rank 0 of 2), collective 2 of its communicator, 4 float32 elements, peer 1";
// a barrier moves no elements and says none.
std::string describe(const CallInfo& c, uint64_t seq, int rank, int size) {
  std::string elements =
      c.op == "barrier" ? "" : fmt::format(", {} {} elements", c.numel, name(c.dtype));
  std::string peer = c.peer >= 0 ? fmt::format(", peer {}", c.peer) : "";
  return fmt::format("group {} (rank {} of {}), collective {} of its communicator{}{}",
                     c.group ? c.group->name() : std::string("?"), rank, size, seq, elements, peer);
}

bool is_16bit_float(DType t) { return t == DType::Float16 || t == DType::BFloat16; }

void to_float(const void* in, float* out, int64_t n, DType t) {
  if (t == DType::Float16) {
    auto* p = static_cast<const Half*>(in);
    for (int64_t i = 0; i < n; ++i) out[i] = p[i];
  } else {
    auto* p = static_cast<const BFloat16*>(in);
    for (int64_t i = 0; i < n; ++i) out[i] = p[i];
  }
}
void from_float(const float* in, void* out, int64_t n, DType t) {
  if (t == DType::Float16) {
    auto* p = static_cast<Half*>(out);
    for (int64_t i = 0; i < n; ++i) p[i] = Half(in[i]);
  } else {
    auto* p = static_cast<BFloat16*>(out);
    for (int64_t i = 0; i < n; ++i) p[i] = BFloat16(in[i]);
  }
}
// Divides n elements by `d` in place (Avg: MPI has no average).
void divide(void* buf, int64_t n, DType t, int d) {
  if (t == DType::Float64) {
    auto* p = static_cast<double*>(buf);
    for (int64_t i = 0; i < n; ++i) p[i] /= d;
  } else {
    auto* p = static_cast<float*>(buf);
    for (int64_t i = 0; i < n; ++i) p[i] /= static_cast<float>(d);
  }
}

// Note [16-bit reductions]
// MPI has no float16 or bfloat16. A reduction of either widens every element to float32,
// reduces in float32 (averaging there too) and rounds once at the end, so every rank gets the
// same bits and no precision is lost between ranks. Widened holds the float32 copies for one
// call (all_reduce, reduce_scatter, the non-blocking all-reduce); for other dtypes it passes
// the caller's buffers through and only averages.
class Widened {
 public:
  // `in` holds in_count elements of `t`, `out` gets out_count; in place when they are equal
  // and the counts match.
  Widened(const void* in, int64_t in_count, void* out, int64_t out_count, DType t)
      : in_(in), out_(out), out_count_(out_count), dtype_(t) {
    if (!is_16bit_float(t)) return;
    wide_in_.resize(in_count);
    to_float(in, wide_in_.data(), in_count, t);
    if (in != out || in_count != out_count) wide_out_.resize(out_count);
  }
  bool in_place() const { return is_16bit_float(dtype_) ? wide_out_.empty() : in_ == out_; }
  const void* send() const { return is_16bit_float(dtype_) ? wide_in_.data() : in_; }
  void* recv() {
    if (!is_16bit_float(dtype_)) return out_;
    return wide_out_.empty() ? wide_in_.data() : wide_out_.data();
  }
  // Averages (Avg over `size` ranks) and rounds the float32 result into `out`.
  void finish(ReduceOp op, int size) {
    const DType t = is_16bit_float(dtype_) ? DType::Float32 : dtype_;
    if (op == ReduceOp::Avg) divide(recv(), out_count_, t, size);
    if (is_16bit_float(dtype_)) from_float(static_cast<float*>(recv()), out_, out_count_, dtype_);
  }

 private:
  const void* in_;
  void* out_;
  int64_t out_count_;
  DType dtype_;
  std::vector<float> wide_in_, wide_out_;
};

int to_int(int64_t n, const CallInfo& c, const char* what) {
  if (n > INT_MAX)
    throw DistributedError(fmt::format(
        "[{}] {} of {} exceeds MPI's int count ({}); split the tensor", c.op, what, n, INT_MAX));
  return static_cast<int>(n);
}

#ifdef KILN_HAVE_MPI
MPI_Comm& mpi(void* h) { return *static_cast<MPI_Comm*>(h); }

// `call` is the call's text (KILN_MPI_CALL): the message names its function.
void check(int rc, const CallInfo& c, const char* call, int rank, int size, uint64_t seq) {
  if (rc == MPI_SUCCESS) return;
  char msg[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, msg, &len);
  std::string_view fn(call);
  throw DistributedError(fmt::format("[{}] {} failed on {}: {}", c.op, fn.substr(0, fn.find('(')),
                                     describe(c, seq, rank, size), std::string(msg, len)));
}
void check_bootstrap(int rc, const char* call) {
  if (rc == MPI_SUCCESS) return;
  char msg[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, msg, &len);
  throw DistributedError(fmt::format("[distributed] {} failed: {}", call, std::string(msg, len)));
}

MPI_Datatype mpi_type(DType t) {
  switch (t) {
    case DType::Bool:
      return MPI_C_BOOL;
    case DType::UInt8:
      return MPI_UINT8_T;
    case DType::Int32:
      return MPI_INT32_T;
    case DType::Int64:
      return MPI_INT64_T;
    case DType::Float16:
    case DType::BFloat16:
    case DType::Float32:
      return MPI_FLOAT;  // 16-bit floats are reduced in float32
    case DType::Float64:
      return MPI_DOUBLE;
  }
  return MPI_BYTE;
}
MPI_Op mpi_op(ReduceOp op, DType t) {
  if (t == DType::Bool)  // sum and max are "any", min and product "all"
    return op == ReduceOp::Sum || op == ReduceOp::Max ? MPI_LOR : MPI_LAND;
  switch (op) {
    case ReduceOp::Sum:
    case ReduceOp::Avg:
      return MPI_SUM;
    case ReduceOp::Max:
      return MPI_MAX;
    case ReduceOp::Min:
      return MPI_MIN;
    case ReduceOp::Product:
      return MPI_PROD;
  }
  return MPI_SUM;
}

// What every rank all-gathers under KILN_DIST_DEBUG=detail (Note [Debug checks]).
struct Fingerprint {
  char op[40] = {};
  int64_t numel = 0;
  int32_t dtype = 0;
  int32_t reduce = 0;
  int32_t peer = 0;
  int32_t pad = 0;
  uint64_t seq = 0;
};
#endif

// The deadline of a bootstrap call (Note [Deadlines]): the group's timeout when the call
// sets up a communicator of a group (MpiComm::set_setup_timeout), else the default one.
class BootstrapDeadline {
 public:
  BootstrapDeadline(const char* call, int rank, int size, std::chrono::milliseconds timeout)
      : deadline_(
            Clock::now() + timeout, [call, rank, size, timeout, world = kiln::distributed::rank()] {
              std::string path = FlightRecorder::get().dump(world);
              abort_job(fmt::format(
                  "kiln: DistributedError: [distributed] {} timed out after {} ms on rank "
                  "{} of {}: it makes or sets up a group's communicator (a thread's or "
                  "stream's own is made at its first collective on the group), and some "
                  "rank has not called it; flight recorder written to {}",
                  call, timeout.count(), rank, size, path.empty() ? "(could not write)" : path));
            }) {}

 private:
  Deadline deadline_;
};

#ifdef KILN_HAVE_MPI
void gather_bytes(void* handle, const void* in, void* out, size_t nbytes_per_rank) {
  int n = static_cast<int>(nbytes_per_rank);
  check_bootstrap(MPI_Allgather(in, n, MPI_BYTE, out, n, MPI_BYTE, mpi(handle)), "MPI_Allgather");
}
#endif

}  // namespace

bool debug_detail() {
  static const bool on = [] {
    const char* v = std::getenv("KILN_DIST_DEBUG");
    return v && std::string_view(v) == "detail";
  }();
  return on;
}

void check_same_call([[maybe_unused]] const MpiComm& comm, [[maybe_unused]] const CallInfo& c,
                     [[maybe_unused]] uint64_t seq,
                     [[maybe_unused]] std::chrono::milliseconds timeout) {
#ifdef KILN_HAVE_MPI
  if (comm.solo_world()) return;
  Fingerprint mine;
  std::strncpy(mine.op, std::string(c.op).c_str(), sizeof(mine.op) - 1);
  mine.numel = c.op == "all_to_all_single" ? 0 : c.numel;  // its sizes differ by rank
  mine.dtype = static_cast<int32_t>(c.dtype);
  mine.reduce = static_cast<int32_t>(c.reduce);
  mine.peer = c.peer;
  mine.seq = seq;
  std::vector<Fingerprint> all(comm.size());
  std::unique_ptr<Deadline> deadline;
  if (timeout.count() > 0) {
    const int world = rank();
    deadline = std::make_unique<Deadline>(Clock::now() + timeout, [c, seq, timeout, world] {
      std::string path = FlightRecorder::get().dump(world);
      abort_job(fmt::format(
          "kiln: DistributedError: [{}] timed out after {} ms in KILN_DIST_DEBUG=detail's check "
          "of collective {} (some rank has not called it); flight recorder written to {}",
          c.op, timeout.count(), seq, path.empty() ? "(could not write)" : path));
    });
  }
  gather_bytes(comm.handle(), &mine, all.data(), sizeof(Fingerprint));
  bool same = std::all_of(all.begin(), all.end(), [&](const Fingerprint& f) {
    return std::memcmp(&f, &all[0], sizeof(Fingerprint)) == 0;
  });
  if (same) return;
  std::string calls;
  for (size_t r = 0; r < all.size(); ++r) {
    const Fingerprint& f = all[r];
    calls += fmt::format("{}rank {}: {} of {} {} (reduce {}, peer {}, collective {})",
                         r ? "; " : "", r, f.op, f.numel, name(static_cast<DType>(f.dtype)),
                         reduce_op_name(static_cast<ReduceOp>(f.reduce)), f.peer, f.seq);
  }
  throw DistributedError(
      fmt::format("[{}] ranks disagree on collective {} of group {} "
                  "(KILN_DIST_DEBUG=detail): {}",
                  c.op, seq, c.group ? c.group->name() : std::string("?"), calls));
#endif
}

std::unique_ptr<MpiComm> MpiComm::solo() { return std::unique_ptr<MpiComm>(new MpiComm()); }

MpiComm::~MpiComm() {
#ifdef KILN_HAVE_MPI
  if (!handle_) return;
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (owned_ && !finalized) MPI_Comm_free(&mpi(handle_));
  delete static_cast<MPI_Comm*>(handle_);
#endif
}

std::unique_ptr<MpiComm> MpiComm::adopt([[maybe_unused]] void* mpi_comm) {
#ifdef KILN_HAVE_MPI
  std::unique_ptr<MpiComm> c(new MpiComm());
  MPI_Comm comm = *static_cast<MPI_Comm*>(mpi_comm);
  c->handle_ = new MPI_Comm(comm);
  c->owned_ = comm != MPI_COMM_WORLD && comm != MPI_COMM_SELF;
  check_bootstrap(MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN), "MPI_Comm_set_errhandler");
  check_bootstrap(MPI_Comm_rank(comm, &c->rank_), "MPI_Comm_rank");
  check_bootstrap(MPI_Comm_size(comm, &c->size_), "MPI_Comm_size");
  return c;
#else
  throw DistributedError("[distributed] Kiln was built without MPI");
#endif
}

std::chrono::milliseconds MpiComm::setup_timeout() const {
  const int64_t ms = setup_timeout_ms_;
  return ms > 0 ? std::chrono::milliseconds(ms) : default_timeout();
}

std::unique_ptr<MpiComm> MpiComm::dup() const {
  std::unique_ptr<MpiComm> c = solo();
#ifdef KILN_HAVE_MPI
  if (handle_) {
    MPI_Comm d;
    BootstrapDeadline deadline("MPI_Comm_dup", rank_, size_, setup_timeout());
    check_bootstrap(MPI_Comm_dup(mpi(handle_), &d), "MPI_Comm_dup");
    c = adopt(&d);
  }
#endif
  c->setup_timeout_ms_ = setup_timeout_ms_.load();
  return c;
}

std::unique_ptr<MpiComm> MpiComm::split(int color, int key) const {
  if (!handle_) return color < 0 ? nullptr : solo();
#ifdef KILN_HAVE_MPI
  MPI_Comm d;
  BootstrapDeadline deadline("MPI_Comm_split", rank_, size_, setup_timeout());
  check_bootstrap(MPI_Comm_split(mpi(handle_), color < 0 ? MPI_UNDEFINED : color, key, &d),
                  "MPI_Comm_split");
  if (d == MPI_COMM_NULL) return nullptr;
  return adopt(&d);
#else
  return nullptr;
#endif
}

// Runs `body` (the MPI calls of one collective) with its sequence number, flight-recorder entry,
// deadline and, under KILN_DIST_DEBUG=detail, the cross-rank check first.
template <class F>
static void run_collective(MpiComm& comm, uint64_t seq, const CallInfo& c, F&& body) {
  const ProcessGroup* g = c.group;
  FlightRecorder& fr = FlightRecorder::get();
  uint64_t slot =
      fr.start(c.op, g ? std::string_view(g->name()) : "?", seq, c.numel, c.dtype, c.peer);
  std::chrono::milliseconds timeout = c.timeout.count() > 0 ? c.timeout
                                      : g                   ? timeout_for(*g)
                                                            : default_timeout();
  // The message is formatted only if the deadline passes: this runs on every collective.
  // (c.op is a literal and groups live until exit, so the copy of `c` stays valid.)
  const int world = rank(), group_rank = comm.rank(), group_size = comm.size();
  Deadline deadline(Clock::now() + timeout, [c, seq, group_rank, group_size, timeout, world] {
    std::string path = FlightRecorder::get().dump(world);
    abort_job(fmt::format(
        "kiln: DistributedError: [{}] timed out after {} ms on {}; flight recorder written to {}",
        c.op, timeout.count(), describe(c, seq, group_rank, group_size),
        path.empty() ? "(could not write)" : path));
  });
  try {
    body();
  } catch (...) {
    fr.finish(slot, CallState::Failed);
    throw;
  }
  fr.finish(slot, CallState::Completed);
}

#ifdef KILN_HAVE_MPI
// Note [Debug checks]: raises on every rank when the ranks' calls differ.
static void debug_check(MpiComm& comm, uint64_t seq, const CallInfo& c) {
  check_same_call(comm, c, seq, std::chrono::milliseconds(0));  // under run_collective's
}
#endif

// The common head of every collective: numbering, the debug check, then run_collective.
#define KILN_MPI_COLLECTIVE(c, ...)                                                              \
  do {                                                                                           \
    uint64_t seq_now = ++seq_;                                                                   \
    run_collective(*this, seq_now, c, [&] {                                                      \
      if (debug_detail() && c.op != "send" && c.op != "recv_") KILN_MPI_DEBUG_CHECK(c, seq_now); \
      __VA_ARGS__;                                                                               \
    });                                                                                          \
  } while (0)
#ifdef KILN_HAVE_MPI
#define KILN_MPI_DEBUG_CHECK(c, seq) debug_check(*this, seq, c)
#define KILN_MPI_CALL(call) check(call, c, #call, rank_, size_, seq_)
#else
#define KILN_MPI_DEBUG_CHECK(c, seq) ((void)0)
#endif

void MpiComm::all_reduce(const void* in, void* out, int64_t count, const CallInfo& c) {
  const size_t nbytes = static_cast<size_t>(count) * itemsize(c.dtype);
  if (!handle_) {
    if (in != out && nbytes) std::memmove(out, in, nbytes);
    return;
  }
#ifdef KILN_HAVE_MPI
  KILN_MPI_COLLECTIVE(c, {
    int n = to_int(count, c, "an all-reduce");
    MPI_Op op = mpi_op(c.reduce, c.dtype);
    Widened w(in, count, out, count, c.dtype);  // Note [16-bit reductions]
    KILN_MPI_CALL(MPI_Allreduce(w.in_place() ? MPI_IN_PLACE : w.send(), w.recv(), n,
                                mpi_type(c.dtype), op, mpi(handle_)));
    w.finish(c.reduce, size_);
  });
#endif
}

void MpiComm::all_gather(const void* in, void* out, int64_t count, const CallInfo& c) {
  const size_t nbytes = static_cast<size_t>(count) * itemsize(c.dtype);
  if (!handle_) {
    if (in != out && nbytes) std::memmove(out, in, nbytes);
    return;
  }
#ifdef KILN_HAVE_MPI
  KILN_MPI_COLLECTIVE(c, {
    int n = to_int(static_cast<int64_t>(nbytes), c, "a block's bytes");
    to_int(static_cast<int64_t>(nbytes) * size_, c, "the gathered bytes");
    KILN_MPI_CALL(MPI_Allgather(in, n, MPI_BYTE, out, n, MPI_BYTE, mpi(handle_)));
  });
#endif
}

void MpiComm::reduce_scatter(const void* in, void* out, int64_t count, const CallInfo& c) {
  const size_t nbytes = static_cast<size_t>(count) * itemsize(c.dtype);
  if (!handle_) {
    if (in != out && nbytes) std::memmove(out, in, nbytes);
    return;
  }
#ifdef KILN_HAVE_MPI
  KILN_MPI_COLLECTIVE(c, {
    int n = to_int(count, c, "a reduce-scatter block");
    to_int(count * size_, c, "a reduce-scatter");
    Widened w(in, count * size_, out, count, c.dtype);  // Note [16-bit reductions]
    KILN_MPI_CALL(MPI_Reduce_scatter_block(w.send(), w.recv(), n, mpi_type(c.dtype),
                                           mpi_op(c.reduce, c.dtype), mpi(handle_)));
    w.finish(c.reduce, size_);
  });
#endif
}

void MpiComm::broadcast(void* buf, int64_t count, int root, const CallInfo& c) {
  if (!handle_) return;
#ifdef KILN_HAVE_MPI
  KILN_MPI_COLLECTIVE(c, {
    int n = to_int(count * static_cast<int64_t>(itemsize(c.dtype)), c, "a broadcast's bytes");
    KILN_MPI_CALL(MPI_Bcast(buf, n, MPI_BYTE, root, mpi(handle_)));
  });
#else
  (void)buf, (void)count, (void)root, (void)c;
#endif
}

void MpiComm::all_to_all(const void* in, std::span<const int64_t> send_counts, void* out,
                         std::span<const int64_t> recv_counts, const CallInfo& c) {
  const int64_t isz = static_cast<int64_t>(itemsize(c.dtype));
  if (!handle_) {
    size_t nbytes = static_cast<size_t>(send_counts.empty() ? 0 : send_counts[0] * isz);
    if (in != out && nbytes) std::memmove(out, in, nbytes);
    return;
  }
#ifdef KILN_HAVE_MPI
  KILN_MPI_COLLECTIVE(c, {
    std::vector<int> sc(size_), sd(size_), rc(size_), rd(size_);
    int64_t so = 0, ro = 0;
    for (int r = 0; r < size_; ++r) {
      sc[r] = to_int(send_counts[r] * isz, c, "a send count's bytes");
      rc[r] = to_int(recv_counts[r] * isz, c, "a receive count's bytes");
      sd[r] = to_int(so, c, "a send offset");
      rd[r] = to_int(ro, c, "a receive offset");
      so += sc[r];
      ro += rc[r];
    }
    KILN_MPI_CALL(MPI_Alltoallv(in, sc.data(), sd.data(), MPI_BYTE, out, rc.data(), rd.data(),
                                MPI_BYTE, mpi(handle_)));
  });
#endif
}

void MpiComm::send(const void* buf, int64_t count, int dst, const CallInfo& c) {
  KILN_ASSERT(handle_, "send in a world of one passed validation");
#ifdef KILN_HAVE_MPI
  KILN_MPI_COLLECTIVE(c, {
    int n = to_int(count * static_cast<int64_t>(itemsize(c.dtype)), c, "a message's bytes");
    KILN_MPI_CALL(MPI_Send(buf, n, MPI_BYTE, dst, 0, mpi(handle_)));
  });
#else
  (void)buf, (void)count, (void)dst, (void)c;
#endif
}

void MpiComm::recv(void* buf, int64_t count, int src, const CallInfo& c) {
  KILN_ASSERT(handle_, "recv in a world of one passed validation");
#ifdef KILN_HAVE_MPI
  KILN_MPI_COLLECTIVE(c, {
    int n = to_int(count * static_cast<int64_t>(itemsize(c.dtype)), c, "a message's bytes");
    MPI_Status st;
    KILN_MPI_CALL(MPI_Recv(buf, n, MPI_BYTE, src, 0, mpi(handle_), &st));
    int got = 0;
    MPI_Get_count(&st, MPI_BYTE, &got);
    if (got != n)
      throw DistributedError(fmt::format("[recv_] expected {} bytes from rank {}, got {} ({})", n,
                                         src, got, describe(c, seq_, rank_, size_)));
  });
#else
  (void)buf, (void)count, (void)src, (void)c;
#endif
}

void MpiComm::barrier(const CallInfo& c) {
  if (!handle_) return;
#ifdef KILN_HAVE_MPI
  KILN_MPI_COLLECTIVE(c, { KILN_MPI_CALL(MPI_Barrier(mpi(handle_))); });
#endif
}

void MpiComm::broadcast_bytes(void* buf, size_t nbytes, int root) const {
  if (!handle_) return;
#ifdef KILN_HAVE_MPI
  KILN_CHECK(nbytes <= INT_MAX, "[distributed] a bootstrap broadcast of {} bytes", nbytes);
  BootstrapDeadline deadline("MPI_Bcast", rank_, size_, setup_timeout());
  check_bootstrap(MPI_Bcast(buf, static_cast<int>(nbytes), MPI_BYTE, root, mpi(handle_)),
                  "MPI_Bcast");
#else
  (void)buf, (void)nbytes, (void)root;
#endif
}

void MpiComm::all_gather_bytes(const void* in, void* out, size_t nbytes_per_rank) const {
  if (!handle_) {
    if (nbytes_per_rank) std::memmove(out, in, nbytes_per_rank);
    return;
  }
#ifdef KILN_HAVE_MPI
  BootstrapDeadline deadline("MPI_Allgather", rank_, size_, setup_timeout());
  gather_bytes(handle_, in, out, nbytes_per_rank);
#endif
}

namespace {
// A finished request (a world of one).
struct DoneRequest final : MpiComm::Request {
  bool test() override { return true; }
  void wait() override {}
};
#ifdef KILN_HAVE_MPI
struct MpiRequest final : MpiComm::Request {
  MPI_Request req = MPI_REQUEST_NULL;
  ReduceOp reduce = ReduceOp::Sum;
  int size = 1;
  std::unique_ptr<Widened> staging;  // Note [16-bit reductions]
  std::string op;
  uint64_t slot = 0;
  std::unique_ptr<Deadline> deadline;
  bool done = false;

  void complete() {
    done = true;
    deadline.reset();
    staging->finish(reduce, size);
    FlightRecorder::get().finish(slot, CallState::Completed);
  }
  bool test() override {
    if (done) return true;
    int flag = 0;
    int rc = MPI_Test(&req, &flag, MPI_STATUS_IGNORE);
    if (rc != MPI_SUCCESS) fail(rc);
    if (flag) complete();
    return done;
  }
  void wait() override {
    if (done) return;
    int rc = MPI_Wait(&req, MPI_STATUS_IGNORE);
    if (rc != MPI_SUCCESS) fail(rc);
    complete();
  }
  [[noreturn]] void fail(int rc) {
    done = true;
    deadline.reset();
    FlightRecorder::get().finish(slot, CallState::Failed);
    char msg[MPI_MAX_ERROR_STRING];
    int len = 0;
    MPI_Error_string(rc, msg, &len);
    throw DistributedError(
        fmt::format("[{}] MPI_Iallreduce failed: {}", op, std::string(msg, len)));
  }
  ~MpiRequest() override {
    // An abandoned request still has to finish: MPI owns the buffer until it does.
    if (!done && req != MPI_REQUEST_NULL) MPI_Wait(&req, MPI_STATUS_IGNORE);
  }
};
#endif
}  // namespace

std::unique_ptr<MpiComm::Request> MpiComm::start_all_reduce(void* buf, int64_t count,
                                                            const CallInfo& c) {
  if (!handle_) return std::make_unique<DoneRequest>();
#ifdef KILN_HAVE_MPI
  uint64_t seq = ++seq_;
  auto r = std::make_unique<MpiRequest>();
  r->reduce = c.reduce;
  r->size = size_;
  r->op = std::string(c.op);
  const ProcessGroup* g = c.group;
  r->slot = FlightRecorder::get().start(c.op, g ? g->name() : "?", seq, count, c.dtype, -1);
  std::chrono::milliseconds timeout = g ? timeout_for(*g) : default_timeout();
  std::string what = fmt::format("[{}] timed out after {} ms on {}", c.op, timeout.count(),
                                 describe(c, seq, rank_, size_));
  int world = kiln::distributed::rank();
  r->deadline = std::make_unique<Deadline>(Clock::now() + timeout, [what, world] {
    std::string path = FlightRecorder::get().dump(world);
    abort_job(fmt::format("kiln: DistributedError: {}; flight recorder written to {}", what,
                          path.empty() ? "(could not write)" : path));
  });
  int n = 0;
  try {
    // Note [Debug checks]. A blocking all-reduce on one rank never matches a non-blocking one on
    // another in MPI, so this one is checked under its own name.
    if (debug_detail()) {
      CallInfo checked = c;
      checked.op = "all_reduce_async";
      debug_check(*this, seq, checked);
    }
    n = to_int(count, c, "an all-reduce");
  } catch (...) {
    FlightRecorder::get().finish(r->slot, CallState::Failed);
    throw;
  }
  r->staging = std::make_unique<Widened>(buf, count, buf, count, c.dtype);
  int rc = MPI_Iallreduce(MPI_IN_PLACE, r->staging->recv(), n, mpi_type(c.dtype),
                          mpi_op(c.reduce, c.dtype), mpi(handle_), &r->req);
  if (rc != MPI_SUCCESS) r->fail(rc);
  return r;
#else
  (void)buf, (void)count, (void)c;
  return std::make_unique<DoneRequest>();
#endif
}

}  // namespace kiln::distributed

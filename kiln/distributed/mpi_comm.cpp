#include "kiln/distributed/mpi_comm.h"

#include <algorithm>
#include <array>
#include <cctype>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <utility>
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

// `fn` names the MPI function that returned `rc`.
void check(int rc, const CallInfo& c, const char* fn, int rank, int size, uint64_t seq) {
  if (rc == MPI_SUCCESS) return;
  char msg[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, msg, &len);
  throw DistributedError(fmt::format("[{}] {} failed on {}: {}", c.op, fn,
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

// ---------------------------------------------------------------- non-blocking scopes

namespace {
thread_local NonBlocking* tls_non_blocking = nullptr;
// A finished request (a world of one).
struct DoneRequest final : MpiComm::Request {
  bool test() override { return true; }
  void wait() override {}
};
}  // namespace

NonBlocking::NonBlocking() : previous_(tls_non_blocking) { tls_non_blocking = this; }
NonBlocking::~NonBlocking() { tls_non_blocking = previous_; }
NonBlocking* NonBlocking::current() { return tls_non_blocking; }
std::vector<std::unique_ptr<MpiComm::Request>> NonBlocking::take() {
  return std::exchange(requests_, {});
}

#ifdef KILN_HAVE_MPI
namespace {

// Note [Non-blocking collectives]
// Each collective below is written once, as its MPI call in both forms: `call(req, status)`
// makes the blocking call when `req` is null and the non-blocking one (MPI_I...) otherwise,
// and `finish` does what follows completion (averaging, rounding a 16-bit result, checking a
// received size). Without a NonBlocking scope on the thread the call blocks under its deadline
// (run_collective). Inside one it starts and returns: its request, holding the deadline, the
// flight-recorder entry and `finish`, goes to the scope, and the caller (a Work) completes it
// with test() or wait(). Open MPI progresses a started collective only inside MPI calls, so
// test() is how a caller lets it advance. The debug check names a started collective
// "<op>_async": MPI never matches a blocking collective on one rank with a non-blocking one on
// another, so the ranks must disagree there rather than hang.
using Finish = std::function<void(const MPI_Status&)>;

// "MPI_Allreduce" -> "MPI_Iallreduce".
std::string non_blocking_name(std::string_view fn) {
  std::string s = "MPI_I";
  s += static_cast<char>(std::tolower(static_cast<unsigned char>(fn[4])));
  s += fn.substr(5);
  return s;
}
// "all_reduce_" -> "all_reduce_async", "send" -> "send_async".
std::string async_name(std::string_view op) {
  if (!op.empty() && op.back() == '_') op.remove_suffix(1);
  return std::string(op) + "_async";
}

struct MpiRequest final : MpiComm::Request {
  MPI_Request req = MPI_REQUEST_NULL;
  Finish finish;
  std::string where;  // "[all_reduce_] MPI_Iallreduce ... on group world (rank 0 of 2), ..."
  uint64_t slot = 0;
  std::unique_ptr<Deadline> deadline;
  bool done = false;

  void complete(const MPI_Status& st) {
    done = true;
    deadline.reset();
    try {
      if (finish) finish(st);
    } catch (...) {
      FlightRecorder::get().finish(slot, CallState::Failed);
      throw;
    }
    FlightRecorder::get().finish(slot, CallState::Completed);
  }
  bool test() override {
    if (done) return true;
    int flag = 0;
    MPI_Status st;
    int rc = MPI_Test(&req, &flag, &st);
    if (rc != MPI_SUCCESS) fail(rc);
    if (flag) complete(st);
    return done;
  }
  void wait() override {
    if (done) return;
    MPI_Status st;
    int rc = MPI_Wait(&req, &st);
    if (rc != MPI_SUCCESS) fail(rc);
    complete(st);
  }
  [[noreturn]] void fail(int rc) {
    done = true;
    deadline.reset();
    FlightRecorder::get().finish(slot, CallState::Failed);
    char msg[MPI_MAX_ERROR_STRING];
    int len = 0;
    MPI_Error_string(rc, msg, &len);
    throw DistributedError(fmt::format("{}: {}", where, std::string(msg, len)));
  }
  ~MpiRequest() override {
    // An abandoned request still has to finish: MPI owns the buffers until it does.
    if (!done && req != MPI_REQUEST_NULL) MPI_Wait(&req, MPI_STATUS_IGNORE);
  }
};

// Note [Debug checks]: raises on every rank when the ranks' calls differ.
void debug_check(MpiComm& comm, uint64_t seq, const CallInfo& c) {
  check_same_call(comm, c, seq, std::chrono::milliseconds(0));  // under the caller's deadline
}
bool debug_checked(const CallInfo& c) {
  return debug_detail() && c.op != "send" && c.op != "recv_";
}

template <class Call>
std::unique_ptr<MpiComm::Request> start(MpiComm& comm, uint64_t seq, const CallInfo& c,
                                        const char* fn, Call& call, Finish finish) {
  auto r = std::make_unique<MpiRequest>();
  const ProcessGroup* g = c.group;
  FlightRecorder& fr = FlightRecorder::get();
  r->slot = fr.start(c.op, g ? std::string_view(g->name()) : "?", seq, c.numel, c.dtype, c.peer);
  std::chrono::milliseconds timeout = c.timeout.count() > 0 ? c.timeout
                                      : g                   ? timeout_for(*g)
                                                            : default_timeout();
  const std::string described = describe(c, seq, comm.rank(), comm.size());
  r->where = fmt::format("[{}] {} failed on {}", c.op, non_blocking_name(fn), described);
  std::string what =
      fmt::format("[{}] timed out after {} ms on {}", c.op, timeout.count(), described);
  int world = kiln::distributed::rank();
  r->deadline = std::make_unique<Deadline>(Clock::now() + timeout, [what, world] {
    std::string path = FlightRecorder::get().dump(world);
    abort_job(fmt::format("kiln: DistributedError: {}; flight recorder written to {}", what,
                          path.empty() ? "(could not write)" : path));
  });
  try {
    if (debug_checked(c)) {
      const std::string name = async_name(c.op);
      CallInfo checked = c;
      checked.op = name;
      debug_check(comm, seq, checked);
    }
    MPI_Status unused;
    int rc = call(&r->req, &unused);
    if (rc != MPI_SUCCESS) r->fail(rc);
  } catch (...) {
    if (!r->done) {
      r->done = true;
      r->deadline.reset();
      fr.finish(r->slot, CallState::Failed);
    }
    throw;
  }
  r->finish = std::move(finish);
  return r;
}

// Runs one collective: blocking, or started into the thread's NonBlocking scope (Note
// [Non-blocking collectives]). `fn` names the blocking MPI function in errors.
template <class Call>
void issue(MpiComm& comm, uint64_t seq, const CallInfo& c, const char* fn, Call&& call,
           Finish finish = {}) {
  if (NonBlocking* scope = NonBlocking::current()) {
    scope->add(start(comm, seq, c, fn, call, std::move(finish)));
    return;
  }
  run_collective(comm, seq, c, [&] {
    if (debug_checked(c)) debug_check(comm, seq, c);
    MPI_Status st;
    check(call(nullptr, &st), c, fn, comm.rank(), comm.size(), seq);
    if (finish) finish(st);
  });
}

// What follows a reduction: Note [16-bit reductions]. Empty when nothing does.
Finish reduced(std::shared_ptr<Widened> w, ReduceOp op, int size, DType t) {
  if (!is_16bit_float(t) && op != ReduceOp::Avg) return {};
  return [w = std::move(w), op, size](const MPI_Status&) { w->finish(op, size); };
}

}  // namespace
#endif

void MpiComm::all_reduce(const void* in, void* out, int64_t count, const CallInfo& c) {
  const size_t nbytes = static_cast<size_t>(count) * itemsize(c.dtype);
  if (!handle_) {
    if (in != out && nbytes) std::memmove(out, in, nbytes);
    return;
  }
#ifdef KILN_HAVE_MPI
  const int n = to_int(count, c, "an all-reduce");
  auto w = std::make_shared<Widened>(in, count, out, count, c.dtype);
  MPI_Comm comm = mpi(handle_);
  issue(
      *this, ++seq_, c, "MPI_Allreduce",
      [&](MPI_Request* r, MPI_Status*) {
        const void* send = w->in_place() ? MPI_IN_PLACE : w->send();
        MPI_Datatype t = mpi_type(c.dtype);
        MPI_Op op = mpi_op(c.reduce, c.dtype);
        return r ? MPI_Iallreduce(send, w->recv(), n, t, op, comm, r)
                 : MPI_Allreduce(send, w->recv(), n, t, op, comm);
      },
      reduced(w, c.reduce, size_, c.dtype));
#endif
}

void MpiComm::all_gather(const void* in, void* out, int64_t count, const CallInfo& c) {
  const size_t nbytes = static_cast<size_t>(count) * itemsize(c.dtype);
  if (!handle_) {
    if (in != out && nbytes) std::memmove(out, in, nbytes);
    return;
  }
#ifdef KILN_HAVE_MPI
  const int n = to_int(static_cast<int64_t>(nbytes), c, "a block's bytes");
  to_int(static_cast<int64_t>(nbytes) * size_, c, "the gathered bytes");
  MPI_Comm comm = mpi(handle_);
  issue(*this, ++seq_, c, "MPI_Allgather", [&](MPI_Request* r, MPI_Status*) {
    return r ? MPI_Iallgather(in, n, MPI_BYTE, out, n, MPI_BYTE, comm, r)
             : MPI_Allgather(in, n, MPI_BYTE, out, n, MPI_BYTE, comm);
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
  const int n = to_int(count, c, "a reduce-scatter block");
  to_int(count * size_, c, "a reduce-scatter");
  auto w = std::make_shared<Widened>(in, count * size_, out, count, c.dtype);
  MPI_Comm comm = mpi(handle_);
  issue(
      *this, ++seq_, c, "MPI_Reduce_scatter_block",
      [&](MPI_Request* r, MPI_Status*) {
        MPI_Datatype t = mpi_type(c.dtype);
        MPI_Op op = mpi_op(c.reduce, c.dtype);
        return r ? MPI_Ireduce_scatter_block(w->send(), w->recv(), n, t, op, comm, r)
                 : MPI_Reduce_scatter_block(w->send(), w->recv(), n, t, op, comm);
      },
      reduced(w, c.reduce, size_, c.dtype));
#endif
}

void MpiComm::broadcast(void* buf, int64_t count, int root, const CallInfo& c) {
  if (!handle_) return;
#ifdef KILN_HAVE_MPI
  const int n = to_int(count * static_cast<int64_t>(itemsize(c.dtype)), c, "a broadcast's bytes");
  MPI_Comm comm = mpi(handle_);
  issue(*this, ++seq_, c, "MPI_Bcast", [&](MPI_Request* r, MPI_Status*) {
    return r ? MPI_Ibcast(buf, n, MPI_BYTE, root, comm, r)
             : MPI_Bcast(buf, n, MPI_BYTE, root, comm);
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
  // Counts and offsets in bytes; a started MPI_Ialltoallv reads them until it completes, so
  // they live in `finish`.
  auto v = std::make_shared<std::array<std::vector<int>, 4>>();
  // Named references, not a structured binding: the lambda below captures them.
  std::vector<int>&sc = (*v)[0], &sd = (*v)[1], &rc = (*v)[2], &rd = (*v)[3];
  sc.resize(size_), sd.resize(size_), rc.resize(size_), rd.resize(size_);
  int64_t so = 0, ro = 0;
  for (int r = 0; r < size_; ++r) {
    sc[r] = to_int(send_counts[r] * isz, c, "a send count's bytes");
    rc[r] = to_int(recv_counts[r] * isz, c, "a receive count's bytes");
    sd[r] = to_int(so, c, "a send offset");
    rd[r] = to_int(ro, c, "a receive offset");
    so += sc[r];
    ro += rc[r];
  }
  MPI_Comm comm = mpi(handle_);
  issue(
      *this, ++seq_, c, "MPI_Alltoallv",
      [&](MPI_Request* r, MPI_Status*) {
        return r ? MPI_Ialltoallv(in, sc.data(), sd.data(), MPI_BYTE, out, rc.data(), rd.data(),
                                  MPI_BYTE, comm, r)
                 : MPI_Alltoallv(in, sc.data(), sd.data(), MPI_BYTE, out, rc.data(), rd.data(),
                                 MPI_BYTE, comm);
      },
      NonBlocking::current() ? Finish([v](const MPI_Status&) {}) : Finish());
#endif
}

void MpiComm::send(const void* buf, int64_t count, int dst, const CallInfo& c) {
  KILN_ASSERT(handle_, "send in a world of one passed validation");
#ifdef KILN_HAVE_MPI
  const int n = to_int(count * static_cast<int64_t>(itemsize(c.dtype)), c, "a message's bytes");
  MPI_Comm comm = mpi(handle_);
  issue(*this, ++seq_, c, "MPI_Send", [&](MPI_Request* r, MPI_Status*) {
    return r ? MPI_Isend(buf, n, MPI_BYTE, dst, 0, comm, r)
             : MPI_Send(buf, n, MPI_BYTE, dst, 0, comm);
  });
#else
  (void)buf, (void)count, (void)dst, (void)c;
#endif
}

void MpiComm::recv(void* buf, int64_t count, int src, const CallInfo& c) {
  KILN_ASSERT(handle_, "recv in a world of one passed validation");
#ifdef KILN_HAVE_MPI
  const int n = to_int(count * static_cast<int64_t>(itemsize(c.dtype)), c, "a message's bytes");
  const uint64_t seq = ++seq_;
  MPI_Comm comm = mpi(handle_);
  issue(
      *this, seq, c, "MPI_Recv",
      [&](MPI_Request* r, MPI_Status* st) {
        return r ? MPI_Irecv(buf, n, MPI_BYTE, src, 0, comm, r)
                 : MPI_Recv(buf, n, MPI_BYTE, src, 0, comm, st);
      },
      [n, src, what = describe(c, seq, rank_, size_)](const MPI_Status& st) {
        int got = 0;
        MPI_Get_count(&st, MPI_BYTE, &got);
        if (got != n)
          throw DistributedError(fmt::format("[recv_] expected {} bytes from rank {}, got {} ({})",
                                             n, src, got, what));
      });
#else
  (void)buf, (void)count, (void)src, (void)c;
#endif
}

void MpiComm::barrier(const CallInfo& c) {
  if (!handle_) return;
#ifdef KILN_HAVE_MPI
  MPI_Comm comm = mpi(handle_);
  issue(*this, ++seq_, c, "MPI_Barrier",
        [&](MPI_Request* r, MPI_Status*) { return r ? MPI_Ibarrier(comm, r) : MPI_Barrier(comm); });
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

std::unique_ptr<MpiComm::Request> MpiComm::start_all_reduce(void* buf, int64_t count,
                                                            const CallInfo& c) {
  NonBlocking scope;
  all_reduce(buf, buf, count, c);
  auto started = scope.take();
  if (started.empty()) return std::make_unique<DoneRequest>();  // a world of one
  return std::move(started.front());
}

}  // namespace kiln::distributed

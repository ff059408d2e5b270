#include "kiln/distributed/cma_allreduce.h"

#include <omp.h>
#include <sys/prctl.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string_view>
#include <type_traits>

#include "kiln/core/error.h"
#include "kiln/core/half.h"
#include "kiln/core/tensor_impl.h"
#include "kiln/distributed/collectives.h"
#include "kiln/distributed/flight_recorder.h"
#include "kiln/distributed/init.h"
#include "kiln/distributed/mpi_comm.h"
#include "kiln/distributed/shm_allreduce.h"
#include "kiln/distributed/watchdog.h"

#ifdef KILN_HAVE_MPI
#include <mpi.h>
#endif

// Note [Cross-memory all-reduce]
// A CPU all-reduce of a large message is bound by memory traffic. Open MPI's (vader's ring or
// recursive doubling) moves each byte through temporary buffers several times, and the
// shared-memory pieces (Note [Large CPU all-reduces] in mpi_backend.cpp) copy every input into a
// staging slot and every result out of a peer's: near 2.5 GB/s bus bandwidth at 64 MB on the GPU
// machine's 16-core host. Linux's cross-memory attach (process_vm_readv) lets a rank read a
// peer's memory at an address the peer gave, in one copy made by the kernel, so the ranks reduce
// straight out of each other's tensors:
//   1. exchange: one MPI_Allgather of every rank's input and output addresses, element count,
//      dtype and reduction (the ranks must agree on the last three, or all raise at once; a rank
//      must never read past a peer's buffer). It is also the entry barrier: every input is ready.
//   2. reduce-scatter: rank r owns share r of the elements (shares rounded to 64 bytes; the last
//      may be short or empty). Block by block (KILN_CPU_CMA_CHUNK_BYTES, sized for the L2 cache),
//      it reads each peer's block of the input into a scratch buffer and reduces every rank's
//      block, in rank order, into its output. 16-bit floats accumulate in float32 and round once
//      (Note [16-bit reductions] in mpi_comm.cpp); avg divides the sum there. The rank's OpenMP
//      threads share this work (Note [Threads of the cross-memory all-reduce]).
//   3. an MPI_Allgather of each rank's error (0, or the errno of a read that failed): every share
//      is reduced, and no rank reads an input again, so in-place callers may now overwrite theirs.
//   4. all-gather: each rank reads every peer's reduced share from the peer's output into its
//      own output, one process_vm_readv per peer and thread.
//   5. the same error all-gather: no rank reads this rank's output any more, so it may return.
// Each element is reduced by one rank only, so every rank gets the same bits; the order (rank
// order) does not depend on which rank owns it. Per rank and per byte of the message, this reads
// the input once, writes the output once and reads a peer's reduced share once, the least an
// all-reduce between separate buffers can do, against roughly twice that for MPI's.
//
// Permission. Reading another process's memory needs ptrace access to it: the same user and,
// where the Yama module's ptrace_scope is 1 (Ubuntu's default), that the target named the reader
// its tracer. A rank that wants the path (KILN_CPU_CMA is not 0) and finds ptrace_scope at 1
// calls prctl(PR_SET_PTRACER, PR_SET_PTRACER_ANY) first: any process of the same user may then
// ptrace it, as without Yama (one tracer pid is not enough for more than two ranks); set
// KILN_CPU_CMA=0 to keep Yama's restriction (and MPI). Whether the path works is decided once per
// group when its CPU backend is made: each rank reads a random token from every peer, and the
// group uses the path only when every rank read every token (same host, same pid namespace,
// ptrace permitted, process_vm_readv not blocked by seccomp); otherwise every rank falls back
// alike, and KILN_LOGS=distributed prints why.
//
// Faults. The call has one deadline, as an MPI collective does (Note [Deadlines] in
// mpi_comm.cpp): a peer that never comes ends the job with the flight recorder. A read that
// fails is reported by steps 3 and 5, so every rank raises the same DistributedError (the
// output is then undefined). KILN_DIST_DEBUG=detail checks the call as every backend does.
//
// Note [Threads of the cross-memory all-reduce]
// One thread moves only 3-6 GB/s through process_vm_readv (the kernel pins each page and copies
// it), far below what a host's memory serves: at 4 ranks on the GPU machine's 16-core host the
// single-threaded path reached 3.6-3.7 GB/s bus bandwidth at 4 and 64 MB. So each rank splits
// its work over its OpenMP threads (omp_get_max_threads() of the calling thread: kiln's
// --threads, kiln::set_num_threads, OMP_NUM_THREADS), at most one per kMinThreadBytes (64 KiB)
// of a share, so that a small message does not pay a team for little work. Thread i of n takes
// piece i of n of the rank's share (whole 64-byte lines) in step 2, reading and reducing it
// block by block into a scratch buffer of its own (thread-local, kept across calls: its pages
// fault in once), and piece i of n of every peer's share in step 4. The pieces only split the
// elements: each element is still reduced by one thread of one rank, from every rank's value in
// rank order, so the bits do not depend on the number of threads, nor on the peer each thread
// reads first (rank + 1 on: the ranks do not all read rank 0 at once). Only the calling thread
// talks to MPI, before and after each team (steps 1, 3, 5); a thread's failed read is kept in
// its slot and the first slot with one is what steps 3 and 5 report. A call from inside a
// parallel region runs on one thread (OpenMP does not nest by default).
namespace kiln::distributed {
namespace {

struct Counters {
  std::atomic<uint64_t> groups{0}, fallbacks{0}, calls{0}, threads{0};
  std::mutex mu;
  std::string reason;  // under mu
} g_stats;

// Note [Large CPU all-reduces] in mpi_backend.cpp has the measurements behind these.
constexpr size_t kDefaultMinBytes = size_t{1} << 20;
constexpr size_t kDefaultChunkBytes = size_t{256} << 10;
// The least of a rank's share that one more thread takes on (Note [Threads of the cross-memory
// all-reduce]).
constexpr size_t kMinThreadBytes = size_t{64} << 10;

#ifdef KILN_HAVE_MPI
// (Without MPI there is no path: make() returns null.)
size_t round_up(size_t n, size_t to) { return (n + to - 1) / to * to; }

bool log_distributed() {
  const char* env = std::getenv("KILN_LOGS");
  if (!env) return false;
  std::string_view s(env);
  if (s == "all") return true;
  for (size_t start = 0; start <= s.size();) {
    size_t end = std::min(s.find(',', start), s.size());
    if (s.substr(start, end - start) == "distributed") return true;
    start = end + 1;
  }
  return false;
}

// A positive byte count from `var`, `fallback` when unset; a bad value leaves `bad` naming it.
size_t bytes_from_env(const char* var, size_t fallback, std::string& bad) {
  const char* v = std::getenv(var);
  if (!v || !*v) return fallback;
  char* end = nullptr;
  errno = 0;
  unsigned long long n = std::strtoull(v, &end, 10);
  if (errno || *end || n == 0 || v[0] == '-') {
    if (bad.empty()) bad = fmt::format("{}='{}'", var, v);
    return fallback;
  }
  return static_cast<size_t>(n);
}

// Reads `bytes` at `remote` in process `pid` into `local`; 0 or the errno of the failure.
int read_peer(int pid, void* local, uintptr_t remote, size_t bytes) {
  char* dst = static_cast<char*>(local);
  while (bytes > 0) {
    iovec l{dst, bytes}, r{reinterpret_cast<void*>(remote), bytes};
    ssize_t got = process_vm_readv(pid, &l, 1, &r, 1, 0);
    if (got < 0) return errno ? errno : EIO;
    if (got == 0) return EFAULT;  // a partial read stops at a page it could not read
    dst += got, remote += static_cast<size_t>(got), bytes -= static_cast<size_t>(got);
  }
  return 0;
}

// The threads that reduce and gather a share of `part_bytes`: this thread's OpenMP threads
// (omp_get_max_threads(), kiln::set_num_threads), at most one per kMinThreadBytes of the share.
int threads_for(size_t part_bytes) {
  const size_t most = std::max<size_t>(1, part_bytes / kMinThreadBytes);
  return static_cast<int>(
      std::min<size_t>(most, static_cast<size_t>(std::max(1, omp_get_max_threads()))));
}

// Yama's ptrace_scope: 1 means a process may be read only by its tracer or one it named.
bool yama_restricted() {
  FILE* f = std::fopen("/proc/sys/kernel/yama/ptrace_scope", "r");
  if (!f) return false;
  int scope = 0;
  bool one = std::fscanf(f, "%d", &scope) == 1 && scope == 1;
  std::fclose(f);
  return one;
}

// Per thread, reused across calls (no page faults after the first): each peer's block of the
// input.
char* scratch(size_t bytes) {
  struct Buffer {
    char* p = nullptr;
    size_t n = 0;
    ~Buffer() { std::free(p); }
  };
  thread_local Buffer b;
  if (b.n < bytes) {
    std::free(b.p);
    b.n = round_up(bytes, 4096);
    b.p = static_cast<char*>(std::aligned_alloc(64, b.n));
    if (!b.p) throw std::bad_alloc();
  }
  return b.p;
}

// out[i] = src[0][i] op src[1][i] op ... (in rank order), in the accumulation type A; avg divides
// the sum by the number of ranks. One src[k] may be `out` itself (in place), so `out` is written
// only once every input has been read: through a tile of A on the stack (in L1) when the types
// differ or there are more than two inputs.
template <class T, class A, class Op>
void reduce_block(const T* const* src, int n, T* out, int64_t m, Op op, bool avg) {
  if constexpr (std::is_same_v<T, A>) {
    if (n == 2) {
      for (int64_t i = 0; i < m; ++i) out[i] = op(src[0][i], src[1][i]);
      if (avg)
        for (int64_t i = 0; i < m; ++i) out[i] /= static_cast<A>(n);
      return;
    }
  }
  constexpr int64_t kTile = 1024;
  A acc[kTile];
  for (int64_t s = 0; s < m; s += kTile) {
    const int64_t k = std::min(kTile, m - s);
    const T* s0 = src[0] + s;
    const T* s1 = src[1] + s;
    for (int64_t i = 0; i < k; ++i) acc[i] = op(static_cast<A>(s0[i]), static_cast<A>(s1[i]));
    for (int r = 2; r < n; ++r) {
      const T* sr = src[r] + s;
      for (int64_t i = 0; i < k; ++i) acc[i] = op(acc[i], static_cast<A>(sr[i]));
    }
    if (avg)
      for (int64_t i = 0; i < k; ++i) acc[i] /= static_cast<A>(n);
    for (int64_t i = 0; i < k; ++i) out[s + i] = static_cast<T>(acc[i]);
  }
}
template <class T, class A>
void reduce_block(const void* const* src, int n, void* out, int64_t m, ReduceOp op) {
  auto s = reinterpret_cast<const T* const*>(src);
  auto o = static_cast<T*>(out);
  switch (op) {
    case ReduceOp::Sum:
    case ReduceOp::Avg:
      return reduce_block<T, A>(
          s, n, o, m, [](A x, A y) { return x + y; }, op == ReduceOp::Avg);
    case ReduceOp::Product:
      return reduce_block<T, A>(
          s, n, o, m, [](A x, A y) { return x * y; }, false);
    case ReduceOp::Max:  // as MPI_MAX: a NaN in `y` is dropped, one in `x` kept
      return reduce_block<T, A>(
          s, n, o, m, [](A x, A y) { return y > x ? y : x; }, false);
    case ReduceOp::Min:
      return reduce_block<T, A>(
          s, n, o, m, [](A x, A y) { return y < x ? y : x; }, false);
  }
}
void reduce_block(DType t, const void* const* src, int n, void* out, int64_t m, ReduceOp op) {
  switch (t) {
    case DType::Float16:
      return reduce_block<Half, float>(src, n, out, m, op);
    case DType::BFloat16:
      return reduce_block<BFloat16, float>(src, n, out, m, op);
    case DType::Float32:
      return reduce_block<float, float>(src, n, out, m, op);
    case DType::Float64:
      return reduce_block<double, double>(src, n, out, m, op);
    default:
      KILN_ASSERT(false, "[all_reduce] the cross-memory all-reduce got {} (bug: eligible())", t);
  }
}

// What every rank all-gathers at set-up.
struct SetupRow {
  char host[64] = {};
  char bad[96] = {};       // a bad KILN_CPU_CMA_* setting, "VAR='value'"
  uint64_t token = 0;      // the value at `probe` in this process
  uint64_t probe = 0;      // its address
  uint64_t min_bytes = 0;  // KILN_CPU_CMA_MIN_BYTES
  uint64_t chunk_bytes = 0;
  int32_t pid = 0;
  int32_t wanted = 0;  // KILN_CPU_CMA is not 0
};
// What every rank all-gathers per call (step 1).
struct CallRow {
  uint64_t in = 0, out = 0;
  int64_t numel = 0;
  int32_t dtype = 0, reduce = 0;
};
// A rank's errors (steps 3 and 5): the errno of its first failed read and the peer it read.
struct ErrorRow {
  int32_t error = 0, peer = -1;
};
#endif

}  // namespace

CmaAllReduceStats cma_all_reduce_stats() {
  std::lock_guard<std::mutex> lock(g_stats.mu);
  return {g_stats.groups.load(), g_stats.fallbacks.load(), g_stats.calls.load(),
          g_stats.threads.load(), g_stats.reason};
}

std::unique_ptr<CmaAllReduce> CmaAllReduce::make(const ProcessGroup& group) {
  MpiComm* base = group.base_comm();
  if (!base || base->size() < 2) return nullptr;
#ifndef KILN_HAVE_MPI
  return nullptr;
#else
  const int rank = base->rank(), size = base->size();
  const std::string where =
      fmt::format("group {} (rank {} of {})", group.name(), rank, group.size());
  const char* env = std::getenv("KILN_CPU_CMA");
  SetupRow mine;
  mine.wanted = !(env && std::string_view(env) == "0");
  std::string bad;
  mine.min_bytes = bytes_from_env("KILN_CPU_CMA_MIN_BYTES", kDefaultMinBytes, bad);
  mine.chunk_bytes =
      round_up(bytes_from_env("KILN_CPU_CMA_CHUNK_BYTES", kDefaultChunkBytes, bad), 64);
  std::snprintf(mine.bad, sizeof(mine.bad), "%s", bad.c_str());
  gethostname(mine.host, sizeof(mine.host) - 1);
  // The token: this process's id and the time, so that a process of another pid namespace with
  // the same pid does not hold it at the same address. It lives on this stack until every peer
  // has read it (the second all-gather below).
  std::atomic<uint64_t> token{(static_cast<uint64_t>(getpid()) << 32) ^
                              static_cast<uint64_t>(Clock::now().time_since_epoch().count()) ^
                              0x9e3779b97f4a7c15ull};
  mine.token = token.load();
  mine.probe = reinterpret_cast<uintptr_t>(&token);
  mine.pid = static_cast<int32_t>(getpid());
  if (mine.wanted && yama_restricted()) prctl(PR_SET_PTRACER, PR_SET_PTRACER_ANY, 0, 0, 0);
  std::vector<SetupRow> rows(size);
  base->all_gather_bytes(&mine, rows.data(), sizeof(SetupRow));
  for (int r = 0; r < size; ++r)
    if (rows[r].bad[0])
      throw DistributedError(fmt::format(
          "[all_reduce] setting up the cross-memory all-reduce of {}: {} on group rank {} is not "
          "a positive number of bytes",
          where, std::string(rows[r].bad, strnlen(rows[r].bad, sizeof(rows[r].bad))), r));
  bool wanted = true, same_host = true;
  size_t min_bytes = mine.min_bytes, chunk_bytes = mine.chunk_bytes;
  for (const SetupRow& r : rows) {
    wanted = wanted && r.wanted;
    same_host = same_host && std::strncmp(r.host, rows[0].host, sizeof(r.host)) == 0;
    min_bytes = std::min<size_t>(min_bytes, r.min_bytes);
    chunk_bytes = std::min<size_t>(chunk_bytes, r.chunk_bytes);
  }
  if (!wanted) return nullptr;  // KILN_CPU_CMA=0: asked for, no fallback to report
  // Each rank reads every peer's token (when they share a host: a pid means nothing elsewhere).
  ErrorRow probe;
  if (same_host) {
    for (int r = 0; r < size && !probe.error; ++r) {
      if (r == rank) continue;
      uint64_t got = 0;
      probe.error = read_peer(rows[r].pid, &got, rows[r].probe, sizeof(got));
      if (!probe.error && got != rows[r].token) probe.error = -1;
      if (probe.error) probe.peer = r;
    }
  }
  std::vector<ErrorRow> probes(size);
  base->all_gather_bytes(&probe, probes.data(), sizeof(ErrorRow));
  std::string why;
  if (!same_host) why = "the ranks are on different hosts";
  for (int r = 0; r < size && why.empty(); ++r)
    if (probes[r].error)
      why =
          fmt::format("group rank {} could not read group rank {}'s memory: {}", r, probes[r].peer,
                      probes[r].error < 0
                          ? std::string("it read another process (pid namespace)")
                          : fmt::format("{} (process_vm_readv)", std::strerror(probes[r].error)));
  if (!why.empty()) {
    g_stats.fallbacks++;
    {
      std::lock_guard<std::mutex> lock(g_stats.mu);
      g_stats.reason = why;
    }
    if (rank == 0 && log_distributed())
      std::fprintf(stderr,
                   "kiln: [all_reduce] %s: no cross-memory all-reduce, large CPU all-reduces take "
                   "the shared-memory pieces or MPI: %s\n",
                   where.c_str(), why.c_str());
    return nullptr;
  }
  std::vector<int> pids(size);
  for (int r = 0; r < size; ++r) pids[r] = rows[r].pid;
  g_stats.groups++;
  return std::unique_ptr<CmaAllReduce>(
      new CmaAllReduce(group, std::move(pids), min_bytes, chunk_bytes));
#endif
}

CmaAllReduce::~CmaAllReduce() = default;

bool CmaAllReduce::eligible(const Tensor& in, ReduceOp /*op*/) const {
  const CustomAllReduceMode mode = custom_all_reduce_mode();
  if (mode == CustomAllReduceMode::Off || !is_floating(in.dtype()) || in.numel() == 0) return false;
  return mode == CustomAllReduceMode::On || in.nbytes() >= min_bytes_;
}

uint64_t CmaAllReduce::next_seq(const MpiComm& comm) {
  std::lock_guard<std::mutex> lock(mu_);
  return ++seq_[&comm];
}

void CmaAllReduce::all_reduce([[maybe_unused]] const Tensor& in, [[maybe_unused]] const Tensor& out,
                              [[maybe_unused]] const Collective& c,
                              [[maybe_unused]] MpiComm& comm) {
#ifndef KILN_HAVE_MPI
  KILN_ASSERT(false, "[all_reduce] the cross-memory all-reduce without MPI");
#else
  const int64_t numel = in.numel();
  const DType t = in.dtype();
  const size_t isz = itemsize(t);
  const int rank = comm.rank(), size = comm.size();
  const uint64_t seq = next_seq(comm);
  const std::chrono::milliseconds timeout = timeout_for(*c.group);
  // "group world (rank 0 of 2), cross-memory all-reduce 3 of its communicator, 8 float32 elements"
  auto describe = [&] {
    return fmt::format(
        "group {} (rank {} of {}), cross-memory all-reduce {} of its communicator, {} {} elements",
        c.group->name(), rank, size, seq, numel, name(t));
  };
  FlightRecorder& fr = FlightRecorder::get();
  const uint64_t slot = fr.start(c.op, c.group->name(), seq, numel, t, -1);
  const int world = distributed::rank();
  // Formatted only if the deadline passes (c.op is a literal; groups live until exit).
  Deadline deadline(Clock::now() + timeout, [op = c.op, group = c.group, rank, size, seq, numel, t,
                                             timeout, world] {
    std::string path = FlightRecorder::get().dump(world);
    abort_job(fmt::format(
        "kiln: DistributedError: [{}] timed out after {} ms on group {} (rank {} of {}), "
        "cross-memory all-reduce {} of its communicator, {} {} elements; flight recorder "
        "written to {}",
        op, timeout.count(), group->name(), rank, size, seq, numel, name(t),
        path.empty() ? "(could not write)" : path));
  });
  MPI_Comm mc = *static_cast<MPI_Comm*>(comm.handle());
  auto check = [&](int rc, const char* call) {
    if (rc == MPI_SUCCESS) return;
    char msg[MPI_MAX_ERROR_STRING];
    int len = 0;
    MPI_Error_string(rc, msg, &len);
    throw DistributedError(
        fmt::format("[{}] {} failed on {}: {}", c.op, call, describe(), std::string(msg, len)));
  };
  // Steps 3 and 5 of Note [Cross-memory all-reduce]: every rank learns every rank's error.
  auto agree = [&](const ErrorRow& e, const char* step) {
    std::vector<ErrorRow> all(size);
    check(MPI_Allgather(&e, sizeof(ErrorRow), MPI_BYTE, all.data(), sizeof(ErrorRow), MPI_BYTE, mc),
          "MPI_Allgather");
    for (int r = 0; r < size; ++r)
      if (all[r].error)
        throw DistributedError(fmt::format(
            "[{}] the cross-memory all-reduce failed on {}: in its {}, group rank {} could not "
            "read group rank {}'s memory: {} (process_vm_readv); set KILN_CPU_CMA=0 to use MPI",
            c.op, describe(), step, r, all[r].peer, std::strerror(all[r].error)));
  };
  try {
    if (debug_detail())
      check_same_call(comm, CallInfo{c.op, c.group, t, numel, c.reduce, -1}, seq,
                      std::chrono::milliseconds(0));  // under this call's deadline
    // 1. Exchange.
    const char* in_p = static_cast<const char*>(in.impl()->data());
    char* out_p = static_cast<char*>(out.impl()->data());
    CallRow me{reinterpret_cast<uintptr_t>(in_p), reinterpret_cast<uintptr_t>(out_p), numel,
               static_cast<int32_t>(t), static_cast<int32_t>(c.reduce)};
    std::vector<CallRow> rows(size);
    check(MPI_Allgather(&me, sizeof(CallRow), MPI_BYTE, rows.data(), sizeof(CallRow), MPI_BYTE, mc),
          "MPI_Allgather");
    for (int r = 0; r < size; ++r)
      if (rows[r].numel != numel || rows[r].dtype != me.dtype || rows[r].reduce != me.reduce)
        throw DistributedError(fmt::format(
            "[{}] the ranks disagree on the cross-memory all-reduce on {}: rank {} has {} {} "
            "elements (reduce {}), rank {} has {} {} elements (reduce {})",
            c.op, describe(), rank, numel, name(t), reduce_op_name(c.reduce), r, rows[r].numel,
            name(static_cast<DType>(rows[r].dtype)),
            reduce_op_name(static_cast<ReduceOp>(rows[r].reduce))));
    // Shares of `part` elements, rounded to 64 bytes.
    const int64_t align = static_cast<int64_t>(std::max<size_t>(1, 64 / isz));
    const int64_t part = (((numel + size - 1) / size + align - 1) / align) * align;
    auto share = [&](int r) {
      return std::pair<int64_t, int64_t>{std::min(numel, r * part),
                                         std::min(numel, (r + 1) * part)};
    };
    // 2. Reduce-scatter, block by block, on `threads` threads, each a piece of this rank's
    // share (Note [Threads of the cross-memory all-reduce]).
    const int64_t block = static_cast<int64_t>(std::max<size_t>(1, chunk_bytes_ / isz));
    const size_t block_bytes = round_up(static_cast<size_t>(block) * isz, 64);
    const int threads = threads_for(static_cast<size_t>(part) * isz);
    // Piece i of n of [from, to), in whole 64-byte lines (the last ones may be short or empty).
    auto piece = [align](int64_t from, int64_t to, int n, int i) {
      const int64_t len = ((to - from + n - 1) / n + align - 1) / align * align;
      return std::pair<int64_t, int64_t>{std::min(to, from + i * len),
                                         std::min(to, from + (i + 1) * len)};
    };
    const std::pair<int64_t, int64_t> mine = share(rank);
    // Runs on an OpenMP thread: raises nothing, returns its first failed read.
    auto reduce_piece = [&](int tid, int nt) {
      ErrorRow err;
      try {
        const auto [pb, pe] = piece(mine.first, mine.second, nt, tid);
        if (pe <= pb) return err;
        char* buf = scratch(block_bytes * (size - 1));
        std::vector<const void*> src(size);
        for (int64_t s = pb; s < pe; s += block) {
          const int64_t m = std::min(block, pe - s);
          const size_t off = static_cast<size_t>(s) * isz, bytes = static_cast<size_t>(m) * isz;
          src[rank] = in_p + off;
          for (int j = 1; j < size; ++j) {  // from the next rank on: the ranks start apart
            const int r = (rank + j) % size;
            char* dst = buf + block_bytes * (j - 1);
            if ((err.error = read_peer(pids_[r], dst, rows[r].in + off, bytes))) {
              err.peer = r;
              return err;
            }
            src[r] = dst;
          }
          reduce_block(t, src.data(), size, out_p + off, m, c.reduce);
        }
      } catch (const std::bad_alloc&) {
        err = ErrorRow{ENOMEM, rank};
      }
      return err;
    };
    // 4. All-gather: the same piece of every peer's reduced share, from its output.
    auto gather_piece = [&](int tid, int nt) {
      ErrorRow err;
      for (int j = 1; j < size; ++j) {
        const int r = (rank + j) % size;
        const auto [sb, se] = share(r);
        const auto [pb, pe] = piece(sb, se, nt, tid);
        if (pe <= pb) continue;
        const size_t off = static_cast<size_t>(pb) * isz;
        if ((err.error = read_peer(pids_[r], out_p + off, rows[r].out + off,
                                   static_cast<size_t>(pe - pb) * isz))) {
          err.peer = r;
          return err;
        }
      }
      return err;
    };
    std::vector<ErrorRow> errs(static_cast<size_t>(threads));
    auto first_error = [&] {
      for (const ErrorRow& e : errs)
        if (e.error) return e;
      return ErrorRow{};
    };
    int team = 1;
#pragma omp parallel num_threads(threads) if (threads > 1)
    {
      const int nt = omp_get_num_threads(), tid = omp_get_thread_num();
      if (tid == 0) team = nt;
      errs[static_cast<size_t>(tid)] = reduce_piece(tid, nt);
    }
    // 3. Every share reduced; no input is read from now on.
    agree(first_error(), "reduce-scatter");
#pragma omp parallel num_threads(threads) if (threads > 1)
    {
      const int nt = omp_get_num_threads(), tid = omp_get_thread_num();
      errs[static_cast<size_t>(tid)] = gather_piece(tid, nt);
    }
    // 5. No output is read from now on.
    agree(first_error(), "all-gather");
    g_stats.threads = static_cast<uint64_t>(team);
  } catch (...) {
    fr.finish(slot, CallState::Failed);
    throw;
  }
  fr.finish(slot, CallState::Completed);
  g_stats.calls++;
#endif
}

}  // namespace kiln::distributed

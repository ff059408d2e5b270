#include "kiln/distributed/shm_allreduce.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "kiln/core/error.h"
#include "kiln/core/half.h"
#include "kiln/core/tensor_impl.h"
#include "kiln/distributed/collectives.h"
#include "kiln/distributed/flight_recorder.h"
#include "kiln/distributed/init.h"
#include "kiln/distributed/mpi_comm.h"
#include "kiln/distributed/watchdog.h"

// Note [Custom all-reduce]
// For small messages between the ranks of one host, a library all-reduce's latency dominates;
// Kiln's own all-reduce has every rank read its peers' inputs from memory they share and sum
// them (one-shot), or reduce one part each and gather the parts (two-shot, for larger messages).
// On CUDA the memory is shared by CUDA IPC and the work is a kernel
// (kiln/backend/cuda/custom_allreduce.cu); here, for a host-task device (sim), it is POSIX
// shared memory and a host task, built to the same design so that every path of it runs in CI.
//
// Which path a call takes (eligible()) depends on the mode, the reduction, the dtype and the
// size, never on whether a capture is under way: the warm-up before a capture and the capture
// take the same path, and every rank the same one (the mode is set alike on every rank; the
// buffer size is agreed when the group is set up). Inside the path, two ways to reach the input:
// - Eager (the stream is not capturing): the input is copied into the rank's staging slot,
//   which every peer mapped when the channel was made, and the peers read it there.
// - Captured: the call registers the graph's own input buffer, *pending*: its address is known
//   now but the peers' are not. One exchange after the capture completes every pending
//   registration at once (their handles or offsets all-gathered over MPI), and from then on
//   each replay reads the registered buffers with no registration and no exchange. A capture
//   made again (the graph's inputs moved) registers its buffers again, and one more exchange
//   follows it. On CUDA the exchange runs when the capture ends (the device plugin's
//   end_capture calls it) and replays read the graph's buffers with no copy. Sim memory cannot
//   be shared, so here a registration is a slot of the rank's shared segment that the replay
//   copies the graph's buffer into, and the exchange runs at the first replay, as the task's
//   first act (every rank runs the same graph, so every rank reaches it at the same point);
//   the states and their order are CUDA's.
// Both ways give the same bits: each element is summed over the ranks in rank order, 16-bit
// floats in float32 and rounded once, so every rank gets the same result, eager or replayed.
//
// The flag barrier. Each rank's segment starts with a Signal: `self_counter[p]`, how many
// barriers this rank has passed with peer p, and `peer_counter[2][p]`, written by p. To pass a
// barrier a rank advances self_counter[p] to v (the counter lives in shared memory and is
// advanced by the task itself: a value fixed when the call was issued would be frozen into the
// graph and go stale at the second replay), stores v into p's peer_counter[v % 2][me] with
// release order, and waits with acquire loads until its own peer_counter[v % 2][p] reads v. Two
// slots, because p may reach its next barrier, and store v + 1, before this rank has seen v.
// One-shot: barrier, read every rank's input and sum, barrier (no rank reuses its staging slot
// while a peer still reads it). Two-shot: barrier, rank r reduces part r into its `tmp`,
// barrier, every rank copies the parts from every tmp; the next call's first barrier keeps a
// rank from overwriting its tmp while a peer still reads it.
//
// Channels. Like MPI communicators (Note [One communicator per stream] in process_group.cpp),
// each stream that issues gets a channel of its own (segments, counters, staging slot), made
// on the issuing thread the first time the stream issues, so in the same order on every rank;
// a channel's tasks run in the order of one stream. A graph keeps the channel of the stream it
// was captured on. Waits poll the call's deadline; when it passes, the rank writes its flight
// recorder and ends the job, as MPI collectives do (Note [Deadlines] in mpi_comm.cpp).
namespace kiln::distributed {
namespace {

constexpr int kMaxRanks = 8;
constexpr size_t kPage = 4096;
// Up to this size one-shot (every rank reads everything once) beats two-shot.
constexpr size_t kOneShotMaxBytes = size_t{256} << 10;
// A channel's registrations share a region this many times the staging slot.
constexpr size_t kRegisterFactor = 8;

struct Signal {
  std::atomic<uint64_t> self_counter[kMaxRanks];
  std::atomic<uint64_t> peer_counter[2][kMaxRanks];
};
static_assert(std::atomic<uint64_t>::is_always_lock_free, "counters shared between processes");
static_assert(sizeof(Signal) <= kPage);

std::atomic<int> g_mode{-1};
struct Counters {
  std::atomic<uint64_t> eager{0}, captured{0}, exchanges{0}, registered{0}, runs{0};
} g_stats;

size_t round_up(size_t n, size_t to) { return (n + to - 1) / to * to; }

// Elements [begin, end) of out = the reduction of the ranks' inputs, in rank order.
template <class T, class Acc>
void reduce_range(const std::vector<const char*>& src, void* out, int64_t begin, int64_t end,
                  bool avg) {
  const int n = static_cast<int>(src.size());
  T* o = static_cast<T*>(out);
  for (int64_t i = begin; i < end; ++i) {
    Acc acc = static_cast<Acc>(reinterpret_cast<const T*>(src[0])[i]);
    for (int r = 1; r < n; ++r) acc += static_cast<Acc>(reinterpret_cast<const T*>(src[r])[i]);
    if (avg) acc /= static_cast<Acc>(n);
    o[i] = static_cast<T>(acc);
  }
}
void reduce(DType t, const std::vector<const char*>& src, void* out, int64_t begin, int64_t end,
            bool avg) {
  switch (t) {
    case DType::Float16:
      return reduce_range<Half, float>(src, out, begin, end, avg);
    case DType::BFloat16:
      return reduce_range<BFloat16, float>(src, out, begin, end, avg);
    case DType::Float32:
      return reduce_range<float, float>(src, out, begin, end, avg);
    case DType::Float64:
      return reduce_range<double, double>(src, out, begin, end, avg);
    default:
      KILN_ASSERT(false, "[all_reduce] the shared-memory all-reduce got {} (bug: eligible())", t);
  }
}

}  // namespace

CustomAllReduceMode custom_all_reduce_mode() {
  int m = g_mode.load(std::memory_order_relaxed);
  if (m < 0) {
    const char* v = std::getenv("KILN_CUSTOM_AR");
    std::string_view s = v ? v : "";
    m = static_cast<int>(s == "0"   ? CustomAllReduceMode::Off
                         : s == "1" ? CustomAllReduceMode::On
                                    : CustomAllReduceMode::Auto);
    int expected = -1;
    g_mode.compare_exchange_strong(expected, m);
    m = g_mode.load(std::memory_order_relaxed);
  }
  return static_cast<CustomAllReduceMode>(m);
}

void set_custom_all_reduce_mode(CustomAllReduceMode mode) {
  g_mode.store(static_cast<int>(mode), std::memory_order_relaxed);
}

size_t custom_all_reduce_max_bytes() {
  static const size_t n = [] {
    const char* v = std::getenv("KILN_CUSTOM_AR_MAX_BYTES");
    long long b = v ? std::atoll(v) : 0;
    return b > 0 ? round_up(static_cast<size_t>(b), 64) : size_t{8} << 20;
  }();
  return n;
}

CustomAllReduceStats shm_all_reduce_stats() {
  return {g_stats.eager.load(), g_stats.captured.load(), g_stats.exchanges.load(),
          g_stats.registered.load(), g_stats.runs.load()};
}

// A registration (Note [Custom all-reduce]): where each rank's copy of one captured call's
// input sits in its segment. offset[rank] is set at capture, the peers' by the exchange.
struct Registration {
  size_t bytes = 0;
  std::vector<size_t> offset;
  std::atomic<bool> exchanged{false};
};

// One stream's shared segments: [Signal | tmp | staging | registered], capacity bytes each for
// tmp and staging, kRegisterFactor times that for registrations.
struct ShmAllReduce::Channel {
  const ProcessGroup* group = nullptr;
  MpiComm* comm = nullptr;  // the stream's communicator: exchanges and debug checks
  int rank = 0, size = 1;
  size_t capacity = 0, bytes = 0;
  std::vector<char*> seg;  // every rank's segment, mapped here
  std::mutex mu;
  size_t registered_bytes = 0;  // used of this rank's registration region (under mu)
  std::vector<std::shared_ptr<Registration>> pending;  // under mu
  uint64_t seq = 0;                                    // calls run, by this channel's tasks only

  size_t tmp_at() const { return kPage; }
  size_t staging_at() const { return kPage + capacity; }
  size_t registered_at() const { return kPage + 2 * capacity; }
  Signal& signal(int r) const { return *reinterpret_cast<Signal*>(seg[r]); }

  ~Channel() {
    for (char* p : seg)
      if (p) munmap(p, bytes);
  }

  std::string where() const {
    return fmt::format("group {} (rank {} of {})", group->name(), rank, size);
  }

  // A pending registration of `nbytes` in this rank's region; a DistributedError when full.
  std::shared_ptr<Registration> register_pending(size_t nbytes) {
    std::lock_guard<std::mutex> lock(mu);
    const size_t need = round_up(nbytes, 64);
    if (registered_bytes + need > kRegisterFactor * capacity)
      throw DistributedError(fmt::format(
          "[all_reduce] the shared-memory all-reduce of {} has no room to register a captured "
          "input of {} bytes ({} of {} bytes registered by earlier captures on this stream); "
          "set KILN_CUSTOM_AR=0, or capture on a new stream",
          where(), nbytes, registered_bytes, kRegisterFactor * capacity));
    auto reg = std::make_shared<Registration>();
    reg->bytes = nbytes;
    reg->offset.assign(size, 0);
    reg->offset[rank] = registered_at() + registered_bytes;
    registered_bytes += need;
    pending.push_back(reg);
    return reg;
  }

  // Completes every pending registration at once (Note [Custom all-reduce]): all ranks run it
  // at the same point, the first replay after a capture.
  void exchange() {
    std::vector<std::shared_ptr<Registration>> regs;
    {
      std::lock_guard<std::mutex> lock(mu);
      regs.swap(pending);
    }
    const uint64_t mine = regs.size();
    CallInfo count_info{"custom_ar_register", group, DType::Int64, 1};
    std::vector<uint64_t> counts(size);
    comm->all_gather(&mine, counts.data(), 1, count_info);
    for (int r = 0; r < size; ++r)
      if (counts[r] != regs.size())
        throw DistributedError(
            fmt::format("[all_reduce] the ranks of {} captured different numbers of shared-memory "
                        "all-reduces: rank {} registered {}, rank {} registered {}",
                        where(), rank, regs.size(), r, counts[r]));
    if (regs.empty()) return;
    // Per registration: its bytes and this rank's offset.
    std::vector<uint64_t> row;
    for (auto& r : regs) row.insert(row.end(), {r->bytes, r->offset[rank]});
    std::vector<uint64_t> all(row.size() * size);
    CallInfo info{"custom_ar_register", group, DType::Int64, static_cast<int64_t>(row.size())};
    comm->all_gather(row.data(), all.data(), static_cast<int64_t>(row.size()), info);
    for (size_t i = 0; i < regs.size(); ++i)
      for (int r = 0; r < size; ++r) {
        const uint64_t* e = &all[r * row.size() + 2 * i];
        if (e[0] != regs[i]->bytes)
          throw DistributedError(fmt::format(
              "[all_reduce] the ranks of {} captured different shared-memory all-reduces: "
              "registration {} is {} bytes on rank {} and {} bytes on rank {}",
              where(), i, regs[i]->bytes, rank, e[0], r));
        regs[i]->offset[r] = e[1];
      }
    for (auto& r : regs) r->exchanged.store(true, std::memory_order_release);
    g_stats.exchanges++;
    g_stats.registered += regs.size();
  }

  // The flag barrier (Note [Custom all-reduce]); past the deadline the job ends.
  void barrier(Clock::time_point deadline, const std::string& what) {
    Signal& me = signal(rank);
    for (int p = 0; p < size; ++p) {
      if (p == rank) continue;
      const uint64_t v = me.self_counter[p].fetch_add(1, std::memory_order_relaxed) + 1;
      signal(p).peer_counter[v % 2][rank].store(v, std::memory_order_release);
    }
    for (int p = 0; p < size; ++p) {
      if (p == rank) continue;
      const uint64_t v = me.self_counter[p].load(std::memory_order_relaxed);
      for (int spins = 0; me.peer_counter[v % 2][p].load(std::memory_order_acquire) != v;) {
        if (++spins < 64) continue;
        spins = 0;
        std::this_thread::yield();
        if (Clock::now() < deadline) continue;
        std::string path = FlightRecorder::get().dump(distributed::rank());
        abort_job(fmt::format(
            "kiln: DistributedError: {}, waiting for group rank {}; flight recorder written to "
            "{}",
            what, p, path.empty() ? "(could not write)" : path));
      }
    }
  }

  // Under KILN_DIST_DEBUG=detail: the ranks' calls must agree (Note [Debug checks]), checked
  // as the MPI backend checks, so a rank here and a rank in an MPI all-reduce disagree.
  void debug_check(int64_t numel, DType t, ReduceOp op, std::chrono::milliseconds timeout) {
    check_same_call(*comm, CallInfo{"all_reduce", group, t, numel, op, -1}, seq, timeout);
  }

  // One all-reduce, as its host task runs it: `reg` null for an eager call.
  void run(Registration* reg, const void* in, void* out, int64_t numel, DType t, ReduceOp op,
           std::chrono::milliseconds timeout) {
    const size_t nbytes = static_cast<size_t>(numel) * itemsize(t);
    FlightRecorder& fr = FlightRecorder::get();
    const uint64_t s = ++seq;
    const uint64_t slot = fr.start("all_reduce", group->name(), s, numel, t, -1);
    try {
      if (debug_detail()) debug_check(numel, t, op, timeout);
      if (reg && !reg->exchanged.load(std::memory_order_acquire)) exchange();
      const Clock::time_point deadline = Clock::now() + timeout;
      const std::string what = fmt::format(
          "[all_reduce] timed out after {} ms on {}, shared-memory all-reduce {} of its "
          "channel, {} {} elements",
          timeout.count(), where(), s, numel, name(t));
      std::vector<const char*> src(size);
      for (int r = 0; r < size; ++r) src[r] = seg[r] + (reg ? reg->offset[r] : staging_at());
      std::memcpy(const_cast<char*>(src[rank]), in, nbytes);
      const bool avg = op == ReduceOp::Avg;
      barrier(deadline, what);
      if (nbytes <= kOneShotMaxBytes) {
        reduce(t, src, out, 0, numel, avg);
        barrier(deadline, what);
      } else {
        const int64_t part = (numel + size - 1) / size;
        const size_t isz = itemsize(t);
        reduce(t, src, seg[rank] + tmp_at(), std::min(numel, rank * part),
               std::min(numel, (rank + 1) * part), avg);
        barrier(deadline, what);
        for (int r = 0; r < size; ++r) {
          const int64_t b = std::min(numel, r * part), e = std::min(numel, (r + 1) * part);
          std::memcpy(static_cast<char*>(out) + b * isz, seg[r] + tmp_at() + b * isz,
                      (e - b) * isz);
        }
      }
    } catch (...) {
      fr.finish(slot, CallState::Failed);
      throw;
    }
    fr.finish(slot, CallState::Completed);
    g_stats.runs++;
  }
};

std::unique_ptr<ShmAllReduce> ShmAllReduce::make(const ProcessGroup& group,
                                                 DeviceInterface* iface) {
  MpiComm* base = group.base_comm();
  if (!base || base->size() < 2 || base->size() > kMaxRanks) return nullptr;
  // Every rank's host and buffer size; all ranks decide alike from the same gathered rows.
  struct Row {
    char host[64] = {};
    uint64_t capacity = 0;
  } mine;
  gethostname(mine.host, sizeof(mine.host) - 1);
  mine.capacity = custom_all_reduce_max_bytes();
  std::vector<Row> rows(base->size());
  base->all_gather_bytes(&mine, rows.data(), sizeof(Row));
  uint64_t capacity = mine.capacity;
  for (const Row& r : rows) {
    if (std::strncmp(r.host, rows[0].host, sizeof(r.host)) != 0) return nullptr;
    capacity = std::min(capacity, r.capacity);
  }
  return std::unique_ptr<ShmAllReduce>(new ShmAllReduce(group, iface, capacity));
}

ShmAllReduce::~ShmAllReduce() = default;

bool ShmAllReduce::eligible_in_pieces(const Tensor& in, ReduceOp op) const {
  const CustomAllReduceMode mode = custom_all_reduce_mode();
  if (mode == CustomAllReduceMode::Off) return false;
  if (op != ReduceOp::Sum && op != ReduceOp::Avg) return false;
  const DType t = in.dtype();
  return t == DType::Float32 || t == DType::Float16 || t == DType::BFloat16 || t == DType::Float64;
}

bool ShmAllReduce::eligible(const Tensor& in, ReduceOp op) const {
  const size_t n = in.nbytes();
  // One size today for both modes: the buffers are as large as Auto's threshold.
  return eligible_in_pieces(in, op) && n > 0 && n <= capacity_;
}

std::shared_ptr<ShmAllReduce::Channel> ShmAllReduce::channel(uint64_t key, Device device) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = channels_.find(key);
  if (it != channels_.end()) return it->second;
  MpiComm* base = group_.base_comm();
  auto ch = std::make_shared<Channel>();
  ch->group = &group_;
  ch->comm = group_.comm(key);
  ch->rank = base->rank();
  ch->size = base->size();
  ch->capacity = capacity_;
  ch->bytes = kPage + (2 + kRegisterFactor) * capacity_;
  ch->seg.assign(ch->size, nullptr);
  // Each rank makes its segment (sparse: pages are backed as they are written), then maps its
  // peers' by name, then unlinks its own, so nothing is left in /dev/shm once all are mapped.
  static std::atomic<int> made{0};
  struct Row {
    char name[64] = {};
    int32_t error = 0;  // errno of the first call that failed, 0 when all went well
    int32_t pad = 0;
  } mine;
  std::snprintf(mine.name, sizeof(mine.name), "/kiln_ar_%d_%d", static_cast<int>(getpid()), made++);
  int fd = shm_open(mine.name, O_CREAT | O_EXCL | O_RDWR, 0600);
  if (fd < 0 || ftruncate(fd, static_cast<off_t>(ch->bytes)) != 0) mine.error = errno;
  // The flags, tmp and staging areas are backed now: a full /dev/shm is this error on every
  // rank, not a SIGBUS at the first write (the registration area stays sparse).
  if (fd >= 0 && !mine.error)
    mine.error = posix_fallocate(fd, 0, static_cast<off_t>(kPage + 2 * capacity_));
  if (fd >= 0 && !mine.error) {
    void* p = mmap(nullptr, ch->bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED)
      mine.error = errno;
    else
      ch->seg[ch->rank] = static_cast<char*>(p);
  }
  if (fd >= 0) close(fd);
  std::vector<Row> rows(ch->size);
  base->all_gather_bytes(&mine, rows.data(), sizeof(Row));
  int failed_rank = -1, failed_errno = 0;
  for (int r = 0; r < ch->size && failed_rank < 0; ++r)
    if (rows[r].error) failed_rank = r, failed_errno = rows[r].error;
  for (int r = 0; r < ch->size && failed_rank < 0 && !mine.error; ++r) {
    if (r == ch->rank) continue;
    int pfd = shm_open(rows[r].name, O_RDWR, 0600);
    void* p =
        pfd < 0 ? MAP_FAILED : mmap(nullptr, ch->bytes, PROT_READ | PROT_WRITE, MAP_SHARED, pfd, 0);
    if (pfd >= 0) close(pfd);
    if (p == MAP_FAILED)
      mine.error = errno;
    else
      ch->seg[r] = static_cast<char*>(p);
  }
  std::vector<Row> mapped(ch->size);
  base->all_gather_bytes(&mine, mapped.data(), sizeof(Row));
  shm_unlink(mine.name);
  for (int r = 0; r < ch->size && failed_rank < 0; ++r)
    if (mapped[r].error) failed_rank = r, failed_errno = mapped[r].error;
  if (failed_rank >= 0)
    throw DistributedError(fmt::format(
        "[all_reduce] setting up the shared-memory all-reduce of {} on {} failed on group rank "
        "{}: {} (POSIX shared memory, {} bytes per segment); set KILN_CUSTOM_AR=0 to use MPI",
        ch->where(), device, failed_rank, std::strerror(failed_errno), ch->bytes));
  channels_.emplace(key, ch);
  return ch;
}

void ShmAllReduce::all_reduce(const Tensor& in, const Tensor& out, const Collective& c) {
  const Device d = in.device();
  std::shared_ptr<Channel> ch = channel(stream_key(d), d);
  std::shared_ptr<Registration> reg;
  if (iface_->capturing(d.index())) {
    reg = ch->register_pending(in.nbytes());
    g_stats.captured++;
  } else {
    g_stats.eager++;
  }
  const void* a = iface_->host_task_address(d.index(), in.impl()->data());
  void* b = iface_->host_task_address(d.index(), out.impl()->data());
  iface_->launch_host_task(
      d.index(), c.op,
      [ch, reg, a, b, n = in.numel(), t = in.dtype(), op = c.reduce,
       timeout = timeout_for(*c.group)] { ch->run(reg.get(), a, b, n, t, op, timeout); });
}

}  // namespace kiln::distributed

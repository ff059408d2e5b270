#include "kiln/distributed/shm_allreduce.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <map>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "kiln/core/error.h"
#include "kiln/core/half.h"
#include "kiln/core/tensor_impl.h"
#include "kiln/distributed/backends.h"
#include "kiln/distributed/collectives.h"
#include "kiln/distributed/flight_recorder.h"
#include "kiln/distributed/init.h"
#include "kiln/distributed/mpi_comm.h"
#include "kiln/distributed/registration_slots.h"
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
//   follows it. The exchange runs when the capture ends, on the capturing thread (the device
//   plugin's end_capture calls it: CUDA's directly, sim's through run_capture_end_hooks), so
//   two captures on one stream before either replays are two exchanges, the same on every
//   rank. On CUDA replays read the graph's buffers with no copy. Sim memory cannot be shared,
//   so here a registration is a range of the rank's shared segment that the replay copies the
//   graph's buffer into; the states and their order are CUDA's. Registrations take slots that
//   are reclaimed once the graphs holding them are gone, agreed by every rank (Note
//   [Registration slots] in registration_slots.cpp).
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
// a channel's tasks run in the order of one stream (so an all_reduce_async on the group's
// communication stream and an all-reduce on the current stream never share one). A graph keeps
// the channel of the stream it was captured on. Waits poll the call's deadline; when it passes, the
// rank writes its flight recorder and ends the job, as MPI collectives do (Note [Deadlines] in
// mpi_comm.cpp).
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
  std::atomic<uint64_t> eager{0}, captured{0}, exchanges{0}, registered{0}, runs{0}, reclaimed{0};
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
  return {g_stats.eager.load(),      g_stats.captured.load(), g_stats.exchanges.load(),
          g_stats.registered.load(), g_stats.runs.load(),     g_stats.reclaimed.load()};
}

// A registration (Note [Custom all-reduce]): where each rank's copy of one captured call's
// input sits in its segment. offset[rank] is set at capture, the peers' by the exchange. The
// graph's host task shares it; when the last graph holding it is gone its slot is released
// (Note [Registration slots]).
struct Registration {
  int slot = -1;
  size_t bytes = 0;
  std::vector<size_t> offset;
  std::atomic<bool> exchanged{false};
  std::shared_ptr<RegistrationSlots> slots;

  ~Registration() {
    if (slots) slots->release(slot);
  }
};

// One stream's shared segments: [Signal | tmp | staging | registered], capacity bytes each for
// tmp and staging, kRegisterFactor times that for registrations. The first three are backed
// when the channel is made, a registration's range when its capture ends (exchange()).
struct ShmAllReduce::Channel {
  const ProcessGroup* group = nullptr;
  MpiComm* comm = nullptr;  // the stream's communicator: debug checks in the stream's tasks
  int rank = 0, size = 1;
  size_t capacity = 0, bytes = 0;
  int device_index = 0;
  int fd = -1;             // this rank's segment, kept open to back registrations
  std::vector<char*> seg;  // every rank's segment, mapped here
  std::mutex mu;
  std::shared_ptr<RegistrationSlots> slots;
  std::map<size_t, size_t> free_ranges;  // of the registration area: offset -> bytes (under mu)
  std::map<int, std::pair<size_t, size_t>> range_of_slot;  // taken slots' ranges (under mu)
  std::vector<std::shared_ptr<Registration>> pending;      // under mu
  uint64_t seq = 0;  // calls run, by this channel's tasks only

  size_t tmp_at() const { return kPage; }
  size_t staging_at() const { return kPage + capacity; }
  size_t registered_at() const { return kPage + 2 * capacity; }
  Signal& signal(int r) const { return *reinterpret_cast<Signal*>(seg[r]); }

  ~Channel() {
    for (char* p : seg)
      if (p) munmap(p, bytes);
    if (fd >= 0) close(fd);
  }

  std::string where() const {
    return fmt::format("group {} (rank {} of {})", group->name(), rank, size);
  }

  // The lowest range of `need` bytes left in the registration area, or npos (under mu).
  size_t take_range(size_t need) {
    for (auto it = free_ranges.begin(); it != free_ranges.end(); ++it) {
      if (it->second < need) continue;
      const size_t at = it->first, left = it->second - need;
      free_ranges.erase(it);
      if (left) free_ranges.emplace(at + need, left);
      return at;
    }
    return std::string::npos;
  }
  void free_range(size_t at, size_t n) {  // under mu; merges with its neighbours
    auto next = free_ranges.lower_bound(at);
    if (next != free_ranges.end() && at + n == next->first) {
      n += next->second;
      next = free_ranges.erase(next);
    }
    if (next != free_ranges.begin()) {
      auto prev = std::prev(next);
      if (prev->first + prev->second == at) {
        prev->second += n;
        return;
      }
    }
    free_ranges.emplace(at, n);
  }

  // A pending registration of `nbytes`, on the capturing thread. When no slot or no range is
  // left, every rank reclaims the slots released everywhere (collective over `host`; every rank
  // gets here at the same call, Note [Registration slots]), and raises alike if still none.
  std::shared_ptr<Registration> register_pending(size_t nbytes, const MpiComm& host) {
    const size_t need = round_up(nbytes, 64);
    std::lock_guard<std::mutex> lock(mu);
    for (bool reclaimed = false;; reclaimed = true) {
      const int slot = slots->take();
      const size_t at = slot < 0 ? std::string::npos : take_range(need);
      if (at != std::string::npos) {
        auto reg = std::make_shared<Registration>();
        reg->slot = slot;
        reg->bytes = nbytes;
        reg->offset.assign(size, 0);
        reg->offset[rank] = registered_at() + at;
        reg->slots = slots;
        range_of_slot[slot] = {at, need};
        pending.push_back(reg);
        return reg;
      }
      if (slot >= 0) slots->untake(slot);
      if (reclaimed) {
        size_t used = kRegisterFactor * capacity;
        for (auto& [o, n] : free_ranges) used -= n;
        throw DistributedError(fmt::format(
            "[all_reduce] the shared-memory all-reduce of {} has no room to register a captured "
            "input of {} bytes: {} of {} slots and {} of {} bytes are held by graphs that are "
            "still alive on some rank; destroy graphs you no longer replay, raise "
            "KILN_CUSTOM_AR_SLOTS, or set KILN_CUSTOM_AR=0",
            where(), nbytes, range_of_slot.size(), slots->end(), used, kRegisterFactor * capacity));
      }
      for (int s : slots->reclaim(host)) {
        auto it = range_of_slot.find(s);
        if (it == range_of_slot.end()) continue;
        free_range(it->second.first, it->second.second);
        range_of_slot.erase(it);
        g_stats.reclaimed++;
      }
    }
  }

  // Completes every pending registration at once (Note [Custom all-reduce]), on the thread that
  // ended the capture, collective over `host`: backs each one's range of this rank's segment,
  // then all-gathers the offsets. A failure on any rank is every rank's DistributedError.
  void exchange(const MpiComm& host) {
    std::vector<std::shared_ptr<Registration>> regs;
    {
      std::lock_guard<std::mutex> lock(mu);
      regs.swap(pending);
    }
    const uint64_t mine = regs.size();
    std::vector<uint64_t> counts(size);
    host.all_gather_bytes(&mine, counts.data(), sizeof mine);
    for (int r = 0; r < size; ++r)
      if (counts[r] != regs.size())
        throw DistributedError(
            fmt::format("[all_reduce] the ranks of {} captured different numbers of shared-memory "
                        "all-reduces: rank {} registered {}, rank {} registered {}",
                        where(), rank, regs.size(), r, counts[r]));
    if (regs.empty()) return;
    // Back the ranges now: a /dev/shm too small is this error on every rank, not a SIGBUS when
    // a replay first writes there.
    std::string error;
    for (auto& r : regs) {
      const size_t need = round_up(r->bytes, 64);
      const int e =
          posix_fallocate(fd, static_cast<off_t>(r->offset[rank]), static_cast<off_t>(need));
      if (e) {
        error = fmt::format(
            "backing {} bytes at offset {} of its segment: {} (POSIX shared "
            "memory: is /dev/shm full?)",
            need, r->offset[rank], std::strerror(e));
        break;
      }
    }
    agree_on_outcome(host, error, "all_reduce",
                     fmt::format("registering {} captured input(s) of the shared-memory all-reduce",
                                 regs.size()),
                     where());
    // Per registration: its bytes and this rank's offset.
    std::vector<uint64_t> row;
    for (auto& r : regs) row.insert(row.end(), {r->bytes, r->offset[rank]});
    std::vector<uint64_t> all(row.size() * size);
    host.all_gather_bytes(row.data(), all.data(), row.size() * sizeof(uint64_t));
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
      if (reg && !reg->exchanged.load(std::memory_order_acquire))
        throw DistributedError(fmt::format(
            "[all_reduce] a graph replays a shared-memory all-reduce of {} whose registration was "
            "never exchanged (bug: its capture's end should have exchanged it or failed)",
            where()));
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

namespace {
std::mutex g_instances_mu;
std::vector<ShmAllReduce*>& instances() {
  static auto* v = new std::vector<ShmAllReduce*>();  // never destroyed: hooks run at exit
  return *v;
}
}  // namespace

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
  static const bool hooked = [] {
    add_capture_end_hook(&ShmAllReduce::end_capture);
    return true;
  }();
  (void)hooked;
  auto made = std::unique_ptr<ShmAllReduce>(new ShmAllReduce(group, iface, capacity));
  std::lock_guard<std::mutex> lock(g_instances_mu);
  instances().push_back(made.get());
  return made;
}

ShmAllReduce::~ShmAllReduce() {
  std::lock_guard<std::mutex> lock(g_instances_mu);
  std::erase(instances(), this);
}

void ShmAllReduce::end_capture(DeviceInterface* iface, int index) {
  std::vector<std::pair<const ProcessGroup*, std::shared_ptr<Channel>>> todo;
  {
    std::lock_guard<std::mutex> lock(g_instances_mu);
    for (ShmAllReduce* a : instances()) {
      if (a->iface_ != iface) continue;
      std::lock_guard<std::mutex> l(a->mu_);
      for (auto& [key, ch] : a->channels_) {
        std::lock_guard<std::mutex> c(ch->mu);
        if (ch->device_index == index && !ch->pending.empty()) todo.emplace_back(&a->group_, ch);
      }
    }
  }
  for (auto& [group, ch] : todo) ch->exchange(*group->comm(0));
}

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
  ch->device_index = device.index();
  ch->seg.assign(ch->size, nullptr);
  ch->slots = std::make_shared<RegistrationSlots>(0, custom_all_reduce_slots());
  ch->free_ranges.emplace(0, kRegisterFactor * capacity_);
  // Each rank makes its segment, then maps its peers' by name, then unlinks its own, so nothing
  // is left in /dev/shm once all are mapped. Every rank maps whole segments; a segment's file
  // covers the flags, tmp and staging areas (backed now) and grows as registrations are backed.
  static std::atomic<int> made{0};
  struct Row {
    char name[64] = {};
    int32_t error = 0;  // errno of the first call that failed, 0 when all went well
    int32_t pad = 0;
  } mine;
  std::snprintf(mine.name, sizeof(mine.name), "/kiln_ar_%d_%d", static_cast<int>(getpid()), made++);
  int fd = shm_open(mine.name, O_CREAT | O_EXCL | O_RDWR, 0600);
  if (fd < 0) mine.error = errno;
  // The flags, tmp and staging areas are backed now: a full /dev/shm is this error on every
  // rank, not a SIGBUS at the first write.
  if (fd >= 0 && !mine.error)
    mine.error = posix_fallocate(fd, 0, static_cast<off_t>(kPage + 2 * capacity_));
  if (fd >= 0 && !mine.error) {
    void* p = mmap(nullptr, ch->bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED)
      mine.error = errno;
    else
      ch->seg[ch->rank] = static_cast<char*>(p);
  }
  ch->fd = fd;  // closed with the channel
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
    reg = ch->register_pending(in.nbytes(), *group_.comm(0));
    g_stats.captured++;
  } else {
    g_stats.eager++;
  }
  const void* a = iface_->host_task_address(d.index(), in.impl()->data());
  void* b = iface_->host_task_address(d.index(), out.impl()->data());
  note_host_task_collectives(d);
  iface_->launch_host_task(
      d.index(), c.op,
      [ch, reg, a, b, n = in.numel(), t = in.dtype(), op = c.reduce,
       timeout = timeout_for(*c.group)] { ch->run(reg.get(), a, b, n, t, op, timeout); });
}

}  // namespace kiln::distributed

// The host side of the custom all-reduce (custom_allreduce.h): set-up over MPI, eligibility,
// eager staging, registration of captured buffers and their exchange after the capture.
//
// Note [Custom all-reduce on CUDA]
// The design is Note [Custom all-reduce] in kiln/distributed/shm_allreduce.cpp; on CUDA:
// - Set-up, when the group is made (the NCCL backend's factory calls make(), never inside a
//   capture): every rank all-gathers its host, its GPU's UUID and PCI bus id, the co-resident
//   blocks of the kernels and its KILN_CUSTOM_AR_MAX_BYTES. The path exists only where every
//   pair of ranks can map each other's memory: the same host, and the same GPU (two processes
//   on one GPU share memory by IPC too, which is how the tests run on one GPU) or
//   cudaDeviceCanAccessPeer. Every rank decides from the same gathered rows, so all agree.
//   Each rank then allocates one buffer, [Signal | tmp | staging | LL lines], zeroes it, and
//   shares it by cudaIpcGetMemHandle; the peers open it (cudaIpcOpenMemHandle). Any failure on any
//   rank leaves every rank without the path (null), never some ranks with it.
// - Each call's kernel reads its inputs' addresses from a RankData slot in device memory: slot
//   0 holds every rank's staging buffer (eager calls); each captured call gets a slot of its
//   own. The slot's address is the kernel's argument, so a graph may hold it while its
//   contents are written after the capture.
// - Eager: the input is copied into the rank's staging buffer, then summed: a one-shot kernel
//   copies a 16-byte-aligned input itself before its first barrier (one launch; Note [Which
//   barriers fence] in custom_allreduce.cu), otherwise a copy on the stream precedes the kernel.
//   Captured calls that stage (below) use a copy in the graph: whether a captured call stages
//   differs between ranks, and the fence of the first barrier must not.
// - Captured: the input's address is recorded as a pending registration and the kernel is
//   captured with the call's slot. When the capture ends (end_capture(), called by the device
//   plugin's end_capture) every pending registration is completed in one exchange: for each,
//   a rank sends the IPC handle of the allocation holding its buffer and the buffer's offset
//   in it (the caching allocator hands out pieces of larger cudaMalloc segments, and IPC
//   shares whole allocations: cuMemGetAddressRange gives the base), the peers open the handle
//   (once per allocation) and add the offset, and the slot is written. Replays then read the
//   graph's own buffers with no copy. Imports are kept by peer and base address with the
//   allocation's buffer id (CU_POINTER_ATTRIBUTE_BUFFER_ID, never reused in a process): an
//   allocation opened twice fails (cudaErrorAlreadyMapped), and a peer's segment may be freed
//   (its graph gone, its cache emptied) and another allocated over its addresses, with another
//   id: the stale imports it overlaps are then closed before the new one is opened. Only a
//   graph whose peers' buffers are already gone could still name them, and replaying that one
//   is invalid anyway. An input the kernel cannot read in place (an in-place call, whose
//   output a one-shot kernel would overwrite while peers read it, or an address not 16-byte
//   aligned) is copied to staging inside the graph instead, and its peers are told so.
//   Getting a handle or an address range, or opening a peer's handle, can fail on one rank
//   only: each step ends with every rank's outcome all-gathered, and all raise the same
//   DistributedError naming the rank that failed (agree_on_outcome).
// - Slots: KILN_CUSTOM_AR_SLOTS (default 4096) per group, slot 0 included. A captured call's
//   slot is held by a user object that the capturing graph retains
//   (cudaGraphRetainUserObject); executable graphs instantiated or updated from it take
//   references, and CUDA runs its destructor once the graph, its executables and their
//   launches are gone, which releases the slot. Released slots are freed when every rank has
//   released them (Note [Registration slots] in kiln/distributed/registration_slots.cpp).
// - Flags: Signal::self_counter, in device memory, is advanced by each kernel by its two
//   barriers; the flag value is never a kernel argument (a graph would freeze it, and the second
//   replay would wait for a value that was already used). A barrier that orders data stores its
//   flag with st.release.sys and polls with ld.acquire.sys, the others with volatile accesses
//   (Note [Which barriers fence] in custom_allreduce.cu). The grid is no larger than the blocks
//   every kernel can keep resident at once (block b waits for block b of each peer, so all must run
//   together), and the same on every rank (the minimum gathered at set-up).
// - Deadlines: a barrier polls %globaltimer against the call's deadline; on expiry it sets the
//   device's error word with this group's code, so the next synchronize raises a DeviceError
//   naming the group, and the kernel ends. The flags are then out of step: the group's custom
//   all-reduce cannot be used again.
// - One stream at a time: two streams running the group's kernels at once would share the
//   staging buffer and the flags. An eager call on another stream than the previous eager
//   call's (all_reduce_async runs on the group's communication stream, a plain all-reduce on
//   the current stream) first makes its stream wait for an event recorded after that call, so
//   the eager calls of a group run one after another whatever their streams. A graph's calls
//   run where the graph is launched, which this code does not see: launch a graph holding them
//   on a stream ordered with the group's other calls.
//
// Note [Which all-reduce in Auto]
// Measured on two H200s against NCCL's blocking communicators (bench/gpu_runs.md, S10, T8 and
// U1-U2), sum of float32, one call and its synchronize, custom against NCCL: captured (a graph
// of 10 chained calls), 4.1 against 9.7 us at 8 B, 4.1 against 10.0 at 1 KiB, 4.2 against 11.8
// at 64 KiB, 6.1 against 13.0 at 256 KiB (the LL kernel), 9.5 against 13.9 at 512 KiB, 13.0
// against 18.3 at 1 MiB, 45.4 against 50.9 at 8 MiB; eager, 13.8 against 22.5 at 8 B, 14.6
// against 26.2 at 64 KiB, 16.0 against 28.1 at 256 KiB, 58.9 against 60.4 at 8 MiB. The custom
// path is ahead at every size from 8 B to its capacity, eager and captured, so in Auto it takes
// every call it can: sum and avg of float32, float16 and bfloat16 up to
// KILN_CUSTOM_AR_MAX_BYTES (8 MiB), NCCL the rest. Within it, the LL kernel takes whole 4-byte
// words up to 512 KiB (its buffers' room): it beats the one-shot kernel at every size up to
// 256 KiB (captured 6.1 against 6.9 us at 256 KiB, eager 16.0 against 18.7) and the two-shot
// one at 512 KiB (9.5 against 10.2 captured, 20.2 against 26.9 eager); at 768 KiB the two are
// even captured (13.2 against 13.0) and at 1 MiB two-shot wins (12.9 against 17.0: the LL
// lines carry twice the data). (Before S10 an eager call copied its input to staging with a
// launch of its own, which cost what NCCL's single kernel saved: Auto then sent eager calls
// under 1 MiB to NCCL; and sizes off a 16-byte pack, 8 B among them, were NCCL's.) Every rank
// decides alike: the decision depends on the call alone.
#include "kiln/backend/cuda/custom_allreduce.h"

#include <cuda.h>
#include <cuda_runtime.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "kiln/backend/cuda/common.h"
#include "kiln/backend/cuda/nccl.h"
#include "kiln/core/error.h"
#include "kiln/core/tensor_impl.h"
#include "kiln/distributed/collectives.h"
#include "kiln/distributed/flight_recorder.h"
#include "kiln/distributed/mpi_comm.h"
#include "kiln/distributed/registration_slots.h"
#include "kiln/distributed/shm_allreduce.h"

namespace kiln::cuda {

namespace dist = kiln::distributed;

namespace {

// Up to this size one-shot (every rank reads every input once) beats two-shot.
constexpr size_t kOneShotMaxBytes = size_t{256} << 10;
// The LL buffers' room, in bytes of data a rank sends a peer in one call (Note [The LL
// all-reduce] in custom_allreduce.cu), at most; KILN_CUSTOM_AR_LL_MAX_BYTES (the least of every
// rank's, gathered at set-up) may make it smaller. Note [Which all-reduce in Auto]: why 512 KiB.
constexpr size_t kLLRoomBytes = size_t{512} << 10;
struct Counters {
  std::atomic<uint64_t> eager{0}, captured{0}, staged_in_capture{0}, exchanges{0}, registered{0},
      reclaimed{0}, ordered{0}, ll{0};
} g_stats;

size_t ll_max_from_env() {
  const char* e = std::getenv("KILN_CUSTOM_AR_LL_MAX_BYTES");
  return e ? static_cast<size_t>(std::strtoull(e, nullptr, 10)) : kLLRoomBytes;
}

std::atomic<size_t> g_ll_cap{SIZE_MAX};  // set_custom_all_reduce_ll_max_bytes

using AddressRangeFn = CUresult (*)(CUdeviceptr*, size_t*, CUdeviceptr);
AddressRangeFn address_range() {
  static auto fn = reinterpret_cast<AddressRangeFn>(driver_function("cuMemGetAddressRange"));
  return fn;
}
using PointerAttributeFn = CUresult (*)(void*, CUpointer_attribute, CUdeviceptr);
PointerAttributeFn pointer_attribute() {
  static auto fn = reinterpret_cast<PointerAttributeFn>(driver_function("cuPointerGetAttribute"));
  return fn;
}

int dtype_code(DType t) { return t == DType::Float16 ? 1 : t == DType::BFloat16 ? 2 : 0; }

}  // namespace

bool nccl_enabled() {
  static const bool on = [] {
    const char* v = std::getenv("KILN_NCCL");
    return !(v && std::string_view(v) == "0");
  }();
  return on;
}

CustomAllReduceStats custom_all_reduce_stats() {
  return {g_stats.eager.load(),     g_stats.captured.load(),   g_stats.staged_in_capture.load(),
          g_stats.exchanges.load(), g_stats.registered.load(), g_stats.reclaimed.load(),
          g_stats.ordered.load(),   g_stats.ll.load()};
}

size_t set_custom_all_reduce_ll_max_bytes(size_t bytes) { return g_ll_cap.exchange(bytes); }

struct CustomAllReduce::State {
  const dist::ProcessGroup* group = nullptr;
  dist::MpiComm* base = nullptr;
  int rank = 0, size = 1, device = 0;
  size_t capacity = 0;        // staging and tmp bytes, the same on every rank
  size_t ll_room = 0;         // the largest LL call, the same on every rank (0: none)
  int max_blocks = 0;         // the same on every rank
  char* buffer = nullptr;     // this rank's [Signal | tmp | staging | LL lines]
  std::vector<char*> bases;   // every rank's buffer, mapped here
  char* rank_data = nullptr;  // slots->end() RankData, device memory; slot 0 is staging's
  std::shared_ptr<dist::RegistrationSlots> slots;
  int error_code = 0;
  std::mutex mu;
  // Of the last eager call (under mu). The legacy default stream's handle is null, so whether
  // there was a call is a flag of its own.
  bool had_eager = false;
  cudaStream_t last_stream = nullptr;
  cudaEvent_t last_done = nullptr;  // recorded after it
  struct Pending {
    int slot;
    const char* ptr;  // null: the replay copies the input to staging
    size_t bytes;
    unsigned long long capture;  // the capture's id (cudaStreamGetCaptureInfo)
  };
  std::vector<Pending> pending;  // under mu
  struct Import {
    uint64_t size = 0, buffer_id = 0;  // the allocation's (CU_POINTER_ATTRIBUTE_BUFFER_ID)
    char* mapped = nullptr;
  };
  std::map<std::pair<int, uint64_t>, Import> opened;  // peer rank, its base -> its import
  uint64_t seq = 0;                                   // calls issued

  char* staging(int r) const {
    return bases[r] + detail::custom_all_reduce_signal_bytes() + capacity;
  }
  // Where the LL lines start in a rank's buffer: 2 parities x size ranks x ll_room / 4 lines of
  // 8 bytes follow.
  size_t ll_offset() const { return detail::custom_all_reduce_signal_bytes() + 2 * capacity; }
  size_t buffer_bytes() const { return ll_offset() + 2 * static_cast<size_t>(size) * ll_room * 2; }
  char* slot_at(int slot) const {
    return rank_data + static_cast<size_t>(slot) * detail::custom_all_reduce_rank_data_bytes();
  }
  std::string where() const {
    return fmt::format("group {} (rank {} of {}) on cuda:{}", group->name(), rank, size, device);
  }
  // A slot for a call captured on `stream`, held by the capturing graph; its pending entry
  // is pending.back() (under mu).
  int take_slot(cudaStream_t stream, std::string_view op);
  void exchange();
  // A rank's registration of one captured input, as every rank all-gathers it.
  struct Row {
    uint64_t slot = 0, bytes = 0, offset = 0;
    uint64_t base = 0, size = 0, buffer_id = 0;  // its allocation
    int32_t staged = 0, pad = 0;
    cudaIpcMemHandle_t handle{};
  };
  // Peer r's allocation holding its captured input `input`, mapped here (Note [Custom
  // all-reduce on CUDA], imports).
  char* import(int r, const Row& row, size_t input);
};

namespace {

std::mutex g_instances_mu;
std::vector<CustomAllReduce::State*>& instances() {
  static auto* v = new std::vector<CustomAllReduce::State*>();  // never destroyed: see ~
  return *v;
}

// An MPI all-gather with a deadline and a flight-recorder entry: set-up and exchanges.
void gather(const CustomAllReduce::State& s, const void* in, void* out, size_t nbytes) {
  dist::CallInfo info{"custom_ar_setup", s.group, DType::UInt8, static_cast<int64_t>(nbytes)};
  s.base->all_gather(in, out, static_cast<int64_t>(nbytes), info);
}

// Whether every rank says yes.
bool all_agree(const CustomAllReduce::State& s, bool mine) {
  int32_t v = mine ? 1 : 0;
  std::vector<int32_t> all(s.size);
  gather(s, &v, all.data(), sizeof v);
  return std::all_of(all.begin(), all.end(), [](int32_t x) { return x == 1; });
}

}  // namespace

CustomAllReduce::CustomAllReduce(std::unique_ptr<State> s) : s_(std::move(s)) {
  std::lock_guard<std::mutex> lock(g_instances_mu);
  instances().push_back(s_.get());
}

// Groups live until exit, and CUDA may be shut down by then: the buffers and mappings are left
// for the process's end to free, as the NCCL communicators are (Note [NCCL communicators]).
CustomAllReduce::~CustomAllReduce() {
  std::lock_guard<std::mutex> lock(g_instances_mu);
  std::erase(instances(), s_.get());
  (void)s_.release();
}

std::unique_ptr<CustomAllReduce> CustomAllReduce::make(dist::ProcessGroup& group, int device) {
  dist::MpiComm* base = group.base_comm();
  if (!base || base->size() < 2 || base->size() > detail::custom_all_reduce_max_ranks())
    return nullptr;
  auto s = std::make_unique<State>();
  s->group = &group;
  s->base = base;
  s->rank = base->rank();
  s->size = base->size();
  s->device = device;
  current_stream(device);  // makes `device` this thread's device

  struct Row {
    char host[64] = {};
    char bus[32] = {};
    char uuid[16] = {};
    uint64_t capacity = 0;
    uint64_t ll_max = 0;
    int32_t blocks = 0;
    int32_t pad = 0;
  } mine;
  gethostname(mine.host, sizeof(mine.host) - 1);
  cudaDeviceProp prop{};
  bool ok = cudaGetDeviceProperties(&prop, device) == cudaSuccess &&
            cudaDeviceGetPCIBusId(mine.bus, sizeof(mine.bus), device) == cudaSuccess;
  if (ok) std::memcpy(mine.uuid, prop.uuid.bytes, sizeof(mine.uuid));
  mine.capacity = dist::custom_all_reduce_max_bytes() / 16 * 16;
  mine.ll_max = std::min(ll_max_from_env(), kLLRoomBytes) / 4 * 4;
  mine.blocks = ok ? detail::custom_all_reduce_max_blocks(device) : 0;
  cudaGetLastError();
  std::vector<Row> rows(s->size);
  gather(*s, &mine, rows.data(), sizeof(Row));
  s->capacity = mine.capacity;
  s->max_blocks = mine.blocks;
  s->ll_room = mine.ll_max;
  for (int r = 0; r < s->size; ++r) {
    const Row& row = rows[r];
    s->capacity = std::min<size_t>(s->capacity, row.capacity);
    s->ll_room = std::min<size_t>(s->ll_room, row.ll_max);
    s->max_blocks = std::min(s->max_blocks, static_cast<int>(row.blocks));
    if (std::strncmp(row.host, mine.host, sizeof(row.host)) != 0) ok = false;
    if (r == s->rank || !ok || std::memcmp(row.uuid, mine.uuid, sizeof(row.uuid)) == 0) continue;
    int peer = -1, can = 0;
    ok = cudaDeviceGetByPCIBusId(&peer, row.bus) == cudaSuccess &&
         cudaDeviceCanAccessPeer(&can, device, peer) == cudaSuccess && can;
    cudaGetLastError();
  }
  if (!all_agree(*s, ok && s->max_blocks > 0 && s->capacity > 0)) return nullptr;

  // The shared buffers.
  s->ll_room = std::min(s->ll_room, s->capacity);
  const size_t bytes = s->buffer_bytes();
  cudaIpcMemHandle_t handle{};
  ok = cudaMalloc(&s->buffer, bytes) == cudaSuccess &&
       cudaMemset(s->buffer, 0, bytes) == cudaSuccess &&
       cudaIpcGetMemHandle(&handle, s->buffer) == cudaSuccess;
  cudaGetLastError();
  std::vector<cudaIpcMemHandle_t> handles(s->size);
  gather(*s, &handle, handles.data(), sizeof handle);
  if (!all_agree(*s, ok)) {
    if (s->buffer) cudaFree(s->buffer);
    return nullptr;
  }
  s->bases.assign(s->size, nullptr);
  s->bases[s->rank] = s->buffer;
  for (int r = 0; r < s->size && ok; ++r) {
    if (r == s->rank) continue;
    void* p = nullptr;
    ok = cudaIpcOpenMemHandle(&p, handles[r], cudaIpcMemLazyEnablePeerAccess) == cudaSuccess;
    s->bases[r] = static_cast<char*>(p);
  }
  cudaGetLastError();
  const size_t rd = detail::custom_all_reduce_rank_data_bytes();
  s->slots = std::make_shared<dist::RegistrationSlots>(1, dist::custom_all_reduce_slots());
  ok = ok && cudaMalloc(&s->rank_data, s->slots->end() * rd) == cudaSuccess &&
       cudaEventCreateWithFlags(&s->last_done, cudaEventDisableTiming) == cudaSuccess;
  if (ok) {  // slot 0: every rank's staging buffer
    std::vector<char> slot0(rd, 0);
    for (int r = 0; r < s->size; ++r) {
      char* p = s->staging(r);
      std::memcpy(slot0.data() + r * sizeof(char*), &p, sizeof p);
    }
    ok = cudaMemcpy(s->rank_data, slot0.data(), rd, cudaMemcpyHostToDevice) == cudaSuccess;
  }
  cudaGetLastError();
  if (!all_agree(*s, ok)) {
    for (int r = 0; r < s->size; ++r)
      if (r != s->rank && s->bases[r]) cudaIpcCloseMemHandle(s->bases[r]);
    if (s->rank_data) cudaFree(s->rank_data);
    if (s->last_done) cudaEventDestroy(s->last_done);
    cudaFree(s->buffer);
    return nullptr;
  }
  s->error_code = error_code(
      fmt::format("[all_reduce] the custom all-reduce of {} timed out waiting for a peer (a rank "
                  "that stopped, or ranks that issued different collectives); its flags are out "
                  "of step, so the group cannot run it again",
                  s->where())
          .c_str());
  return std::unique_ptr<CustomAllReduce>(new CustomAllReduce(std::move(s)));
}

bool CustomAllReduce::eligible(const Tensor& in, dist::ReduceOp op) const {
  const dist::CustomAllReduceMode mode = dist::custom_all_reduce_mode();
  if (mode == dist::CustomAllReduceMode::Off) return false;
  if (op != dist::ReduceOp::Sum && op != dist::ReduceOp::Avg) return false;
  const DType t = in.dtype();
  if (t != DType::Float32 && t != DType::Float16 && t != DType::BFloat16) return false;
  const size_t n = in.nbytes();
  return n > 0 && n <= s_->capacity;  // Note [Which all-reduce in Auto]
}

namespace {

// Held by a capturing graph (cudaGraphRetainUserObject): CUDA destroys it once the graph, the
// executable graphs made from it and their launches are gone, which releases the slot.
struct SlotRef {
  std::shared_ptr<dist::RegistrationSlots> slots;
  int slot;
};
void release_slot(void* p) {  // on a CUDA thread: no CUDA call here
  auto* ref = static_cast<SlotRef*>(p);
  ref->slots->release(ref->slot);
  delete ref;
}

}  // namespace

int CustomAllReduce::State::take_slot(cudaStream_t stream, std::string_view op) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  unsigned long long id = 0;
  cudaGraph_t graph = nullptr;
  KILN_CUDA_CHECK(cudaStreamGetCaptureInfo(stream, &status, &id, &graph));
  // Registrations of a capture that ended without its exchange (it failed): their graph is gone.
  std::erase_if(pending, [id](const Pending& p) { return p.capture != id; });
  int slot = slots->take();
  if (slot < 0) {  // every rank gets here at the same call (Note [Registration slots])
    g_stats.reclaimed += slots->reclaim(*base).size();
    slot = slots->take();
  }
  if (slot < 0)
    throw DistributedError(fmt::format(
        "[{}] the custom all-reduce of {} has no free registration slot: all {} are held by "
        "captured graphs still alive on some rank; destroy graphs you no longer replay, raise "
        "KILN_CUSTOM_AR_SLOTS, or set KILN_CUSTOM_AR=0",
        op, where(), slots->end() - 1));
  auto* ref = new SlotRef{slots, slot};
  cudaUserObject_t obj = nullptr;
  cudaError_t err =
      cudaUserObjectCreate(&obj, ref, release_slot, 1, cudaUserObjectNoDestructorSync);
  if (err != cudaSuccess) {
    delete ref;
    slots->untake(slot);
    KILN_CUDA_CHECK(err);
  }
  KILN_CUDA_CHECK(cudaGraphRetainUserObject(graph, obj, 1, cudaGraphUserObjectMove));
  pending.push_back({slot, nullptr, 0, id});
  return slot;
}

uint64_t CustomAllReduce::calls() const { return s_->seq; }

namespace {

// The one-shot and two-shot kernels: their inputs through the staging buffer (eager) or
// registered with the capture (under mu).
// `n` bytes from `src` (in's data) to `dst` (out's).
void launch_pull(CustomAllReduce::State& s, const Tensor& in, const Tensor& out, const char* src,
                 char* dst, size_t n, const dist::Collective& c, cudaStream_t stream, bool eager,
                 uint64_t timeout_ns) {
  int slot = 0;
  bool stage = true;
  if (!eager) {
    const bool overlap = src < dst + out.nbytes() && dst < src + n;
    stage = overlap || reinterpret_cast<uintptr_t>(src) % 16 != 0;
    slot = s.take_slot(stream, c.op);
    s.pending.back().ptr = stage ? nullptr : src;
    s.pending.back().bytes = n;
    g_stats.captured++;
    if (stage) g_stats.staged_in_capture++;
  } else {
    g_stats.eager++;
  }
  // An eager one-shot kernel stages an aligned input that is its output or apart from it
  // itself, behind a fenced first barrier on every rank (Note [Which barriers fence]).
  const bool two_shot = n > kOneShotMaxBytes;
  const bool apart = src == dst || dst + out.nbytes() <= src || src + n <= dst;
  const bool kernel_stages =
      eager && !two_shot && apart && reinterpret_cast<uintptr_t>(src) % 16 == 0;
  if (stage && !kernel_stages)
    KILN_CUDA_CHECK(cudaMemcpyAsync(s.staging(s.rank), src, n, cudaMemcpyDeviceToDevice, stream));
  detail::launch_custom_all_reduce(dtype_code(in.dtype()), s.slot_at(slot), s.bases.data(), s.rank,
                                   s.size, static_cast<int64_t>(n), eager && !two_shot,
                                   kernel_stages ? src : nullptr, dst,
                                   c.reduce == dist::ReduceOp::Avg, two_shot, s.max_blocks,
                                   timeout_ns, error_word(s.device), s.error_code, stream);
}

}  // namespace

void CustomAllReduce::all_reduce(const Tensor& in, const Tensor& out, const dist::Collective& c) {
  State& s = *s_;
  KILN_CHECK_DEVICE(in.device().index() == s.device,
                    "[{}] the tensor is on {} but the custom all-reduce of {} serves cuda:{}", c.op,
                    in.device(), s.where(), s.device);
  cudaStream_t stream = current_stream(s.device);
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  KILN_CUDA_CHECK(cudaStreamIsCapturing(stream, &capture));
  const size_t n = in.nbytes();
  const auto* src = static_cast<const char*>(in.impl()->data());
  auto* dst = static_cast<char*>(out.impl()->data());
  std::lock_guard<std::mutex> lock(s.mu);
  const bool eager = capture == cudaStreamCaptureStatusNone;
  if (eager && s.had_eager && s.last_stream != stream) {  // Note [Custom all-reduce on CUDA]
    KILN_CUDA_CHECK(cudaStreamWaitEvent(stream, s.last_done));
    g_stats.ordered++;
  }
  const auto timeout = dist::timeout_for(*c.group);
  const uint64_t timeout_ns = static_cast<uint64_t>(timeout.count()) * 1'000'000;
  // Note [The LL all-reduce] in custom_allreduce.cu: whole 4-byte words, read and written in
  // place. Decided from the size alone, as every rank decides (addresses may differ).
  const bool ll =
      n <= std::min(s.ll_room, g_ll_cap.load(std::memory_order_relaxed)) && n % 4 == 0 && n > 0;
  if (ll) {
    g_stats.ll++;
    detail::launch_custom_all_reduce_ll(dtype_code(in.dtype()), s.bases.data(), s.rank, s.size,
                                        static_cast<int64_t>(n), s.ll_offset(),
                                        static_cast<int64_t>(s.ll_room / 4), src, dst,
                                        c.reduce == dist::ReduceOp::Avg, s.max_blocks, timeout_ns,
                                        error_word(s.device), s.error_code, stream);
  } else {
    launch_pull(s, in, out, src, dst, n, c, stream, eager, timeout_ns);
  }
  check_launch("all_reduce");
  if (eager) {
    KILN_CUDA_CHECK(cudaEventRecord(s.last_done, stream));
    s.last_stream = stream;
    s.had_eager = true;
  }
  dist::FlightRecorder& fr = dist::FlightRecorder::get();
  fr.finish(fr.start(c.op, s.group->name(), ++s.seq, in.numel(), in.dtype(), -1),
            dist::CallState::Completed);  // queued; a hang shows as the kernel's deadline
}

char* CustomAllReduce::State::import(int r, const Row& row, size_t input) {
  auto it = opened.find({r, row.base});
  if (it != opened.end() && it->second.buffer_id == row.buffer_id) return it->second.mapped;
  // Another allocation than the one imported from there: the peer freed that one.
  std::erase_if(opened, [&](const auto& kv) {
    const auto& [key, old] = kv;
    const bool stale =
        key.first == r && key.second < row.base + row.size && row.base < key.second + old.size;
    if (stale) cudaIpcCloseMemHandle(old.mapped);
    return stale;
  });
  cudaGetLastError();
  void* m = nullptr;
  const cudaError_t err = cudaIpcOpenMemHandle(&m, row.handle, cudaIpcMemLazyEnablePeerAccess);
  KILN_CHECK_DEVICE(err == cudaSuccess,
                    "cudaIpcOpenMemHandle of group rank {}'s captured input {} failed: {} ({})", r,
                    input, cudaGetErrorName(err), cudaGetErrorString(err));
  opened.emplace(std::pair{r, row.base}, Import{row.size, row.buffer_id, static_cast<char*>(m)});
  return static_cast<char*>(m);
}

void CustomAllReduce::State::exchange() {
  KILN_CUDA_CHECK(cudaSetDevice(device));  // handles are opened on the current device
  std::vector<Pending> regs;
  {
    std::lock_guard<std::mutex> lock(mu);
    regs.swap(pending);
  }
  const int64_t count = static_cast<int64_t>(regs.size());
  std::vector<int64_t> counts(size);
  gather(*this, &count, counts.data(), sizeof count);
  for (int r = 0; r < size; ++r)
    if (counts[r] != count)
      throw DistributedError(fmt::format(
          "[all_reduce] the ranks of {} captured different numbers of custom all-reduces: rank "
          "{} registered {}, rank {} registered {}",
          where(), rank, count, r, counts[r]));
  // This rank's rows: what fails here fails on this rank only, so every rank hears of it.
  std::vector<Row> mine(regs.size());
  std::string error;
  try {
    for (size_t i = 0; i < regs.size(); ++i) {
      Row& row = mine[i];
      row.slot = static_cast<uint64_t>(regs[i].slot);
      row.bytes = regs[i].bytes;
      row.staged = regs[i].ptr == nullptr;
      if (row.staged) continue;
      AddressRangeFn range = address_range();
      KILN_CHECK_DEVICE(range,
                        "the driver does not provide cuMemGetAddressRange, which the custom "
                        "all-reduce needs");
      CUdeviceptr b = 0;
      size_t sz = 0;
      const CUresult r = range(&b, &sz, reinterpret_cast<CUdeviceptr>(regs[i].ptr));
      KILN_CHECK_DEVICE(r == CUDA_SUCCESS,
                        "cuMemGetAddressRange failed (CUresult {}) for captured input {} at {} (a "
                        "buffer not from cudaMalloc?)",
                        static_cast<int>(r), i, fmt::ptr(regs[i].ptr));
      row.offset = reinterpret_cast<uintptr_t>(regs[i].ptr) - static_cast<uintptr_t>(b);
      row.base = static_cast<uint64_t>(b);
      row.size = sz;
      PointerAttributeFn attribute = pointer_attribute();
      KILN_CHECK_DEVICE(
          attribute && attribute(&row.buffer_id, CU_POINTER_ATTRIBUTE_BUFFER_ID, b) == CUDA_SUCCESS,
          "cuPointerGetAttribute(CU_POINTER_ATTRIBUTE_BUFFER_ID) failed for the allocation at {} "
          "holding captured input {}",
          fmt::ptr(reinterpret_cast<void*>(b)), i);
      KILN_CUDA_CHECK(cudaIpcGetMemHandle(&row.handle, reinterpret_cast<void*>(b)));
    }
  } catch (const Error& e) {
    error = e.what();
  }
  const std::string what =
      fmt::format("registering {} captured input(s) of the custom all-reduce", regs.size());
  dist::agree_on_outcome(*base, error, "all_reduce", what, where());
  std::vector<Row> all(regs.size() * size);
  if (!regs.empty()) gather(*this, mine.data(), all.data(), regs.size() * sizeof(Row));
  for (size_t i = 0; i < regs.size(); ++i)
    for (int r = 0; r < size; ++r) {
      const Row& row = all[r * regs.size() + i];
      if (row.bytes != mine[i].bytes || row.slot != mine[i].slot)
        throw DistributedError(fmt::format(
            "[all_reduce] the ranks of {} captured different custom all-reduces: registration "
            "{} is {} bytes in slot {} on rank {} and {} bytes in slot {} on rank {}",
            where(), i, mine[i].bytes, mine[i].slot, rank, row.bytes, row.slot, r));
    }
  // Open the peers' handles and write the slots; again every rank hears of a failure.
  const size_t rd = detail::custom_all_reduce_rank_data_bytes();
  try {
    for (size_t i = 0; i < regs.size(); ++i) {
      std::vector<char> data(rd, 0);
      for (int r = 0; r < size; ++r) {
        const Row& row = all[r * regs.size() + i];
        const char* p = nullptr;
        if (r == rank) {
          p = regs[i].ptr ? regs[i].ptr : staging(rank);
        } else if (row.staged) {
          p = staging(r);
        } else {
          p = import(r, row, i) + row.offset;
        }
        std::memcpy(data.data() + r * sizeof(char*), &p, sizeof p);
      }
      KILN_CUDA_CHECK(cudaMemcpy(slot_at(regs[i].slot), data.data(), rd, cudaMemcpyHostToDevice));
    }
  } catch (const Error& e) {
    cudaGetLastError();
    error = e.what();
  }
  dist::agree_on_outcome(*base, error, "all_reduce", what, where());
  g_stats.exchanges++;
  g_stats.registered += regs.size();
}

void CustomAllReduce::end_capture(int device) {
  std::vector<State*> todo;
  {
    std::lock_guard<std::mutex> lock(g_instances_mu);
    for (State* s : instances()) {
      std::lock_guard<std::mutex> l(s->mu);
      if (s->device == device && !s->pending.empty()) todo.push_back(s);
    }
  }
  for (State* s : todo) s->exchange();
}

namespace {

// Without NCCL: all_reduce through the custom all-reduce, and every other collective refused.
class CustomOnlyBackend final : public dist::CollectiveBackend {
 public:
  explicit CustomOnlyBackend(dist::ProcessGroup& g)
      : group_(g), custom_(CustomAllReduce::make(g, nccl_device())) {}
  std::string_view name() const override { return "custom all-reduce (no NCCL)"; }

  void all_reduce(const Tensor& in, const Tensor& out, const dist::Collective& c) override {
    if (group_.size() == 1) {  // a world of one: the sum of one tensor
      if (in.impl()->data() != out.impl()->data() && in.nbytes())
        KILN_CUDA_CHECK(cudaMemcpyAsync(out.impl()->data(), in.impl()->data(), in.nbytes(),
                                        cudaMemcpyDeviceToDevice,
                                        current_stream(in.device().index())));
      return;
    }
    if (custom_ && custom_->eligible(in, c.reduce)) return custom_->all_reduce(in, out, c);
    throw DistributedError(fmt::format(
        "[{}] {}: NCCL is off{} and the custom all-reduce {} ({} bytes of {}, reduce {}; it "
        "takes sum and avg of float32, float16 and bfloat16, up to {} bytes, "
        "between ranks that can map each other's memory)",
        c.op, where(), nccl_version() ? " (KILN_NCCL=0)" : " (built without NCCL)",
        custom_ ? "cannot take this call" : "could not be set up for this group", in.nbytes(),
        in.dtype(), dist::reduce_op_name(c.reduce), dist::custom_all_reduce_max_bytes()));
  }
  void all_gather(const Tensor&, const Tensor&, const dist::Collective& c) override { refuse(c); }
  void reduce_scatter(const Tensor&, const Tensor&, const dist::Collective& c) override {
    refuse(c);
  }
  void broadcast(const Tensor&, const dist::Collective& c) override { refuse(c); }
  void all_to_all(const Tensor&, const Tensor&, const dist::Collective& c) override { refuse(c); }
  void send(const Tensor&, const dist::Collective& c) override { refuse(c); }
  void recv(const Tensor&, const dist::Collective& c) override { refuse(c); }
  void barrier(Device, const dist::Collective& c) override { refuse(c); }

 private:
  std::string where() const {
    return fmt::format("group {} (rank {} of {})", group_.name(), group_.rank(), group_.size());
  }
  [[noreturn]] void refuse(const dist::Collective& c) const {
    throw DistributedError(
        fmt::format("[{}] {}: NCCL is off{}, so cuda tensors have only the custom all-reduce", c.op,
                    where(), nccl_version() ? " (KILN_NCCL=0)" : " (built without NCCL)"));
  }

  dist::ProcessGroup& group_;
  std::unique_ptr<CustomAllReduce> custom_;
};

}  // namespace

#ifndef KILN_HAVE_NCCL
// Without NCCL in the build, cuda tensors' groups get the custom all-reduce alone.
void register_collective_backends() {
  dist::register_collective_backend(
      "cuda", [](dist::ProcessGroup& g) { return make_custom_only_backend(g); });
}
#endif

std::unique_ptr<dist::CollectiveBackend> make_custom_only_backend(dist::ProcessGroup& group) {
  return std::make_unique<CustomOnlyBackend>(group);
}

}  // namespace kiln::cuda

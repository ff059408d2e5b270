// The kernels of the custom all-reduce (Note [Custom all-reduce on CUDA] in
// custom_allreduce.cpp): one-shot and two-shot sums over buffers that the ranks share by CUDA
// IPC, behind a flag barrier. This file includes no Kiln header; custom_allreduce.h declares
// what it defines (namespace kiln::cuda::detail).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>

namespace kiln::cuda::detail {

constexpr int kMaxRanks = 8;
constexpr int kMaxBlocks = 36;
constexpr int kThreads = 512;

// The flags of one rank, at the start of its shared buffer. self_counter[b][p]: barriers block
// b has passed with peer p (advanced by each kernel, in device memory: see barrier_counts);
// peer_counter[s][b][p]: written by peer p's block b, two slots so that a peer already at the
// next barrier cannot overwrite the value this block still waits for.
// ll_counter[b]: the LL kernel's calls so far (Note [The LL all-reduce]), one copy a block.
struct Signal {
  alignas(128) uint32_t self_counter[kMaxBlocks][kMaxRanks];
  alignas(128) uint32_t peer_counter[2][kMaxBlocks][kMaxRanks];
  alignas(128) uint32_t ll_counter[kMaxBlocks];
};
constexpr size_t kSignalBytes = (sizeof(Signal) + 4095) / 4096 * 4096;

// Where each rank's input of one call is, as this rank maps it (device memory, one slot per
// eager staging buffer or captured call).
struct RankData {
  const void* ptrs[kMaxRanks];
};
// Every rank's shared buffer as this rank maps it: [Signal | tmp | staging]. Fixed when the
// group is set up, so a graph may hold them.
struct Peers {
  char* base[kMaxRanks];
};

__device__ __forceinline__ void st_release_sys(uint32_t* p, uint32_t v) {
  asm volatile("st.release.sys.global.u32 [%1], %0;" ::"r"(v), "l"(p) : "memory");
}
__device__ __forceinline__ uint32_t ld_acquire_sys(const uint32_t* p) {
  uint32_t v;
  asm volatile("ld.acquire.sys.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ void st_volatile(uint32_t* p, uint32_t v) {
  asm volatile("st.volatile.global.u32 [%1], %0;" ::"r"(v), "l"(p) : "memory");
}
__device__ __forceinline__ uint32_t ld_volatile(const uint32_t* p) {
  uint32_t v;
  asm volatile("ld.volatile.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ int64_t imin(int64_t a, int64_t b) { return a < b ? a : b; }
__device__ __forceinline__ uint64_t globaltimer() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// Note [Which barriers fence]
// A barrier orders memory only where a peer reads what a block wrote in this kernel: the
// two-shot kernel's middle barrier (its peers then read the parts it reduced into tmp), and the
// first barrier of an eager one-shot call (a rank's kernel may have staged its input itself,
// see the kernel); their flags are stored with release and polled with acquire at system scope
// on every rank. Which barriers fence depends only on what every rank knows alike (the size,
// and whether the call is captured), never on one rank's choice to stage in its kernel: a
// release read by a relaxed load orders nothing. The others carry no data, and their flags are
// plain volatile stores and loads, which cost a fraction of a system-scope fence (the one-shot
// kernel is mostly its two barriers):
// - the first, otherwise: a peer's input was written before its kernel started (an earlier
//   kernel or the staging copy on its stream, complete and in its memory by then), so reaching
//   the barrier is all a peer has to show;
// - the one-shot kernel's last: this block's reads of the peers' inputs have returned (their
//   values are already stored in the output, before the __syncthreads), so when a peer sees the
//   flag it may overwrite its input or staging buffer.
// Block b of this rank meets block b of every peer. Returns false on every thread of the block
// when a peer did not arrive within `timeout_ns` (the device's error word then holds `code`).
// A barrier that ends a phase first waits for the block's own reads and writes.
// Thread p < size (p != rank) signals peer p with `v`, this block's count of barriers with it
// (from barrier_counts()).
template <bool kStart, bool kFence>
__device__ bool barrier(const Peers& peers, int rank, int size, uint32_t v, uint64_t timeout_ns,
                        int* err, int code) {
  if constexpr (!kStart) __syncthreads();
  bool ok = true;
  const int p = static_cast<int>(threadIdx.x);
  if (p < size && p != rank) {
    auto* self = reinterpret_cast<Signal*>(peers.base[rank]);
    auto* peer = reinterpret_cast<Signal*>(peers.base[p]);
    uint32_t* theirs = &peer->peer_counter[v % 2][blockIdx.x][rank];
    const uint32_t* mine = &self->peer_counter[v % 2][blockIdx.x][p];
    if constexpr (kFence)
      st_release_sys(theirs, v);
    else
      st_volatile(theirs, v);
    const uint64_t start = globaltimer();
    while ((kFence ? ld_acquire_sys(mine) : ld_volatile(mine)) != v) {
      if (globaltimer() - start > timeout_ns) {
        atomicCAS(err, 0, code);
        ok = false;
        break;
      }
    }
  }
  return __syncthreads_or(!ok) == 0;
}

// Every kernel passes two barriers. Thread p (a peer) reads how many block b has passed with p
// and advances the count by 2 at once, so the second barrier does not wait for a read of memory
// (the next kernel on the stream reads the count after this one ends); returns the count.
__device__ __forceinline__ uint32_t barrier_counts(const Peers& peers, int rank, int size) {
  const int p = static_cast<int>(threadIdx.x);
  if (p >= size || p == rank) return 0;
  uint32_t* count = &reinterpret_cast<Signal*>(peers.base[rank])->self_counter[blockIdx.x][p];
  const uint32_t v = *count;
  *count = v + 2;
  return v;
}

template <class T>
__device__ __forceinline__ float to_f(T v) {
  if constexpr (std::is_same_v<T, __half>)
    return __half2float(v);
  else if constexpr (std::is_same_v<T, __nv_bfloat16>)
    return __bfloat162float(v);
  else
    return v;
}
template <class T>
__device__ __forceinline__ T from_f(float v) {
  if constexpr (std::is_same_v<T, __half>)
    return __float2half_rn(v);
  else if constexpr (std::is_same_v<T, __nv_bfloat16>)
    return __float2bfloat16_rn(v);
  else
    return v;
}

template <class T>
struct alignas(16) Pack {
  static constexpr int N = 16 / sizeof(T);
  T v[N];
};

// Pack `i` of the sum over ranks, in rank order, accumulated in float and rounded once.
template <class T>
__device__ __forceinline__ Pack<T> reduce_pack(const RankData& d, int size, int64_t i, bool avg) {
  float acc[Pack<T>::N];
  Pack<T> x = reinterpret_cast<const Pack<T>*>(d.ptrs[0])[i];
#pragma unroll
  for (int k = 0; k < Pack<T>::N; ++k) acc[k] = to_f(x.v[k]);
  for (int r = 1; r < size; ++r) {
    x = reinterpret_cast<const Pack<T>*>(d.ptrs[r])[i];
#pragma unroll
    for (int k = 0; k < Pack<T>::N; ++k) acc[k] += to_f(x.v[k]);
  }
  Pack<T> out;
#pragma unroll
  for (int k = 0; k < Pack<T>::N; ++k)
    out.v[k] = from_f<T>(avg ? acc[k] / static_cast<float>(size) : acc[k]);
  return out;
}

template <class T>
__device__ __forceinline__ void store_pack(void* out, int64_t i, const Pack<T>& p, bool aligned) {
  if (aligned) {
    reinterpret_cast<Pack<T>*>(out)[i] = p;
    return;
  }
  T* o = static_cast<T*>(out) + i * Pack<T>::N;
#pragma unroll
  for (int k = 0; k < Pack<T>::N; ++k) o[k] = p.v[k];
}

// Element `i` (of type T) of the sum over ranks, as reduce_pack sums it.
template <class T>
__device__ __forceinline__ T reduce_element(const RankData& d, int size, int64_t i, bool avg) {
  float acc = to_f(static_cast<const T*>(d.ptrs[0])[i]);
  for (int r = 1; r < size; ++r) acc += to_f(static_cast<const T*>(d.ptrs[r])[i]);
  return from_f<T>(avg ? acc / static_cast<float>(size) : acc);
}

// out = the sum of every rank's input: `packs` packs of 16 bytes, then `tail` elements (a size
// that is not a whole number of packs), which block 0 sums one a thread, reading the inputs
// directly in both kernels. One-shot: every rank reads every input. Two-shot: rank r reduces
// packs [r*part, (r+1)*part) into its tmp, then every rank copies every part. Block b handles
// the same packs in both phases on every rank, so it only meets block b of its peers. The
// slot's addresses are read before the first barrier, while it waits.
// An eager one-shot call (`fence_start`) meets its peers at a fenced first barrier; given
// `stage_from`, it first copies that into its staging buffer (this rank's entry of the slot)
// instead of a copy launched before it (one launch, not two): block b copies exactly the packs
// (and block 0 the tail) that block b of every peer reads, and the same thread later writes
// them to `out`, so an in-place call is safe too.
template <class T, bool kTwoShot>
__global__ void __launch_bounds__(kThreads)
    custom_all_reduce_kernel(const RankData* rank_data, Peers peers, int rank, int size,
                             int64_t packs, int tail, bool fence_start, const void* stage_from,
                             void* out, bool out_aligned, bool avg, uint64_t timeout_ns, int* err,
                             int code) {
  const RankData d = *rank_data;
  const uint32_t passed = barrier_counts(peers, rank, size);
  const int64_t first = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  bool met;
  if (!kTwoShot && fence_start) {
    if (stage_from) {
      auto* staging = const_cast<Pack<T>*>(static_cast<const Pack<T>*>(d.ptrs[rank]));
      for (int64_t i = first; i < packs; i += stride)
        staging[i] = static_cast<const Pack<T>*>(stage_from)[i];
      if (blockIdx.x == 0 && static_cast<int>(threadIdx.x) < tail) {
        const int64_t i = packs * Pack<T>::N + threadIdx.x;
        reinterpret_cast<T*>(staging)[i] = static_cast<const T*>(stage_from)[i];
      }
    }
    met = barrier<false, true>(peers, rank, size, passed + 1, timeout_ns, err, code);
  } else {
    met = barrier<true, false>(peers, rank, size, passed + 1, timeout_ns, err, code);
  }
  if (!met) return;
  if (blockIdx.x == 0 && static_cast<int>(threadIdx.x) < tail) {
    const int64_t i = packs * Pack<T>::N + threadIdx.x;
    static_cast<T*>(out)[i] = reduce_element<T>(d, size, i, avg);
  }
  if constexpr (!kTwoShot) {
    for (int64_t i = first; i < packs; i += stride)
      store_pack<T>(out, i, reduce_pack<T>(d, size, i, avg), out_aligned);
    barrier<false, false>(peers, rank, size, passed + 2, timeout_ns, err, code);
  } else {
    const int64_t part = (packs + size - 1) / size;
    auto* tmp = reinterpret_cast<Pack<T>*>(peers.base[rank] + kSignalBytes);
    for (int64_t i = rank * part + first; i < imin(packs, (rank + 1) * part); i += stride)
      tmp[i] = reduce_pack<T>(d, size, i, avg);
    if (!barrier<false, true>(peers, rank, size, passed + 2, timeout_ns, err, code)) return;
    for (int r = 0; r < size; ++r) {
      auto* src = reinterpret_cast<const Pack<T>*>(peers.base[r] + kSignalBytes);
      for (int64_t i = r * part + first; i < imin(packs, (r + 1) * part); i += stride)
        store_pack<T>(out, i, src[i], out_aligned);
    }
  }
}

// Note [The LL all-reduce]
// Small messages skip both barriers and the staging: every rank stores its input into each
// peer's LL buffer as 8-byte lines {4 bytes of data, the call's flag} (one 8-byte store, so a
// reader sees a line whole or not at all: NCCL's LL protocol), then reads its own LL buffer
// polling each line until it carries the call's flag, and sums, in rank order and in float as
// the other kernels do, its own input in its place. No fence and no barrier: the flag travels
// with the data, and the call costs one NVLink write one way (the one-shot kernel pays two
// barriers and a remote read).
// - The flag is the call's number v (1, 2, ...), from ll_counter in device memory: a graph may
//   replay the kernel. Every block reads its own copy (all copies are equal between calls) and
//   sets every copy it owns (b, b + grid, ...) to v, so the next call, whatever its grid, reads
//   v everywhere.
// - Two buffers, by v's parity. A peer's call v + 2 writes where this rank's call v read; it
//   starts after the peer's call v + 1 got this rank's lines of call v + 1, which this rank
//   stores only after its call v has ended (one stream, or ordered streams, run a group's
//   calls: Note [Custom all-reduce on CUDA]). So no line is overwritten before it is read, and
//   a stale line (flag v - 2) is never taken for the current one.
// - Every rank reads its own input in place: nothing to stage, nothing to register in a
//   capture, and an in-place call is safe (a thread reads word i before it writes it; an output
//   that overlaps the input only in part is not: the collectives never make one).
// - A call has at least one word, so the peer's call v + 1 does wait for one of this rank's
//   lines (an empty all-reduce never reaches the kernels).
// - Words of 4 bytes (a size that is a multiple of 4); block b stores and reads the same words on
//   every rank (the grid is the same on every rank). Whether a call takes this kernel depends on
//   the size alone, never on addresses, which may differ between ranks: an input or output
//   that is not 4-byte aligned (a 16-bit view at an odd element) is read or written a half at a
//   time.
// - A line not there within the deadline sets the error word, as a barrier does.

// A line: the data in the low 4 bytes, the flag in the high 4, stored and loaded as one 8-byte
// scalar (single-copy atomic).
__device__ __forceinline__ void st_line(uint64_t* p, uint32_t data, uint32_t flag) {
  const uint64_t v = static_cast<uint64_t>(flag) << 32 | data;
  asm volatile("st.volatile.global.b64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}
__device__ __forceinline__ uint64_t ld_line(const uint64_t* p) {
  uint64_t v;
  asm volatile("ld.volatile.global.b64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
}

// Word i of `p`, 4-byte aligned or (a 16-bit view at an odd element) only 2-byte aligned.
__device__ __forceinline__ uint32_t load_word(const void* p, int64_t i, bool aligned) {
  if (aligned) return static_cast<const uint32_t*>(p)[i];
  const auto* h = static_cast<const uint16_t*>(p) + 2 * i;
  return static_cast<uint32_t>(h[0]) | static_cast<uint32_t>(h[1]) << 16;
}
__device__ __forceinline__ void store_word(void* p, int64_t i, uint32_t w, bool aligned) {
  if (aligned) {
    static_cast<uint32_t*>(p)[i] = w;
    return;
  }
  auto* h = static_cast<uint16_t*>(p) + 2 * i;
  h[0] = static_cast<uint16_t>(w);
  h[1] = static_cast<uint16_t>(w >> 16);
}

template <class T>
__global__ void __launch_bounds__(kThreads)
    custom_all_reduce_ll_kernel(Peers peers, int rank, int size, const void* in, bool in_aligned,
                                void* out, bool out_aligned, int64_t words, size_t ll_offset,
                                int64_t ll_words, bool avg, uint64_t timeout_ns, int* err,
                                int code) {
  constexpr int kPer = 4 / static_cast<int>(sizeof(T));
  auto* sig = reinterpret_cast<Signal*>(peers.base[rank]);
  const uint32_t v = sig->ll_counter[blockIdx.x] + 1;
  __syncthreads();
  if (threadIdx.x == 0)
    for (int j = blockIdx.x; j < kMaxBlocks; j += gridDim.x) sig->ll_counter[j] = v;
  // This rank's lines in buffer (parity, from rank `from`) of rank `to`.
  auto lines = [&](int to, int from) {
    return reinterpret_cast<uint64_t*>(peers.base[to] + ll_offset) +
           (static_cast<int64_t>(v & 1u) * size + from) * ll_words;
  };
  const int64_t first = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = first; i < words; i += stride) {
    const uint32_t x = load_word(in, i, in_aligned);
    for (int p = 0; p < size; ++p)
      if (p != rank) st_line(lines(p, rank) + i, x, v);
  }
  for (int64_t i = first; i < words; i += stride) {
    float acc[kPer];
    for (int r = 0; r < size; ++r) {
      uint32_t x;
      if (r == rank) {
        x = load_word(in, i, in_aligned);
      } else {
        const uint64_t* line = lines(rank, r) + i;
        uint64_t got = ld_line(line);
        const uint64_t start = globaltimer();
        for (uint32_t polls = 1; static_cast<uint32_t>(got >> 32) != v; ++polls) {
          if (polls % 64 == 0 && globaltimer() - start > timeout_ns) {
            atomicCAS(err, 0, code);
            return;
          }
          got = ld_line(line);
        }
        x = static_cast<uint32_t>(got);
      }
      T e[kPer];
      memcpy(e, &x, 4);
#pragma unroll
      for (int k = 0; k < kPer; ++k) acc[k] = r == 0 ? to_f(e[k]) : acc[k] + to_f(e[k]);
    }
    T o[kPer];
#pragma unroll
    for (int k = 0; k < kPer; ++k)
      o[k] = from_f<T>(avg ? acc[k] / static_cast<float>(size) : acc[k]);
    uint32_t packed;
    memcpy(&packed, o, 4);
    store_word(out, i, packed, out_aligned);
  }
}

// go(T{}) for dtype 0 float32, 1 float16, 2 bfloat16.
template <class F>
void by_dtype(int dtype, F go) {
  if (dtype == 1)
    go(__half{});
  else if (dtype == 2)
    go(__nv_bfloat16{});
  else
    go(float{});
}

template <class T, bool kTwoShot>
int occupancy() {
  int n = 0;
  cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, custom_all_reduce_kernel<T, kTwoShot>, kThreads,
                                                0);
  return n;
}

size_t custom_all_reduce_signal_bytes() { return kSignalBytes; }
size_t custom_all_reduce_rank_data_bytes() { return sizeof(RankData); }
int custom_all_reduce_max_ranks() { return kMaxRanks; }

// The most blocks every one of the kernels can keep resident at once on `device` (each block
// spins on its peers' flags, so all of them must run together), at most kMaxBlocks.
int custom_all_reduce_max_blocks(int device) {
  int sms = 0;
  if (cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) != cudaSuccess) return 0;
  int per_sm = std::min({occupancy<float, false>(), occupancy<float, true>(),
                         occupancy<__half, false>(), occupancy<__half, true>(),
                         occupancy<__nv_bfloat16, false>(), occupancy<__nv_bfloat16, true>()});
  int ll = 0;
  cudaOccupancyMaxActiveBlocksPerMultiprocessor(&ll, custom_all_reduce_ll_kernel<float>, kThreads,
                                                0);
  cudaGetLastError();
  return std::min(kMaxBlocks, std::min(per_sm, ll) * sms);  // 0 (no path) if a query failed
}

void launch_custom_all_reduce_ll(int dtype, char* const* bases, int rank, int size, int64_t nbytes,
                                 size_t ll_offset, int64_t ll_words, const void* in, void* out,
                                 bool avg, int max_blocks, uint64_t timeout_ns, int* err, int code,
                                 void* stream) {
  Peers peers{};
  for (int r = 0; r < size; ++r) peers.base[r] = bases[r];
  const int64_t words = nbytes / 4;
  const int blocks = static_cast<int>(
      std::max<int64_t>(1, std::min<int64_t>(max_blocks, (words + kThreads - 1) / kThreads)));
  auto s = static_cast<cudaStream_t>(stream);
  const bool ia = reinterpret_cast<uintptr_t>(in) % 4 == 0;
  const bool oa = reinterpret_cast<uintptr_t>(out) % 4 == 0;
  by_dtype(dtype, [&](auto zero) {
    custom_all_reduce_ll_kernel<decltype(zero)><<<blocks, kThreads, 0, s>>>(
        peers, rank, size, in, ia, out, oa, words, ll_offset, ll_words, avg, timeout_ns, err, code);
  });
}

// dtype: 0 float32, 1 float16, 2 bfloat16. `bases` holds `size` mapped buffers.
void launch_custom_all_reduce(int dtype, const void* rank_data, char* const* bases, int rank,
                              int size, int64_t nbytes, bool fence_start, const void* stage_from,
                              void* out, bool avg, bool two_shot, int max_blocks,
                              uint64_t timeout_ns, int* err, int code, void* stream) {
  Peers peers{};
  for (int r = 0; r < size; ++r) peers.base[r] = bases[r];
  const int64_t packs = nbytes / 16;
  const int elem = dtype == 0 ? 4 : 2;
  const int tail = static_cast<int>(nbytes % 16 / elem);
  const int64_t work = two_shot ? (packs + size - 1) / size : packs;
  const int blocks = static_cast<int>(
      std::max<int64_t>(1, std::min<int64_t>(max_blocks, (work + kThreads - 1) / kThreads)));
  const bool aligned = reinterpret_cast<uintptr_t>(out) % 16 == 0;
  const auto* rd = static_cast<const RankData*>(rank_data);
  auto s = static_cast<cudaStream_t>(stream);
  by_dtype(dtype, [&](auto zero) {
    using T = decltype(zero);
    if (two_shot)
      custom_all_reduce_kernel<T, true>
          <<<blocks, kThreads, 0, s>>>(rd, peers, rank, size, packs, tail, fence_start, stage_from,
                                       out, aligned, avg, timeout_ns, err, code);
    else
      custom_all_reduce_kernel<T, false>
          <<<blocks, kThreads, 0, s>>>(rd, peers, rank, size, packs, tail, fence_start, stage_from,
                                       out, aligned, avg, timeout_ns, err, code);
  });
}

}  // namespace kiln::cuda::detail

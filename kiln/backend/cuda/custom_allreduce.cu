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
#include <type_traits>

namespace kiln::cuda::detail {

constexpr int kMaxRanks = 8;
constexpr int kMaxBlocks = 36;
constexpr int kThreads = 512;

// The flags of one rank, at the start of its shared buffer. self_counter[b][p]: barriers block
// b has passed with peer p (advanced by the kernel, in device memory: see the Note);
// peer_counter[s][b][p]: written by peer p's block b, two slots so that a peer already at the
// next barrier cannot overwrite the value this block still waits for.
struct Signal {
  alignas(128) uint32_t self_counter[kMaxBlocks][kMaxRanks];
  alignas(128) uint32_t peer_counter[2][kMaxBlocks][kMaxRanks];
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
__device__ __forceinline__ int64_t imin(int64_t a, int64_t b) { return a < b ? a : b; }
__device__ __forceinline__ uint64_t globaltimer() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// Block b of this rank meets block b of every peer. Returns false on every thread of the block
// when a peer did not arrive within `timeout_ns` (the device's error word then holds `code`).
// A barrier that ends a phase first waits for the block's own reads and writes.
template <bool kStart>
__device__ bool barrier(const Peers& peers, int rank, int size, uint64_t timeout_ns, int* err,
                        int code) {
  if constexpr (!kStart) __syncthreads();
  bool ok = true;
  const int p = static_cast<int>(threadIdx.x);
  if (p < size && p != rank) {
    auto* self = reinterpret_cast<Signal*>(peers.base[rank]);
    auto* peer = reinterpret_cast<Signal*>(peers.base[p]);
    const uint32_t v = self->self_counter[blockIdx.x][p] += 1;
    st_release_sys(&peer->peer_counter[v % 2][blockIdx.x][rank], v);
    const uint64_t start = globaltimer();
    while (ld_acquire_sys(&self->peer_counter[v % 2][blockIdx.x][p]) != v) {
      if (globaltimer() - start > timeout_ns) {
        atomicCAS(err, 0, code);
        ok = false;
        break;
      }
    }
  }
  return __syncthreads_or(!ok) == 0;
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

// out (packs of 16 bytes) = the sum of every rank's input. One-shot: every rank reads every
// input. Two-shot: rank r reduces packs [r*part, (r+1)*part) into its tmp, then every rank
// copies every part. Block b handles the same packs in both phases on every rank, so it only
// meets block b of its peers.
template <class T, bool kTwoShot>
__global__ void __launch_bounds__(kThreads)
    custom_all_reduce_kernel(const RankData* rank_data, Peers peers, int rank, int size,
                             int64_t packs, void* out, bool out_aligned, bool avg,
                             uint64_t timeout_ns, int* err, int code) {
  if (!barrier<true>(peers, rank, size, timeout_ns, err, code)) return;
  const RankData d = *rank_data;
  const int64_t first = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  if constexpr (!kTwoShot) {
    for (int64_t i = first; i < packs; i += stride)
      store_pack<T>(out, i, reduce_pack<T>(d, size, i, avg), out_aligned);
    barrier<false>(peers, rank, size, timeout_ns, err, code);
  } else {
    const int64_t part = (packs + size - 1) / size;
    auto* tmp = reinterpret_cast<Pack<T>*>(peers.base[rank] + kSignalBytes);
    for (int64_t i = rank * part + first; i < imin(packs, (rank + 1) * part); i += stride)
      tmp[i] = reduce_pack<T>(d, size, i, avg);
    if (!barrier<false>(peers, rank, size, timeout_ns, err, code)) return;
    for (int r = 0; r < size; ++r) {
      auto* src = reinterpret_cast<const Pack<T>*>(peers.base[r] + kSignalBytes);
      for (int64_t i = r * part + first; i < imin(packs, (r + 1) * part); i += stride)
        store_pack<T>(out, i, src[i], out_aligned);
    }
  }
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
  cudaGetLastError();
  return std::min(kMaxBlocks, per_sm * sms);
}

// dtype: 0 float32, 1 float16, 2 bfloat16. `bases` holds `size` mapped buffers.
void launch_custom_all_reduce(int dtype, const void* rank_data, char* const* bases, int rank,
                              int size, int64_t nbytes, void* out, bool avg, bool two_shot,
                              int max_blocks, uint64_t timeout_ns, int* err, int code,
                              void* stream) {
  Peers peers{};
  for (int r = 0; r < size; ++r) peers.base[r] = bases[r];
  const int64_t packs = nbytes / 16;
  const int64_t work = two_shot ? (packs + size - 1) / size : packs;
  const int blocks = static_cast<int>(
      std::max<int64_t>(1, std::min<int64_t>(max_blocks, (work + kThreads - 1) / kThreads)));
  const bool aligned = reinterpret_cast<uintptr_t>(out) % 16 == 0;
  const auto* rd = static_cast<const RankData*>(rank_data);
  auto s = static_cast<cudaStream_t>(stream);
  auto go = [&](auto zero) {
    using T = decltype(zero);
    if (two_shot)
      custom_all_reduce_kernel<T, true><<<blocks, kThreads, 0, s>>>(
          rd, peers, rank, size, packs, out, aligned, avg, timeout_ns, err, code);
    else
      custom_all_reduce_kernel<T, false><<<blocks, kThreads, 0, s>>>(
          rd, peers, rank, size, packs, out, aligned, avg, timeout_ns, err, code);
  };
  if (dtype == 1)
    go(__half{});
  else if (dtype == 2)
    go(__nv_bfloat16{});
  else
    go(float{});
}

}  // namespace kiln::cuda::detail

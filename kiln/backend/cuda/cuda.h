#pragma once
// The CUDA backend's public calls, for programs that link Kiln::kiln_cuda. The backend itself
// is loaded with kiln::load_backend("cuda") (libkiln_cuda.so); tensors then live on "cuda:N".
// No CUDA header is needed to use this one.
#include <cstddef>
#include <cstdint>
#include <string>

#include "kiln/core/stream.h"
#include "kiln/core/tensor.h"

namespace kiln::cuda {

// What the caching allocator of one device holds, in bytes (Note [CUDA caching allocator]).
struct MemoryStats {
  size_t allocated = 0;       // in live tensors (sizes rounded to 512 bytes)
  size_t reserved = 0;        // obtained from cudaMalloc, cached or in use
  size_t peak_allocated = 0;  // since the last reset_peak_memory()
  int64_t cuda_mallocs = 0;   // calls to cudaMalloc
  int64_t cache_hits = 0;     // allocations served from the cache
};

// CUDA devices present (0 without a driver or a GPU).
int device_count();

struct DeviceProperties {
  std::string name;
  int major = 0, minor = 0;  // compute capability
  int multiprocessors = 0;
  size_t total_memory = 0;             // bytes
  size_t shared_memory_per_block = 0;  // bytes a kernel may opt into
  int l2_cache_bytes = 0;
  int warp_size = 0;
};
DeviceProperties device_properties(int device);

// Streams of `device` for side work without creating one each time: kStreamPoolSize created
// (non-blocking) streams, handed out round-robin, living until exit.
inline constexpr int kStreamPoolSize = 8;
Stream stream_from_pool(int device);

// `t` (a cuda tensor from the caching allocator) is also used by the work queued on `stream`,
// another stream of its device: when t's storage is freed, its memory is reused only after the
// work queued on `stream` up to the free is done (PyTorch's Tensor.record_stream).
void record_stream(const Tensor& t, const Stream& stream);

// Page-locked host memory. pin_memory(t) copies a cpu tensor into memory from cudaHostAlloc
// (cached and reused); is_pinned says whether a tensor lives there.
Tensor pin_memory(const Tensor& t);
bool is_pinned(const Tensor& t);
// dst = src between a pinned cpu tensor and a cuda tensor (either way; same dtype and shape,
// both contiguous), queued on the cuda tensor's current stream without the host waiting for
// it. Read a pinned destination only after synchronising (the stream, an event or the
// device); write a pinned source only after the copy is done. A pinned block freed while a
// copy of it is queued is reused only once that copy is done.
void copy_async(const Tensor& dst, const Tensor& src);
MemoryStats memory_stats(int device);
void reset_peak_memory(int device);
// Returns cached, unused segments of `device` to CUDA; the bytes released.
size_t empty_cache(int device);

// How many streams of `device` hold a cuBLASLt workspace of their own (each stream that ran a
// floating-point product, or was captured; Note [cuBLASLt workspaces]).
int64_t lt_workspace_count(int device);

// The floors under Kiln's own costs on `device` (diagnostics for benchmarks): host microseconds
// per launch of an empty kernel, and microseconds per node of a replayed graph of empty kernels.
double empty_launch_us(int device, int iters = 10000);
// The empty launch through the driver API's cuLaunchKernel instead of the runtime's (-1 where
// the driver does not hand it out).
double empty_driver_launch_us(int device, int iters = 10000);
double empty_graph_node_us(int device, int nodes = 256, int iters = 200);
// Keeps `device`'s current stream busy for `ns` nanoseconds of the device's clock, so that what
// the host queues behind it meanwhile runs back to back (timing kernels without the host's cost
// between their launches: Note [Timing cuDNN plans] in cudnn_graph.cpp).
void hold_current_stream(int device, uint64_t ns);

// Whether float16 and bfloat16 flash_attention and its backward may run on cuDNN's fused
// attention engines where they take the call (default yes; KILN_CUDNN_ATTENTION=0 starts with
// no), as torch.backends.cuda.enable_cudnn_sdp; and how many calls they have run in this
// process (Note [cuDNN fused attention]).
void set_cudnn_attention(bool on);
int64_t cudnn_attention_runs();

}  // namespace kiln::cuda

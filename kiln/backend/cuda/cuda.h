#pragma once
// The CUDA backend's public calls, for programs that link Kiln::kiln_cuda. The backend itself
// is loaded with kiln::load_backend("cuda") (libkiln_cuda.so); tensors then live on "cuda:N".
// No CUDA header is needed to use this one.
#include <cstddef>
#include <cstdint>

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
MemoryStats memory_stats(int device);
void reset_peak_memory(int device);
// Returns cached, unused segments of `device` to CUDA; the bytes released.
size_t empty_cache(int device);

// The floors under Kiln's own costs on `device` (diagnostics for benchmarks): host microseconds
// per launch of an empty kernel, and microseconds per node of a replayed graph of empty kernels.
double empty_launch_us(int device, int iters = 10000);
double empty_graph_node_us(int device, int nodes = 256, int iters = 200);

}  // namespace kiln::cuda

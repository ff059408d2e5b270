#pragma once
// The CUDA caching allocator. Internal to kiln/backend/cuda; see Note [CUDA caching allocator]
// in allocator.cpp.
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

#include "kiln/backend/cuda/cuda.h"
#include "kiln/core/storage.h"

namespace kiln::cuda {

class CachingAllocator final : public Allocator {
 public:
  explicit CachingAllocator(int device) : device_(device) {}
  void* allocate(size_t nbytes) override;
  void deallocate(void* p, size_t nbytes) override;

  // Graph pools (DeviceInterface::create_pool): while this thread captures with a pool, every
  // allocation on this device comes from it and stays reserved until the pool is released.
  uint64_t create_pool();
  void release_pool(uint64_t pool);
  void begin_capture(uint64_t pool);
  void end_capture();

  // The live block at `p` is also used by work queued on `stream` (record_stream in cuda.h):
  // when freed, it is reused only once that work is done.
  void record_stream(void* p, cudaStream_t stream);

  // Returns cached blocks of whole segments to CUDA; the bytes released.
  size_t empty_cache();
  MemoryStats stats();
  void reset_peak();

 private:
  struct Block {
    void* ptr = nullptr;
    size_t size = 0;
    cudaStream_t stream = nullptr;
    bool free = false;
    bool large = false;     // from the large-segment pool
    Block* prev = nullptr;  // neighbours in the same cudaMalloc segment
    Block* next = nullptr;
    std::vector<cudaStream_t> uses = {};  // other streams its tensor was recorded on
  };
  // A freed block waiting for the work of the streams it was recorded on.
  struct PendingFree {
    Block* block;
    std::vector<cudaEvent_t> events;
    std::vector<cudaStream_t> capturing;  // recorded on once their capture has ended
  };
  struct BySize {
    bool operator()(const Block* a, const Block* b) const {
      if (a->stream != b->stream) return a->stream < b->stream;
      if (a->size != b->size) return a->size < b->size;
      return a->ptr < b->ptr;
    }
  };
  struct Pool {
    std::vector<std::pair<void*, size_t>> blocks;
    std::set<void*> freed;
  };

  void* malloc_segment(size_t size);
  Block* take_free(std::set<Block*, BySize>& bins, cudaStream_t stream, size_t size);
  void free_block(Block* b);
  void defer_free(Block* b);
  void free_finished_pending();
  size_t release_free_segments();
  [[noreturn]] void out_of_memory(size_t nbytes, cudaError_t err);

  int device_;
  std::mutex mu_;
  std::set<Block*, BySize> small_, large_;
  std::unordered_map<void*, Block*> live_;
  std::map<uint64_t, Pool> pools_;
  std::unordered_map<void*, uint64_t> pool_of_;
  std::vector<std::pair<void*, size_t>> frees_after_capture_;
  std::vector<PendingFree> pending_;
  std::unordered_map<void*, size_t> orphans_;  // alive blocks of released graph pools
  uint64_t next_pool_ = 1;
  MemoryStats stats_;
};

}  // namespace kiln::cuda

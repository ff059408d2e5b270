// Note [CUDA caching allocator]
// cudaMalloc and cudaFree synchronise the device and cost tens of microseconds, so freed blocks
// are kept and reused, as PyTorch's CUDACachingAllocator does:
// - Sizes are rounded up to 512 bytes. Requests up to 1 MiB come from 2 MiB segments (the
//   small pool); larger ones from segments of their own size rounded to 2 MiB (the large pool).
// - A free block is found best-fit among the blocks of the same stream; a block larger than
//   needed is split (the rest stays free) and neighbours in one segment merge when freed.
// - A block belongs to the stream it was allocated on: a free is ordered on that stream, so
//   the block can be reused at once by later work on the same stream (which runs after
//   everything queued before the free). A tensor used on another stream is recorded on it
//   (record_stream): its block, when freed, waits for an event recorded then on each such
//   stream, and goes back to the cache once they have all passed (checked when allocating).
// - A graph capture allocates from the capture's pool (DeviceInterface::create_pool): blocks
//   of their own, kept until the pool is released, since a graph replays into the addresses it
//   was captured with. Frees made by the capturing thread wait for the capture to end.
// - When cudaMalloc fails, cached segments are released and the call retried once; then the
//   error says what is allocated, cached and free.
#include "kiln/backend/cuda/allocator.h"

#include <algorithm>

#include "kiln/backend/cuda/common.h"

namespace kiln::cuda {
namespace {

constexpr size_t kRound = 512;
constexpr size_t kSmallSize = size_t{1} << 20;     // requests up to this use the small pool
constexpr size_t kSmallSegment = size_t{2} << 20;  // segment size of the small pool
constexpr size_t kLargeRound = size_t{2} << 20;
constexpr int kMaxDevices = 16;

// The pool this thread captures into, per device (0: not capturing; kNoPool: capturing
// without a pool, where allocating is an error).
constexpr uint64_t kNoPool = ~uint64_t{0};
thread_local uint64_t tls_capture_pool[kMaxDevices] = {};

std::string bytes(size_t n) {
  if (n >= (size_t{1} << 30)) return fmt::format("{:.2f} GiB", n / double(size_t{1} << 30));
  if (n >= (size_t{1} << 20)) return fmt::format("{:.2f} MiB", n / double(size_t{1} << 20));
  return fmt::format("{} bytes", n);
}

}  // namespace

void CachingAllocator::out_of_memory(size_t nbytes, cudaError_t err) {
  cudaGetLastError();  // clear the sticky-free error state of a failed cudaMalloc
  size_t free_b = 0, total_b = 0;
  cudaMemGetInfo(&free_b, &total_b);
  KILN_THROW(Device,
             "[cuda] out of memory allocating {} on cuda:{} ({}): {} allocated to tensors, {} "
             "reserved by Kiln's cache, {} free of {} on the device",
             bytes(nbytes), device_, cudaGetErrorString(err), bytes(stats_.allocated),
             bytes(stats_.reserved), bytes(free_b), bytes(total_b));
}

// cudaMalloc is not a stream operation, but a thread capturing in CUDA's thread-local mode may
// not call it: the call runs in relaxed mode, as PyTorch's allocator does.
static cudaError_t malloc_relaxed(void** p, size_t size) {
  cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
  cudaThreadExchangeStreamCaptureMode(&mode);
  cudaError_t err = cudaMalloc(p, size);
  cudaThreadExchangeStreamCaptureMode(&mode);
  return err;
}

void* CachingAllocator::malloc_segment(size_t size) {
  void* p = nullptr;
  cudaError_t err = malloc_relaxed(&p, size);
  if (err != cudaSuccess) {
    cudaGetLastError();
    if (!pending_.empty()) {  // blocks waiting for other streams may be free by now
      cudaDeviceSynchronize();
      free_finished_pending();
    }
    release_free_segments();
    err = malloc_relaxed(&p, size);
    if (err != cudaSuccess) out_of_memory(size, err);
  }
  stats_.reserved += size;
  ++stats_.cuda_mallocs;
  return p;
}

CachingAllocator::Block* CachingAllocator::take_free(std::set<Block*, BySize>& bins,
                                                     cudaStream_t stream, size_t size) {
  Block key;
  key.stream = stream;
  key.size = size;
  auto it = bins.lower_bound(&key);
  if (it == bins.end() || (*it)->stream != stream) return nullptr;
  Block* b = *it;
  bins.erase(it);
  return b;
}

void* CachingAllocator::allocate(size_t nbytes) {
  if (nbytes == 0) return nullptr;
  const size_t size = (nbytes + kRound - 1) / kRound * kRound;
  cudaStream_t stream = current_stream(device_);
  std::lock_guard<std::mutex> lock(mu_);
  if (uint64_t pool = tls_capture_pool[device_]) {
    KILN_CHECK_DEVICE(pool != kNoPool,
                      "[cuda] allocating {} on cuda:{} outside a graph memory pool while "
                      "capturing (cudaErrorStreamCaptureUnsupported)",
                      bytes(nbytes), device_);
    void* p = malloc_segment(size);
    pools_[pool].blocks.push_back({p, size});
    pool_of_[p] = pool;
    stats_.allocated += size;
    stats_.peak_allocated = std::max(stats_.peak_allocated, stats_.allocated);
    return p;
  }
  if (!pending_.empty()) free_finished_pending();
  const bool large = size > kSmallSize;
  auto& bins = large ? large_ : small_;
  Block* b = take_free(bins, stream, size);
  if (b) {
    ++stats_.cache_hits;
  } else {
    const size_t seg = large ? (size + kLargeRound - 1) / kLargeRound * kLargeRound : kSmallSegment;
    b = new Block{malloc_segment(seg), seg, stream, false, large, nullptr, nullptr};
  }
  // Split off what is not needed when the rest is worth keeping.
  const size_t rest = b->size - size;
  if (rest >= (large ? kSmallSize : kRound)) {
    auto* r = new Block{static_cast<char*>(b->ptr) + size, rest, stream, true, large, b, b->next};
    if (b->next) b->next->prev = r;
    b->next = r;
    b->size = size;
    bins.insert(r);
  }
  b->free = false;
  live_[b->ptr] = b;
  stats_.allocated += b->size;
  stats_.peak_allocated = std::max(stats_.peak_allocated, stats_.allocated);
  return b->ptr;
}

void CachingAllocator::free_block(Block* b) {
  stats_.allocated -= b->size;
  b->free = true;
  auto& bins = b->large ? large_ : small_;
  // Merge with free neighbours of the same segment.
  for (Block* n : {b->prev, b->next}) {
    if (!n || !n->free) continue;
    bins.erase(n);
    if (n == b->prev) {
      n->size += b->size;
      n->next = b->next;
      if (b->next) b->next->prev = n;
      delete b;
      b = n;
    } else {
      b->size += n->size;
      b->next = n->next;
      if (n->next) n->next->prev = b;
      delete n;
    }
  }
  bins.insert(b);
}

void CachingAllocator::deallocate(void* p, size_t) {
  if (!p) return;
  try {
    std::lock_guard<std::mutex> lock(mu_);
    if (auto it = pool_of_.find(p); it != pool_of_.end()) {
      auto pool = pools_.find(it->second);
      if (pool != pools_.end()) {
        pool->second.freed.insert(p);  // its graph may still replay into it
        for (auto& [ptr, size] : pool->second.blocks)
          if (ptr == p) stats_.allocated -= size;
        return;
      }
      // The pool was released while this block was alive: it goes back to CUDA now.
      pool_of_.erase(it);
      cudaFree(p);
      if (auto o = orphans_.find(p); o != orphans_.end()) {
        stats_.reserved -= o->second;
        stats_.allocated -= o->second;
        orphans_.erase(o);
      }
      return;
    }
    auto it = live_.find(p);
    if (it == live_.end()) return;  // not ours: a bug elsewhere, never a crash in a destructor
    if (tls_capture_pool[device_]) {
      frees_after_capture_.push_back({p, 0});
      return;
    }
    Block* b = it->second;
    live_.erase(it);
    if (b->uses.empty())
      free_block(b);
    else
      defer_free(b);
  } catch (...) {  // NOLINT: deallocate runs in destructors and must not throw
  }
}

void CachingAllocator::record_stream(void* p, cudaStream_t stream) {
  std::lock_guard<std::mutex> lock(mu_);
  if (pool_of_.count(p)) return;  // a graph pool's blocks wait for the pool's release anyway
  auto it = live_.find(p);
  KILN_CHECK_DEVICE(it != live_.end(),
                    "[record_stream] {} is not a live block of cuda:{}'s caching allocator",
                    fmt::ptr(p), device_);
  Block* b = it->second;
  if (stream != b->stream && std::find(b->uses.begin(), b->uses.end(), stream) == b->uses.end())
    b->uses.push_back(stream);
}

// Called with mu_ held, from any thread and any current device.
void CachingAllocator::defer_free(Block* b) {
  int previous = -1;
  cudaGetDevice(&previous);
  if (previous != device_) cudaSetDevice(device_);
  PendingFree pf{b, {}, {}};
  for (cudaStream_t s : b->uses) {
    // A stream another thread is capturing would take the event into its graph: the event is
    // recorded once that capture has ended (its work before the capture is still ordered).
    cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
    if (cudaStreamIsCapturing(s, &status) == cudaSuccess && status != cudaStreamCaptureStatusNone) {
      pf.capturing.push_back(s);
      continue;
    }
    cudaGetLastError();
    cudaEvent_t e = nullptr;
    if (cudaEventCreateWithFlags(&e, cudaEventDisableTiming) == cudaSuccess &&
        cudaEventRecord(e, s) == cudaSuccess) {
      pf.events.push_back(e);
      continue;
    }
    cudaGetLastError();  // no event: wait for the stream here instead
    if (e) cudaEventDestroy(e);
    cudaStreamSynchronize(s);
  }
  b->uses.clear();
  if (previous >= 0 && previous != device_) cudaSetDevice(previous);
  if (pf.events.empty() && pf.capturing.empty())
    free_block(b);
  else
    pending_.push_back(std::move(pf));
}

// Called with mu_ held.
void CachingAllocator::free_finished_pending() {
  for (auto it = pending_.begin(); it != pending_.end();) {
    for (auto s = it->capturing.begin(); s != it->capturing.end();) {
      cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
      cudaEvent_t e = nullptr;
      if (cudaStreamIsCapturing(*s, &status) != cudaSuccess ||
          status != cudaStreamCaptureStatusNone ||
          cudaEventCreateWithFlags(&e, cudaEventDisableTiming) != cudaSuccess) {
        cudaGetLastError();
        ++s;
        continue;
      }
      if (cudaEventRecord(e, *s) != cudaSuccess) {
        cudaGetLastError();
        cudaEventDestroy(e);
        ++s;
        continue;
      }
      it->events.push_back(e);
      s = it->capturing.erase(s);
    }
    bool done = it->capturing.empty();
    for (cudaEvent_t e : it->events) {
      if (!done) break;
      cudaError_t r = cudaEventQuery(e);
      if (r == cudaErrorNotReady) {
        cudaGetLastError();
        done = false;
        break;
      }
      if (r != cudaSuccess) cudaGetLastError();  // a broken context: nothing left to wait for
    }
    if (!done) {
      ++it;
      continue;
    }
    for (cudaEvent_t e : it->events) cudaEventDestroy(e);
    free_block(it->block);
    it = pending_.erase(it);
  }
}

size_t CachingAllocator::release_free_segments() {
  // A whole segment is one free block with no neighbours.
  size_t released = 0;
  for (auto* bins : {&small_, &large_}) {
    for (auto it = bins->begin(); it != bins->end();) {
      Block* b = *it;
      if (!b->prev && !b->next) {
        cudaFree(b->ptr);
        stats_.reserved -= b->size;
        released += b->size;
        delete b;
        it = bins->erase(it);
      } else {
        ++it;
      }
    }
  }
  return released;
}

size_t CachingAllocator::empty_cache() {
  KILN_CUDA_CHECK(cudaDeviceSynchronize());
  std::lock_guard<std::mutex> lock(mu_);
  free_finished_pending();
  return release_free_segments();
}

uint64_t CachingAllocator::create_pool() {
  std::lock_guard<std::mutex> lock(mu_);
  uint64_t id = next_pool_++;
  pools_[id];
  return id;
}

void CachingAllocator::release_pool(uint64_t id) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = pools_.find(id);
  if (it == pools_.end()) return;
  bool any_freed = !it->second.freed.empty();
  if (any_freed) cudaDeviceSynchronize();  // launched graphs may still use the blocks
  for (auto [p, size] : it->second.blocks) {
    if (!it->second.freed.count(p)) {  // alive: freed (to CUDA) when its tensor goes
      orphans_[p] = size;
      continue;
    }
    pool_of_.erase(p);
    cudaFree(p);
    stats_.reserved -= size;
  }
  pools_.erase(it);
}

void CachingAllocator::begin_capture(uint64_t pool) {
  std::lock_guard<std::mutex> lock(mu_);
  KILN_CHECK_DEVICE(pool == 0 || pools_.count(pool), "[cuda] cuda:{} has no graph memory pool {}",
                    device_, pool);
  tls_capture_pool[device_] = pool ? pool : kNoPool;
}

void CachingAllocator::end_capture() {
  std::vector<std::pair<void*, size_t>> frees;
  {
    std::lock_guard<std::mutex> lock(mu_);
    tls_capture_pool[device_] = 0;
    frees.swap(frees_after_capture_);
  }
  for (auto [p, n] : frees) deallocate(p, n);
}

MemoryStats CachingAllocator::stats() {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

void CachingAllocator::reset_peak() {
  std::lock_guard<std::mutex> lock(mu_);
  stats_.peak_allocated = stats_.allocated;
}

}  // namespace kiln::cuda

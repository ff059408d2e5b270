// A sim device's memory: a caching allocator with stream-ordered frees, and the memory pools
// captures allocate into (Note [The sim device] in sim.cpp).
#include <bit>
#include <cstdlib>

#include "kiln/backend/sim/sim_impl.h"

namespace kiln::sim {

void* Allocator::allocate(size_t nbytes) { return device_state(device).allocate(nbytes); }
void Allocator::deallocate(void* p, size_t nbytes) { device_state(device).deallocate(p, nbytes); }

size_t SimDevice::size_class(size_t n) {
  n = (n + 511) & ~size_t{511};
  return n <= (size_t{1} << 20) ? std::bit_ceil(n)
                                : (n + (size_t{1} << 20) - 1) & ~((size_t{1} << 20) - 1);
}

void* SimDevice::allocate(size_t nbytes) {
  if (nbytes == 0) return nullptr;
  Capture* c = tls_capture;
  if (c && c->device == index_ && c->pool == 0)
    forbid_in_capture(
        fmt::format("allocating {} bytes outside a graph memory pool", nbytes).c_str(),
        "cudaErrorStreamCaptureUnsupported");
  const size_t cls = size_class(nbytes);
  void* p = take_cached(cls);
  if (!p) p = std::aligned_alloc(64, cls);
  KILN_CHECK(p != nullptr, "[sim] out of memory allocating {} bytes on sim:{}", nbytes, index_);
  const size_t now = allocated_bytes_ += cls;
  size_t peak = peak_bytes_.load();
  while (now > peak && !peak_bytes_.compare_exchange_weak(peak, now)) {
  }
  std::lock_guard<std::mutex> lock(mu_);
  if (c && c->device == index_) {
    pools_[c->pool].blocks.push_back({p, nbytes});
    pool_of_[p] = c->pool;
  } else {
    stream_of_[p] = current();
  }
  return p;
}

void SimDevice::deallocate(void* p, size_t nbytes) noexcept {
  if (!p) return;
  allocated_bytes_ -= size_class(nbytes);
  try {
    std::shared_ptr<Stream> owner;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (auto it = pool_of_.find(p); it != pool_of_.end()) {
        pools_[it->second].freed.insert(p);  // the pool's graph may still replay into it
        return;
      }
      Capture* c = tls_capture;
      if (c && c->device == index_) {  // the capturing stream must not record the free
        frees_after_capture_.push_back({p, nbytes});
        return;
      }
      uint64_t sid = 0;
      if (auto it = stream_of_.find(p); it != stream_of_.end()) {
        sid = it->second;
        stream_of_.erase(it);
      }
      if (auto it = streams_.find(sid); it != streams_.end()) owner = it->second;
    }
    // A destroyed stream had finished its work: the block is free now.
    if (!owner) return cache(p, size_class(nbytes));
    owner->push({[this, p, cls = size_class(nbytes)] { cache(p, cls); }, 0});
  } catch (...) {  // NOLINT: out of memory for the bookkeeping; the block is lost, not reused
  }
}

void* SimDevice::take_cached(size_t cls) {
  std::lock_guard<std::mutex> lock(cache_mu_);
  auto it = cache_.find(cls);
  if (it == cache_.end() || it->second.empty()) return nullptr;
  void* p = it->second.back();
  it->second.pop_back();
  cached_bytes_ -= cls;
  return p;
}

void SimDevice::cache(void* p, size_t cls) {
  static constexpr size_t kMaxCached = size_t{1} << 30;
  {
    std::lock_guard<std::mutex> lock(cache_mu_);
    if (cached_bytes_ + cls <= kMaxCached) {
      cache_[cls].push_back(p);
      cached_bytes_ += cls;
      return;
    }
  }
  std::free(p);
}

DeviceMemoryStats SimDevice::memory_stats() {
  const size_t allocated = allocated_bytes_.load();
  std::lock_guard<std::mutex> lock(cache_mu_);
  return {allocated, allocated + cached_bytes_, peak_bytes_.load()};
}

void SimDevice::reset_peak_memory() { peak_bytes_ = allocated_bytes_.load(); }

uint64_t SimDevice::create_pool() {
  std::lock_guard<std::mutex> lock(mu_);
  uint64_t id = next_id_++;
  pools_[id];
  return id;
}

void SimDevice::release_pool(uint64_t id) {
  std::vector<std::pair<void*, size_t>> freed;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = pools_.find(id);
    if (it == pools_.end()) return;
    for (auto [b, n] : it->second.blocks) {
      pool_of_.erase(b);
      if (it->second.freed.count(b))
        freed.push_back({b, n});
      else
        stream_of_[b] = 0;  // still in use: freed later, like any block
    }
    pools_.erase(it);
  }
  // Graphs queued so far may still replay into the pool: let them finish first.
  if (freed.empty()) return;
  for (const auto& s : all_streams()) s->wait_for(s->submitted());
  for (auto [b, n] : freed) cache(b, size_class(n));
}

}  // namespace kiln::sim

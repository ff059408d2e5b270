#include "kiln/core/storage.h"

#include <algorithm>
#include <atomic>
#include <bit>
#include <cstdint>
#include <cstdlib>
#include <mutex>
#include <new>
#include <unordered_map>
#include <vector>

#include "kiln/core/error.h"

namespace kiln {

namespace {
// 64-byte alignment by over-allocating from malloc and keeping the original pointer just below
// the aligned block: glibc's aligned_alloc takes a slow path that costs more than the small
// tensors it serves.
//
// Blocks of 64 KiB and more are cached after they are freed, in size classes a quarter of a
// power of two apart, up to kMaxCached bytes. glibc hands such blocks back to the kernel
// (munmap, heap trimming), and a training step that allocates the same activations every
// step then spends a sixth of its time in page faults.
class CpuAllocator final : public Allocator {
 public:
  static constexpr size_t kAlign = 64;
  static constexpr size_t kCacheMin = size_t{1} << 16;
#if defined(__SANITIZE_ADDRESS__)
  static constexpr size_t kMaxCached = 0;  // reused blocks would hide use-after-free from ASan
#else
  static constexpr size_t kMaxCached = size_t{1} << 30;
#endif

  void* allocate(size_t nbytes) override {
    if (nbytes == 0) return nullptr;
    if (tracking_.load(std::memory_order_relaxed) > 0) count(static_cast<int64_t>(nbytes));
    KILN_CHECK(nbytes < (size_t{1} << 62), "[cpu allocator] cannot allocate {} bytes", nbytes);
    if (nbytes >= kCacheMin) {
      nbytes = size_class(nbytes);
      std::lock_guard<std::mutex> lock(mu_);
      auto it = free_.find(nbytes);
      if (it != free_.end() && !it->second.empty()) {
        void* p = it->second.back();
        it->second.pop_back();
        cached_ -= nbytes;
        return p;
      }
    }
    void* raw = std::malloc(nbytes + kAlign);
    KILN_CHECK(raw != nullptr, "[cpu allocator] out of memory allocating {} bytes", nbytes);
    uintptr_t aligned = (reinterpret_cast<uintptr_t>(raw) + kAlign) & ~(uintptr_t{kAlign} - 1);
    reinterpret_cast<void**>(aligned)[-1] = raw;
    return reinterpret_cast<void*>(aligned);
  }
  void deallocate(void* p, size_t nbytes) override {
    if (!p) return;
    if (tracking_.load(std::memory_order_relaxed) > 0) count(-static_cast<int64_t>(nbytes));
    if (nbytes >= kCacheMin) {
      nbytes = size_class(nbytes);
      std::lock_guard<std::mutex> lock(mu_);
      if (cached_ + nbytes <= kMaxCached) {
        free_[nbytes].push_back(p);
        cached_ += nbytes;
        return;
      }
    }
    std::free(static_cast<void**>(p)[-1]);
  }
  void begin_peak() {
    if (tracking_.fetch_add(1) == 0) {
      delta_.store(0);
      peak_.store(0);
    }
  }
  size_t end_peak() {
    size_t p = static_cast<size_t>(std::max<int64_t>(0, peak_.load()));
    tracking_.fetch_sub(1);
    return p;
  }

  size_t release_cached() {
    std::lock_guard<std::mutex> lock(mu_);
    size_t n = cached_;
    for (auto& [size, blocks] : free_)
      for (void* p : blocks) std::free(static_cast<void**>(p)[-1]);
    free_.clear();
    cached_ = 0;
    return n;
  }

 private:
  // n rounded up to a multiple of a quarter of its highest power of two (at most 25% more).
  static size_t size_class(size_t n) {
    size_t step = (size_t{1} << (63 - std::countl_zero(static_cast<uint64_t>(n)))) / 4;
    return (n + step - 1) / step * step;
  }
  // Bytes allocated minus freed since the open region began, and its maximum.
  void count(int64_t n) {
    int64_t now = delta_.fetch_add(n, std::memory_order_relaxed) + n;
    int64_t peak = peak_.load(std::memory_order_relaxed);
    while (now > peak && !peak_.compare_exchange_weak(peak, now, std::memory_order_relaxed)) {
    }
  }
  std::atomic<int> tracking_{0};
  std::atomic<int64_t> delta_{0};
  std::atomic<int64_t> peak_{0};
  std::mutex mu_;
  std::unordered_map<size_t, std::vector<void*>> free_;
  size_t cached_ = 0;
};

CpuAllocator& cpu_allocator_instance() {
  // Never destroyed: storages freed during static destruction still find it.
  static CpuAllocator* a = new CpuAllocator;
  return *a;
}
}  // namespace

size_t release_cached_cpu_memory() { return cpu_allocator_instance().release_cached(); }

Allocator* cpu_allocator() { return &cpu_allocator_instance(); }
void begin_cpu_peak() { cpu_allocator_instance().begin_peak(); }
size_t end_cpu_peak() { return cpu_allocator_instance().end_peak(); }

StorageImpl::StorageImpl(size_t nbytes, Device device, Allocator* allocator)
    : nbytes_(nbytes), device_(device), allocator_(allocator) {
  if (allocator_) data_ = allocator_->allocate(nbytes);
}

StorageImpl::StorageImpl(void* data, size_t nbytes, Device device)
    : data_(data), nbytes_(nbytes), device_(device), allocator_(nullptr) {}

namespace detail {
thread_local ReleaseHook tls_release_hook __attribute__((tls_model("initial-exec"))) = nullptr;
}

void StorageImpl::free_data() {
  KILN_CHECK(allocator_ != nullptr, "[StorageImpl::free_data] the storage borrows its bytes");
  if (freed_) return;
  if (data_) allocator_->deallocate(data_, nbytes_);
  data_ = nullptr;
  freed_ = true;
}

void StorageImpl::reallocate_data() {
  if (!freed_) return;
  data_ = allocator_->allocate(nbytes_);
  freed_ = false;
}

StorageImpl::~StorageImpl() {
  if (__builtin_expect(detail::tls_release_hook != nullptr, 0)) detail::tls_release_hook(this);
  if (allocator_ && data_) allocator_->deallocate(data_, nbytes_);
}

}  // namespace kiln

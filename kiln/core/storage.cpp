#include "kiln/core/storage.h"

#include <cstdint>
#include <cstdlib>
#include <new>

#include "kiln/core/error.h"

namespace kiln {

namespace {
// 64-byte alignment by over-allocating from malloc and keeping the original pointer just below
// the aligned block: glibc's aligned_alloc takes a slow path that costs more than the small
// tensors it serves.
class CpuAllocator final : public Allocator {
 public:
  static constexpr size_t kAlign = 64;
  void* allocate(size_t nbytes) override {
    if (nbytes == 0) return nullptr;
    KILN_CHECK(nbytes < (size_t{1} << 62), "[cpu allocator] cannot allocate {} bytes", nbytes);
    void* raw = std::malloc(nbytes + kAlign);
    KILN_CHECK(raw != nullptr, "[cpu allocator] out of memory allocating {} bytes", nbytes);
    uintptr_t aligned = (reinterpret_cast<uintptr_t>(raw) + kAlign) & ~(uintptr_t{kAlign} - 1);
    reinterpret_cast<void**>(aligned)[-1] = raw;
    return reinterpret_cast<void*>(aligned);
  }
  void deallocate(void* p, size_t) override {
    if (p) std::free(static_cast<void**>(p)[-1]);
  }
};
}  // namespace

Allocator* cpu_allocator() {
  static CpuAllocator a;
  return &a;
}

StorageImpl::StorageImpl(size_t nbytes, Device device, Allocator* allocator)
    : nbytes_(nbytes), device_(device), allocator_(allocator) {
  if (allocator_) data_ = allocator_->allocate(nbytes);
}

StorageImpl::~StorageImpl() {
  if (allocator_ && data_) allocator_->deallocate(data_, nbytes_);
}

}  // namespace kiln

#include "kiln/core/storage.h"

#include <cstdlib>
#include <new>

#include "kiln/core/error.h"

namespace kiln {

namespace {
class CpuAllocator final : public Allocator {
 public:
  void* allocate(size_t nbytes) override {
    if (nbytes == 0) return nullptr;
    size_t rounded = (nbytes + 63) & ~size_t{63};
    void* p = std::aligned_alloc(64, rounded);
    KILN_CHECK_KIND(p != nullptr, Value, "[cpu allocator] out of memory allocating {} bytes",
                    nbytes);
    return p;
  }
  void deallocate(void* p, size_t) override { std::free(p); }
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

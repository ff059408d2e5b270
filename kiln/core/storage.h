#pragma once
// Allocators and storages: bytes on one device.
#include <atomic>
#include <cstddef>
#include <cstdint>

#include "kiln/core/device.h"
#include "kiln/core/ref.h"

namespace kiln {

class Allocator {
 public:
  virtual ~Allocator() = default;
  // Returns nbytes of memory (nullptr only for nbytes == 0). Throws on failure.
  virtual void* allocate(size_t nbytes) = 0;
  virtual void deallocate(void* p, size_t nbytes) = 0;
};

// Host memory aligned to 64 bytes. Freed blocks of 64 KiB and more are kept for reuse (up to
// 1 GiB in all) rather than returned to the system.
Allocator* cpu_allocator();
// Returns the CPU allocator's cached blocks to the system; the number of bytes released.
size_t release_cached_cpu_memory();
// The peak of CPU tensor memory allocated during a region of code, beyond what was allocated
// when it began (compile reports it for a traced call). Counting happens only while a region
// is open, so allocations elsewhere pay one relaxed load. Regions on several threads at once
// share the count.
void begin_cpu_peak();
size_t end_cpu_peak();

namespace detail {
// Called with the address of every TensorImpl and StorageImpl destroyed on this thread, when
// set: compile's tracer forgets tensors that died (their addresses may be reused). nullptr
// when idle.
using ReleaseHook = void (*)(const void* object);
extern thread_local ReleaseHook tls_release_hook __attribute__((tls_model("initial-exec")));
}  // namespace detail

// Bytes on one device from one allocator. A meta storage has no bytes (data() is nullptr).
// The version counter is shared by every tensor viewing this storage; in-place ops bump it.
class StorageImpl : public RefCounted {
 public:
  StorageImpl(size_t nbytes, Device device, Allocator* allocator);
  // Borrows `nbytes` at `data`, owned by someone else who outlives this storage (compile's
  // arena hands out one per planned buffer).
  StorageImpl(void* data, size_t nbytes, Device device);
  ~StorageImpl() override;
  void* data() const { return data_; }
  size_t nbytes() const { return nbytes_; }
  Device device() const { return device_; }
  Allocator* allocator() const { return allocator_; }  // nullptr for borrowed bytes
  uint64_t version() const { return version_.load(std::memory_order_relaxed); }
  void bump_version() { version_.fetch_add(1, std::memory_order_relaxed); }
  // Frees the bytes but keeps the storage (and every tensor viewing it), as PyTorch's
  // `untyped_storage().resize_(0)`: FSDP frees a gathered parameter that backward formulas
  // saved and fills the same storage again before they run (Note [FSDP reshards after
  // forward] in kiln/parallel/fsdp.cpp). Reading a freed storage is undefined: only the owner
  // of such tensors may free them. Only for owned (allocator) storages.
  void free_data();
  // Allocates nbytes() again after free_data() (the contents are undefined until written).
  void reallocate_data();
  bool data_freed() const { return freed_; }

 private:
  void* data_ = nullptr;
  size_t nbytes_;
  Device device_;
  Allocator* allocator_;
  bool freed_ = false;
  std::atomic<uint64_t> version_{0};
};

}  // namespace kiln

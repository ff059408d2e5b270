#include "kiln/core/tensor_impl.h"

#include "kiln/core/error.h"

namespace kiln {

namespace detail {
thread_local bool tls_inference_mode __attribute__((tls_model("initial-exec"))) = false;
thread_local HostReadHook tls_host_read_hook __attribute__((tls_model("initial-exec"))) = nullptr;
}  // namespace detail

TensorImpl::TensorImpl(Ref<StorageImpl> storage, DType dtype, IntArrayRef sizes,
                       IntArrayRef strides, int64_t offset)
    : sizes_(sizes),
      strides_(strides),
      offset_(offset),
      storage_(std::move(storage)),
      dtype_(dtype),
      device_(storage_->device()),
      keys_(device_.dispatch_key()),
      inference_(detail::tls_inference_mode) {
  refresh();
}

TensorImpl::TensorImpl(const TensorImpl& base, IntArrayRef sizes, IntArrayRef strides,
                       int64_t offset)
    : sizes_(sizes),
      strides_(strides),
      offset_(offset),
      storage_(base.storage_),
      dtype_(base.dtype_),
      device_(base.device_),
      keys_(base.keys_ & kBackendKeys),
      inference_(base.inference_) {
  KILN_ASSERT(!base.sharded_,
              "a view of a DTensor with a geometry of its own bypassed the "
              "Sharded layer (views of DTensors are ops on DTensors)");
  refresh();
}

TensorImpl::TensorImpl(const TensorImpl& base)
    : RefCounted(),
      sizes_(base.sizes_),
      strides_(base.strides_),
      offset_(base.offset_),
      numel_(base.numel_),
      storage_(base.storage_),
      dtype_(base.dtype_),
      device_(base.device_),
      keys_(base.keys_ & kBackendKeys),
      contiguous_(base.contiguous_),
      inference_(base.inference_) {
  // An alias of a DTensor (a saved output, detach's twin) is a DTensor of the same shard.
  if (base.sharded_) {
    sharded_ = base.sharded_->clone();
    keys_ = keys_.add(DispatchKey::Sharded);
  }
}

TensorImpl::TensorImpl(const TensorImpl& base, IntArrayRef sizes, int64_t offset)
    : sizes_(sizes),
      strides_(sizes.size()),
      offset_(offset),
      numel_(base.numel_),
      storage_(base.storage_),
      dtype_(base.dtype_),
      device_(base.device_),
      keys_(base.keys_ & kBackendKeys),
      inference_(base.inference_) {
  KILN_ASSERT(!base.sharded_,
              "a view of a DTensor with a geometry of its own bypassed the "
              "Sharded layer (views of DTensors are ops on DTensors)");
  int64_t s = 1;
  for (size_t i = sizes.size(); i-- > 0;) {
    strides_[i] = s;
    s *= sizes[i] > 1 ? sizes[i] : 1;
  }
}

namespace {
// A bounded free list of impl-sized blocks per thread. A block freed on another thread joins
// that thread's list; that is fine, the blocks are plain heap memory. The list itself is plain
// data in initial-exec TLS (no guard on access); a separate guarded object frees the blocks
// when the thread exits, registered the first time the thread caches a block. Thread-locals
// are destroyed in reverse order of construction, so one made before that object (a kernel's
// thread_local scratch tensor) dies after it: once closed, the list frees what it is given.
struct ImplCache {
  static constexpr int kMax = 128;
  void* blocks[kMax];
  int count;
  bool registered;
  bool closed;
};
thread_local ImplCache t_impl_cache __attribute__((tls_model("initial-exec")));

struct ImplCacheCleanup {
  ~ImplCacheCleanup() {
    ImplCache& c = t_impl_cache;
    while (c.count) ::operator delete(c.blocks[--c.count]);
    c.closed = true;
  }
};
thread_local ImplCacheCleanup t_impl_cache_cleanup;
}  // namespace

void* TensorImpl::operator new(size_t nbytes) {
  ImplCache& c = t_impl_cache;
  if (nbytes == sizeof(TensorImpl) && c.count) return c.blocks[--c.count];
  return ::operator new(nbytes);
}

void TensorImpl::operator delete(void* p, size_t nbytes) {
  ImplCache& c = t_impl_cache;
  if (nbytes == sizeof(TensorImpl) && c.count < ImplCache::kMax && !c.closed) {
    if (!c.registered) {
      (void)&t_impl_cache_cleanup;  // odr-use: constructs it, so its destructor runs at exit
      c.registered = true;
    }
    c.blocks[c.count++] = p;
    return;
  }
  ::operator delete(p);
}

TensorImpl::~TensorImpl() {
  if (__builtin_expect(detail::tls_release_hook != nullptr, 0)) detail::tls_release_hook(this);
}

void TensorImpl::set_geometry(IntArrayRef sizes, IntArrayRef strides, int64_t offset) {
  sizes_ = sizes;
  strides_ = strides;
  offset_ = offset;
  refresh();
}

void TensorImpl::refresh() {
  KILN_ASSERT(sizes_.size() == strides_.size());
  int64_t n = 1;
  for (int64_t s : sizes_) n *= s;
  numel_ = n;
  // Contiguous means row-major; dims of size 1 may have any stride, as in PyTorch.
  bool c = true;
  int64_t expected = 1;
  for (size_t i = sizes_.size(); i-- > 0;) {
    if (sizes_[i] == 1) continue;
    if (strides_[i] != expected) {
      c = false;
      break;
    }
    expected *= sizes_[i];
  }
  contiguous_ = c || n == 0;
}

Shape contiguous_strides(IntArrayRef sizes) {
  Shape st(sizes.size());
  int64_t s = 1;
  for (size_t i = sizes.size(); i-- > 0;) {
    st[i] = s;
    s *= sizes[i] > 1 ? sizes[i] : 1;
  }
  return st;
}

int64_t checked_numel(IntArrayRef sizes, const char* op) {
  int64_t n = 1;
  for (int64_t s : sizes) {
    KILN_CHECK(s >= 0, "[{}] negative dimension in size [{}]", op, fmt::join(sizes, ", "));
    KILN_CHECK(!__builtin_mul_overflow(n, s, &n), "[{}] size [{}] has too many elements", op,
               fmt::join(sizes, ", "));
  }
  return n;
}

}  // namespace kiln

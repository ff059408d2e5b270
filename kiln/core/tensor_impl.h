#pragma once
// TensorImpl: sizes, strides, offset, dtype, device, key set, storage. See DESIGN.md.
#include <memory>

#include "kiln/core/dispatch_key.h"
#include "kiln/core/dtype.h"
#include "kiln/core/small_vector.h"
#include "kiln/core/storage.h"

namespace kiln {

// Per-tensor autograd state; defined by the autograd layer.
class AutogradMetaBase {
 public:
  virtual ~AutogradMetaBase() = default;
};

// Per-tensor DTensor state (local tensor and spec); defined by kiln/dtensor. Set only on the
// impls that carry the Sharded key.
class ShardedMetaBase {
 public:
  virtual ~ShardedMetaBase() = default;
  // The same state for an alias impl (TensorImpl(const TensorImpl&)).
  virtual std::unique_ptr<ShardedMetaBase> clone() const = 0;
  // The layout (an immortal pointer: kiln/dtensor's interned spec) that makes a tensor like this
  // one: autograd keeps it with a tensor's geometry (TensorGeometry).
  virtual const void* layout() const = 0;
};

class TensorImpl : public RefCounted {
 public:
  // A tensor over `storage` with the given geometry. Strides are in elements.
  TensorImpl(Ref<StorageImpl> storage, DType dtype, IntArrayRef sizes, IntArrayRef strides,
             int64_t offset);
  // A view of `base`: its storage, dtype, device and backend key set, with a new geometry.
  TensorImpl(const TensorImpl& base, IntArrayRef sizes, IntArrayRef strides, int64_t offset);
  // A view of `base` with base's own geometry (detach, alias); of a DTensor, a DTensor.
  explicit TensorImpl(const TensorImpl& base);
  // A row-major view of `base` with `sizes` (whose product must be base's numel).
  TensorImpl(const TensorImpl& base, IntArrayRef sizes, int64_t offset);

  ~TensorImpl() override;

  // Impls are made and dropped on every op: recycle their memory through a per-thread cache.
  static void* operator new(size_t nbytes);
  static void operator delete(void* p, size_t nbytes);

  IntArrayRef sizes() const { return sizes_; }
  IntArrayRef strides() const { return strides_; }
  int64_t dim() const { return static_cast<int64_t>(sizes_.size()); }
  int64_t numel() const { return numel_; }
  int64_t storage_offset() const { return offset_; }
  DType dtype() const { return dtype_; }
  Device device() const { return device_; }
  DispatchKeySet key_set() const { return keys_; }
  bool is_contiguous() const { return contiguous_; }
  StorageImpl* storage() const { return storage_.get(); }
  const Ref<StorageImpl>& storage_ref() const { return storage_; }
  // First element; nullptr for meta tensors.
  void* data() const {
    char* base = static_cast<char*>(storage_->data());
    return base ? base + offset_ * static_cast<int64_t>(itemsize(dtype_)) : nullptr;
  }

  // Replaces the geometry (used by view ops on a fresh impl and by resize of outputs).
  void set_geometry(IntArrayRef sizes, IntArrayRef strides, int64_t offset);
  // Points this impl at another storage of the same device (compile's executables re-bind
  // their buffers to each call's inputs this way). Nothing else may call it.
  void rebind_storage(Ref<StorageImpl> storage, int64_t offset) {
    storage_ = std::move(storage);
    offset_ = offset;
  }
  void add_key(DispatchKey k) { keys_ = keys_.add(k); }
  void remove_key(DispatchKey k) { keys_ = keys_.remove(k); }

  // A 0-d tensor made from a C++ number (`add(t, 2.0)`): it promotes like a Scalar, not like a
  // tensor (PyTorch's wrapped numbers).
  bool is_wrapped_number() const { return wrapped_number_; }
  void set_wrapped_number(bool w) { wrapped_number_ = w; }

  // A tensor requires grad exactly when its key set holds Autograd (see kiln/autograd).
  bool requires_grad() const { return keys_.has(DispatchKey::Autograd); }
  // Made while InferenceModeGuard was active (see kiln/autograd/grad_mode.h): such a tensor
  // can never be saved for backward.
  bool is_inference() const { return inference_; }

  // Dims marked with kiln::mark_dynamic: compile neither guards nor specialises on their size.
  uint32_t dynamic_dims() const { return dynamic_dims_; }
  void set_dynamic_dims(uint32_t mask) { dynamic_dims_ = mask; }

  AutogradMetaBase* autograd_meta() const { return autograd_.get(); }
  void set_autograd_meta(std::unique_ptr<AutogradMetaBase> m) { autograd_ = std::move(m); }
  ShardedMetaBase* sharded_meta() const { return sharded_.get(); }
  void set_sharded_meta(std::unique_ptr<ShardedMetaBase> m) { sharded_ = std::move(m); }

  // The Python object that wraps this impl while one lives (a borrowed PyObject*), so that
  // Python sees one object per tensor: `t.grad is t.grad`, tensors as dict keys. Read and
  // written only by kiln's Python module, under the GIL (Note [One Python object per tensor] in
  // python/src/tensor_caster.h); a new impl, a view or an alias starts without one.
  void* python_object() const { return python_object_; }
  void set_python_object(void* o) { python_object_ = o; }

 private:
  void refresh();

  Shape sizes_;
  Shape strides_;
  int64_t offset_ = 0;
  int64_t numel_ = 1;
  Ref<StorageImpl> storage_;
  DType dtype_;
  Device device_;
  DispatchKeySet keys_;
  bool contiguous_ = true;
  bool wrapped_number_ = false;
  bool inference_ = false;
  uint32_t dynamic_dims_ = 0;
  std::unique_ptr<AutogradMetaBase> autograd_;
  std::unique_ptr<ShardedMetaBase> sharded_;
  void* python_object_ = nullptr;
};

namespace detail {
// Called by every host read of a tensor's values (item(), data_ptr(), to_vector(), printing)
// when set: compile's tracer uses it to find graph breaks. Thread-local; nullptr when idle.
using HostReadHook = void (*)(const TensorImpl& t, const char* what);
extern thread_local HostReadHook tls_host_read_hook __attribute__((tls_model("initial-exec")));
inline void note_host_read(const TensorImpl& t, const char* what) {
  if (__builtin_expect(tls_host_read_hook != nullptr, 0)) tls_host_read_hook(t, what);
}
// Whether InferenceModeGuard is active on this thread; new impls record it.
extern thread_local bool tls_inference_mode __attribute__((tls_model("initial-exec")));
}  // namespace detail

// Row-major strides for `sizes`.
Shape contiguous_strides(IntArrayRef sizes);
// Product of sizes, checked against overflow: "[op] ... too many elements".
int64_t checked_numel(IntArrayRef sizes, const char* op);

}  // namespace kiln

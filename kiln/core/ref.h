#pragma once
// Intrusive reference counting for tensors and storages: one atomic in the object, a
// pointer-sized handle, no control block.
#include <atomic>
#include <cstdint>
#include <type_traits>
#include <utility>

namespace kiln {

class RefCounted {
 public:
  RefCounted() = default;
  RefCounted(const RefCounted&) = delete;
  RefCounted& operator=(const RefCounted&) = delete;
  int use_count() const { return refs_.load(std::memory_order_relaxed); }

 protected:
  virtual ~RefCounted() = default;

 private:
  template <class T>
  friend class Ref;
  void retain() const { refs_.fetch_add(1, std::memory_order_relaxed); }
  // The last owner skips the atomic read-modify-write: with one reference, no other thread
  // can be adding one.
  void release() const {
    if (refs_.load(std::memory_order_acquire) == 1 ||
        refs_.fetch_sub(1, std::memory_order_acq_rel) == 1)
      delete this;
  }
  mutable std::atomic<int32_t> refs_{0};
};

// Owning handle to a RefCounted object.
template <class T>
class Ref {
 public:
  Ref() = default;
  explicit Ref(T* p) : p_(p) {
    if (p_) p_->retain();
  }
  // Takes ownership of a new object whose count is still 0, without an atomic operation.
  static Ref adopt_new(T* p) {
    p->refs_.store(1, std::memory_order_relaxed);
    Ref r;
    r.p_ = p;
    return r;
  }
  Ref(const Ref& o) : p_(o.p_) {
    if (p_) p_->retain();
  }
  Ref(Ref&& o) noexcept : p_(std::exchange(o.p_, nullptr)) {}
  // From a handle to a derived type.
  template <class U>
  requires std::is_convertible_v<U*, T*> Ref(const Ref<U>& o)
      : Ref(o.get()) {}  // NOLINT(google-explicit-constructor)
  template <class U>
  requires std::is_convertible_v<U*, T*> Ref(Ref<U>&& o)
  noexcept : p_(o.release_unsafe()) {}  // NOLINT(google-explicit-constructor)
  // Gives up ownership without releasing (for conversions between handle types).
  T* release_unsafe() { return std::exchange(p_, nullptr); }
  Ref& operator=(const Ref& o) {
    Ref(o).swap(*this);
    return *this;
  }
  Ref& operator=(Ref&& o) noexcept {
    Ref(std::move(o)).swap(*this);
    return *this;
  }
  ~Ref() {
    if (p_) p_->release();
  }
  void swap(Ref& o) noexcept { std::swap(p_, o.p_); }
  T* get() const { return p_; }
  T* operator->() const { return p_; }
  T& operator*() const { return *p_; }
  explicit operator bool() const { return p_ != nullptr; }
  bool operator==(const Ref& o) const { return p_ == o.p_; }

 private:
  T* p_ = nullptr;
};

template <class T, class... Args>
Ref<T> make_ref(Args&&... args) {
  return Ref<T>::adopt_new(new T(std::forward<Args>(args)...));
}

}  // namespace kiln

#pragma once
// SmallVector: a vector whose first N elements live inline (no heap allocation).
#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <new>
#include <type_traits>
#include <utility>

namespace kiln {

// A non-owning view of contiguous elements. Unlike std::span it binds to a braced list, so
// `zeros({2, 3})` works; such a list lives until the end of the full expression.
template <class T>
class ArrayRef {
 public:
  constexpr ArrayRef() = default;
  constexpr ArrayRef(const T* data, size_t size) : data_(data), size_(size) {}
#if defined(__GNUC__) && !defined(__clang__)  // a GCC-only warning
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Winit-list-lifetime"
#endif
  constexpr ArrayRef(std::initializer_list<T> il)
      : data_(il.begin()), size_(il.size()) {}  // NOLINT
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif
  template <class C, class = decltype(std::declval<const C&>().data()),
            class = std::enable_if_t<!std::is_same_v<C, T>>>
  constexpr ArrayRef(const C& c) : data_(c.data()), size_(c.size()) {}  // NOLINT
  constexpr const T* data() const { return data_; }
  constexpr size_t size() const { return size_; }
  constexpr bool empty() const { return size_ == 0; }
  constexpr const T* begin() const { return data_; }
  constexpr const T* end() const { return data_ + size_; }
  constexpr const T& operator[](size_t i) const { return data_[i]; }
  constexpr const T& back() const { return data_[size_ - 1]; }
  constexpr ArrayRef subspan(size_t from) const { return {data_ + from, size_ - from}; }
  constexpr ArrayRef subspan(size_t from, size_t n) const { return {data_ + from, n}; }
  friend bool operator==(ArrayRef a, ArrayRef b) {
    if (a.size_ != b.size_) return false;
    for (size_t i = 0; i < a.size_; ++i)
      if (!(a.data_[i] == b.data_[i])) return false;
    return true;
  }

 private:
  const T* data_ = nullptr;
  size_t size_ = 0;
};

// Only for trivially copyable T (sizes, strides, indices).
template <class T, size_t N>
class SmallVector {
  static_assert(std::is_trivially_copyable_v<T>);

 public:
  SmallVector() = default;
  explicit SmallVector(size_t n, T value = T()) { resize(n, value); }
  SmallVector(std::initializer_list<T> il) { assign(il.begin(), il.size()); }
  SmallVector(ArrayRef<T> s) { assign(s.data(), s.size()); }  // NOLINT: implicit on purpose
  SmallVector(const SmallVector& o) { assign(o.data(), o.size()); }
  SmallVector(SmallVector&& o) noexcept { steal(o); }
  SmallVector& operator=(const SmallVector& o) {
    if (this != &o) assign(o.data(), o.size());
    return *this;
  }
  SmallVector& operator=(SmallVector&& o) noexcept {
    if (this != &o) {
      release();
      steal(o);
    }
    return *this;
  }
  ~SmallVector() { release(); }

  T* data() { return heap_ ? heap_ : inline_; }
  const T* data() const { return heap_ ? heap_ : inline_; }
  size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }
  T& operator[](size_t i) { return data()[i]; }
  const T& operator[](size_t i) const { return data()[i]; }
  T* begin() { return data(); }
  T* end() { return data() + size_; }
  const T* begin() const { return data(); }
  const T* end() const { return data() + size_; }
  T& back() { return data()[size_ - 1]; }
  const T& back() const { return data()[size_ - 1]; }
  ArrayRef<T> span() const { return {data(), size_}; }

  void reserve(size_t n) {
    if (n <= capacity()) return;
    T* p = static_cast<T*>(std::malloc(n * sizeof(T)));
    if (!p) throw std::bad_alloc();
    if (size_) std::memcpy(p, data(), size_ * sizeof(T));
    std::free(heap_);
    heap_ = p;
    cap_ = n;
  }
  void resize(size_t n, T value = T()) {
    reserve(n);
    for (size_t i = size_; i < n; ++i) data()[i] = value;
    size_ = n;
  }
  void push_back(T v) {
    if (size_ == capacity()) reserve(capacity() * 2);
    data()[size_++] = v;
  }
  void insert(size_t pos, T v) {
    push_back(v);
    T* d = data();
    for (size_t i = size_ - 1; i > pos; --i) d[i] = d[i - 1];
    d[pos] = v;
  }
  void erase(size_t pos) {
    T* d = data();
    for (size_t i = pos; i + 1 < size_; ++i) d[i] = d[i + 1];
    --size_;
  }
  void clear() { size_ = 0; }

  friend bool operator==(const SmallVector& a, const SmallVector& b) {
    return a.size_ == b.size_ && std::equal(a.begin(), a.end(), b.begin());
  }

 private:
  size_t capacity() const { return heap_ ? cap_ : N; }
  void assign(const T* p, size_t n) {
    if (n > capacity()) {
      std::free(heap_);
      heap_ = nullptr;
      size_ = 0;  // nothing to carry over into the new block
      reserve(n);
    }
    T* d = data();
    // An inline loop: these copies are a handful of elements on the dispatch path.
    if (d + n <= p || p + n <= d) {
      for (size_t i = 0; i < n; ++i) d[i] = p[i];
    } else {
      std::memmove(d, p, n * sizeof(T));
    }
    size_ = n;
  }
  void steal(SmallVector& o) {
    size_ = o.size_;
    if (o.heap_) {
      heap_ = o.heap_;
      cap_ = o.cap_;
      o.heap_ = nullptr;
    } else {
      for (size_t i = 0; i < size_; ++i) inline_[i] = o.inline_[i];
    }
    o.size_ = 0;
  }
  void release() {
    if (heap_) std::free(heap_);  // skip the libc call in the common, inline case
    heap_ = nullptr;
  }

  T inline_[N];
  T* heap_ = nullptr;
  size_t size_ = 0;
  size_t cap_ = 0;
};

// Sizes and strides: up to 6 dims inline.
using Shape = SmallVector<int64_t, 6>;
using IntArrayRef = ArrayRef<int64_t>;

}  // namespace kiln

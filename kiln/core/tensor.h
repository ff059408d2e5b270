#pragma once
// Tensor: a refcounted handle to a TensorImpl. Copies share the impl; views share storage.
#include <initializer_list>
#include <optional>
#include <string>
#include <vector>

#include "kiln/core/scalar.h"
#include "kiln/core/tensor_impl.h"

namespace kiln {

class TensorIndex;  // kiln/ops/indexing.h

class Tensor {
 public:
  Tensor() = default;
  explicit Tensor(Ref<TensorImpl> impl) : impl_(std::move(impl)) {}

  bool defined() const { return static_cast<bool>(impl_); }
  TensorImpl* impl() const { return impl_.get(); }
  const Ref<TensorImpl>& impl_ref() const { return impl_; }
  // Whether two handles refer to the same impl.
  bool is_same(const Tensor& o) const { return impl_ == o.impl_; }

  IntArrayRef sizes() const { return impl_->sizes(); }
  IntArrayRef strides() const { return impl_->strides(); }
  // Size/stride of `dim`, which may be negative (counted from the end).
  int64_t size(int64_t dim) const;
  int64_t stride(int64_t dim) const;
  int64_t dim() const { return impl_->dim(); }
  int64_t numel() const { return impl_->numel(); }
  int64_t storage_offset() const { return impl_->storage_offset(); }
  DType dtype() const { return impl_->dtype(); }
  Device device() const { return impl_->device(); }
  DispatchKeySet key_set() const { return impl_ ? impl_->key_set() : DispatchKeySet(); }
  bool is_contiguous() const { return impl_->is_contiguous(); }
  size_t itemsize() const { return kiln::itemsize(dtype()); }
  size_t nbytes() const { return static_cast<size_t>(numel()) * itemsize(); }
  uint64_t version() const;
  // Raw pointer to the first element. Throws for meta tensors and non-host devices.
  void* data_ptr() const;
  // Typed pointer; throws if T does not match dtype().
  template <class T>
  T* data() const;

  bool requires_grad() const { return impl_->requires_grad(); }

  // --- defined in kiln/autograd ---
  // Marks a floating-point leaf as needing gradients (or stops it). Returns *this.
  const Tensor& requires_grad_(bool on = true) const;
  // The gradient accumulated into this leaf by backward() (or, after retain_grad(), into this
  // non-leaf); undefined until then.
  const Tensor& grad() const;
  // Keeps the gradient of a non-leaf in grad() during backward (a no-op for leaves).
  void retain_grad() const;
  // Replaces the gradient (an undefined tensor clears it).
  void set_grad(const Tensor& grad) const;
  // Whether this tensor was created by the user rather than by a recorded op.
  bool is_leaf() const;
  // Name of the backward node that produced this tensor ("MulBackward"), empty for leaves.
  std::string grad_fn_name() const;
  // Backpropagates from this tensor. `grad` defaults to 1 for a single-element tensor.
  void backward(const Tensor& grad = {}, bool retain_graph = false) const;

  // --- defined in kiln/ops (they dispatch) ---
  // The single element as a Scalar (its dtype's category). Throws unless numel() == 1.
  Scalar item() const;
  template <class T>
  T item() const {
    return item().to<T>();
  }
  Tensor to(DType dtype, bool copy = false) const;
  Tensor to(Device device, bool copy = false) const;
  Tensor contiguous() const;
  Tensor clone() const;
  // Copies src (broadcast to this tensor's shape, cast to its dtype) into this tensor.
  Tensor& copy_(const Tensor& src);
  Tensor& fill_(const Scalar& value);
  Tensor& zero_();
  Tensor view(IntArrayRef sizes) const;
  Tensor reshape(IntArrayRef sizes) const;
  Tensor detach() const;
  // libtorch's x.index({Slice(1, 3), idx, None, Ellipsis, 0}) and x.index_put_({...}, v):
  // TensorIndex and Slice/None/Ellipsis are in kiln/ops/indexing.h, which callers include.
  Tensor index(std::initializer_list<TensorIndex> indices) const;
  Tensor index(const std::vector<TensorIndex>& indices) const;
  Tensor& index_put_(std::initializer_list<TensorIndex> indices, const Tensor& values);
  Tensor& index_put_(std::initializer_list<TensorIndex> indices, const Scalar& value);
  // Host vector of the elements in row-major order, converted to T.
  template <class T>
  std::vector<T> to_vector() const;
  // PyTorch-style text: tensor([[0.1000, 2.0000]], dtype=float64)
  std::string str() const;

 private:
  Ref<TensorImpl> impl_;
};

using TensorList = std::vector<Tensor>;

namespace detail {
[[noreturn]] void throw_data_type_mismatch(DType expected, DType actual);
[[noreturn]] void throw_undefined(const char* what);
}  // namespace detail

template <class T>
T* Tensor::data() const {
  if (!defined()) detail::throw_undefined("data");
  if (dtype() != dtype_of<std::remove_const_t<T>>::value)
    detail::throw_data_type_mismatch(dtype_of<std::remove_const_t<T>>::value, dtype());
  return static_cast<T*>(data_ptr());
}

// Wraps an existing dimension index into [0, ndim); IndexError naming `op` when out of range.
int64_t wrap_dim(int64_t dim, int64_t ndim, const char* op);

}  // namespace kiln

template <>
struct fmt::formatter<kiln::Tensor> : fmt::formatter<std::string_view> {
  auto format(const kiln::Tensor& t, format_context& ctx) const {
    return fmt::formatter<std::string_view>::format(t.str(), ctx);
  }
};

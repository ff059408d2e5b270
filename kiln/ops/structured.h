#pragma once
// Structured kernels: one meta function and one `impl(out, args...)` per backend give an op's
// functional, in-place and out= kernels. Internal to kiln/ops and the backends.
#include <type_traits>

#include "kiln/ops/meta.h"

namespace kiln::detail {

// Allocates an uninitialised contiguous tensor (meta tensors get no bytes).
Tensor empty_tensor(IntArrayRef sizes, DType dtype, Device device);

// The tensor arguments of a call, TensorList elements included, for overlap checks.
using TensorPtrs = SmallVector<const Tensor*, 8>;
template <class T>
void collect_tensors(TensorPtrs& out, const T& v) {
  if constexpr (std::is_same_v<std::remove_cvref_t<T>, Tensor>) {
    out.push_back(&v);
  } else if constexpr (std::is_same_v<std::remove_cvref_t<T>, TensorList>) {
    for (const Tensor& t : v) out.push_back(&t);
  }
}
template <class... A>
TensorPtrs tensor_args(const A&... a) {
  TensorPtrs p;
  (collect_tensors(p, a), ...);
  return p;
}
template <class First, class... Rest>
const Tensor& first_arg(const First& f, const Rest&...) {
  return f;
}

template <class Sig>
struct Structured;
template <class... A>
struct Structured<Tensor(A...)> {
  using MetaFn = TensorSpec (*)(A...);
  using ImplFn = void (*)(const Tensor& out, A...);

  template <MetaFn Meta, ImplFn Impl>
  static Tensor functional(A... a) {
    TensorSpec s = Meta(a...);
    Tensor out = empty_tensor(s.sizes, s.dtype, s.device);
    Impl(out, a...);
    return out;
  }
  template <auto& Op, MetaFn Meta, ImplFn Impl>
  static void inplace(A... a) {
    TensorSpec s = Meta(a...);
    const Tensor& self = first_arg(a...);
    meta::check_inplace(Op.def.name(), self, s, tensor_args(a...).span());
    Impl(self, a...);
    self.impl()->storage()->bump_version();
  }
  // Elementwise kernels may write an element over the same element of an input; others go
  // through a temporary when `out` shares storage with an input.
  template <auto& Op, MetaFn Meta, ImplFn Impl, bool Elementwise = false>
  static void out(const Tensor& out, A... a) {
    TensorSpec s = Meta(a...);
    TensorPtrs inputs = tensor_args(a...);
    meta::check_out(Op.def.name(), out, s, inputs.span());
    if (!Elementwise && meta::shares_storage(out, inputs.span())) {
      Tensor tmp = empty_tensor(s.sizes, s.dtype, s.device);
      Impl(tmp, a...);
      ops::op_copy_(out, tmp);
      return;
    }
    Impl(out, a...);
    out.impl()->storage()->bump_version();
  }
  // The impl on the meta device: validation and shapes only.
  static void no_data(const Tensor&, A...) {}
};

}  // namespace kiln::detail

#define KILN_CONCAT_IMPL(a, b) a##b
#define KILN_CONCAT(a, b) KILN_CONCAT_IMPL(a, b)

// Registers backend `KEY`'s kernels for a pointwise op (functional, in-place, out=).
#define KILN_REGISTER_POINTWISE(name, KEY, impl)                                       \
  static const bool KILN_CONCAT(kiln_reg_##name##_, __LINE__) = [] {                   \
    using S = ::kiln::detail::Structured<decltype(::kiln::ops::op_##name)::Sig>;       \
    ::kiln::ops::op_##name.set_kernel(KEY, &S::functional<&::kiln::meta::name, impl>); \
    ::kiln::ops::op_##name##_.set_kernel(                                              \
        KEY, &S::inplace<::kiln::ops::op_##name##_, &::kiln::meta::name, impl>);       \
    ::kiln::ops::op_##name##_out.set_kernel(                                           \
        KEY, &S::out<::kiln::ops::op_##name##_out, &::kiln::meta::name, impl, true>);  \
    return true;                                                                       \
  }()
// Same for a structured op (functional and out=).
#define KILN_REGISTER_STRUCTURED(name, KEY, impl)                                      \
  static const bool KILN_CONCAT(kiln_reg_##name##_, __LINE__) = [] {                   \
    using S = ::kiln::detail::Structured<decltype(::kiln::ops::op_##name)::Sig>;       \
    ::kiln::ops::op_##name.set_kernel(KEY, &S::functional<&::kiln::meta::name, impl>); \
    ::kiln::ops::op_##name##_out.set_kernel(                                           \
        KEY, &S::out<::kiln::ops::op_##name##_out, &::kiln::meta::name, impl>);        \
    return true;                                                                       \
  }()

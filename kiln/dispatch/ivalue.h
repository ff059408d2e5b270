#pragma once
// IValue: one boxed argument or result, for fallbacks that treat every op alike.
#include <optional>
#include <span>
#include <tuple>
#include <variant>
#include <vector>

#include "kiln/core/generator.h"
#include "kiln/core/tensor.h"

namespace kiln {

// None is std::monostate. Int lists are stored as Shape.
using IValue = std::variant<std::monostate, Tensor, TensorList, Scalar, int64_t, double, bool,
                            Shape, DType, Device, Generator*>;
using Stack = std::vector<IValue>;

namespace detail {

// to_ivalue / from_ivalue for every argument type an op signature may use.
inline IValue to_ivalue(const Tensor& t) { return t; }
inline IValue to_ivalue(const TensorList& t) { return t; }
inline IValue to_ivalue(const Scalar& s) { return s; }
inline IValue to_ivalue(int64_t v) { return v; }
inline IValue to_ivalue(double v) { return v; }
inline IValue to_ivalue(bool v) { return v; }
inline IValue to_ivalue(IntArrayRef v) { return Shape(v); }
inline IValue to_ivalue(DType v) { return v; }
inline IValue to_ivalue(Device v) { return v; }
inline IValue to_ivalue(Generator* v) { return v; }
template <class T>
IValue to_ivalue(const std::optional<T>& v) {
  return v ? to_ivalue(*v) : IValue{};
}

template <class T>
struct FromIValue {
  static const T& get(IValue& v) { return std::get<T>(v); }
};
template <>
struct FromIValue<IntArrayRef> {
  static IntArrayRef get(IValue& v) { return std::get<Shape>(v).span(); }
};
template <class T>
struct FromIValue<std::optional<T>> {
  static std::optional<T> get(IValue& v) {
    if (std::holds_alternative<std::monostate>(v)) return std::nullopt;
    return T(FromIValue<T>::get(v));
  }
};
template <class A>
decltype(auto) from_ivalue(IValue& v) {
  return FromIValue<std::remove_cvref_t<A>>::get(v);
}

// A copy of `in` with `tensor` applied to every tensor (TensorList elements too) and `other`
// to every other value: how fallbacks move a call's arguments to another device.
template <class T, class O>
Stack map_stack(const Stack& in, T&& tensor, O&& other) {
  Stack out;
  out.reserve(in.size());
  for (const IValue& v : in) {
    if (auto* t = std::get_if<Tensor>(&v)) {
      out.emplace_back(tensor(*t));
    } else if (auto* l = std::get_if<TensorList>(&v)) {
      TensorList m;
      m.reserve(l->size());
      for (const Tensor& x : *l) m.push_back(tensor(x));
      out.emplace_back(std::move(m));
    } else {
      out.push_back(other(v));
    }
  }
  return out;
}
inline IValue same_value(const IValue& v) { return v; }

// Results: a Tensor, a tuple of Tensors, a TensorList, or nothing.
inline void push_result(Stack& s, Tensor t) { s.emplace_back(std::move(t)); }
inline void push_result(Stack& s, TensorList t) { s.emplace_back(std::move(t)); }
template <class... T>
void push_result(Stack& s, std::tuple<T...> t) {
  std::apply([&](auto&... x) { (s.emplace_back(std::move(x)), ...); }, t);
}
template <class R>
struct PopResult {
  static R get(Stack& s) { return std::get<R>(std::move(s.at(0))); }
};
template <class... T>
struct PopResult<std::tuple<T...>> {
  static std::tuple<T...> get(Stack& s) { return get_impl(s, std::index_sequence_for<T...>{}); }
  template <size_t... I>
  static std::tuple<T...> get_impl(Stack& s, std::index_sequence<I...>) {
    return {std::get<T>(std::move(s.at(I)))...};
  }
};

}  // namespace detail
}  // namespace kiln

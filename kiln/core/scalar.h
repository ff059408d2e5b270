#pragma once
// Scalar: a number passed to an op (alpha, a fill value, a clamp bound).
#include <cmath>
#include <cstdint>
#include <type_traits>

#include <fmt/format.h>

#include "kiln/core/dtype.h"

namespace kiln {

// Holds a bool, an int64 or a double; its dtype for promotion is kBool, kInt64 or the
// default floating dtype (PyTorch's "wrapped number" rules).
class Scalar {
 public:
  enum class Kind : uint8_t { Bool, Int, Float };
  Scalar() : Scalar(int64_t{0}) {}
  Scalar(bool v) : kind_(Kind::Bool) { i_ = v; }  // NOLINT: implicit like a number
  template <class T, std::enable_if_t<std::is_integral_v<T> && !std::is_same_v<T, bool>, int> = 0>
  Scalar(T v) : kind_(Kind::Int) {  // NOLINT
    i_ = static_cast<int64_t>(v);
  }
  template <class T, std::enable_if_t<std::is_floating_point_v<T>, int> = 0>
  Scalar(T v) : kind_(Kind::Float) {  // NOLINT
    d_ = static_cast<double>(v);
  }
  Scalar(Half v) : Scalar(static_cast<float>(v)) {}      // NOLINT
  Scalar(BFloat16 v) : Scalar(static_cast<float>(v)) {}  // NOLINT

  Kind kind() const { return kind_; }
  bool is_bool() const { return kind_ == Kind::Bool; }
  bool is_integral() const { return kind_ == Kind::Int; }
  bool is_floating() const { return kind_ == Kind::Float; }
  // The category's dtype: bool, int64 or float64 (before wrapped-number demotion).
  DType dtype() const {
    return kind_ == Kind::Bool ? kBool : kind_ == Kind::Int ? kInt64 : kFloat64;
  }
  template <class T>
  T to() const {
    if (kind_ == Kind::Float) return static_cast<T>(d_);
    if constexpr (std::is_same_v<T, Half> || std::is_same_v<T, BFloat16>)
      return T(static_cast<float>(i_));
    else
      return static_cast<T>(i_);
  }
  double to_double() const { return kind_ == Kind::Float ? d_ : static_cast<double>(i_); }
  int64_t to_int() const { return kind_ == Kind::Float ? static_cast<int64_t>(d_) : i_; }
  bool to_bool() const { return kind_ == Kind::Float ? d_ != 0.0 : i_ != 0; }
  bool operator==(const Scalar& o) const {
    return kind_ == o.kind_ && (kind_ == Kind::Float ? d_ == o.d_ : i_ == o.i_);
  }

 private:
  Kind kind_;
  union {
    int64_t i_;
    double d_;
  };
};

}  // namespace kiln

template <>
struct fmt::formatter<kiln::Scalar> : fmt::formatter<double> {
  auto format(const kiln::Scalar& s, format_context& ctx) const {
    if (s.is_bool()) return fmt::format_to(ctx.out(), "{}", s.to_bool());
    if (s.is_integral()) return fmt::format_to(ctx.out(), "{}", s.to_int());
    double d = s.to_double();
    // Keep a float visibly a float: 2.0 prints as "2.0", not "2".
    if (d == static_cast<double>(static_cast<int64_t>(d)) && std::abs(d) < 1e15)
      return fmt::format_to(ctx.out(), "{:.1f}", d);
    return fmt::format_to(ctx.out(), "{}", d);
  }
};

#pragma once
// Element types and PyTorch's type-promotion rules.
#include <cstdint>
#include <string_view>

#include <fmt/format.h>

#include "kiln/core/half.h"

namespace kiln {

// Order matters: it is the index into the promotion table.
enum class DType : uint8_t { Bool, UInt8, Int32, Int64, Float16, BFloat16, Float32, Float64 };
inline constexpr int kNumDTypes = 8;

inline constexpr DType kBool = DType::Bool;
inline constexpr DType kUInt8 = DType::UInt8;
inline constexpr DType kInt32 = DType::Int32;
inline constexpr DType kInt64 = DType::Int64;
inline constexpr DType kFloat16 = DType::Float16;
inline constexpr DType kBFloat16 = DType::BFloat16;
inline constexpr DType kFloat32 = DType::Float32;
inline constexpr DType kFloat64 = DType::Float64;

// Bytes per element.
constexpr size_t itemsize(DType t) {
  constexpr size_t sizes[] = {1, 1, 4, 8, 2, 2, 4, 8};
  return sizes[static_cast<int>(t)];
}
constexpr bool is_floating(DType t) { return t >= DType::Float16; }
constexpr bool is_integral(DType t, bool include_bool) {
  return t == DType::Bool ? include_bool : !is_floating(t);
}
// "float32", "int64", ...
std::string_view name(DType t);
// Parses "float32", "float", "f32", "half", "bfloat16", "int64", "long", "bool", ...
// Throws ValueError on anything else.
DType parse_dtype(std::string_view s);

// The smallest type both a and b convert to without losing range (PyTorch's promoteTypes).
DType promote_types(DType a, DType b);
// Whether a value of type `from` may be written into a tensor of type `to` by an in-place or
// out= op (PyTorch's canCast: no float -> integral, no non-bool -> bool).
bool can_cast(DType from, DType to);

// Default dtype for floating-point factory functions and Python-like float scalars.
DType default_dtype();
// Only float32 or float64 are accepted, as in PyTorch.
void set_default_dtype(DType t);

// The C++ type of each dtype, and the reverse.
template <class T>
struct dtype_of;
template <>
struct dtype_of<bool> {
  static constexpr DType value = kBool;
};
template <>
struct dtype_of<uint8_t> {
  static constexpr DType value = kUInt8;
};
template <>
struct dtype_of<int32_t> {
  static constexpr DType value = kInt32;
};
template <>
struct dtype_of<int64_t> {
  static constexpr DType value = kInt64;
};
template <>
struct dtype_of<Half> {
  static constexpr DType value = kFloat16;
};
template <>
struct dtype_of<BFloat16> {
  static constexpr DType value = kBFloat16;
};
template <>
struct dtype_of<float> {
  static constexpr DType value = kFloat32;
};
template <>
struct dtype_of<double> {
  static constexpr DType value = kFloat64;
};

// The type arithmetic is done in: float for the 16-bit floats, the type itself otherwise.
template <class T>
struct acc_type {
  using type = T;
};
template <>
struct acc_type<Half> {
  using type = float;
};
template <>
struct acc_type<BFloat16> {
  using type = float;
};
template <class T>
using acc_t = typename acc_type<T>::type;

}  // namespace kiln

template <>
struct fmt::formatter<kiln::DType> : fmt::formatter<std::string_view> {
  auto format(kiln::DType t, format_context& ctx) const {
    return fmt::formatter<std::string_view>::format(kiln::name(t), ctx);
  }
};

// Runs `body` with `scalar_t` bound to the C++ type of `dtype`. Usage:
//   KILN_DISPATCH_TYPES(t.dtype(), "relu", [&] { kernel<scalar_t>(...); });
#define KILN_DTYPE_CASE(DT, T, ...) \
  case DT: {                        \
    using scalar_t = T;             \
    return __VA_ARGS__();           \
  }
#define KILN_DISPATCH_TYPES(dtype, opname, ...)                               \
  [&] {                                                                       \
    switch (dtype) {                                                          \
      KILN_DTYPE_CASE(::kiln::DType::Bool, bool, __VA_ARGS__)                 \
      KILN_DTYPE_CASE(::kiln::DType::UInt8, uint8_t, __VA_ARGS__)             \
      KILN_DTYPE_CASE(::kiln::DType::Int32, int32_t, __VA_ARGS__)             \
      KILN_DTYPE_CASE(::kiln::DType::Int64, int64_t, __VA_ARGS__)             \
      KILN_DTYPE_CASE(::kiln::DType::Float16, ::kiln::Half, __VA_ARGS__)      \
      KILN_DTYPE_CASE(::kiln::DType::BFloat16, ::kiln::BFloat16, __VA_ARGS__) \
      KILN_DTYPE_CASE(::kiln::DType::Float32, float, __VA_ARGS__)             \
      KILN_DTYPE_CASE(::kiln::DType::Float64, double, __VA_ARGS__)            \
    }                                                                         \
    KILN_THROW(Type, "[{}] unsupported dtype", opname);                       \
  }()
// Floating types only; anything else is a TypeError naming the op and dtype.
#define KILN_DISPATCH_FLOAT_TYPES(dtype, opname, ...)                                \
  [&] {                                                                              \
    switch (dtype) {                                                                 \
      KILN_DTYPE_CASE(::kiln::DType::Float16, ::kiln::Half, __VA_ARGS__)             \
      KILN_DTYPE_CASE(::kiln::DType::BFloat16, ::kiln::BFloat16, __VA_ARGS__)        \
      KILN_DTYPE_CASE(::kiln::DType::Float32, float, __VA_ARGS__)                    \
      KILN_DTYPE_CASE(::kiln::DType::Float64, double, __VA_ARGS__)                   \
      default:                                                                       \
        break;                                                                       \
    }                                                                                \
    KILN_THROW(Type, "[{}] expected a floating-point dtype, got {}", opname, dtype); \
  }()

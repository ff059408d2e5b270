#include "kiln/core/dtype.h"

#include <atomic>

#include "kiln/core/error.h"

namespace kiln {

namespace {
std::atomic<DType> g_default_dtype{kFloat32};
}

std::string_view name(DType t) {
  constexpr std::string_view names[] = {"bool",    "uint8",    "int32",   "int64",
                                        "float16", "bfloat16", "float32", "float64"};
  return names[static_cast<int>(t)];
}

DType parse_dtype(std::string_view s) {
  struct Entry {
    std::string_view name;
    DType t;
  };
  static constexpr Entry entries[] = {
      {"bool", kBool},     {"uint8", kUInt8},       {"int32", kInt32},     {"int", kInt32},
      {"int64", kInt64},   {"long", kInt64},        {"float16", kFloat16}, {"half", kFloat16},
      {"f16", kFloat16},   {"bfloat16", kBFloat16}, {"bf16", kBFloat16},   {"float32", kFloat32},
      {"float", kFloat32}, {"f32", kFloat32},       {"float64", kFloat64}, {"double", kFloat64},
      {"f64", kFloat64}};
  for (const auto& e : entries)
    if (e.name == s) return e.t;
  KILN_THROW(Value,
             "[dtype] unknown dtype '{}'; expected one of bool, uint8, int32, int64, float16, "
             "bfloat16, float32, float64",
             s);
}

DType promote_types(DType a, DType b) {
  if (a == b) return a;
  // Table over (Bool, UInt8, Int32, Int64, Float16, BFloat16, Float32, Float64).
  constexpr DType b1 = kBool, u1 = kUInt8, i4 = kInt32, i8 = kInt64, f2 = kFloat16, bf = kBFloat16,
                  f4 = kFloat32, f8 = kFloat64;
  static constexpr DType table[kNumDTypes][kNumDTypes] = {
      /* b1 */ {b1, u1, i4, i8, f2, bf, f4, f8},
      /* u1 */ {u1, u1, i4, i8, f2, bf, f4, f8},
      /* i4 */ {i4, i4, i4, i8, f2, bf, f4, f8},
      /* i8 */ {i8, i8, i8, i8, f2, bf, f4, f8},
      /* f2 */ {f2, f2, f2, f2, f2, f4, f4, f8},
      /* bf */ {bf, bf, bf, bf, f4, bf, f4, f8},
      /* f4 */ {f4, f4, f4, f4, f4, f4, f4, f8},
      /* f8 */ {f8, f8, f8, f8, f8, f8, f8, f8},
  };
  return table[static_cast<int>(a)][static_cast<int>(b)];
}

bool can_cast(DType from, DType to) {
  if (is_floating(from) && !is_floating(to)) return false;
  if (from != kBool && to == kBool) return false;
  return true;
}

DType default_dtype() { return g_default_dtype.load(std::memory_order_relaxed); }

void set_default_dtype(DType t) {
  KILN_CHECK_TYPE(t == kFloat32 || t == kFloat64,
                  "[set_default_dtype] only float32 or float64 can be the default, got {}", t);
  g_default_dtype.store(t, std::memory_order_relaxed);
}

}  // namespace kiln

#pragma once
// float16 and bfloat16 storage types; arithmetic happens in float.
#include <bit>
#include <cstdint>
#include <cstring>

namespace kiln {

// IEEE 754 binary16. Conversions round to nearest even; NaN and infinities are preserved.
struct Half {
  uint16_t bits = 0;
  Half() = default;
  Half(float f) : bits(from_float(f)) {}             // NOLINT: implicit like a builtin float type
  operator float() const { return to_float(bits); }  // NOLINT

  static uint16_t from_float(float f) {
    uint32_t x = std::bit_cast<uint32_t>(f);
    uint32_t sign = (x >> 16) & 0x8000u;
    uint32_t absx = x & 0x7fffffffu;
    if (absx >= 0x7f800000u)
      return static_cast<uint16_t>(sign | (absx > 0x7f800000u ? 0x7e00u : 0x7c00u));
    if (absx >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // overflow -> inf
    if (absx < 0x38800000u) {                                               // subnormal or zero
      // Add 0.5 so the float adder performs the round-to-nearest-even for us.
      float a = std::bit_cast<float>(absx) + 0.5f;
      return static_cast<uint16_t>(sign | (std::bit_cast<uint32_t>(a) - 0x3f000000u));
    }
    uint32_t mant_odd = (absx >> 13) & 1u;
    absx += 0xc8000fffu + mant_odd;  // rebias exponent (-112 << 23) and round
    return static_cast<uint16_t>(sign | (absx >> 13));
  }
  static float to_float(uint16_t h) {
    uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu;
    uint32_t mant = h & 0x3ffu;
    uint32_t out;
    if (exp == 0) {
      if (mant == 0) {
        out = sign;
      } else {  // subnormal: value = mant * 2^-24
        float v = static_cast<float>(mant) * 5.9604644775390625e-8f;
        return sign ? -v : v;
      }
    } else if (exp == 31) {
      out = sign | 0x7f800000u | (mant << 13) | (mant ? 0x400000u : 0u);  // NaNs come out quiet
    } else {
      out = sign | ((exp + 112) << 23) | (mant << 13);
    }
    return std::bit_cast<float>(out);
  }
};

// bfloat16: the top 16 bits of a float32. Conversion rounds to nearest even.
struct BFloat16 {
  uint16_t bits = 0;
  BFloat16() = default;
  BFloat16(float f) : bits(from_float(f)) {}  // NOLINT
  operator float() const {
    return std::bit_cast<float>(static_cast<uint32_t>(bits) << 16);
  }  // NOLINT

  static uint16_t from_float(float f) {
    uint32_t x = std::bit_cast<uint32_t>(f);
    if ((x & 0x7fffffffu) > 0x7f800000u) return 0x7fc0;  // NaN
    uint32_t rounding = 0x7fffu + ((x >> 16) & 1u);
    return static_cast<uint16_t>((x + rounding) >> 16);
  }
};

}  // namespace kiln

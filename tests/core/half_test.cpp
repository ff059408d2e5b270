// Tests for kiln/core/half.h against c10::Half and c10::BFloat16.
#include "kiln/core/half.h"

#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>

namespace kiln {
namespace {

uint32_t bits_of(float f) { return std::bit_cast<uint32_t>(f); }
float float_of(uint32_t b) { return std::bit_cast<float>(b); }

uint16_t c10_half_bits(float f) { return c10::Half(f).x; }
float c10_half_to_float(uint16_t h) {
  return static_cast<float>(c10::Half(h, c10::Half::from_bits()));
}
uint16_t c10_bf16_bits(float f) { return c10::BFloat16(f).x; }
float c10_bf16_to_float(uint16_t h) {
  return static_cast<float>(c10::BFloat16(h, c10::BFloat16::from_bits()));
}

// Counts mismatches of from_float against c10 and reports the first few.
struct Checker {
  int mismatches = 0;
  void half(float f) {
    uint16_t got = Half::from_float(f), want = c10_half_bits(f);
    if (got != want && ++mismatches <= 10)
      ADD_FAILURE() << std::hexfloat << "Half::from_float(" << f << ") [bits 0x" << std::hex
                    << bits_of(f) << "] = 0x" << got << ", c10 gives 0x" << want;
  }
  void bf16(float f) {
    uint16_t got = BFloat16::from_float(f), want = c10_bf16_bits(f);
    if (got != want && ++mismatches <= 10)
      ADD_FAILURE() << std::hexfloat << "BFloat16::from_float(" << f << ") [bits 0x" << std::hex
                    << bits_of(f) << "] = 0x" << got << ", c10 gives 0x" << want;
  }
};

bool is_signaling_nan(uint16_t h) { return (h & 0x7c00) == 0x7c00 && (h & 0x3ff) && !(h & 0x200); }

// Bitwise, so signed zeros and NaN payloads count. Together with the next test this covers all
// 65536 bit patterns.
TEST(HalfTest, ToFloatMatchesC10OnAllBitPatternsExceptSignalingNaNs) {
  int mismatches = 0;
  for (uint32_t h = 0; h <= 0xffff; ++h) {
    uint16_t b = static_cast<uint16_t>(h);
    if (is_signaling_nan(b)) continue;
    float got = Half::to_float(b), want = c10_half_to_float(b);
    if (bits_of(got) != bits_of(want) && ++mismatches <= 10)
      ADD_FAILURE() << std::hex << "Half::to_float(0x" << h << ") = bits 0x" << bits_of(got)
                    << ", c10 gives 0x" << bits_of(want);
    Half x;
    x.bits = b;
    EXPECT_EQ(bits_of(static_cast<float>(x)), bits_of(got))
        << "operator float, 0x" << std::hex << h;
  }
  EXPECT_EQ(mismatches, 0);
}

// c10 returns a quiet NaN (float bit 22 set) for a signaling-NaN half, keeping sign and
// payload. 1022 of the 65536 patterns.
TEST(HalfTest, ToFloatQuietsSignalingNaNsLikeC10) {
  int count = 0, mismatches = 0;
  for (uint32_t h = 0; h <= 0xffff; ++h) {
    uint16_t b = static_cast<uint16_t>(h);
    if (!is_signaling_nan(b)) continue;
    ++count;
    float got = Half::to_float(b), want = c10_half_to_float(b);
    EXPECT_TRUE(std::isnan(got)) << std::hex << "0x" << h;
    if (bits_of(got) != bits_of(want) && ++mismatches <= 3)
      ADD_FAILURE() << std::hex << "Half::to_float(0x" << h << ") = bits 0x" << bits_of(got)
                    << ", c10 gives 0x" << bits_of(want);
  }
  EXPECT_EQ(count, 1022);
  EXPECT_EQ(mismatches, 0);
}

TEST(HalfTest, FromFloatMatchesC10OnAllHalfValues) {
  // Every half value converted to float and back, and the float itself, match c10.
  Checker c;
  for (uint32_t h = 0; h <= 0xffff; ++h) c.half(Half::to_float(static_cast<uint16_t>(h)));
  EXPECT_EQ(c.mismatches, 0);
  for (uint32_t h = 0; h <= 0xffff; ++h) {
    float f = Half::to_float(static_cast<uint16_t>(h));
    if (!std::isnan(f)) {
      EXPECT_EQ(Half::from_float(f), static_cast<uint16_t>(h))
          << std::hex << "round trip of 0x" << h;
    }
  }
}

TEST(HalfTest, FromFloatMatchesC10AtEveryRoundingBoundary) {
  // For each pair of neighbouring finite halves: the exact midpoint (a tie) and the floats
  // just below and above it. The midpoint is exact in float (11 vs 24 significand bits).
  Checker c;
  for (uint32_t h = 0; h < 0x7bff; ++h) {
    for (uint32_t sign : {0u, 0x8000u}) {
      float lo = Half::to_float(static_cast<uint16_t>(h | sign));
      float hi = Half::to_float(static_cast<uint16_t>((h + 1) | sign));
      float mid = (lo + hi) / 2;
      c.half(mid);
      c.half(std::nextafter(mid, 0.0f));
      c.half(std::nextafter(mid, sign ? -INFINITY : INFINITY));
    }
  }
  // Around the overflow threshold 65520 (midpoint of 65504 and 2^16).
  for (float f : {65504.0f, 65519.0f, 65520.0f, 65536.0f, 1e10f}) {
    for (float g : {std::nextafter(f, 0.0f), f, std::nextafter(f, INFINITY)}) {
      c.half(g);
      c.half(-g);
    }
  }
  EXPECT_EQ(c.mismatches, 0);
}

TEST(HalfTest, FromFloatMatchesC10OnRandomFloats) {
  std::mt19937 rng(12345);
  Checker c;
  // Uniform over all bit patterns (every exponent, NaNs, infinities, float subnormals).
  for (int i = 0; i < 3'000'000; ++i) c.half(float_of(static_cast<uint32_t>(rng())));
  // Concentrated on exponents where half has normals and subnormals: 2^-26 .. 2^17.
  std::uniform_int_distribution<uint32_t> exp(127 - 26, 127 + 17);
  for (int i = 0; i < 3'000'000; ++i) {
    uint32_t r = static_cast<uint32_t>(rng());
    c.half(float_of((r & 0x807fffffu) | (exp(rng) << 23)));
  }
  EXPECT_EQ(c.mismatches, 0);
}

TEST(HalfTest, NamedCases) {
  EXPECT_EQ(Half::from_float(0.0f), 0x0000);
  EXPECT_EQ(Half::from_float(-0.0f), 0x8000);
  EXPECT_EQ(Half::from_float(1.0f), 0x3c00);
  EXPECT_EQ(Half::from_float(-2.0f), 0xc000);
  EXPECT_EQ(Half::from_float(65504.0f), 0x7bff);  // largest finite half
  EXPECT_EQ(Half::from_float(65519.0f), 0x7bff);
  EXPECT_EQ(Half::from_float(65520.0f), 0x7c00);  // tie between 65504 and 2^16: to even, inf
  EXPECT_EQ(Half::from_float(1e10f), 0x7c00);
  EXPECT_EQ(Half::from_float(-1e10f), 0xfc00);
  EXPECT_EQ(Half::from_float(INFINITY), 0x7c00);
  EXPECT_EQ(Half::from_float(-INFINITY), 0xfc00);
  EXPECT_EQ(Half::from_float(std::numeric_limits<float>::quiet_NaN()), 0x7e00);
  EXPECT_TRUE(std::isnan(static_cast<float>(Half(NAN))));
  EXPECT_EQ(Half::from_float(0x1p-14f), 0x0400);    // smallest normal
  EXPECT_EQ(Half::from_float(0x1p-24f), 0x0001);    // smallest subnormal
  EXPECT_EQ(Half::from_float(0x1p-25f), 0x0000);    // tie between 0 and 2^-24: to even, 0
  EXPECT_EQ(Half::from_float(0x1.8p-24f), 0x0002);  // tie between 1 and 2 ulps: to even, 2
  EXPECT_EQ(Half::from_float(0x1.4p-24f), 0x0001);
  EXPECT_EQ(Half::from_float(1.0f + 0x1p-11f), 0x3c00);             // tie: to even (down)
  EXPECT_EQ(Half::from_float(1.0f + 0x3p-11f), 0x3c02);             // tie: to even (up)
  EXPECT_EQ(Half::from_float(1.0f + 0x1p-11f + 0x1p-23f), 0x3c01);  // just above a tie
  EXPECT_EQ(Half::to_float(0x0001), 0x1p-24f);
  EXPECT_EQ(Half::to_float(0x03ff), 0x3ffp-24f);
  EXPECT_EQ(Half::to_float(0x7bff), 65504.0f);
  EXPECT_EQ(Half::to_float(0xfc00), -INFINITY);
  EXPECT_EQ(bits_of(Half::to_float(0x8000)), 0x80000000u);
  EXPECT_EQ(static_cast<float>(Half(0.1f)), 0.0999755859375f);
}

TEST(BFloat16Test, ToFloatMatchesC10OnAllBitPatterns) {
  int mismatches = 0;
  for (uint32_t h = 0; h <= 0xffff; ++h) {
    BFloat16 x;
    x.bits = static_cast<uint16_t>(h);
    float got = x, want = c10_bf16_to_float(static_cast<uint16_t>(h));
    if (bits_of(got) != bits_of(want) && ++mismatches <= 10)
      ADD_FAILURE() << std::hex << "BFloat16 0x" << h << " -> bits 0x" << bits_of(got)
                    << ", c10 gives 0x" << bits_of(want);
  }
  EXPECT_EQ(mismatches, 0);
}

TEST(BFloat16Test, FromFloatMatchesC10AtEveryRoundingBoundary) {
  Checker c;
  for (uint32_t h = 0; h <= 0xffff; ++h) {
    BFloat16 x;
    x.bits = static_cast<uint16_t>(h);
    float f = x;
    c.bf16(f);
    // The tie halfway to the next bfloat16 and its neighbours (all exact in float).
    uint32_t mid = bits_of(f) | 0x8000u;
    for (uint32_t m : {mid - 1, mid, mid + 1}) c.bf16(float_of(m));
  }
  EXPECT_EQ(c.mismatches, 0);
}

TEST(BFloat16Test, FromFloatMatchesC10OnRandomFloats) {
  std::mt19937 rng(777);
  Checker c;
  for (int i = 0; i < 3'000'000; ++i) c.bf16(float_of(static_cast<uint32_t>(rng())));
  EXPECT_EQ(c.mismatches, 0);
}

TEST(BFloat16Test, NamedCases) {
  EXPECT_EQ(BFloat16::from_float(1.0f), 0x3f80);
  EXPECT_EQ(BFloat16::from_float(-1.0f), 0xbf80);
  EXPECT_EQ(BFloat16::from_float(1.0f + 0x1p-8f), 0x3f80);  // tie: to even (down)
  EXPECT_EQ(BFloat16::from_float(1.0f + 0x3p-8f), 0x3f82);  // tie: to even (up)
  EXPECT_EQ(BFloat16::from_float(INFINITY), 0x7f80);
  EXPECT_EQ(BFloat16::from_float(-INFINITY), 0xff80);
  EXPECT_EQ(BFloat16::from_float(std::numeric_limits<float>::max()), 0x7f80);  // rounds to inf
  EXPECT_EQ(BFloat16::from_float(std::numeric_limits<float>::quiet_NaN()), 0x7fc0);
  EXPECT_EQ(BFloat16::from_float(0x1p-130f), 0x0008);  // float subnormals are kept
  EXPECT_EQ(static_cast<float>(BFloat16(3.0f)), 3.0f);
}

}  // namespace
}  // namespace kiln

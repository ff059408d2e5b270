// Tests for kiln/core/scalar.h.
#include "kiln/core/scalar.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>

namespace kiln {
namespace {

TEST(ScalarTest, Kinds) {
  EXPECT_EQ(Scalar().kind(), Scalar::Kind::Int);
  EXPECT_EQ(Scalar(true).kind(), Scalar::Kind::Bool);
  EXPECT_EQ(Scalar(3).kind(), Scalar::Kind::Int);
  EXPECT_EQ(Scalar(int64_t{-7}).kind(), Scalar::Kind::Int);
  EXPECT_EQ(Scalar(uint8_t{200}).kind(), Scalar::Kind::Int);
  EXPECT_EQ(Scalar(int16_t{-2}).kind(), Scalar::Kind::Int);
  EXPECT_EQ(Scalar(2.5).kind(), Scalar::Kind::Float);
  EXPECT_EQ(Scalar(2.5f).kind(), Scalar::Kind::Float);
  EXPECT_EQ(Scalar(Half(1.5f)).kind(), Scalar::Kind::Float);
  EXPECT_EQ(Scalar(BFloat16(1.5f)).kind(), Scalar::Kind::Float);

  Scalar b(false), i(1), f(1.0);
  EXPECT_TRUE(b.is_bool());
  EXPECT_FALSE(b.is_integral());
  EXPECT_FALSE(b.is_floating());
  EXPECT_TRUE(i.is_integral());
  EXPECT_FALSE(i.is_bool());
  EXPECT_TRUE(f.is_floating());
  EXPECT_FALSE(f.is_integral());
}

TEST(ScalarTest, DTypeIsTheCategory) {
  EXPECT_EQ(Scalar(true).dtype(), kBool);
  EXPECT_EQ(Scalar(int32_t{3}).dtype(), kInt64);
  EXPECT_EQ(Scalar(uint8_t{3}).dtype(), kInt64);
  EXPECT_EQ(Scalar(3.0f).dtype(), kFloat64);
  EXPECT_EQ(Scalar(Half(3.0f)).dtype(), kFloat64);
}

TEST(ScalarTest, ConversionsFromInt) {
  Scalar s(int64_t{-3});
  EXPECT_EQ(s.to_int(), -3);
  EXPECT_EQ(s.to_double(), -3.0);
  EXPECT_TRUE(s.to_bool());
  EXPECT_EQ(s.to<int32_t>(), -3);
  EXPECT_EQ(s.to<float>(), -3.0f);
  EXPECT_EQ(static_cast<float>(s.to<Half>()), -3.0f);
  EXPECT_EQ(static_cast<float>(s.to<BFloat16>()), -3.0f);
  EXPECT_FALSE(Scalar(0).to_bool());
  EXPECT_EQ(Scalar(uint8_t{200}).to_int(), 200);
  EXPECT_EQ(Scalar(int64_t{1} << 62).to_int(), int64_t{1} << 62);  // no trip through double
  EXPECT_EQ(Scalar(std::numeric_limits<int64_t>::min()).to_int(),
            std::numeric_limits<int64_t>::min());
}

TEST(ScalarTest, ConversionsFromFloat) {
  Scalar s(2.75);
  EXPECT_EQ(s.to_double(), 2.75);
  EXPECT_EQ(s.to_int(), 2);  // truncation, like a C++ cast
  EXPECT_EQ(Scalar(-2.75).to_int(), -2);
  EXPECT_TRUE(s.to_bool());
  EXPECT_FALSE(Scalar(0.0).to_bool());
  EXPECT_FALSE(Scalar(-0.0).to_bool());
  EXPECT_TRUE(Scalar(0.25).to_bool());
  EXPECT_EQ(s.to<float>(), 2.75f);
  EXPECT_EQ(s.to<int64_t>(), 2);
  EXPECT_EQ(static_cast<float>(s.to<Half>()), 2.75f);
  EXPECT_EQ(static_cast<float>(Scalar(0.1).to<Half>()), static_cast<float>(Half(0.1f)));
  EXPECT_EQ(static_cast<float>(Scalar(1.0 / 3).to<BFloat16>()),
            static_cast<float>(BFloat16(static_cast<float>(1.0 / 3))));
  EXPECT_TRUE(std::isnan(Scalar(NAN).to_double()));
  EXPECT_EQ(Scalar(INFINITY).to<float>(), INFINITY);
  EXPECT_EQ(Scalar(Half(1.5f)).to_double(), 1.5);
  EXPECT_EQ(Scalar(1e-3f).to_double(), static_cast<double>(1e-3f));  // widened exactly
}

TEST(ScalarTest, ConversionsFromBool) {
  EXPECT_EQ(Scalar(true).to_int(), 1);
  EXPECT_EQ(Scalar(false).to_int(), 0);
  EXPECT_EQ(Scalar(true).to_double(), 1.0);
  EXPECT_TRUE(Scalar(true).to_bool());
  EXPECT_FALSE(Scalar(false).to_bool());
  EXPECT_EQ(Scalar(true).to<float>(), 1.0f);
  EXPECT_EQ(Scalar(true).to<bool>(), true);
  EXPECT_EQ(Scalar(2).to<bool>(), true);
}

TEST(ScalarTest, Equality) {
  EXPECT_EQ(Scalar(1), Scalar(int64_t{1}));
  EXPECT_EQ(Scalar(1.5), Scalar(1.5f));
  EXPECT_EQ(Scalar(true), Scalar(true));
  EXPECT_FALSE(Scalar(1) == Scalar(1.0));  // different kinds
  EXPECT_FALSE(Scalar(true) == Scalar(1));
  EXPECT_FALSE(Scalar(1) == Scalar(2));
  EXPECT_EQ(Scalar(0.0), Scalar(-0.0));
  EXPECT_FALSE(Scalar(NAN) == Scalar(NAN));
}

TEST(ScalarTest, CopyKeepsKindAndValue) {
  Scalar a(2.5);
  Scalar b = a;
  EXPECT_EQ(b.kind(), Scalar::Kind::Float);
  EXPECT_EQ(b.to_double(), 2.5);
  b = Scalar(int64_t{9});
  EXPECT_EQ(b.kind(), Scalar::Kind::Int);
  EXPECT_EQ(b.to_int(), 9);
}

TEST(ScalarTest, Formatting) {
  EXPECT_EQ(fmt::format("{}", Scalar(true)), "true");
  EXPECT_EQ(fmt::format("{}", Scalar(false)), "false");
  EXPECT_EQ(fmt::format("{}", Scalar(42)), "42");
  EXPECT_EQ(fmt::format("{}", Scalar(int64_t{-9000000000})), "-9000000000");
  EXPECT_EQ(fmt::format("{}", Scalar(2.5)), "2.5");
  EXPECT_EQ(fmt::format("{}", Scalar(-0.125)), "-0.125");
  EXPECT_EQ(fmt::format("{}", Scalar(1e-7)), "1e-07");
  EXPECT_EQ(fmt::format("{}", Scalar(0.1)), "0.1");  // shortest round-trip form
  EXPECT_EQ(fmt::format("{}", Scalar(0.1f)), fmt::format("{}", static_cast<double>(0.1f)));
  EXPECT_EQ(fmt::format("{}", Scalar(INFINITY)), "inf");
  EXPECT_EQ(fmt::format("{}", Scalar(NAN)), "nan");
  EXPECT_EQ(fmt::format("alpha={}", Scalar(3)), "alpha=3");
}

TEST(ScalarTest, FormattedFloatIsDistinguishableFromInt) {
  // Error messages print Scalars to explain kind errors, e.g. "[add] for integral input
  // tensors, alpha must not be a floating point number (got 2)": the float 2.0 has to read
  // differently from the int 2 there.
  EXPECT_NE(fmt::format("{}", Scalar(2.0)), fmt::format("{}", Scalar(2)));
  EXPECT_NE(fmt::format("{}", Scalar(-1.0)), fmt::format("{}", Scalar(-1)));
}

}  // namespace
}  // namespace kiln

// The branch-free float exp/tanh/erf of kiln/backend/cpu/vec_math.h against glibc, over every
// 251st float bit pattern (about 17 million values) and the special values.
#include "kiln/backend/cpu/vec_math.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>

namespace kiln::cpu {
namespace {

// Distance in units in the last place; NaN only matches NaN.
int64_t ulps(float a, float b) {
  if (a == b || (std::isnan(a) && std::isnan(b))) return 0;
  if (std::isnan(a) || std::isnan(b)) return std::numeric_limits<int32_t>::max();
  int32_t ia, ib;
  std::memcpy(&ia, &a, 4);
  std::memcpy(&ib, &b, 4);
  if (ia < 0) ia = std::numeric_limits<int32_t>::min() - ia;
  if (ib < 0) ib = std::numeric_limits<int32_t>::min() - ib;
  return std::llabs(static_cast<int64_t>(ia) - ib);
}

template <class F>
void for_floats(F f) {
  for (uint64_t bits = 0; bits <= 0xFFFFFFFFull; bits += 251) {
    float x;
    uint32_t b = static_cast<uint32_t>(bits);
    std::memcpy(&x, &b, 4);
    f(x);
  }
}

TEST(VecMathTest, ExpWithinOneUlp) {
  int64_t worst = 0;
  float at = 0;
  for_floats([&](float x) {
    int64_t u = ulps(exp_f(x), std::exp(x));
    if (u > worst) worst = u, at = x;
  });
  EXPECT_LE(worst, 1) << "at x = " << at;
}

TEST(VecMathTest, TanhWithinTwoUlp) {
  int64_t worst = 0;
  float at = 0;
  for_floats([&](float x) {
    int64_t u = ulps(tanh_f(x), std::tanh(x));
    if (u > worst) worst = u, at = x;
  });
  EXPECT_LE(worst, 2) << "at x = " << at;
}

TEST(VecMathTest, ErfWithinSixTenMillionths) {
  double worst = 0;
  float at = 0;
  for_floats([&](float x) {
    if (std::isnan(x)) return;
    double e = std::abs(static_cast<double>(erf_f(x)) - std::erf(static_cast<double>(x)));
    if (e > worst) worst = e, at = x;
  });
  EXPECT_LE(worst, 6e-7) << "at x = " << at;
}

TEST(VecMathTest, SpecialValues) {
  const float inf = std::numeric_limits<float>::infinity(), nan = std::nanf("");
  EXPECT_EQ(exp_f(inf), inf);
  EXPECT_EQ(exp_f(-inf), 0.0f);
  EXPECT_TRUE(std::isnan(exp_f(nan)));
  EXPECT_EQ(exp_f(88.73f), inf);                 // overflows, as expf does
  EXPECT_EQ(exp_f(88.72f), std::exp(88.72f));    // the largest finite results scale right
  EXPECT_EQ(exp_f(-103.0f), std::exp(-103.0f));  // denormal results too
  EXPECT_EQ(tanh_f(inf), 1.0f);
  EXPECT_EQ(tanh_f(-inf), -1.0f);
  EXPECT_TRUE(std::isnan(tanh_f(nan)));
  EXPECT_EQ(erf_f(inf), 1.0f);
  EXPECT_EQ(erf_f(-inf), -1.0f);
  EXPECT_TRUE(std::isnan(erf_f(nan)));
  EXPECT_EQ(exp_any(1.0), std::exp(1.0));  // double goes to libm
}

}  // namespace
}  // namespace kiln::cpu

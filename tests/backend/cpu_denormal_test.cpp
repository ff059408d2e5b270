// kiln::set_flush_denormal (kiln/backend/cpu/denormal.cpp, Note [Flushing denormals]): results
// below the smallest normal float become 0 and denormal inputs count as 0, on the caller and on
// every thread its CPU kernels use, including a team enlarged afterwards; off again restores
// gradual underflow. Inputs are made while the mode is off (a cast to float would flush them).
#include <gtest/gtest.h>
#include <omp.h>

#include <cstdint>
#include <cstring>
#include <vector>

#include "kiln/ops/ops.h"

#if defined(__x86_64__) || defined(__i386__)
#include <xmmintrin.h>

namespace kiln {
namespace {

constexpr unsigned kBoth = (1u << 15) | (1u << 6);

// The MXCSR mode bits of every thread of a team of `threads`.
std::vector<unsigned> team_modes(int threads) {
  std::vector<unsigned> modes(static_cast<size_t>(threads), 0xffffffffu);
#pragma omp parallel num_threads(threads)
  modes[static_cast<size_t>(omp_get_thread_num())] = _mm_getcsr() & kBoth;
  return modes;
}

// Read by their bits (a float read into a double under DAZ would count a denormal as 0).
bool all_zero(const Tensor& t) {
  Tensor c = t.contiguous();
  for (int64_t i = 0; i < c.numel(); ++i) {
    uint32_t bits;
    std::memcpy(&bits, c.data<float>() + i, sizeof bits);
    if (bits << 1) return false;  // anything but +0 or -0
  }
  return true;
}
double smallest(const Tensor& t) { return amin(abs(t.to(kFloat64))).item<double>(); }

class FlushDenormal : public ::testing::Test {
 protected:
  void SetUp() override { set_num_threads(2); }
  void TearDown() override {
    set_flush_denormal(false);
    set_num_threads(threads_);
  }
  int threads_ = get_num_threads();
};

TEST_F(FlushDenormal, FlushesResultsAndInputsOnEveryKernelThread) {
  const int64_t n = 1 << 20;  // past the elementwise engine's parallel threshold
  Tensor tiny = full({n}, 1e-30, kFloat32), small = full({n}, 1e-10, kFloat32);
  Tensor denormal = full({n}, 1e-40, kFloat32);  // stored as a denormal float
  ASSERT_GT(smallest(denormal), 0.0);

  // Off (the default): gradual underflow, and denormal inputs take part.
  EXPECT_GT(smallest(mul(tiny, small)), 0.0);
  EXPECT_NEAR(smallest(mul(denormal, 1e30)), 1e-10, 1e-12);

  ASSERT_TRUE(set_flush_denormal(true));
  for (unsigned m : team_modes(2)) EXPECT_EQ(m, kBoth);
  EXPECT_EQ(_mm_getcsr() & kBoth, kBoth);
  EXPECT_TRUE(all_zero(mul(tiny, small)));     // flush to zero: a denormal result is 0
  EXPECT_TRUE(all_zero(mul(denormal, 1e30)));  // denormals are zero: the input is 0
  // A product on one thread runs on the caller, OpenBLAS included (its own pool's threads keep
  // their mode: the Note's exception).
  set_num_threads(1);
  EXPECT_TRUE(all_zero(mm(tiny.view({1024, 1024}), small.view({1024, 1024}))));
  set_num_threads(2);

  ASSERT_TRUE(set_flush_denormal(false));
  for (unsigned m : team_modes(2)) EXPECT_EQ(m, 0u);
  EXPECT_GT(smallest(mul(tiny, small)), 0.0);
  EXPECT_NEAR(smallest(mul(denormal, 1e30)), 1e-10, 1e-12);
}

// OpenMP reuses the idle threads of an earlier, larger team: they must have the mode too, and
// threads started for a larger team afterwards inherit it from the caller.
TEST_F(FlushDenormal, EveryThreadOfLaterTeamsHasTheMode) {
  set_num_threads(4);
  for (unsigned m : team_modes(4)) EXPECT_EQ(m, 0u);
  set_num_threads(2);
  ASSERT_TRUE(set_flush_denormal(true));
  set_num_threads(4);
  for (unsigned m : team_modes(4)) EXPECT_EQ(m, kBoth);
  set_num_threads(6);
  for (unsigned m : team_modes(6)) EXPECT_EQ(m, kBoth);
  ASSERT_TRUE(set_flush_denormal(false));
  for (unsigned m : team_modes(6)) EXPECT_EQ(m, 0u);
}

}  // namespace
}  // namespace kiln

#else
TEST(FlushDenormal, UnsupportedOffX86) { EXPECT_FALSE(kiln::set_flush_denormal(true)); }
#endif

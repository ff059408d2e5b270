// The CPU elementwise engine of kiln/backend/cpu/loops.h: its preconditions (Note [Debug
// asserts] in kiln/core/error.h) raise InternalError in debug builds when a kernel is called
// directly with arguments no meta function would let through. Each check runs before any byte
// is read or written; release builds skip these tests (calling the kernels so would be undefined
// behaviour there).
#include "kiln/backend/cpu/loops.h"

#include <gtest/gtest.h>

#include <functional>
#include <string>

#include "kiln/ops/ops.h"
#include "tests/core/test_util.h"

namespace kiln::cpu {
namespace {

std::string internal_message(const std::function<void()>& f) {
  return kiln_test::message_of<InternalError>(f);
}

TEST(CpuLoops, CopiesAndBroadcasts) {
  Tensor dst = zeros({2, 3}, kFloat32);
  copy_kernel(dst, full({3}, 2.5, kFloat32));
  EXPECT_EQ(sum(dst).item().to_double(), 15.0);
  EXPECT_TRUE(broadcasts_to(ones({3}), dst));
  EXPECT_TRUE(broadcasts_to(ones({1, 3}), dst));
  EXPECT_FALSE(broadcasts_to(ones({4}), dst));
  EXPECT_FALSE(broadcasts_to(ones({1, 2, 3}), dst));
}

TEST(CpuLoops, InputThatDoesNotBroadcastIsABug) {
  if (!KILN_DEBUG_ASSERTS) GTEST_SKIP() << "debug asserts are compiled out (NDEBUG)";
  Tensor dst = zeros({4}, kFloat32), src = ones({3}, kFloat32);
  std::string msg =
      internal_message([&] { elementwise<float, float>(dst, {&src}, [](float x) { return x; }); });
  EXPECT_TRUE(msg.starts_with("[internal] bug in Kiln: assertion `broadcasts_to(*t, out)`")) << msg;
  EXPECT_NE(msg.find("an input of shape [3] does not broadcast to out's shape [4]"),
            std::string::npos)
      << msg;
  EXPECT_EQ(sum(dst).item().to_double(), 0.0);  // nothing written
}

TEST(CpuLoops, ElementTypeOtherThanTheOperandsIsABug) {
  if (!KILN_DEBUG_ASSERTS) GTEST_SKIP() << "debug asserts are compiled out (NDEBUG)";
  Tensor out = zeros({4}, kFloat32), in = ones({4}, kFloat32);
  std::string msg = internal_message(
      [&] { elementwise<double, float>(out, {&in}, [](float x) { return double(x); }); });
  EXPECT_NE(msg.find("[elementwise] out is float32, but the kernel writes 8-byte elements"),
            std::string::npos)
      << msg;
  msg = internal_message(
      [&] { elementwise<float, int64_t>(out, {&in}, [](int64_t x) { return float(x); }); });
  EXPECT_NE(msg.find("[elementwise] input 0 is float32, but the kernel reads 8-byte elements"),
            std::string::npos)
      << msg;
  EXPECT_EQ(sum(out).item().to_double(), 0.0);
}

}  // namespace
}  // namespace kiln::cpu

// Tests for kiln/core/error.h: the exception types and the three tiers of check macros.
#include "kiln/core/error.h"

#include <gtest/gtest.h>

#include <string>

#include "core/test_util.h"

using namespace kiln;
using kiln_test::contains;
using kiln_test::message_of;
using kiln_test::starts_with;

namespace {

void assert_positive(int n) { KILN_ASSERT(n > 0, "n is {}", n); }
void debug_assert_positive(int n) { KILN_DEBUG_ASSERT(n > 0, "n is {}", n); }

}  // namespace

TEST(ErrorTest, CheckThrowsTheKindItNames) {
  EXPECT_THROW(KILN_CHECK(false, "[op] v"), ValueError);
  EXPECT_THROW(KILN_CHECK_TYPE(false, "[op] t"), TypeError);
  EXPECT_THROW(KILN_CHECK_INDEX(false, "[op] i"), IndexError);
  EXPECT_THROW(KILN_CHECK_DEVICE(false, "[op] d"), DeviceError);
  EXPECT_THROW(KILN_THROW(NotImplemented, "[op] n"), NotImplementedError);
  EXPECT_NO_THROW(KILN_CHECK(true, "[op] never"));
  EXPECT_EQ(message_of<ValueError>([] { KILN_CHECK(1 == 2, "[op] got {}, want {}", 1, 2); }),
            "[op] got 1, want 2");
}

TEST(ErrorTest, AssertThrowsInternalErrorNamingTheBug) {
  EXPECT_NO_THROW(assert_positive(1));
  std::string msg = message_of<InternalError>([] { assert_positive(-3); });
  EXPECT_PRED2(starts_with, msg, "[internal] bug in Kiln: assertion `n > 0` failed at ");
  EXPECT_PRED2(contains, msg, "error_test.cpp:");
  EXPECT_PRED2(contains, msg, ": n is -3");
  // InternalError is a kiln::Error, and no user-error type: a bug is never the caller's fault.
  try {
    assert_positive(0);
    ADD_FAILURE() << "no exception";
  } catch (const Error& e) {
    EXPECT_NE(dynamic_cast<const InternalError*>(&e), nullptr);
    EXPECT_EQ(dynamic_cast<const ValueError*>(&e), nullptr);
  }
}

TEST(ErrorTest, AssertWithoutMessage) {
  int n = 0;
  std::string msg = message_of<InternalError>([&] { KILN_ASSERT(n == 1); });
  EXPECT_PRED2(starts_with, msg, "[internal] bug in Kiln: assertion `n == 1` failed at ");
  EXPECT_FALSE(msg.ends_with(": ")) << msg;
}

TEST(ErrorTest, ThrowInternalKindIsInternalError) {
  EXPECT_THROW(KILN_THROW(Internal, "[op] unreachable {}", 7), InternalError);
}

TEST(DebugAssertTest, ActiveExactlyWithoutNDEBUG) {
#ifdef NDEBUG
  EXPECT_EQ(KILN_DEBUG_ASSERTS, 0);
#else
  EXPECT_EQ(KILN_DEBUG_ASSERTS, 1);
#endif
}

TEST(DebugAssertTest, ThrowsInternalErrorInDebugBuilds) {
  if (!KILN_DEBUG_ASSERTS) GTEST_SKIP() << "debug asserts are compiled out (NDEBUG)";
  EXPECT_NO_THROW(debug_assert_positive(1));
  std::string msg = message_of<InternalError>([] { debug_assert_positive(-2); });
  EXPECT_PRED2(starts_with, msg, "[internal] bug in Kiln: assertion `n > 0` failed at ");
  EXPECT_PRED2(contains, msg, ": n is -2");
}

// See Note [Debug asserts]: compiled out, the condition is not evaluated at all.
TEST(DebugAssertTest, EvaluatesNothingInReleaseBuilds) {
  if (KILN_DEBUG_ASSERTS) GTEST_SKIP() << "debug asserts are checked (no NDEBUG)";
  int evaluated = 0;
  KILN_DEBUG_ASSERT(++evaluated < 0, "{}", ++evaluated);
  EXPECT_EQ(evaluated, 0);
  EXPECT_NO_THROW(debug_assert_positive(-2));
}

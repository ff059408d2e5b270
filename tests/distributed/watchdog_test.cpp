// The watchdog (kiln/distributed/watchdog.h) and the deadlines collectives get from groups and
// TimeoutGuard (collectives.h), in one process: a world of one. What a deadline does when it
// fires in a job is in fault_test.cpp (Note [Fault tests]).
#include "kiln/distributed/watchdog.h"

#include <gtest/gtest.h>

#include <condition_variable>
#include <cstdlib>
#include <mutex>
#include <string_view>
#include <thread>
#include <vector>

#include "kiln/core/error.h"
#include "kiln/distributed/collectives.h"

namespace kiln::distributed {
namespace {

using std::chrono::milliseconds;

// Expiry actions report here; wait_for() blocks until `n` have, or a minute has passed (a
// guard against hanging, not a timing assertion).
struct Fired {
  std::mutex mu;
  std::condition_variable cv;
  std::vector<int> order;
  std::function<void()> action(int id) {
    return [this, id] {
      std::lock_guard<std::mutex> lock(mu);
      order.push_back(id);
      cv.notify_all();
    };
  }
  std::vector<int> wait_for(size_t n) {
    std::unique_lock<std::mutex> lock(mu);
    cv.wait_for(lock, std::chrono::minutes(1), [&] { return order.size() >= n; });
    return order;
  }
};

TEST(Watchdog, RunsTheActionOnceTheDeadlinePasses) {
  Fired f;
  uint64_t h = watchdog_arm(Clock::now() + milliseconds(5), f.action(1));
  EXPECT_EQ(f.wait_for(1), std::vector<int>{1});
  EXPECT_FALSE(watchdog_disarm(h));  // it already ran
}

TEST(Watchdog, ADisarmedDeadlineNeverFires) {
  Fired f;
  uint64_t h = watchdog_arm(Clock::now() + milliseconds(20), f.action(1));
  EXPECT_TRUE(watchdog_disarm(h));
  EXPECT_FALSE(watchdog_disarm(h));
  // A later deadline fires after the disarmed one's has passed: had it been armed, it would
  // have run first.
  watchdog_arm(Clock::now() + milliseconds(40), f.action(2));
  EXPECT_EQ(f.wait_for(1), std::vector<int>{2});
}

TEST(Watchdog, AnEarlierDeadlineWakesTheWatchdog) {
  Fired f;
  uint64_t late = watchdog_arm(Clock::now() + std::chrono::hours(1), f.action(1));
  watchdog_arm(Clock::now() + milliseconds(5), f.action(2));
  EXPECT_EQ(f.wait_for(1), std::vector<int>{2});
  EXPECT_TRUE(watchdog_disarm(late));
}

// Note [Waking the watchdog] in watchdog.cpp: after a disarm the thread sleeps on until the
// deadline it slept for. A shorter deadline armed then must still wake it...
TEST(Watchdog, AShortDeadlineArmedAfterALongOneWasDisarmedFires) {
  Fired f;
  uint64_t late = watchdog_arm(Clock::now() + std::chrono::hours(1), f.action(1));
  EXPECT_TRUE(watchdog_disarm(late));
  watchdog_arm(Clock::now() + milliseconds(5), f.action(2));
  EXPECT_EQ(f.wait_for(1), std::vector<int>{2});
}

// ... and a later one, armed without waking it, fires once the thread has woken for the old
// deadline and found it gone.
TEST(Watchdog, ALaterDeadlineArmedWithoutWakingTheThreadFires) {
  Fired f;
  uint64_t first = watchdog_arm(Clock::now() + milliseconds(20), f.action(1));
  EXPECT_TRUE(watchdog_disarm(first));
  watchdog_arm(Clock::now() + milliseconds(60), f.action(2));
  EXPECT_EQ(f.wait_for(1), std::vector<int>{2});
}

TEST(Watchdog, FiresInDeadlineOrder) {
  Fired f;
  Clock::time_point t = Clock::now();
  watchdog_arm(t + milliseconds(30), f.action(3));
  watchdog_arm(t + milliseconds(10), f.action(1));
  watchdog_arm(t + milliseconds(20), f.action(2));
  EXPECT_EQ(f.wait_for(3), (std::vector<int>{1, 2, 3}));
}

TEST(Watchdog, AnActionMayArmAnotherDeadline) {
  Fired f;
  watchdog_arm(Clock::now(), [&f] { watchdog_arm(Clock::now(), f.action(2)); });
  EXPECT_EQ(f.wait_for(1), std::vector<int>{2});
}

TEST(Watchdog, DeadlineDisarmsWhenDestroyed) {
  Fired f;
  { Deadline d(Clock::now() + milliseconds(20), f.action(1)); }
  {
    Deadline d(Clock::now(), f.action(2));
    f.wait_for(1);
  }  // fired, then destroyed: no error
  watchdog_arm(Clock::now() + milliseconds(40), f.action(3));
  EXPECT_EQ(f.wait_for(2), (std::vector<int>{2, 3}));
}

TEST(TimeoutGuard, OverridesTheGroupsTimeoutOnThisThreadAndRestoresIt) {
  ProcessGroup& w = world();
  const milliseconds before = w.timeout();
  EXPECT_EQ(before, default_timeout());
  w.set_timeout(milliseconds(3000));
  EXPECT_EQ(timeout_for(w), milliseconds(3000));
  {
    TimeoutGuard g(milliseconds(1000));
    EXPECT_EQ(timeout_for(w), milliseconds(1000));
    {
      TimeoutGuard inner(milliseconds(2000));
      EXPECT_EQ(timeout_for(w), milliseconds(2000));
    }
    EXPECT_EQ(timeout_for(w), milliseconds(1000));
    milliseconds other{0};
    std::thread([&] { other = timeout_for(w); }).join();
    EXPECT_EQ(other, milliseconds(3000));  // another thread's collectives keep the group's
  }
  EXPECT_EQ(timeout_for(w), milliseconds(3000));
  w.set_timeout(before);
}

TEST(TimeoutGuard, RefusesANonPositiveTimeout) {
  EXPECT_THROW({ TimeoutGuard g(milliseconds(0)); }, ValueError);
  EXPECT_THROW({ TimeoutGuard g(milliseconds(-5)); }, ValueError);
  EXPECT_EQ(timeout_for(world()), world().timeout());
}

}  // namespace
}  // namespace kiln::distributed

namespace kiln::distributed {
namespace {

// KILN_DIST_TIMEOUT is read once per process: ctest runs this with a bad value
// (kiln_fault_unit_test.bad_timeout_env); elsewhere it skips.
TEST(DefaultTimeout, ABadEnvironmentValueIsAnError) {
  const char* v = std::getenv("KILN_DIST_TIMEOUT");
  if (!v || std::string_view(v) != "5s") GTEST_SKIP() << "run with KILN_DIST_TIMEOUT=5s";
  try {
    (void)default_timeout();
    FAIL() << "no error";
  } catch (const ValueError& e) {
    EXPECT_NE(std::string(e.what()).find(
                  "[distributed] KILN_DIST_TIMEOUT='5s' is not a positive number of seconds"),
              std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace kiln::distributed

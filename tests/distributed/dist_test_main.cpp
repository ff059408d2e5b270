// The main of the distributed tests: run as a world of one (no launcher) or under
// `scripts/mpirun.sh N`. Every rank runs every test; rank 0 prints gtest's usual report, the
// other ranks print only their failures, each line prefixed with the rank.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>

#include "kiln/distributed/init.h"
#include "tests/backend/sim_util.h"

namespace {

class RankFailurePrinter final : public ::testing::EmptyTestEventListener {
 public:
  explicit RankFailurePrinter(int rank) : rank_(rank) {}
  void OnTestPartResult(const ::testing::TestPartResult& r) override {
    if (!r.failed()) return;
    std::fprintf(stderr, "[rank %d] %s:%d: Failure\n%s\n", rank_,
                 r.file_name() ? r.file_name() : "?", r.line_number(), r.message());
  }
  void OnTestEnd(const ::testing::TestInfo& t) override {
    if (t.result()->Failed())
      std::fprintf(stderr, "[rank %d] [  FAILED  ] %s.%s\n", rank_, t.test_suite_name(), t.name());
  }

 private:
  int rank_;
};

}  // namespace

int main(int argc, char** argv) {
  // A collective of these tests takes milliseconds: a rank that waits 30 s is waiting for a
  // peer that will never come, and the deadline ends the job with the flight recorder instead
  // of a hang. KILN_DIST_TIMEOUT set by the caller wins.
  setenv("KILN_DIST_TIMEOUT", "30", 0);
  ::testing::InitGoogleTest(&argc, argv);
  kiln::distributed::init();
  (void)kiln::test::sim();  // loaded by every rank before any test
  if (kiln::distributed::rank() != 0) {
    auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
    listeners.Append(new RankFailurePrinter(kiln::distributed::rank()));
  }
  return RUN_ALL_TESTS();
}

// The cross-memory all-reduce of CPU tensors (kiln/distributed/cma_allreduce.h): every
// reduction and floating dtype, in place and out of place, sizes that the ranks do not divide,
// on the world and on sub-groups, bitwise equal to the reference and the same on every rank;
// equal to MPI's within float tolerance on values whose sums round; which calls take the path;
// the fallback when a rank turns it off; bad settings and ranks that disagree, raised on every
// rank; the rank's OpenMP threads sharing the work, bitwise equal to one thread. Run on 2 ranks,
// and a sample on 3 and 4; as a world of one every test skips.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>

#include "kiln/core/half.h"
#include "kiln/distributed/cma_allreduce.h"
#include "kiln/distributed/shm_allreduce.h"
#include "tests/distributed/dist_test_util.h"

namespace kiln::test {
namespace {

using dist::CustomAllReduceMode;
using dist::ReduceOp;

// Sets the mode for one test, on every rank alike, and restores Auto.
class ModeGuard {
 public:
  explicit ModeGuard(CustomAllReduceMode m) { dist::set_custom_all_reduce_mode(m); }
  ~ModeGuard() { dist::set_custom_all_reduce_mode(CustomAllReduceMode::Auto); }
};

// Sets an environment variable (unset: null) while it lives, then restores it.
class EnvGuard {
 public:
  EnvGuard(const char* var, const char* value) : var_(var) {
    const char* old = std::getenv(var);
    had_ = old != nullptr;
    if (had_) old_ = old;
    if (value)
      setenv(var, value, 1);
    else
      unsetenv(var);
  }
  ~EnvGuard() {
    if (had_)
      setenv(var_, old_.c_str(), 1);
    else
      unsetenv(var_);
  }

 private:
  const char* var_;
  bool had_ = false;
  std::string old_;
};

uint64_t calls() { return dist::cma_all_reduce_stats().calls; }

// Sets kiln's OpenMP threads for one test, and restores them.
class ThreadsGuard {
 public:
  explicit ThreadsGuard(int n) : old_(get_num_threads()) { set_num_threads(n); }
  ~ThreadsGuard() { set_num_threads(old_); }

 private:
  int old_;
};

// reduce_value (dist_test_util.h) of dtype `t`: sums, products and averages of up to 4 ranks
// exact in float32.
ValueFn reduce_value_fn(DType t) {
  return [t](int r, int64_t k) { return reduce_value(t, r, k); };
}

const std::vector<DType> kFloats = {kFloat32, kFloat64, kBFloat16, kFloat16};

class CmaAllReduce : public ::testing::Test {
 protected:
  void SetUp() override {
    if (dist::world_size() < 2) GTEST_SKIP() << "a world of one reads no peer";
    // The world's CPU backend is made by its first CPU collective; every rank agrees whether
    // the path works, so every rank skips alike where it does not.
    dist::all_reduce(full({1}, 1.0));
    auto s = dist::cma_all_reduce_stats();
    if (s.groups == 0) GTEST_SKIP() << "cross-memory attach is not permitted here: " << s.reason;
  }
};

// Every reduction of every floating dtype, functional and in place, on every test group, at
// sizes the group's ranks do not divide (shares of 64 bytes: 1001 leaves the last rank short
// and, at 4 ranks, 21 elements leave some ranks no share at all): bitwise the reference (each
// sum exact in float32, 16-bit types rounded once), the same on every rank, and one
// cross-memory all-reduce per call.
TEST_F(CmaAllReduce, EveryReductionAndFloatDtypeMatchesTheReferenceBitwise) {
  ModeGuard m(CustomAllReduceMode::On);  // every size takes the path
  for (const GroupCase& g : test_groups()) {
    if (!g.member()) continue;
    for (DType t : kFloats)
      for (ReduceOp op : all_reduce_ops())
        for (const std::vector<int64_t>& sizes :
             {std::vector<int64_t>{1001}, std::vector<int64_t>{3, 7}}) {
          const std::string at =
              where(g, Device(kCPU), t, dist::reduce_op_name(op)) +
              fmt::format(", {} elements", sizes.size() == 1 ? sizes[0] : sizes[0] * sizes[1]);
          Tensor x = make_tensor(sizes, t, Device(kCPU), dist::rank(), reduce_value_fn(t));
          Tensor want = expected_reduce(sizes, t, op, g.members, reduce_value_fn(t));
          const uint64_t before = calls();
          Tensor got = dist::all_reduce(x, op, g.group);
          Tensor inplace = x.clone();
          dist::all_reduce_(inplace, op, g.group);
          EXPECT_EQ(calls() - before, g.size() > 1 ? 2u : 0u) << at;
          EXPECT_TRUE(bitwise_equal(got, want)) << at;
          EXPECT_TRUE(bitwise_equal(inplace, want)) << at;
          EXPECT_TRUE(bitwise_equal(
              x, make_tensor(sizes, t, Device(kCPU), dist::rank(), reduce_value_fn(t))))
              << at << ": the functional form changed its input";
          EXPECT_TRUE(same_on_every_rank(got, g.group)) << at;
        }
  }
}

// The default mode takes the path from KILN_CPU_CMA_MIN_BYTES (1 MiB) up, for floating dtypes
// only: several blocks per share, in place and not.
TEST_F(CmaAllReduce, AutoTakesLargeFloatMessages) {
  const dist::ProcessGroup* world = &dist::world();
  std::vector<int> all(dist::world_size());
  for (int r = 0; r < dist::world_size(); ++r) all[r] = r;
  const int64_t big = (int64_t{3} << 20) / 4 + 77;  // 3 MiB of float32 and a little
  for (DType t : kFloats)
    for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Max}) {
      const int64_t n = t == kBFloat16 || t == kFloat16 ? 2 * big : big;
      const std::string at = fmt::format("{} {} {} elements", name(t), dist::reduce_op_name(op), n);
      Tensor x = make_tensor({n}, t, Device(kCPU), dist::rank(), reduce_value_fn(t));
      Tensor want = expected_reduce({n}, t, op, all, reduce_value_fn(t));
      const uint64_t before = calls();
      Tensor got = dist::all_reduce(x, op, world);
      dist::all_reduce_(x, op, world);
      EXPECT_EQ(calls() - before, 2u) << at;
      EXPECT_TRUE(bitwise_equal(got, want)) << at;
      EXPECT_TRUE(bitwise_equal(x, want)) << at;
    }
  // Small messages, integers and KILN_CUSTOM_AR=0 take MPI.
  const uint64_t before = calls();
  Tensor small =
      make_tensor({1000}, kFloat32, Device(kCPU), dist::rank(), reduce_value_fn(kFloat32));
  EXPECT_TRUE(bitwise_equal(
      dist::all_reduce(small),
      expected_reduce({1000}, kFloat32, ReduceOp::Sum, all, reduce_value_fn(kFloat32))));
  Tensor ints = make_tensor({big}, kInt32, Device(kCPU), dist::rank(), reduce_value_fn(kInt32));
  EXPECT_TRUE(bitwise_equal(dist::all_reduce(ints), expected_reduce({big}, kInt32, ReduceOp::Sum,
                                                                    all, reduce_value_fn(kInt32))));
  {
    ModeGuard off(CustomAllReduceMode::Off);
    Tensor x = make_tensor({big}, kFloat32, Device(kCPU), dist::rank(), reduce_value_fn(kFloat32));
    EXPECT_TRUE(bitwise_equal(
        dist::all_reduce(x),
        expected_reduce({big}, kFloat32, ReduceOp::Sum, all, reduce_value_fn(kFloat32))));
  }
  EXPECT_EQ(calls() - before, 0u);
}

// Values whose sums round: the result equals MPI's within float tolerance (MPI may add in
// another order) and is bitwise the same on every rank.
TEST_F(CmaAllReduce, MatchesMpiWithinTolerance) {
  const int64_t n = 300007;
  auto value = [](int r, int64_t k) { return std::sin(0.37 * static_cast<double>(k) + r) * 3.1; };
  for (DType t : kFloats)
    for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Product}) {
      const std::string at = fmt::format("{} {}", name(t), dist::reduce_op_name(op));
      Tensor x = make_tensor({n}, t, Device(kCPU), dist::rank(), value);
      Tensor mpi;
      {
        ModeGuard off(CustomAllReduceMode::Off);
        mpi = dist::all_reduce(x, op);
      }
      ModeGuard on(CustomAllReduceMode::On);
      Tensor got = dist::all_reduce(x, op);
      const double tol = t == kBFloat16  ? 5e-2
                         : t == kFloat16 ? 5e-3
                         : t == kFloat32 ? 1e-5
                                         : 1e-12;
      EXPECT_TRUE(allclose(got.to(kFloat64), mpi.to(kFloat64), tol, tol)) << at;
      EXPECT_TRUE(same_on_every_rank(got, &dist::world())) << at;
    }
}

// Values whose sums round, already rounded to dtype `t`, so that the reference (in rank order,
// 16-bit types in float32 and rounded once) is bitwise what the ranks compute.
ValueFn rounding_value_fn(DType t) {
  return [t](int r, int64_t k) {
    const double v = std::sin(0.37 * static_cast<double>(k) + r) * 3.1;
    if (t == kFloat32) return static_cast<double>(static_cast<float>(v));
    if (t == kFloat16) return static_cast<double>(static_cast<float>(Half(static_cast<float>(v))));
    if (t == kBFloat16)
      return static_cast<double>(static_cast<float>(BFloat16(static_cast<float>(v))));
    return v;
  };
}

// The rank's OpenMP threads share its work (Note [Threads of the cross-memory all-reduce]):
// on 1 to 4 threads, with the default block and with 4 KiB blocks (many per thread, their
// edges not the pieces'), every floating dtype and the reductions whose order shows, on values
// whose sums round: bitwise the one-thread result and the rank-order reference, in place and
// not, the same on every rank, and the call ran on the threads asked for.
TEST_F(CmaAllReduce, ThreadsGiveTheOneThreadResultBitwise) {
  std::vector<int> all(dist::world_size());
  for (int r = 0; r < dist::world_size(); ++r) all[r] = r;
  std::shared_ptr<dist::ProcessGroup> small_blocks;
  {
    EnvGuard env("KILN_CPU_CMA_CHUNK_BYTES", "4096");
    small_blocks = dist::new_group(all);
    dist::all_reduce(full({1}, 1.0), ReduceOp::Sum, small_blocks.get());  // makes its backend
  }
  // 1 MiB and a little: every rank's share takes 4 threads of kMinThreadBytes (64 KiB) at up to
  // 4 ranks, and the pieces end mid-block.
  const int64_t big = (int64_t{1} << 20) / 4 + 77;
  for (DType t : kFloats)
    for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Product, ReduceOp::Max}) {
      const int64_t n = t == kBFloat16 || t == kFloat16 ? 2 * big : big;
      const ValueFn f = rounding_value_fn(t);
      const Tensor x = make_tensor({n}, t, Device(kCPU), dist::rank(), f);
      const Tensor want = expected_reduce({n}, t, op, all, f);
      for (const dist::ProcessGroup* g : {&dist::world(), small_blocks.get()}) {
        Tensor one;
        for (int threads : {1, 2, 3, 4}) {
          const std::string at = fmt::format("group {} {} {} on {} threads", g->name(), name(t),
                                             dist::reduce_op_name(op), threads);
          ThreadsGuard th(threads);
          const uint64_t before = calls();
          Tensor got = dist::all_reduce(x, op, g);
          EXPECT_EQ(dist::cma_all_reduce_stats().threads, static_cast<uint64_t>(threads)) << at;
          Tensor inplace = x.clone();
          dist::all_reduce_(inplace, op, g);
          EXPECT_EQ(calls() - before, 2u) << at;
          if (threads == 1) one = got;
          EXPECT_TRUE(bitwise_equal(got, one)) << at;
          EXPECT_TRUE(bitwise_equal(got, want)) << at;
          EXPECT_TRUE(bitwise_equal(inplace, want)) << at;
          EXPECT_TRUE(same_on_every_rank(got, g)) << at;
        }
      }
    }
}

// A message whose share is under two threads' worth (64 KiB each) runs on one thread whatever
// the rank has; from two threads' worth up, on two.
TEST_F(CmaAllReduce, SmallSharesRunOnOneThread) {
  ModeGuard m(CustomAllReduceMode::On);
  ThreadsGuard th(4);
  const int ranks = dist::world_size();
  std::vector<int> all(ranks);
  for (int r = 0; r < ranks; ++r) all[r] = r;
  for (auto [share_bytes, threads] :
       {std::pair<int64_t, uint64_t>{1 << 10, 1}, {(128 << 10) - 64, 1}, {128 << 10, 2}}) {
    const int64_t n = share_bytes / 4 * ranks;
    Tensor x = make_tensor({n}, kFloat32, Device(kCPU), dist::rank(), reduce_value_fn(kFloat32));
    EXPECT_TRUE(bitwise_equal(dist::all_reduce(x), expected_reduce({n}, kFloat32, ReduceOp::Sum,
                                                                   all, reduce_value_fn(kFloat32))))
        << share_bytes;
    EXPECT_EQ(dist::cma_all_reduce_stats().threads, threads) << share_bytes << " bytes a share";
  }
}

// The flight recorder holds one entry per call, under the op's name.
TEST_F(CmaAllReduce, OneFlightRecorderEntryPerCall) {
  ModeGuard m(CustomAllReduceMode::On);
  const double mark = calls_mark();
  Tensor x = full({100}, 1.0);
  dist::all_reduce_(x);
  dist::all_reduce_(x);
  EXPECT_EQ(calls_since(mark, "all_reduce_"), 2) << calls_str(mark);
  EXPECT_EQ(calls_since(mark, "all_reduce"), 0) << calls_str(mark);
  EXPECT_TRUE(
      bitwise_equal(x, full({100}, static_cast<double>(dist::world_size()) * dist::world_size())));
}

// A group whose rank 1 sets KILN_CPU_CMA=0 falls back on every rank (MPI, or the shared-memory
// pieces from 32 MiB), with the right result; the world keeps the path.
TEST_F(CmaAllReduce, TurnedOffOnOneRankFallsBackOnEvery) {
  ModeGuard m(CustomAllReduceMode::On);
  std::vector<int> all(dist::world_size());
  for (int r = 0; r < dist::world_size(); ++r) all[r] = r;
  const auto before = dist::cma_all_reduce_stats();
  std::shared_ptr<dist::ProcessGroup> g;
  Tensor x = make_tensor({5000}, kFloat32, Device(kCPU), dist::rank(), reduce_value_fn(kFloat32));
  Tensor got;
  {
    EnvGuard env("KILN_CPU_CMA", dist::rank() == 1 ? "0" : nullptr);
    g = dist::new_group(all);
    got = dist::all_reduce(x, ReduceOp::Sum, g.get());  // makes the group's CPU backend
  }
  const auto after = dist::cma_all_reduce_stats();
  EXPECT_EQ(after.calls, before.calls);
  EXPECT_EQ(after.groups, before.groups);
  EXPECT_EQ(after.fallbacks, before.fallbacks);  // turned off is not a fallback to report
  EXPECT_TRUE(bitwise_equal(
      got, expected_reduce({5000}, kFloat32, ReduceOp::Sum, all, reduce_value_fn(kFloat32))));
  dist::all_reduce_(x);
  EXPECT_EQ(calls() - after.calls, 1u);
}

// A bad KILN_CPU_CMA_MIN_BYTES on one rank is an error naming it on every rank, when the
// group's CPU backend is made; nothing is sent.
TEST_F(CmaAllReduce, BadSettingIsAnErrorOnEveryRank) {
  std::vector<int> all(dist::world_size());
  for (int r = 0; r < dist::world_size(); ++r) all[r] = r;
  EnvGuard env("KILN_CPU_CMA_MIN_BYTES", dist::rank() == 1 ? "lots" : nullptr);
  auto g = dist::new_group(all);
  try {
    dist::all_reduce(full({4}, 1.0), ReduceOp::Sum, g.get());
    ADD_FAILURE() << "no error";
  } catch (const DistributedError& e) {
    EXPECT_NE(std::string(e.what()).find("KILN_CPU_CMA_MIN_BYTES='lots' on group rank 1 is not a "
                                         "positive number of bytes"),
              std::string::npos)
        << e.what();
  }
}

// Ranks that call it with different sizes all raise, naming both, before anyone reads a peer;
// the communicator still pairs up afterwards.
TEST_F(CmaAllReduce, RanksThatDisagreeOnTheSizeRaiseOnEveryRank) {
  ModeGuard m(CustomAllReduceMode::On);
  const uint64_t before = calls();
  Tensor x = full({dist::rank() == 1 ? 12 : 10}, 1.0);
  try {
    dist::all_reduce_(x);
    ADD_FAILURE() << "no error";
  } catch (const DistributedError& e) {
    EXPECT_NE(std::string(e.what()).find("[all_reduce_] the ranks disagree on the cross-memory "
                                         "all-reduce on group world"),
              std::string::npos)
        << e.what();
    EXPECT_NE(std::string(e.what()).find("has 12 float32 elements"), std::string::npos) << e.what();
  }
  EXPECT_EQ(calls(), before);
  Tensor y = full({10}, 1.0);
  dist::all_reduce_(y);
  EXPECT_TRUE(bitwise_equal(y, full({10}, static_cast<double>(dist::world_size()))));
}

}  // namespace
}  // namespace kiln::test

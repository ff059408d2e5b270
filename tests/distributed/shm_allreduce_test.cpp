// The shared-memory all-reduce of sim tensors (kiln/distributed/shm_allreduce.h), the mirror of
// CUDA's custom all-reduce: eager calls through the staging slot (one-shot and two-shot, every
// floating dtype, sum and avg, in place), a warm-up, a capture and 100 replays with changing
// inputs bitwise equal to the reference sum, the same with the path forced on and off, the
// state machine of registrations (pending at capture, one exchange at the first replay, none
// after) and a capture made again after its inputs moved. Run on 2 and 3 ranks of one host;
// as a world of one every test skips (there is nothing to share).
#include <fmt/ranges.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <string_view>

#include "kiln/compile/compile.h"
#include "kiln/core/stream.h"
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

std::vector<int> world_ranks() {
  std::vector<int> r(dist::world_size());
  for (int i = 0; i < dist::world_size(); ++i) r[i] = i;
  return r;
}

// Call `call`'s input on world rank r: exact in every floating dtype, so any order of the sum
// gives the same bits.
double value(int call, int r, int64_t k) {
  return 0.5 * static_cast<double>((r * 7 + k * 3 + call * 5) % 19) - 4.0;
}
Tensor input(int call, IntArrayRef sizes, DType t) {
  return make_tensor(sizes, t, sim(), dist::rank(),
                     [call](int r, int64_t k) { return value(call, r, k); });
}
Tensor reference(int call, IntArrayRef sizes, DType t, ReduceOp op = ReduceOp::Sum) {
  return expected_reduce(sizes, t, op, world_ranks(),
                         [call](int r, int64_t k) { return value(call, r, k); });
}

dist::CustomAllReduceStats delta(const dist::CustomAllReduceStats& before) {
  dist::CustomAllReduceStats now = dist::shm_all_reduce_stats();
  return {now.eager - before.eager, now.captured - before.captured,
          now.exchanges - before.exchanges, now.registered - before.registered,
          now.runs - before.runs};
}

void sync() { Stream::current(sim()).synchronize(); }

std::string str(const std::vector<int64_t>& sizes) {
  return fmt::format("[{}]", fmt::join(sizes, ", "));
}

class ShmAllReduce : public ::testing::Test {
 protected:
  void SetUp() override {
    if (dist::world_size() < 2) GTEST_SKIP() << "a world of one shares nothing";
  }
};

// 5 and 3x7 elements take one-shot; 200000 (400 KB and more) two-shot.
const std::vector<std::vector<int64_t>> kSizes = {{5}, {3, 7}, {200000}};

TEST_F(ShmAllReduce, EagerCallsMatchTheReferenceAndMpiBitwise) {
  for (DType t : {kFloat32, kFloat16, kBFloat16, kFloat64})
    for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Avg})
      for (const auto& sizes : kSizes) {
        Tensor x = input(1, sizes, t);
        Tensor want = reference(1, sizes, t, op);
        Tensor off;
        {
          ModeGuard m(CustomAllReduceMode::Off);
          auto before = dist::shm_all_reduce_stats();
          off = dist::all_reduce(x, op);
          sync();
          EXPECT_EQ(delta(before).runs, 0u);
        }
        ModeGuard m(CustomAllReduceMode::On);
        auto before = dist::shm_all_reduce_stats();
        Tensor got = dist::all_reduce(x, op);
        Tensor inplace = x.clone();
        dist::all_reduce_(inplace, op);
        sync();
        const std::string at =
            fmt::format("{} {} {}", name(t), dist::reduce_op_name(op), str(sizes));
        EXPECT_TRUE(bitwise_equal(got, want)) << at;
        EXPECT_TRUE(bitwise_equal(inplace, want)) << at;
        EXPECT_TRUE(bitwise_equal(off, want)) << at << " (MPI)";
        auto d = delta(before);
        EXPECT_EQ(d.eager, 2u) << at;
        EXPECT_EQ(d.runs, 2u) << at;
        EXPECT_EQ(d.captured, 0u) << at;
      }
}

TEST_F(ShmAllReduce, IneligibleCallsTakeMpi) {
  ModeGuard m(CustomAllReduceMode::On);
  auto before = dist::shm_all_reduce_stats();
  Tensor x = input(2, {6}, kFloat32);
  EXPECT_TRUE(bitwise_equal(dist::all_reduce(x, ReduceOp::Max),
                            reference(2, {6}, kFloat32, ReduceOp::Max)));
  Tensor i = input(2, {6}, kInt32);
  EXPECT_TRUE(bitwise_equal(dist::all_reduce(i), reference(2, {6}, kInt32)));
  sync();
  EXPECT_EQ(delta(before).runs, 0u);
}

// The state machine by hand: a warm-up, a capture whose registration stays pending until the
// first replay exchanges it, then 100 replays over new inputs with no further exchange.
TEST_F(ShmAllReduce, WarmupCaptureAndReplaysRegisterOnce) {
  ModeGuard m(CustomAllReduceMode::On);
  DeviceInterface& di = sim_interface();
  for (const auto& sizes : kSizes) {
    Tensor x = input(0, sizes, kFloat32);
    auto before = dist::shm_all_reduce_stats();
    EXPECT_TRUE(bitwise_equal(dist::all_reduce(x), reference(0, sizes, kFloat32)));  // warm-up
    const uint64_t s = di.create_stream(0), pool = di.create_pool(0);
    di.set_current_stream(0, s);
    di.begin_capture(0, s, pool);
    Tensor out = dist::all_reduce(x);
    const uint64_t graph = di.end_capture(0, s);
    di.set_current_stream(0, 0);
    const uint64_t exec = di.instantiate(0, graph);
    sync();
    auto d = delta(before);
    EXPECT_EQ(d.eager, 1u);
    EXPECT_EQ(d.captured, 1u);
    EXPECT_EQ(d.exchanges, 0u);  // pending: nothing has replayed yet
    for (int call = 1; call <= 100; ++call) {
      x.copy_(input(call, sizes, kFloat32));
      di.launch(0, exec, 0);
      ASSERT_TRUE(bitwise_equal(out, reference(call, sizes, kFloat32)))
          << "replay " << call << ", " << str(sizes);
    }
    d = delta(before);
    EXPECT_EQ(d.exchanges, 1u);
    EXPECT_EQ(d.registered, 1u);
    EXPECT_EQ(d.runs, 101u);
    di.destroy_exec(0, exec);
    di.destroy_graph(0, graph);
    di.release_pool(0, pool);
    di.destroy_stream(0, s);
  }
}

// A compiled step whose all-reduces read the graph's own buffers: call 0 traces, call 1 is the
// warm-up, call 2 captures, and 100 replays follow, all bitwise equal to the reference; the
// same with the path forced off, where no shared-memory all-reduce runs at all.
void compiled_step_matches_the_reference(CustomAllReduceMode mode) {
  ModeGuard m(mode);
  auto fn = [](const Tensor& x, const Tensor& y) -> TensorList {
    Tensor a = dist::all_reduce(mul(x, 2.0));
    Tensor b = mul(y, 3.0);
    dist::all_reduce_(b);  // in place, two-shot
    return {add(a, 1.0), b};
  };
  CompiledFunction f = compile(fn, {.name = "shm_allreduce"});
  auto before = dist::shm_all_reduce_stats();
  for (int call = 0; call < 103; ++call) {
    Tensor x = input(call, {64}, kFloat32), y = input(call + 1, {2, 100000}, kFloat32);
    TensorList got = f({x, y});
    Tensor sum_x = reference(call, {64}, kFloat32);
    // Every value is a small multiple of 0.5: scaling before or after the sum is exact.
    ASSERT_TRUE(bitwise_equal(got[0], add(mul(sum_x, 2.0), 1.0))) << "call " << call;
    ASSERT_TRUE(bitwise_equal(got[1], mul(reference(call + 1, {2, 100000}, kFloat32), 3.0)))
        << "call " << call;
    if (call == 2 && mode != CustomAllReduceMode::Off) {
      sync();
      EXPECT_EQ(delta(before).exchanges, 1u);  // the first replay, right after the capture
    }
  }
  sync();
  EXPECT_EQ(f.entries().at(0).captures, 1) << f.explain();
  auto d = delta(before);
  if (mode == CustomAllReduceMode::Off) {
    EXPECT_EQ(d.runs, 0u);
    return;
  }
  EXPECT_EQ(d.eager, 4u);  // the trace and the warm-up
  EXPECT_EQ(d.captured, 2u);
  EXPECT_EQ(d.exchanges, 1u);
  EXPECT_EQ(d.registered, 2u);
  EXPECT_EQ(d.runs, 2u * 103);
}

TEST_F(ShmAllReduce, CompiledStepWarmupCaptureAnd100Replays) {
  compiled_step_matches_the_reference(CustomAllReduceMode::On);
}
TEST_F(ShmAllReduce, CompiledStepForcedOff) {
  compiled_step_matches_the_reference(CustomAllReduceMode::Off);
}
TEST_F(ShmAllReduce, CompiledStepAuto) {
  compiled_step_matches_the_reference(CustomAllReduceMode::Auto);
}

// A static input is baked into the graph by address: when the caller passes another tensor the
// step is captured again, its all-reduce registers the new buffer and one more exchange follows.
TEST_F(ShmAllReduce, RecaptureAfterTheInputsMove) {
  ModeGuard m(CustomAllReduceMode::On);
  CompiledFunction f =
      compile([](const Tensor& x) { return dist::all_reduce(x); }, {.static_inputs = {0}});
  auto before = dist::shm_all_reduce_stats();
  Tensor x = input(0, {48}, kFloat32);
  for (int call = 0; call < 6; ++call) {
    x.copy_(input(call, {48}, kFloat32));  // new values at the same address
    ASSERT_TRUE(bitwise_equal(f({x})[0], reference(call, {48}, kFloat32))) << "call " << call;
  }
  sync();
  EXPECT_EQ(delta(before).exchanges, 1u);
  Tensor moved = input(6, {48}, kFloat32);
  for (int call = 6; call < 12; ++call) {
    moved.copy_(input(call, {48}, kFloat32));
    ASSERT_TRUE(bitwise_equal(f({moved})[0], reference(call, {48}, kFloat32))) << "call " << call;
  }
  sync();
  CacheEntryInfo e = f.entries().at(0);
  EXPECT_EQ(e.captures, 2) << f.explain();
  auto d = delta(before);
  EXPECT_EQ(d.captured, 2u);
  EXPECT_EQ(d.exchanges, 2u);
  EXPECT_EQ(d.registered, 2u);
}

// Ranks that capture all-reduces of different sizes all raise at the exchange, naming both,
// instead of reducing garbage.
TEST_F(ShmAllReduce, RanksCapturingDifferentSizesRaise) {
  ModeGuard m(CustomAllReduceMode::On);
  DeviceInterface& di = sim_interface();
  Tensor x = input(0, {dist::rank() == 0 ? 4 : 8}, kFloat32);
  const uint64_t s = di.create_stream(0), pool = di.create_pool(0);
  di.set_current_stream(0, s);
  di.begin_capture(0, s, pool);
  Tensor out = dist::all_reduce(x);
  const uint64_t graph = di.end_capture(0, s);
  di.set_current_stream(0, 0);
  const uint64_t exec = di.instantiate(0, graph);
  di.launch(0, exec, 0);
  EXPECT_THROW_CONTAINS(sync(), DeviceError, "captured different shared-memory all-reduces");
  di.destroy_exec(0, exec);
  di.destroy_graph(0, graph);
  di.release_pool(0, pool);
  di.destroy_stream(0, s);
}

// A staging slot larger than /dev/shm can back (ctest's kiln_shm_allreduce_test.full_dev_shm
// sets KILN_CUSTOM_AR_MAX_BYTES to 1 TiB): setting up the channel is a DistributedError on every
// rank, not a SIGBUS at its first write.
TEST(ShmAllReduceSetup, ADevShmTooSmallIsAnError) {
  const char* v = std::getenv("KILN_CUSTOM_AR_MAX_BYTES");
  if (dist::world_size() < 2 || !v || std::string_view(v) != "1099511627776")
    GTEST_SKIP() << "run on 2 ranks with KILN_CUSTOM_AR_MAX_BYTES=1099511627776";
  ModeGuard m(CustomAllReduceMode::On);
  Tensor x = input(0, {4}, kFloat32);
  EXPECT_THROW_CONTAINS(dist::all_reduce_(x), DistributedError,
                        "setting up the shared-memory all-reduce");
}

}  // namespace
}  // namespace kiln::test

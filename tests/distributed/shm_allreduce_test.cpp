// The shared-memory all-reduce of sim tensors (kiln/distributed/shm_allreduce.h), the mirror of
// CUDA's custom all-reduce: eager calls through the staging slot (one-shot and two-shot, every
// floating dtype, sum and avg, in place), a warm-up, a capture and 100 replays with changing
// inputs bitwise equal to the reference sum, the same with the path forced on and off, the
// state machine of registrations (pending at capture, one exchange when the capture ends, none
// after; two captures before either replays), a capture made again after its inputs moved, a
// registration one rank cannot back (every rank raises), the reclaiming of registration slots,
// and all_reduce_async beside current-stream calls. Run on 2 and 3 ranks of one host; as a
// world of one every test skips (there is nothing to share).
#include <gtest/gtest.h>

#include <sys/resource.h>

#include <csignal>
#include <cstdlib>
#include <memory>
#include <string_view>

#include "kiln/compile/compile.h"
#include "kiln/core/stream.h"
#include "kiln/distributed/registration_slots.h"
#include "kiln/distributed/shm_allreduce.h"
#include "tests/distributed/dist_test_util.h"

namespace kiln::test {
namespace {

using dist::CustomAllReduceMode;
using dist::ReduceOp;
using ModeGuard = CustomModeGuard;

Tensor input(int call, IntArrayRef sizes, DType t) { return custom_input(call, sizes, t, sim()); }
Tensor reference(int call, IntArrayRef sizes, DType t, ReduceOp op = ReduceOp::Sum) {
  return custom_reference(call, sizes, t, op);
}
std::string str(IntArrayRef sizes) { return sizes_str(sizes); }

dist::CustomAllReduceStats delta(const dist::CustomAllReduceStats& before) {
  dist::CustomAllReduceStats now = dist::shm_all_reduce_stats();
  return {now.eager - before.eager,         now.captured - before.captured,
          now.exchanges - before.exchanges, now.registered - before.registered,
          now.runs - before.runs,           now.reclaimed - before.reclaimed};
}

void sync() { Stream::current(sim()).synchronize(); }

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

// The state machine by hand: a warm-up, a capture whose registration is exchanged as the
// capture ends, then 100 replays over new inputs with no further exchange.
TEST_F(ShmAllReduce, WarmupCaptureAndReplaysRegisterOnce) {
  ModeGuard m(CustomAllReduceMode::On);
  for (const auto& sizes : kSizes) {
    Tensor x = input(0, sizes, kFloat32);
    auto before = dist::shm_all_reduce_stats();
    EXPECT_TRUE(bitwise_equal(dist::all_reduce(x), reference(0, sizes, kFloat32)));  // warm-up
    Tensor out;
    HandCapture g(sim(), [&] { out = dist::all_reduce(x); });
    sync();
    auto d = delta(before);
    EXPECT_EQ(d.eager, 1u);
    EXPECT_EQ(d.captured, 1u);
    EXPECT_EQ(d.exchanges, 1u);  // when the capture ended, before any replay
    EXPECT_EQ(d.registered, 1u);
    for (int call = 1; call <= 100; ++call) {
      x.copy_(input(call, sizes, kFloat32));
      g.launch();
      ASSERT_TRUE(bitwise_equal(out, reference(call, sizes, kFloat32)))
          << "replay " << call << ", " << str(sizes);
    }
    d = delta(before);
    EXPECT_EQ(d.exchanges, 1u);
    EXPECT_EQ(d.registered, 1u);
    EXPECT_EQ(d.runs, 101u);
  }
}

// Two captures on one stream before either replays: each capture's registrations are exchanged
// when it ends (two exchanges, the same on every rank), never split by which replay comes
// first; then the graphs replay in the other order, each bitwise equal to the reference.
TEST_F(ShmAllReduce, TwoCapturesOnOneStreamBeforeTheFirstReplay) {
  ModeGuard m(CustomAllReduceMode::On);
  DeviceInterface& di = sim_interface();
  const uint64_t stream = di.create_stream(0);
  Tensor x = input(0, {8}, kFloat32), y = input(0, {3, 5}, kFloat32), z = input(0, {64}, kFloat32);
  auto before = dist::shm_all_reduce_stats();
  Tensor ax, ay, bz;
  {
    HandCapture a(
        sim(),
        [&] {
          ax = dist::all_reduce(x);
          ay = dist::all_reduce(y);
        },
        stream);
    EXPECT_EQ(delta(before).exchanges, 1u);
    HandCapture b(
        sim(), [&] { bz = dist::all_reduce(z); }, stream);
    auto d = delta(before);
    EXPECT_EQ(d.exchanges, 2u);
    EXPECT_EQ(d.registered, 3u);
    for (int call = 1; call <= 10; ++call) {
      z.copy_(input(call, {64}, kFloat32));
      b.launch();
      x.copy_(input(call + 1, {8}, kFloat32));
      y.copy_(input(call + 2, {3, 5}, kFloat32));
      a.launch();
      ASSERT_TRUE(bitwise_equal(bz, reference(call, {64}, kFloat32))) << "call " << call;
      ASSERT_TRUE(bitwise_equal(ax, reference(call + 1, {8}, kFloat32))) << "call " << call;
      ASSERT_TRUE(bitwise_equal(ay, reference(call + 2, {3, 5}, kFloat32))) << "call " << call;
    }
    EXPECT_EQ(delta(before).exchanges, 2u);
  }
  di.destroy_stream(0, stream);
}

// An all_reduce_async on the group's communication stream and all-reduces on the current
// stream, issued without waiting for each other: each stream has a channel of its own (flags
// and staging), so they never share one, and every result is the reference.
TEST_F(ShmAllReduce, AsyncAndCurrentStreamCallsDoNotShareAChannel) {
  ModeGuard m(CustomAllReduceMode::On);
  auto before = dist::shm_all_reduce_stats();
  for (int call = 0; call < 20; ++call) {
    Tensor a = input(call, {32}, kFloat32), b = input(call + 1, {200000}, kFloat32);
    dist::Work w = dist::all_reduce_async(a);
    Tensor c = dist::all_reduce(b);
    w.wait();
    ASSERT_TRUE(bitwise_equal(a, reference(call, {32}, kFloat32))) << "call " << call;
    ASSERT_TRUE(bitwise_equal(c, reference(call + 1, {200000}, kFloat32))) << "call " << call;
  }
  EXPECT_EQ(delta(before).runs, 40u);
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

// Ranks that capture all-reduces of different sizes all raise when the capture ends, naming
// both, instead of reducing garbage.
TEST_F(ShmAllReduce, RanksCapturingDifferentSizesRaise) {
  ModeGuard m(CustomAllReduceMode::On);
  Tensor x = input(0, {dist::rank() == 0 ? 4 : 8}, kFloat32);
  EXPECT_THROW_CONTAINS(HandCapture(sim(), [&] { (void)dist::all_reduce(x); }), DistributedError,
                        "captured different shared-memory all-reduces");
}

// A registration that one rank cannot back (its files may not grow past the registration area's
// start: RLIMIT_FSIZE stands in for a full /dev/shm) is the capture's DistributedError on
// every rank, naming that rank and why, never a SIGBUS at the first replay; once the limit is
// lifted, the same capture works.
TEST_F(ShmAllReduce, ARegistrationOneRankCannotBackIsAnErrorOnEveryRank) {
  ModeGuard m(CustomAllReduceMode::On);
  DeviceInterface& di = sim_interface();
  const uint64_t stream = di.create_stream(0);
  Tensor x = input(0, {16}, kFloat32);
  rlimit old{};
  getrlimit(RLIMIT_FSIZE, &old);
  void (*old_handler)(int) = std::signal(SIGXFSZ, SIG_IGN);
  if (dist::rank() == 1) {
    // Past the flags, tmp and staging areas of a segment (page, then two slots).
    rlimit low = old;
    low.rlim_cur = 4096 + 2 * dist::custom_all_reduce_max_bytes();
    setrlimit(RLIMIT_FSIZE, &low);
  }
  EXPECT_THROW_CONTAINS(HandCapture(
                            sim(), [&] { (void)dist::all_reduce(x); }, stream),
                        DistributedError, "failed on group rank 1: backing 64 bytes at offset");
  setrlimit(RLIMIT_FSIZE, &old);
  std::signal(SIGXFSZ, old_handler);
  Tensor out;
  {
    HandCapture g(
        sim(), [&] { out = dist::all_reduce(x); }, stream);
    x.copy_(input(3, {16}, kFloat32));
    g.launch();
    EXPECT_TRUE(bitwise_equal(out, reference(3, {16}, kFloat32)));
  }
  di.destroy_stream(0, stream);
}

// KILN_CUSTOM_AR_SLOTS=4 (ctest's kiln_shm_allreduce_test.few_slots): a stream that captures and
// drops three times as many graphs as it has slots reuses the slots of the graphs that are
// gone; with every slot held by a live graph, one more capture is an error on every rank.
TEST(ShmAllReduceSlots, DroppedGraphsGiveBackTheirSlots) {
  const int slots = dist::custom_all_reduce_slots();
  if (dist::world_size() < 2 || slots > 8)
    GTEST_SKIP() << "run on 2 ranks with KILN_CUSTOM_AR_SLOTS=4";
  ModeGuard m(CustomAllReduceMode::On);
  DeviceInterface& di = sim_interface();
  const uint64_t stream = di.create_stream(0);
  auto before = dist::shm_all_reduce_stats();
  Tensor x = input(0, {16}, kFloat32);
  for (int call = 0; call < 3 * slots; ++call) {
    Tensor out;
    HandCapture g(
        sim(), [&] { out = dist::all_reduce(x); }, stream);
    x.copy_(input(call, {16}, kFloat32));
    g.launch();
    ASSERT_TRUE(bitwise_equal(out, reference(call, {16}, kFloat32))) << "graph " << call;
  }
  EXPECT_GE(delta(before).reclaimed, static_cast<uint64_t>(slots));
  {
    std::vector<std::unique_ptr<HandCapture>> alive;
    for (int i = 0; i < slots; ++i)
      alive.push_back(std::make_unique<HandCapture>(
          sim(), [&] { (void)dist::all_reduce(x); }, stream));
    EXPECT_THROW_CONTAINS(HandCapture(
                              sim(), [&] { (void)dist::all_reduce(x); }, stream),
                          DistributedError, "has no room to register a captured input of 64 bytes");
  }
  {
    Tensor out;
    HandCapture g(
        sim(), [&] { out = dist::all_reduce(x); }, stream);  // room again
    g.launch();
    EXPECT_TRUE(bitwise_equal(out, reference(3 * slots - 1, {16}, kFloat32)));
  }
  di.destroy_stream(0, stream);
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

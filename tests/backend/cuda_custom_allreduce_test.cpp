// The capture-aware custom all-reduce of cuda tensors (kiln/backend/cuda/custom_allreduce.h):
// eager calls through the staging buffer (one-shot and two-shot, float32, float16, bfloat16,
// sum and avg, in place), a compiled step's warm-up, capture and 100 replays with changing
// inputs bitwise equal to the reference sum, the same with the path forced on and off, one
// registration exchange per capture, and a capture made again after its inputs moved. Run under
// `mpirun -n 2`: ranks that share a GPU (the GPU machine has one) turn NCCL off (KILN_NCCL=0,
// NCCL refuses two ranks on one GPU) and exercise the whole IPC protocol between two processes
// on one device. Every test skips without a GPU (CI) or as a world of one.
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "kiln/backend/cuda/cuda.h"
#include "kiln/backend/cuda/custom_allreduce.h"
#include "kiln/backend/cuda/nccl.h"
#include "kiln/compile/compile.h"
#include "kiln/core/stream.h"
#include "kiln/distributed/shm_allreduce.h"
#include "tests/backend/cuda_util.h"
#include "tests/distributed/dist_test_util.h"

namespace kiln::test {
namespace {

using dist::CustomAllReduceMode;
using dist::ReduceOp;

class ModeGuard {
 public:
  explicit ModeGuard(CustomAllReduceMode m) { dist::set_custom_all_reduce_mode(m); }
  ~ModeGuard() { dist::set_custom_all_reduce_mode(CustomAllReduceMode::Auto); }
};

Device gpu() { return Device("cuda", cuda::nccl_device()); }

std::vector<int> world_ranks() {
  std::vector<int> r(dist::world_size());
  for (int i = 0; i < dist::world_size(); ++i) r[i] = i;
  return r;
}

double value(int call, int r, int64_t k) {
  return 0.5 * static_cast<double>((r * 7 + k * 3 + call * 5) % 19) - 4.0;
}
Tensor input(int call, IntArrayRef sizes, DType t) {
  return make_tensor(sizes, t, gpu(), dist::rank(),
                     [call](int r, int64_t k) { return value(call, r, k); });
}
Tensor reference(int call, IntArrayRef sizes, DType t, ReduceOp op = ReduceOp::Sum) {
  return expected_reduce(sizes, t, op, world_ranks(),
                         [call](int r, int64_t k) { return value(call, r, k); });
}

cuda::CustomAllReduceStats delta(const cuda::CustomAllReduceStats& b) {
  cuda::CustomAllReduceStats n = cuda::custom_all_reduce_stats();
  return {n.eager - b.eager, n.captured - b.captured, n.staged_in_capture - b.staged_in_capture,
          n.exchanges - b.exchanges, n.registered - b.registered};
}

void sync() { Stream::current(gpu()).synchronize(); }

// Why these tests cannot run here, or "". Decided alike on every rank, before the world (and
// so its cuda backend) is made: ranks that share a GPU turn NCCL off first.
const std::string& unavailable() {
  static const std::string why = []() -> std::string {
    if (!cuda_unavailable().empty()) return cuda_unavailable();
    if (dist::world_size() < 2) return "a world of one shares nothing (run under mpirun -n 2)";
    if (dist::local_world_size() > cuda::device_count()) setenv("KILN_NCCL", "0", 1);
    ModeGuard m(CustomAllReduceMode::On);
    auto before = cuda::custom_all_reduce_stats();
    try {
      (void)dist::all_reduce(input(0, {16}, kFloat32));
      sync();
    } catch (const Error& e) {
      return std::string("the custom all-reduce is not available: ") + e.what();
    }
    if (delta(before).eager != 1)
      return "the custom all-reduce could not be set up for the world (peers cannot map each "
             "other's memory)";
    return "";
  }();
  return why;
}

class CustomAllReduce : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!unavailable().empty()) GTEST_SKIP() << unavailable();
  }
};

// 8 and 3x64 elements take one-shot; 300000 (600 KB and more) two-shot.
const std::vector<std::vector<int64_t>> kSizes = {{8}, {3, 64}, {300000}};

TEST_F(CustomAllReduce, EagerCallsMatchTheReferenceBitwise) {
  ModeGuard m(CustomAllReduceMode::On);
  for (DType t : {kFloat32, kFloat16, kBFloat16})
    for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Avg})
      for (const auto& sizes : kSizes) {
        Tensor x = input(1, sizes, t);
        Tensor want = reference(1, sizes, t, op);
        auto before = cuda::custom_all_reduce_stats();
        Tensor got = dist::all_reduce(x, op);
        Tensor inplace = x.clone();
        dist::all_reduce_(inplace, op);
        sync();
        const std::string at =
            fmt::format("{} {} {} elements", name(t), dist::reduce_op_name(op), x.numel());
        EXPECT_TRUE(bitwise_equal(got, want)) << at;
        EXPECT_TRUE(bitwise_equal(inplace, want)) << at;
        EXPECT_EQ(delta(before).eager, 2u) << at;
      }
}

TEST_F(CustomAllReduce, IneligibleCallsAreNotTaken) {
  ModeGuard m(CustomAllReduceMode::On);
  auto before = cuda::custom_all_reduce_stats();
  Tensor x = input(2, {5}, kFloat32);  // 20 bytes: not a multiple of 16
  if (cuda::nccl_enabled()) {
    EXPECT_TRUE(bitwise_equal(dist::all_reduce(x), reference(2, {5}, kFloat32)));
    EXPECT_TRUE(bitwise_equal(dist::all_reduce(input(2, {8}, kFloat32), ReduceOp::Max),
                              reference(2, {8}, kFloat32, ReduceOp::Max)));
  } else {
    EXPECT_THROW_CONTAINS(dist::all_reduce(x), DistributedError,
                          "cannot take this call (20 bytes of float32, reduce sum");
    EXPECT_THROW_CONTAINS(dist::all_gather_into_tensor(x), DistributedError,
                          "cuda tensors have only the custom all-reduce");
  }
  sync();
  EXPECT_EQ(delta(before).eager, 0u);
}

// A compiled step whose all-reduces read the graph's own buffers: call 0 traces, call 1 is the
// warm-up (real results, through the staging buffer), call 2 captures (the exchange runs as
// the capture ends), and 100 replays follow with new inputs, all bitwise equal to the
// reference. Forced off, no custom all-reduce runs: NCCL serves the step, or, with NCCL off,
// the call is a clear error.
void compiled_step(CustomAllReduceMode mode) {
  ModeGuard m(mode);
  auto fn = [](const Tensor& x, const Tensor& y) -> TensorList {
    Tensor a = dist::all_reduce(mul(x, 2.0));
    Tensor b = mul(y, 3.0);
    dist::all_reduce_(b);  // in place, two-shot: staged inside the graph
    return {add(a, 1.0), b};
  };
  CompiledFunction f = compile(fn, {.name = "custom_allreduce"});
  if (mode == CustomAllReduceMode::Off && !cuda::nccl_enabled()) {
    EXPECT_THROW_CONTAINS(f({input(0, {64}, kFloat32), input(1, {2, 100000}, kFloat32)}), Error,
                          "NCCL is off");  // raised while tracing
    return;
  }
  auto before = cuda::custom_all_reduce_stats();
  for (int call = 0; call < 103; ++call) {
    Tensor x = input(call, {64}, kFloat32), y = input(call + 1, {2, 100000}, kFloat32);
    TensorList got = f({x, y});
    Tensor sum_x = reference(call, {64}, kFloat32);
    ASSERT_TRUE(bitwise_equal(got[0], add(mul(sum_x, 2.0), 1.0))) << "call " << call;
    ASSERT_TRUE(bitwise_equal(got[1], mul(reference(call + 1, {2, 100000}, kFloat32), 3.0)))
        << "call " << call;
    if (call == 2 && mode != CustomAllReduceMode::Off) {
      EXPECT_EQ(delta(before).exchanges, 1u);  // when the capture ended
    }
  }
  sync();
  EXPECT_EQ(f.entries().at(0).captures, 1) << f.explain();
  auto d = delta(before);
  if (mode == CustomAllReduceMode::Off) {
    EXPECT_EQ(d.eager + d.captured, 0u);
    return;
  }
  EXPECT_EQ(d.eager, 4u);  // the trace and the warm-up
  EXPECT_EQ(d.captured, 2u);
  EXPECT_EQ(d.staged_in_capture, 1u);  // the in-place one
  EXPECT_EQ(d.exchanges, 1u);
  EXPECT_EQ(d.registered, 2u);
}

TEST_F(CustomAllReduce, CompiledStepWarmupCaptureAnd100Replays) {
  compiled_step(CustomAllReduceMode::On);
}
TEST_F(CustomAllReduce, CompiledStepForcedOff) { compiled_step(CustomAllReduceMode::Off); }

// A static input is baked into the graph by address: passing another tensor captures the step
// again, its all-reduce registers the new buffer (a piece of a larger cudaMalloc segment,
// registered as base + offset) and one more exchange follows.
TEST_F(CustomAllReduce, RecaptureAfterTheInputsMove) {
  ModeGuard m(CustomAllReduceMode::On);
  CompiledFunction f =
      compile([](const Tensor& x) { return dist::all_reduce(x); }, {.static_inputs = {0}});
  auto before = cuda::custom_all_reduce_stats();
  Tensor x = input(0, {48}, kFloat32);
  for (int call = 0; call < 6; ++call) {
    x.copy_(input(call, {48}, kFloat32));
    ASSERT_TRUE(bitwise_equal(f({x})[0], reference(call, {48}, kFloat32))) << "call " << call;
  }
  EXPECT_EQ(delta(before).exchanges, 1u);
  Tensor pad = input(0, {1000}, kFloat32);  // so the moved input sits at another offset
  Tensor moved = input(6, {48}, kFloat32);
  for (int call = 6; call < 106; ++call) {
    moved.copy_(input(call, {48}, kFloat32));
    ASSERT_TRUE(bitwise_equal(f({moved})[0], reference(call, {48}, kFloat32))) << "call " << call;
  }
  sync();
  EXPECT_EQ(f.entries().at(0).captures, 2) << f.explain();
  auto d = delta(before);
  EXPECT_EQ(d.captured, 2u);
  EXPECT_EQ(d.staged_in_capture, 0u);
  EXPECT_EQ(d.exchanges, 2u);
  EXPECT_EQ(d.registered, 2u);
}

}  // namespace
}  // namespace kiln::test

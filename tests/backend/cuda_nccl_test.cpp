// The NCCL collective backend of cuda tensors (kiln/backend/cuda/nccl.cpp): every collective's
// result in every dtype, the out= and in-place forms, the current stream, a compiled step whose
// all-reduce is captured into a CUDA graph against eager, errors before anything is sent, and a
// collective past its deadline aborting its communicator (Note [NCCL deadlines]). Runs as a
// world of one on one GPU (no launcher needed) and, unchanged, under `mpirun -n N` with a GPU
// per rank: the values depend on the rank, the expected results are computed for the world.
// Every test skips when no CUDA device is present or the plugin was built without NCCL, as in CI.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "kiln/backend/cuda/cuda.h"
#include "kiln/backend/cuda/nccl.h"
#include "kiln/compile/compile.h"
#include "kiln/core/stream.h"
#include "kiln/distributed/collective_backend.h"
#include "kiln/nn/layers.h"
#include "kiln/optim/optimizer.h"
#include "kiln/parallel/ddp.h"
#include "tests/backend/cuda_util.h"
#include "tests/distributed/dist_test_util.h"

namespace kiln::test {
namespace {

// The reason these tests cannot run here, or "".
const std::string& nccl_unavailable() {
  static const std::string why = []() -> std::string {
    if (!cuda_unavailable().empty()) return cuda_unavailable();
    if (cuda::nccl_version() == 0) return "libkiln_cuda was built without NCCL";
    return "";
  }();
  return why;
}
#define SKIP_WITHOUT_NCCL() \
  if (!nccl_unavailable().empty()) GTEST_SKIP() << nccl_unavailable()

Device gpu() { return Device("cuda", cuda::nccl_device()); }
Device host() { return Device(kCPU); }
int world_n() { return dist::world_size(); }
int me() { return dist::rank(); }
std::vector<int> world_ranks() {
  std::vector<int> r(world_n());
  for (int i = 0; i < world_n(); ++i) r[i] = i;
  return r;
}

// reduce_value of dtype `t`, as make_tensor and expected_reduce take it.
ValueFn rv(DType t) {
  return [t](int r, int64_t k) { return reduce_value(t, r, k); };
}

// NCCL reduces 16-bit floats in their own type hop by hop, so beyond two ranks they may differ
// from the float32-then-round-once reference by an ulp; everything else is exact.
::testing::AssertionResult matches(const Tensor& got, const Tensor& want) {
  if (got.device() != gpu())
    return ::testing::AssertionFailure() << "the result is on " << got.device().str();
  if ((want.dtype() == kFloat16 || want.dtype() == kBFloat16) && world_n() > 2) {
    if (allclose(got.to(host()).to(kFloat64), want.to(kFloat64), 1e-2, 1e-2))
      return ::testing::AssertionSuccess();
    return ::testing::AssertionFailure()
           << "got " << got.to(host()).str() << "\nwant " << want.str();
  }
  return bitwise_equal(got, want);
}

// The rows of every rank's tagged({rows, 3}) input, as all_gather_into_tensor concatenates them.
Tensor gathered(int64_t rows, DType t) {
  std::vector<Tensor> parts;
  for (int r = 0; r < world_n(); ++r) parts.push_back(tagged({rows, 3}, t, host(), r));
  return cat(parts, 0);
}

TEST(Nccl, CudaTensorsUseTheNcclBackend) {
  SKIP_WITHOUT_NCCL();
  EXPECT_EQ(dist::world().backend(gpu(), "test").name(), "nccl");
  EXPECT_GE(cuda::nccl_version(), 22800) << "the NCCL loaded is older than the header's 2.28";
  EXPECT_EQ(cuda::nccl_device(), dist::local_rank() % cuda::device_count());
  RecordProperty("nccl_version", cuda::nccl_version());
}

TEST(Nccl, AllReduceEveryOpAndDtype) {
  SKIP_WITHOUT_NCCL();
  for (DType t : all_dtypes()) {
    for (dist::ReduceOp op : all_reduce_ops()) {
      if (!reduce_allowed(op, t)) continue;
      std::string at =
          fmt::format("rank {} of {}, {} {}", me(), world_n(), name(t), dist::reduce_op_name(op));
      Tensor x = make_tensor({3, 5}, t, gpu(), me(), rv(t));
      Tensor before = x.to(host());
      Tensor want = expected_reduce({3, 5}, t, op, world_ranks(), rv(t));
      EXPECT_TRUE(matches(dist::all_reduce(x, op), want)) << at;
      EXPECT_TRUE(bitwise_equal(x, before)) << at << ": the functional form wrote its input";
      Tensor y = x.clone();
      dist::all_reduce_(y, op);
      EXPECT_TRUE(matches(y, want)) << at << " (in place)";
    }
  }
}

TEST(Nccl, AllGatherEveryDtype) {
  SKIP_WITHOUT_NCCL();
  for (DType t : all_dtypes()) {
    Tensor x = tagged({2, 3}, t, gpu(), me());
    EXPECT_TRUE(matches(dist::all_gather_into_tensor(x), gathered(2, t))) << name(t);
    // out= over a sentinel, so that memory NCCL did not write shows.
    Tensor out = full({2 * world_n(), 3}, 7, t, gpu());
    dist::all_gather_into_tensor_out(out, x);
    EXPECT_TRUE(matches(out, gathered(2, t))) << name(t) << " (out=)";
  }
}

TEST(Nccl, ReduceScatterEveryOpAndDtype) {
  SKIP_WITHOUT_NCCL();
  for (DType t : all_dtypes()) {
    for (dist::ReduceOp op : all_reduce_ops()) {
      if (!reduce_allowed(op, t)) continue;
      std::string at = fmt::format("{} {}", name(t), dist::reduce_op_name(op));
      Tensor x = make_tensor({2 * world_n(), 3}, t, gpu(), me(), rv(t));
      Tensor want = expected_reduce({2, 3}, t, op, world_ranks(), rv(t), 6 * me());
      EXPECT_TRUE(matches(dist::reduce_scatter_tensor(x, op), want)) << at;
      Tensor out = full({2, 3}, 7, t, gpu());
      dist::reduce_scatter_tensor_out(out, x, op);
      EXPECT_TRUE(matches(out, want)) << at << " (out=)";
    }
  }
}

TEST(Nccl, BroadcastFromEveryRank) {
  SKIP_WITHOUT_NCCL();
  for (DType t : all_dtypes()) {
    for (int src = 0; src < world_n(); ++src) {
      Tensor x = tagged({4, 3}, t, gpu(), me());
      Tensor want = tagged({4, 3}, t, host(), src);
      EXPECT_TRUE(matches(dist::broadcast(x, src), want)) << name(t) << " from " << src;
      dist::broadcast_(x, src);
      EXPECT_TRUE(matches(x, want)) << name(t) << " from " << src << " (in place)";
    }
  }
}

TEST(Nccl, AllToAllEqualAndUnevenSplits) {
  SKIP_WITHOUT_NCCL();
  const int n = world_n();
  for (DType t : all_dtypes()) {
    // Equal parts: rank r gets rows [2r, 2r + 2) of every rank's input, in rank order.
    Tensor x = tagged({2 * n, 3}, t, gpu(), me());
    std::vector<Tensor> parts;
    for (int j = 0; j < n; ++j)
      parts.push_back(narrow(tagged({2 * n, 3}, t, host(), j), 0, 2 * me(), 2));
    EXPECT_TRUE(matches(dist::all_to_all_single(x), cat(parts, 0))) << name(t);
    // Uneven: every rank sends j + 1 rows to rank j, so rank r gets r + 1 rows from each.
    std::vector<int64_t> in_splits, out_splits(n, me() + 1);
    int64_t rows = 0, first = 0;
    for (int j = 0; j < n; ++j) {
      in_splits.push_back(j + 1);
      if (j < me()) first += j + 1;
      rows += j + 1;
    }
    Tensor u = tagged({rows, 3}, t, gpu(), me());
    parts.clear();
    for (int j = 0; j < n; ++j)
      parts.push_back(narrow(tagged({rows, 3}, t, host(), j), 0, first, me() + 1));
    EXPECT_TRUE(matches(dist::all_to_all_single(u, out_splits, in_splits), cat(parts, 0)))
        << name(t) << " (uneven)";
  }
}

TEST(Nccl, SendAndRecvBetweenTwoRanks) {
  SKIP_WITHOUT_NCCL();
  if (world_n() < 2) GTEST_SKIP() << "needs two ranks (mpirun -n 2, a GPU each)";
  for (DType t : all_dtypes()) {
    if (me() == 0) dist::send(tagged({5}, t, gpu(), 0), 1);
    if (me() == 1) {
      Tensor got = full({5}, 7, t, gpu());
      dist::recv_(got, 0);
      EXPECT_TRUE(matches(got, tagged({5}, t, host(), 0))) << name(t);
    }
  }
}

TEST(Nccl, BarrierEmptyAndNonContiguousTensors) {
  SKIP_WITHOUT_NCCL();
  dist::barrier(nullptr, gpu());
  synchronize(gpu());
  Tensor none = empty({0, 3}, kFloat32, gpu());
  EXPECT_EQ(dist::all_reduce(none).numel(), 0);
  EXPECT_EQ(dist::all_gather_into_tensor(none).numel(), 0);
  // A strided input is made contiguous first; the result has the input's sizes.
  Tensor x = make_tensor({4, 6}, kFloat32, gpu(), me(), rv(kFloat32));
  Tensor want = expected_reduce({4, 6}, kFloat32, dist::ReduceOp::Sum, world_ranks(), rv(kFloat32));
  EXPECT_TRUE(matches(dist::all_reduce(t(x)), t(want).contiguous()));
}

TEST(Nccl, QueuedOnTheCurrentStreamAndRecorded) {
  SKIP_WITHOUT_NCCL();
  Stream side = Stream::create(gpu());
  Tensor x = make_tensor({1024}, kFloat32, gpu(), me(), rv(kFloat32));
  Tensor want = expected_reduce({1024}, kFloat32, dist::ReduceOp::Max, world_ranks(), rv(kFloat32));
  synchronize(gpu());
  double mark = calls_mark();
  {
    StreamGuard guard(side);
    dist::all_reduce_(x, dist::ReduceOp::Max);
    side.synchronize();  // the collective is on `side`: waiting for it is enough
  }
  EXPECT_TRUE(matches(x, want));
  EXPECT_EQ(calls_since(mark, "all_reduce_"), 1);
  // A later call retires the finished one (Note [NCCL deadlines]).
  dist::barrier(nullptr, gpu());
  synchronize(gpu());
  dist::barrier(nullptr, gpu());
  bool completed = false;
  for (const auto& e : dist::FlightRecorder::get().entries())
    if (e.started_s > mark && e.op == "all_reduce_")
      completed = e.state == dist::CallState::Completed && e.group == "world" && e.numel == 1024 &&
                  e.dtype == kFloat32;
  EXPECT_TRUE(completed);
}

// ---------------------------------------------------------------- compile

TEST(NcclCompile, AllReduceCapturedIntoAGraphEqualsEager) {
  SKIP_WITHOUT_NCCL();
  auto fn = [](const Tensor& x) {
    Tensor y = add(mul(x, 3.0), 1.0);
    return mul(dist::all_reduce(y), 0.5);
  };
  CompiledFunction f = compile(fn, {.name = "all_reduce_step"});
  for (int i = 0; i < 6; ++i) {
    // Inputs change every call: a replay must read them, not the captured call's.
    Tensor x = make_tensor({256}, kFloat32, gpu(), me(),
                           [i](int r, int64_t k) { return reduce_value(kFloat32, r, k + i); });
    EXPECT_TRUE(bitwise_equal(f({x})[0], fn(x))) << "call " << i;
  }
  EXPECT_GE(f.entries().at(0).captures, 1) << f.explain();
}

TEST(NcclCompile, TrainingStepWithAllReducedGradientsEqualsEager) {
  SKIP_WITHOUT_NCCL();
  auto run = [](bool compiled) {
    Generator g(5);
    nn::Init init{.gen = &g};
    nn::Sequential model;
    model.push_back(std::make_shared<nn::Linear>(32, 64, true, init));
    model.push_back(std::make_shared<nn::GELU>());
    model.push_back(std::make_shared<nn::Linear>(64, 10, true, init));
    model.to(gpu());
    optim::AdamW opt(model.parameters(), {.lr = 1e-2});
    Generator data(100 + me());  // each rank its own batch
    Tensor x = randn({16, 32}, &data).to(gpu()), y = randint(0, 10, {16}, &data).to(gpu());
    auto step = [&](const Tensor& xs, const Tensor& ys) {
      opt.zero_grad();
      Tensor loss = cross_entropy(model(xs), ys);
      loss.backward();
      for (const Tensor& p : model.parameters()) dist::all_reduce_(p.grad(), dist::ReduceOp::Avg);
      opt.step();
      return loss.detach();
    };
    CompiledFunction cf = compile(step, {.name = "train_step"});
    std::vector<double> losses;
    for (int i = 0; i < 8; ++i)
      losses.push_back((compiled ? cf({x, y})[0] : step(x, y)).item<double>());
    if (compiled) {
      EXPECT_GE(cf.entries().at(0).captures, 1) << cf.explain();
      // Each gradient's all-reduce runs on the communication stream and overlaps what follows
      // (Note [Collectives on a stream of their own] in kiln/compile/comm_stream.cpp).
      const int n = static_cast<int>(model.parameters().size());
      EXPECT_EQ(cf.entries().at(0).comm_stream_steps, n) << cf.steps_str(0);
    }
    // The averaged gradients keep every rank's parameters the same.
    for (const Tensor& p : model.parameters())
      EXPECT_TRUE(same_on_every_rank(p.detach(), &dist::world()));
    return losses;
  };
  std::vector<double> eager = run(false), compiled = run(true);
  for (size_t i = 0; i < eager.size(); ++i) EXPECT_NEAR(compiled[i], eager[i], 1e-5) << i;
  EXPECT_LT(eager.back(), eager.front());
}

// A compiled DDP step with several buckets: each bucket's all-reduce runs on the communication
// stream inside the captured graph while backward goes on, and the step equals the eager one.
TEST(NcclCompile, DdpStepOverlapsItsBucketsAndEqualsEager) {
  SKIP_WITHOUT_NCCL();
  auto run = [](bool compiled) {
    Generator g(7);
    nn::Init init{.gen = &g};
    nn::Sequential model;
    for (int i = 0; i < 4; ++i) {
      model.push_back(std::make_shared<nn::Linear>(64, 64, true, init));
      model.push_back(std::make_shared<nn::GELU>());
    }
    model.to(gpu());
    parallel::DistributedDataParallel ddp(
        model, {.bucket_cap_bytes = 20 << 10, .first_bucket_cap_bytes = 4 << 10});
    EXPECT_GE(ddp.buckets().size(), 3u);
    optim::AdamW opt(model.parameters(), {.lr = 1e-2});
    Generator data(200 + me());
    Tensor x = randn({32, 64}, &data).to(gpu()), y = randint(0, 64, {32}, &data).to(gpu());
    auto step = [&](const Tensor& xs, const Tensor& ys) {
      ddp.zero_grad();
      Tensor loss = cross_entropy(model(xs), ys);
      loss.backward();
      opt.step();
      return loss.detach();
    };
    CompiledFunction cf = compile(step, {.name = "ddp_step"});
    std::vector<double> losses;
    for (int i = 0; i < 8; ++i)
      losses.push_back((compiled ? cf({x, y})[0] : step(x, y)).item<double>());
    if (compiled) {
      const CacheEntryInfo e = cf.entries().at(0);
      EXPECT_GE(e.captures, 1) << cf.explain();
      EXPECT_EQ(e.comm_stream_steps, static_cast<int>(ddp.buckets().size())) << cf.steps_str(0);
    }
    for (const Tensor& p : model.parameters())
      EXPECT_TRUE(same_on_every_rank(p.detach(), &dist::world()));
    return losses;
  };
  std::vector<double> eager = run(false), compiled = run(true);
  for (size_t i = 0; i < eager.size(); ++i) EXPECT_NEAR(compiled[i], eager[i], 1e-5) << i;
  EXPECT_LT(eager.back(), eager.front());
}

// ---------------------------------------------------------------- errors

TEST(NcclErrors, BadCallsRaiseBeforeAnythingIsSent) {
  SKIP_WITHOUT_NCCL();
  const int n = world_n();
  Tensor x = make_tensor({2 * n, 3}, kFloat32, gpu(), me(), rv(kFloat32));
  synchronize(gpu());
  double mark = calls_mark();
  std::string grp = fmt::format("group world (rank {} of {})", me(), n);
  EXPECT_THROW_PREFIX(
      dist::all_gather_into_tensor_out(empty({2 * n * n, 3}, kFloat32, host()), x), DeviceError,
      fmt::format("[all_gather_into_tensor] out is on cpu but self is on {}", gpu().str()));
  EXPECT_THROW_PREFIX(dist::broadcast(x, n), ValueError,
                      fmt::format("[broadcast] src {} is outside {}", n, grp));
  EXPECT_THROW_PREFIX(dist::all_reduce(x.to(kInt32), dist::ReduceOp::Avg), TypeError,
                      "[all_reduce] avg needs a floating dtype, got int32");
  EXPECT_THROW_PREFIX(dist::all_reduce_(t(x)), ValueError, "[all_reduce_] self must be contiguous");
  if (n > 1) {
    EXPECT_THROW_PREFIX(dist::reduce_scatter_tensor(narrow(x, 0, 0, 2 * n - 1)), ValueError,
                        "[reduce_scatter_tensor] dim 0 of self");
  }
  if (cuda::device_count() > 1) {
    // One device per process: a tensor on another one is refused, naming both. 4 bytes, which
    // the custom all-reduce (multiples of 16) leaves to NCCL.
    Device other("cuda", (cuda::nccl_device() + 1) % cuda::device_count());
    Tensor one = make_tensor({1}, kFloat32, gpu(), me(), rv(kFloat32));
    EXPECT_THROW_PREFIX(dist::all_reduce(one.to(other)), DeviceError,
                        fmt::format("[all_reduce] the tensor is on {} but the NCCL communicator of "
                                    "group world (rank {} of {}) serves {}",
                                    other.str(), me(), n, gpu().str()));
  }
  synchronize(gpu());
  for (const char* op : {"all_gather_into_tensor", "broadcast", "all_reduce", "all_reduce_",
                         "reduce_scatter_tensor"})
    EXPECT_EQ(calls_since(mark, op), 0) << op << " reached NCCL";
}

// A collective held past its deadline (the stream is stalled by a host task queued before it):
// the watchdog aborts the group's communicator, the next synchronize raises the
// DistributedError naming op, group, sequence number and sizes, every later call on the group
// says it was aborted, and other groups go on. Its own group, so the world's communicator is
// untouched. A world of one only: there NCCL's in-place one-rank sum queues no kernel, while with
// peers the aborted communicator's kernels would still be queued behind the stall (a real hang
// has them running, and ncclCommAbort ends them).
TEST(NcclFaults, ACollectivePastItsDeadlineAbortsItsCommunicator) {
  SKIP_WITHOUT_NCCL();
  if (world_n() > 1) GTEST_SKIP() << "a world of one only (see above)";
  setenv("KILN_DIST_DUMP_DIR", ::testing::TempDir().c_str(), 1);
  std::shared_ptr<dist::ProcessGroup> g = dist::new_group(world_ranks());
  ASSERT_TRUE(g);
  Tensor x = make_tensor({64}, kFloat32, gpu(), me(), rv(kFloat32));
  dist::all_reduce_(x, dist::ReduceOp::Sum, g.get());  // the communicator works
  synchronize(gpu());
  auto released = std::make_shared<std::atomic<bool>>(false);
  device_interface(gpu().type())->launch_host_task(gpu().index(), "stall", [released] {
    while (!released->load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  });
  {
    dist::TimeoutGuard deadline(std::chrono::milliseconds(1000));
    dist::all_reduce_(x, dist::ReduceOp::Sum, g.get());
  }
  auto failed = [&] {
    for (const auto& e : dist::FlightRecorder::get().entries())
      if (e.group == g->name() && e.op == "all_reduce_" && e.state == dist::CallState::Failed)
        return true;
    return false;
  };
  auto until = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (!failed() && std::chrono::steady_clock::now() < until)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  released->store(true);
  ASSERT_TRUE(failed()) << "the deadline did not abort the collective within 30 s";
  std::string msg = kiln_test::message_of<DistributedError>([&] { synchronize(gpu()); });
  EXPECT_TRUE(kiln_test::starts_with(
      msg, fmt::format("[all_reduce_] timed out after 1000 ms on group {} (rank {} of {}), "
                       "collective 2 of its NCCL communicator, 64 float32 elements",
                       g->name(), me(), world_n())))
      << msg;
  EXPECT_TRUE(kiln_test::contains(msg, "ncclCommAbort")) << msg;
  EXPECT_TRUE(kiln_test::contains(msg, "flight recorder written to")) << msg;
  EXPECT_THROW_CONTAINS(dist::all_reduce_(x, dist::ReduceOp::Sum, g.get()), DistributedError,
                        fmt::format("the NCCL communicator of group {} (rank {} of {}) was aborted",
                                    g->name(), me(), world_n()));
  // The world's communicator is another one: it goes on.
  Tensor y = make_tensor({64}, kFloat32, gpu(), me(), rv(kFloat32));
  EXPECT_TRUE(matches(dist::all_reduce(y), expected_reduce({64}, kFloat32, dist::ReduceOp::Sum,
                                                           world_ranks(), rv(kFloat32))));
}

}  // namespace
}  // namespace kiln::test

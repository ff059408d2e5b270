// kiln/parallel/ddp.h on every rank of the world (run under scripts/mpirun.sh with 2 and 3
// ranks, and alone as a world of one). Each test is collective: every rank runs it, in order.
// The single-process references are computed on every rank locally, with the whole batch.
#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "kiln/compile/compile.h"
#include "kiln/core/storage.h"
#include "kiln/core/tensor_impl.h"
#include "kiln/distributed/collectives.h"
#include "kiln/distributed/process_group.h"
#include "kiln/nn/layers.h"
#include "kiln/ops/ops.h"
#include "kiln/optim/optimizer.h"
#include "kiln/parallel/ddp.h"
#include "tests/backend/sim_util.h"
#include "tests/core/test_util.h"

namespace kiln::test {
namespace {

using parallel::DDPOptions;
using parallel::DistributedDataParallel;

// The world (dist_test_main.cpp sets a 30 s deadline: a rank left behind by a failed
// assertion ends the job instead of hanging the test run).
const distributed::ProcessGroup& world() { return distributed::world(); }

// Linear(8, 16) -> GELU -> Linear(16, 4), times a buffer; `extra` (when made) is added while
// use_extra is set. Parameters in registration order: extra, l1.weight, l1.bias,
// l2.weight, l2.bias.
class Net : public nn::UnaryModule {
 public:
  explicit Net(uint64_t seed, bool with_extra = false) : use_extra(with_extra) {
    Generator gen(seed);
    nn::Init init{.gen = &gen};
    if (with_extra) {
      extra = randn({4}, &gen);
      register_parameter("extra", &extra);
    }
    l1 = register_module("l1", std::make_shared<nn::Linear>(8, 16, true, init));
    l2 = register_module("l2", std::make_shared<nn::Linear>(16, 4, true, init));
    scale = add(randn({4}, &gen), 2.0);
    register_buffer("scale", &scale);
  }
  Tensor forward(const Tensor& x) override {
    Tensor y = mul(l2->forward(gelu(l1->forward(x))), scale);
    return use_extra ? add(y, extra) : y;
  }
  std::shared_ptr<nn::Linear> l1, l2;
  Tensor extra, scale;
  bool use_extra;
};

constexpr int64_t kBatch = 4;  // per rank

// Step `step`'s whole batch (every rank's shares, in rank order): inputs [ranks * rows, 8] and
// classes [ranks * rows].
std::pair<Tensor, Tensor> batch(int64_t step, int64_t rows) {
  Generator gen(1000 + static_cast<uint64_t>(step));
  int64_t n = world().size() * rows;
  return {randn({n, 8}, &gen), randint(0, 4, {n}, &gen)};
}
// This rank's share of a whole batch.
Tensor share(const Tensor& t, int64_t rows) { return narrow(t, 0, world().rank() * rows, rows); }

Tensor loss_of(Net& m, const Tensor& x, const Tensor& y) { return cross_entropy(m(x), y); }

void expect_params_close(Net& a, Net& b, const char* what) {
  auto pa = a.named_parameters(), pb = b.named_parameters();
  ASSERT_EQ(pa.size(), pb.size());
  for (size_t i = 0; i < pa.size(); ++i)
    EXPECT_TRUE(allclose(pa[i].second, pb[i].second, 1e-4, 1e-5))
        << what << ": " << pa[i].first << " differs on rank " << world().rank();
}
void expect_params_equal(Net& a, Net& b, const char* what) {
  auto pa = a.named_parameters(), pb = b.named_parameters();
  ASSERT_EQ(pa.size(), pb.size());
  for (size_t i = 0; i < pa.size(); ++i)
    EXPECT_TRUE(equal(pa[i].second, pb[i].second))
        << what << ": " << pa[i].first << " differs on rank " << world().rank();
}

TEST(DDP, BroadcastsRankZerosParametersAndBuffers) {
  Net m(1 + world().rank());  // every rank starts from its own weights
  Net rank0(1);
  DistributedDataParallel ddp(m);
  expect_params_equal(m, rank0, "after construction");
  EXPECT_TRUE(equal(m.scale, rank0.scale));
  for (const Tensor& p : m.parameters()) {
    Tensor gathered = distributed::all_gather_into_tensor(p.reshape({1, -1}));
    for (int r = 1; r < world().size(); ++r)
      EXPECT_TRUE(equal(select(gathered, 0, r), select(gathered, 0, 0)));
  }
}

// A frozen parameter is not bucketed but still starts equal on every rank.
TEST(DDP, BroadcastsFrozenParametersToo) {
  Net m(1 + world().rank()), rank0(1);
  m.l1->weight.requires_grad_(false);
  DistributedDataParallel ddp(m);
  EXPECT_TRUE(equal(m.l1->weight, rank0.l1->weight)) << "on rank " << world().rank();
  for (const auto& b : ddp.buckets())
    for (const std::string& name : b.params) EXPECT_NE(name, "l1.weight");
}

// N ranks with batch B each train as one process with batch N * B (20 SGD steps).
TEST(DDP, MatchesOneProcessWithTheWholeBatch) {
  Net m(7 + world().rank()), ref(7);
  // Small caps: three buckets (l2.bias; l2.weight; l1.bias and l1.weight), reduced while
  // backward runs (Note [DDP's buckets]).
  DistributedDataParallel ddp(m, {.bucket_cap_bytes = 200, .first_bucket_cap_bytes = 16});
  ASSERT_EQ(ddp.buckets().size(), 3u);
  optim::SGD opt(m.parameters(), {.lr = 0.1, .momentum = 0.9});
  optim::SGD ref_opt(ref.parameters(), {.lr = 0.1, .momentum = 0.9});
  for (int64_t step = 0; step < 20; ++step) {
    auto [x, y] = batch(step, kBatch);
    opt.zero_grad();
    loss_of(m, share(x, kBatch), share(y, kBatch)).backward();
    opt.step();
    ref_opt.zero_grad();
    loss_of(ref, x, y).backward();
    ref_opt.step();
  }
  expect_params_close(m, ref, "after 20 steps");
  EXPECT_EQ(ddp.stats().syncs, 20);
  EXPECT_EQ(ddp.stats().bytes, (8 * 16 + 16 + 16 * 4 + 4) * 4);
}

TEST(DDP, BucketsTakeParametersInReverseOrderAndGradientsAreViews) {
  Net m(3, /*with_extra=*/true);
  // extra 16 B, l1.weight 512 B, l1.bias 64 B, l2.weight 256 B, l2.bias 16 B: the first bucket
  // closes at >= 200 bytes, the next at >= 300.
  DistributedDataParallel ddp(m, {.bucket_cap_bytes = 300, .first_bucket_cap_bytes = 200});
  const auto& b = ddp.buckets();
  ASSERT_EQ(b.size(), 3u);
  EXPECT_EQ(b[0].params, (std::vector<std::string>{"l2.bias", "l2.weight"}));
  EXPECT_EQ(b[1].params, (std::vector<std::string>{"l1.bias", "l1.weight"}));
  EXPECT_EQ(b[2].params, (std::vector<std::string>{"extra"}));
  EXPECT_EQ(b[0].numel, 4 + 64);
  EXPECT_EQ(b[0].dtype, kFloat32);
  // Note [Bucket padding]: each bucket reduces whole 512-byte blocks, the last its flags too.
  EXPECT_EQ(b[0].reduced_numel, 128);
  EXPECT_EQ(b[2].numel, 4);
  EXPECT_EQ(b[2].reduced_numel, (4 + world().size() <= 128) ? 128 : 256);
  // The gradient views sit in flat tensors of those lengths.
  EXPECT_EQ(m.l2->bias.grad().impl()->storage()->nbytes(), 128 * sizeof(float));
  EXPECT_EQ(m.extra.grad().impl()->storage()->nbytes(), b[2].reduced_numel * sizeof(float));
  // Every .grad is a view of its bucket: l2.bias at offset 0, l2.weight right after it.
  auto* bias = static_cast<float*>(m.l2->bias.grad().data_ptr());
  EXPECT_EQ(static_cast<float*>(m.l2->weight.grad().data_ptr()), bias + 4);
  // Dropping the gradients (zero_grad(set_to_none)) does not lose the layout: the next
  // backward puts them back into their buckets.
  m.zero_grad(/*set_to_none=*/true);
  auto [x, y] = batch(0, kBatch);
  loss_of(m, share(x, kBatch), share(y, kBatch)).backward();
  EXPECT_EQ(static_cast<float*>(m.l2->bias.grad().data_ptr()), bias);
  EXPECT_EQ(ddp.stats().syncs, 1);
  // zero_grad fills the buckets.
  ddp.zero_grad();
  for (const Tensor& p : m.parameters()) EXPECT_EQ(amax(abs(p.grad())).item<float>(), 0.0f);
}

TEST(DDP, DefaultCapsPutASmallModelInOneBucket) {
  Net m(3);
  DistributedDataParallel ddp(m);
  ASSERT_EQ(ddp.buckets().size(), 1u);
  EXPECT_EQ(ddp.buckets()[0].params.front(), "l2.bias");
  EXPECT_EQ(&ddp.module(), &m);
  EXPECT_EQ(&ddp.group(), &world());
}

// Two micro-batches, the first under no_sync: the same as one process with both micro-batches
// of every rank in one batch.
TEST(DDP, NoSyncAccumulationEqualsTheLargerBatch) {
  Net m(11), ref(11);
  DistributedDataParallel ddp(m, {.bucket_cap_bytes = 300, .first_bucket_cap_bytes = 200});
  optim::SGD opt(m.parameters(), {.lr = 0.1});
  optim::SGD ref_opt(ref.parameters(), {.lr = 0.1});
  for (int64_t step = 0; step < 3; ++step) {
    auto [x0, y0] = batch(2 * step, kBatch);
    auto [x1, y1] = batch(2 * step + 1, kBatch);
    opt.zero_grad();
    {
      auto guard = ddp.no_sync();
      EXPECT_FALSE(ddp.sync_enabled());
      mul(loss_of(m, share(x0, kBatch), share(y0, kBatch)), 0.5).backward();
    }
    EXPECT_TRUE(ddp.sync_enabled());
    EXPECT_EQ(ddp.stats().syncs, step);  // nothing was communicated
    mul(loss_of(m, share(x1, kBatch), share(y1, kBatch)), 0.5).backward();
    opt.step();
    ref_opt.zero_grad();
    loss_of(ref, cat({x0, x1}), cat({y0, y1})).backward();
    ref_opt.step();
  }
  expect_params_close(m, ref, "after 3 accumulated steps");
  EXPECT_EQ(ddp.stats().syncs, 3);
}

TEST(DDP, ParameterWithoutGradientIsAnErrorNamingIt) {
  Net m(5, /*with_extra=*/true);
  DistributedDataParallel ddp(m, {.bucket_cap_bytes = 300, .first_bucket_cap_bytes = 200});
  m.use_extra = false;
  auto [x, y] = batch(0, kBatch);
  Tensor xs = share(x, kBatch), ys = share(y, kBatch);
  std::string msg = kiln_test::message_of<ValueError>([&] { loss_of(m, xs, ys).backward(); });
  EXPECT_TRUE(kiln_test::starts_with(
      msg, "[DistributedDataParallel] parameter 'extra' received no gradient in this backward"))
      << msg;
  EXPECT_TRUE(kiln_test::contains(msg, "1 of 5 parameters")) << msg;
  // Under no_sync nothing is checked; and the group is still in step: a full backward
  // synchronises on every rank.
  {
    auto guard = ddp.no_sync();
    loss_of(m, xs, ys).backward();
  }
  m.use_extra = true;
  Net ref(5, true);
  ddp.zero_grad();
  loss_of(m, xs, ys).backward();
  loss_of(ref, x, y).backward();
  EXPECT_TRUE(allclose(m.l1->weight.grad(), ref.l1->weight.grad(), 1e-4, 1e-6));
  EXPECT_EQ(ddp.stats().syncs, 1);
}

// A parameter used on rank 0 only (Note [A parameter without a gradient] in ddp.cpp): every
// rank raises, rank 0 naming the ranks that missed and their bucket, the others the parameter,
// well before the 5 s deadline (a regression ends the job there instead of hanging); then a
// backward that uses it everywhere works. On the cpu the faulty backward raises; on a device
// with streams the next backward does, on every rank, before it communicates.
void unused_on_some_ranks(Device device) {
  distributed::TimeoutGuard deadline(std::chrono::seconds(5));
  Net m(5, /*with_extra=*/true), ref(5, true);
  m.to(device);
  DistributedDataParallel ddp(m, {.bucket_cap_bytes = 300, .first_bucket_cap_bytes = 200});
  ASSERT_EQ(ddp.buckets().size(), 3u);  // extra is alone in bucket 2
  auto [x, y] = batch(0, kBatch);
  Tensor xs = share(x, kBatch).to(device), ys = share(y, kBatch).to(device);
  m.use_extra = world().rank() == 0;
  std::string msg;
  if (device.is_cpu()) {
    msg = kiln_test::message_of<ValueError>([&] { loss_of(m, xs, ys).backward(); });
  } else {
    loss_of(m, xs, ys).backward();  // the flags are read by the next backward
    m.use_extra = true;
    msg = kiln_test::message_of<ValueError>([&] { loss_of(m, xs, ys).backward(); });
  }
  const std::string when = device.is_cpu() ? "this backward" : "the previous synchronised backward";
  if (world().rank() == 0) {
    EXPECT_TRUE(kiln_test::starts_with(
        msg, "[DistributedDataParallel] another rank got no gradient in " + when))
        << msg;
    EXPECT_TRUE(kiln_test::contains(msg, "rank 1 (for a parameter of bucket 2 of 3: 'extra')"))
        << msg;
    EXPECT_TRUE(kiln_test::contains(msg, "rank 0 of group 'world' raises too")) << msg;
  } else {
    EXPECT_TRUE(kiln_test::starts_with(
        msg, "[DistributedDataParallel] parameter 'extra' received no gradient in " + when))
        << msg;
    EXPECT_TRUE(kiln_test::contains(
        msg, fmt::format("(1 of 5 parameters did not: 'extra') on rank {} of group 'world'",
                         world().rank())))
        << msg;
  }
  // The ranks are still in step: a backward that uses it everywhere gives the average.
  m.use_extra = true;
  ddp.zero_grad();
  loss_of(m, xs, ys).backward();
  loss_of(ref, x, y).backward();
  EXPECT_TRUE(allclose(m.l1->weight.grad().to(Device(kCPU)), ref.l1->weight.grad(), 1e-4, 1e-6));
  EXPECT_TRUE(allclose(m.extra.grad().to(Device(kCPU)), ref.extra.grad(), 1e-4, 1e-6));
  EXPECT_EQ(ddp.stats().syncs, device.is_cpu() ? 1 : 2);
}

TEST(DDP, ParameterUnusedOnSomeRanksRaisesOnEveryRank) {
  if (world().size() < 2) GTEST_SKIP() << "needs 2 ranks";
  unused_on_some_ranks(Device(kCPU));
}
TEST(DDP, ParameterUnusedOnSomeRanksRaisesOnEveryRankOnSim) {
  if (world().size() < 2) GTEST_SKIP() << "needs 2 ranks";
  unused_on_some_ranks(sim());
}

// Traced, the flags are read at once: the trace fails on every rank, and a later trace in
// which every rank uses the parameter gives a working compiled step.
void unused_on_some_ranks_compiled(Device device) {
  distributed::TimeoutGuard deadline(std::chrono::seconds(5));
  Net m(5, /*with_extra=*/true), ref(5, true);
  m.to(device);
  DistributedDataParallel ddp(m, {.bucket_cap_bytes = 300, .first_bucket_cap_bytes = 200});
  auto [x, y] = batch(0, kBatch);
  Tensor xs = share(x, kBatch).to(device), ys = share(y, kBatch).to(device);
  m.use_extra = world().rank() == 0;
  auto step = [&](const Tensor& a, const Tensor& b) {
    ddp.zero_grad();
    Tensor loss = loss_of(m, a, b);
    loss.backward();
    return loss.detach();
  };
  CompiledFunction failing = compile(step, {.name = "ddp_unused"});
  std::string msg = kiln_test::message_of<ValueError>([&] { failing({xs, ys}); });
  EXPECT_TRUE(kiln_test::starts_with(msg, world().rank() == 0
                                              ? "[DistributedDataParallel] another rank got no "
                                                "gradient in this backward"
                                              : "[DistributedDataParallel] parameter 'extra' "
                                                "received no gradient in this backward"))
      << msg;
  m.use_extra = true;
  CompiledFunction working = compile(step, {.name = "ddp_used"});
  for (int i = 0; i < 3; ++i) working({xs, ys});
  loss_of(ref, x, y).backward();
  EXPECT_TRUE(allclose(m.extra.grad().to(Device(kCPU)), ref.extra.grad(), 1e-4, 1e-6));
  EXPECT_TRUE(allclose(m.l1->weight.grad().to(Device(kCPU)), ref.l1->weight.grad(), 1e-4, 1e-6));
}

TEST(DDP, ParameterUnusedOnSomeRanksFailsTheTraceOnEveryRank) {
  if (world().size() < 2) GTEST_SKIP() << "needs 2 ranks";
  unused_on_some_ranks_compiled(Device(kCPU));
}
TEST(DDP, ParameterUnusedOnSomeRanksFailsTheTraceOnEveryRankOnSim) {
  if (world().size() < 2) GTEST_SKIP() << "needs 2 ranks";
  unused_on_some_ranks_compiled(sim());
}

TEST(DDP, RanksWrappingDifferentModulesRaise) {
  if (world().size() < 2) GTEST_SKIP() << "needs 2 ranks";
  nn::Linear m(4, world().rank() == 0 ? 4 : 5);
  EXPECT_THROW_CONTAINS(DistributedDataParallel(m), ValueError,
                        "[DistributedDataParallel] the ranks of group 'world' wrap different "
                        "modules: rank 0 has 2 parameters (20 elements), rank 1 has 2 (25 "
                        "elements)");
}

TEST(DDP, BadBucketCapsRaise) {
  Net m(1);
  EXPECT_THROW_PREFIX(DistributedDataParallel(m, {.bucket_cap_bytes = 0}), ValueError,
                      "[DistributedDataParallel] bucket caps must be positive, got "
                      "bucket_cap_bytes 0");
}

// A compiled DDP step (its bucketed all-reduces traced in order with backward) gives the eager
// step's results bit for bit on `device`; returns the compiled function's first entry.
CacheEntryInfo compiled_equals_eager(Device device) {
  Net eager(21 + world().rank()), traced(21 + world().rank());
  eager.to(device);
  traced.to(device);
  DDPOptions small{.bucket_cap_bytes = 200, .first_bucket_cap_bytes = 16};
  DistributedDataParallel de(eager, small), dt(traced, small);
  optim::SGD oe(eager.parameters(), {.lr = 0.1, .momentum = 0.9});
  optim::SGD ot(traced.parameters(), {.lr = 0.1, .momentum = 0.9});
  auto step = [](Net& m, optim::SGD& o, const Tensor& x, const Tensor& y) {
    o.zero_grad();
    Tensor loss = loss_of(m, x, y);
    loss.backward();
    o.step();
    return loss.detach();
  };
  CompiledFunction compiled = compile(
      [&](const Tensor& x, const Tensor& y) { return step(traced, ot, x, y); }, {.name = "ddp"});
  for (int64_t s = 0; s < 6; ++s) {
    auto [x, y] = batch(s, kBatch);
    Tensor xs = share(x, kBatch).to(device), ys = share(y, kBatch).to(device);
    Tensor le = step(eager, oe, xs, ys);
    Tensor lt = compiled({xs, ys})[0];
    EXPECT_TRUE(equal(le.to(Device(kCPU)), lt.to(Device(kCPU))))
        << "step " << s << " on " << device.str();
  }
  expect_params_equal(eager, traced, "after 6 steps");
  EXPECT_EQ(compiled.entries().size(), 1u);
  CacheEntryInfo e = compiled.entries().at(0);
  EXPECT_GE(e.hits, 3);
  // One all-reduce per bucket in the traced step.
  std::string g = compiled.graph_str(0);
  size_t n = 0;
  for (size_t at = g.find("all_reduce"); at != std::string::npos; at = g.find("all_reduce", at + 1))
    ++n;
  EXPECT_EQ(n, dt.buckets().size()) << g;
  // On a device with streams every bucket's all-reduce runs on the communication stream, and
  // nothing waits for it before the optimizer reads the gradients (Note [Collectives on a
  // stream of their own] in kiln/compile/comm_stream.cpp).
  EXPECT_EQ(e.comm_stream_steps, device.is_cpu() ? 0 : static_cast<int>(n))
      << compiled.steps_str(0);
  if (!device.is_cpu()) {
    const std::string steps = compiled.steps_str(0);
    const size_t wait = steps.find("waits for the communication stream");
    EXPECT_NE(wait, std::string::npos) << steps;
    if (wait != std::string::npos) {
      EXPECT_EQ(steps.find("waits for", wait + 1), std::string::npos) << "one wait\n" << steps;
      EXPECT_GT(wait, steps.rfind("all_reduce")) << "after the last all-reduce\n" << steps;
    }
  }
  return e;
}

TEST(DDP, CompiledEqualsEagerBitwise) { compiled_equals_eager(Device(kCPU)); }

// On sim the all-reduces are host tasks on the stream, so the compiled step, all-reduces and
// all, is one captured device graph.
TEST(DDP, CompiledOnSimIsADeviceGraphEqualToEager) {
  EXPECT_TRUE(compiled_equals_eager(sim()).device_graphs);
}

// no_sync is a guard of a compiled step: flipping it traces a step without the all-reduces.
TEST(DDP, NoSyncIsAGuardOfACompiledStep) {
  Net m(2);
  DistributedDataParallel ddp(m);
  CompiledFunction compiled = compile([&](const Tensor& x, const Tensor& y) {
    Tensor loss = loss_of(m, x, y);
    loss.backward();
    return loss.detach();
  });
  auto [x, y] = batch(0, kBatch);
  Tensor xs = share(x, kBatch).contiguous(), ys = share(y, kBatch).contiguous();
  compiled({xs, ys});
  compiled({xs, ys});
  {
    auto guard = ddp.no_sync();
    compiled({xs, ys});
  }
  ASSERT_EQ(compiled.entries().size(), 2u);
  ASSERT_EQ(compiled.miss_reasons().size(), 1u);
  EXPECT_TRUE(
      kiln_test::contains(compiled.miss_reasons()[0], "DistributedDataParallel gradient sync"))
      << compiled.miss_reasons()[0];
  EXPECT_NE(compiled.graph_str(0).find("all_reduce"), std::string::npos);
  EXPECT_EQ(compiled.graph_str(1).find("all_reduce"), std::string::npos);
}

}  // namespace
}  // namespace kiln::test

// kiln/nn/sync_batch_norm.h on every rank of the world (run under scripts/mpirun.sh with 2 and
// 3 ranks, and alone as a world of one). Each test is collective: every rank runs it, in order.
// The references are BatchNorm on the whole batch, computed on every rank locally; each rank
// feeds SyncBatchNorm its own slice (slices of different sizes).
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "kiln/core/error.h"
#include "kiln/distributed/collectives.h"
#include "kiln/distributed/process_group.h"
#include "kiln/nn/cnn.h"
#include "kiln/nn/sync_batch_norm.h"
#include "kiln/ops/ops.h"
#include "tests/core/test_util.h"

namespace kiln::test {
namespace {

const distributed::ProcessGroup& world() { return distributed::world(); }

// Rank r holds r + 2 samples: uneven slices. The whole batch and this rank's start in it.
int64_t rows_of(int r) { return r + 2; }
int64_t whole_rows() {
  int64_t n = 0;
  for (int r = 0; r < world().size(); ++r) n += rows_of(r);
  return n;
}
int64_t my_start() {
  int64_t s = 0;
  for (int r = 0; r < world().rank(); ++r) s += rows_of(r);
  return s;
}
Tensor my_slice(const Tensor& t) { return narrow(t, 0, my_start(), rows_of(world().rank())); }

const nn::Init kDouble{.dtype = kFloat64};

// Random weight and bias (the same on every rank), into both modules.
void randomise_affine(nn::BatchNormNd& a, nn::BatchNormNd& b, uint64_t seed) {
  Generator gen(seed);
  const int64_t c = a.num_features;
  Tensor w = add(randn({c}, &gen, kFloat64), 1.0), bias = randn({c}, &gen, kFloat64);
  a.weight.detach().copy_(w);
  b.weight.detach().copy_(w);
  a.bias.detach().copy_(bias);
  b.bias.detach().copy_(bias);
}

void expect_close(const Tensor& a, const Tensor& b, const std::string& what) {
  EXPECT_TRUE(allclose(a, b, 1e-10, 1e-12)) << what << " differs on rank " << world().rank();
}

// One training step of each module on `x_whole` (the reference) and this rank's slice (sync),
// with the loss sum(y * g): outputs, input gradients, all-reduced weight/bias gradients.
void expect_step_matches(nn::SyncBatchNorm& sync, nn::BatchNormNd& ref, const Tensor& x_whole,
                         const Tensor& g_whole, const std::string& what) {
  Tensor xr = x_whole.clone().requires_grad_(), xs = my_slice(x_whole).clone().requires_grad_();
  Tensor yr = ref(xr), ys = sync(xs);
  sum(yr * g_whole).backward();
  sum(ys * my_slice(g_whole)).backward();
  expect_close(ys, my_slice(yr), what + " output");
  expect_close(xs.grad(), my_slice(xr.grad()), what + " input gradient");
  expect_close(distributed::all_reduce(sync.weight.grad()), ref.weight.grad(),
               what + " weight gradient");
  expect_close(distributed::all_reduce(sync.bias.grad()), ref.bias.grad(), what + " bias gradient");
  sync.zero_grad(true);
  ref.zero_grad(true);
}

TEST(SyncBatchNorm, MatchesBatchNormOnTheWholeBatch) {
  const std::vector<std::vector<int64_t>> tails = {{}, {5}, {4, 3}, {2, 3, 2}};
  for (const auto& tail : tails) {
    const std::string what = fmt::format("[N, 3{}]", tail.empty() ? "" : ", ...");
    const int64_t c = 3;
    nn::SyncBatchNorm sync(c, {.momentum = 0.3}, nullptr, kDouble);
    nn::BatchNormNd ref("BatchNormNd", 2, 5, c, {.momentum = 0.3}, kDouble);
    randomise_affine(sync, ref, 7);
    std::vector<int64_t> shape{whole_rows(), c};
    shape.insert(shape.end(), tail.begin(), tail.end());
    for (int step = 0; step < 2; ++step) {
      Generator gen(100 + static_cast<uint64_t>(step));
      // Far from zero mean: the two-pass variance keeps tight agreement.
      Tensor x = add(mul(randn(shape, &gen, kFloat64), 3.0), 50.0);
      Tensor g = randn(shape, &gen, kFloat64);
      expect_step_matches(sync, ref, x, g, what + fmt::format(" step {}", step));
    }
    expect_close(sync.running_mean, ref.running_mean, what + " running_mean");
    expect_close(sync.running_var, ref.running_var, what + " running_var");
    EXPECT_TRUE(equal(sync.num_batches_tracked, ref.num_batches_tracked)) << what;

    // Eval: the running stats, BatchNorm's path (bitwise on the same input).
    sync.eval();
    ref.eval();
    Generator gen(300);
    Tensor x = randn(shape, &gen, kFloat64);
    expect_close(sync(my_slice(x)), ref(my_slice(x)), what + " eval");
  }
}

TEST(SyncBatchNorm, WithoutRunningStatsOrAffine) {
  nn::SyncBatchNorm sync(4, {.affine = false, .track_running_stats = false}, nullptr, kDouble);
  nn::BatchNorm2d ref(4, {.affine = false, .track_running_stats = false}, kDouble);
  EXPECT_TRUE(sync.state_dict().empty());
  Generator gen(5);
  Tensor x = randn({whole_rows(), 4, 3, 3}, &gen, kFloat64);
  Tensor xs = my_slice(x).clone().requires_grad_(), xr = x.clone().requires_grad_();
  Tensor ys = sync(xs), yr = ref(xr);
  expect_close(ys, my_slice(yr), "output");
  sum(ys * ys).backward();
  sum(yr * yr).backward();
  expect_close(xs.grad(), my_slice(xr.grad()), "input gradient");
  // Eval without running stats: this rank's batch statistics, as PyTorch's (no sync).
  sync.eval();
  ref.eval();
  EXPECT_TRUE(equal(sync(my_slice(x)), ref(my_slice(x))));
}

TEST(SyncBatchNorm, SixteenBitInputsNormaliseInFloat32) {
  nn::SyncBatchNorm sync(3);
  nn::BatchNorm2d ref(3, {}, kDouble);
  Generator gen(13);
  Tensor x = add(randn({whole_rows(), 3, 4, 4}, &gen, kFloat64), 4.0);
  for (DType dt : {kFloat16, kBFloat16}) {
    Tensor y = sync(my_slice(x).to(dt));
    EXPECT_EQ(y.dtype(), dt);
    EXPECT_TRUE(allclose(y.to(kFloat64), my_slice(ref(x.to(dt).to(kFloat64))), 2e-2, 2e-2))
        << fmt::format("{}", dt);
  }
}

TEST(SyncBatchNorm, AGroupOfOneIsBatchNormBitwise) {
  // Each rank alone in its group: native batch norm, bitwise.
  std::shared_ptr<distributed::ProcessGroup> alone =
      distributed::split_group(world(), world().rank());
  ASSERT_EQ(alone->size(), 1);
  nn::SyncBatchNorm sync(3, {}, alone.get(), kDouble);
  nn::BatchNorm2d ref(3, {}, kDouble);
  randomise_affine(sync, ref, 9);
  Generator gen(11);
  Tensor x = randn({4, 3, 5, 5}, &gen, kFloat64), g = randn({4, 3, 5, 5}, &gen, kFloat64);
  Tensor xs = x.clone().requires_grad_(), xr = x.clone().requires_grad_();
  Tensor ys = sync(xs), yr = ref(xr);
  EXPECT_TRUE(equal(ys, yr));
  sum(ys * g).backward();
  sum(yr * g).backward();
  EXPECT_TRUE(equal(xs.grad(), xr.grad()));
  EXPECT_TRUE(equal(sync.weight.grad(), ref.weight.grad()));
  EXPECT_TRUE(equal(sync.bias.grad(), ref.bias.grad()));
  EXPECT_TRUE(equal(sync.running_mean, ref.running_mean));
  EXPECT_TRUE(equal(sync.running_var, ref.running_var));
  EXPECT_TRUE(equal(sync.num_batches_tracked, ref.num_batches_tracked));
}

TEST(SyncBatchNorm, BadInputRaisesBeforeAnythingChanges) {
  nn::SyncBatchNorm sync(3, {}, nullptr, kDouble);
  EXPECT_THROW_PREFIX(sync(zeros({4}, kFloat64)), ValueError,
                      "[SyncBatchNorm] expected an input [N, C, *] of rank >= 2, got shape [4]");
  EXPECT_THROW_PREFIX(sync(zeros({2, 4, 3}, kFloat64)), ValueError,
                      "[SyncBatchNorm] expected 3 channels (dim 1), got shape [2, 4, 3]");
  EXPECT_EQ(sync.num_batches_tracked.item<int64_t>(), 0);
  EXPECT_TRUE(equal(sync.running_mean, zeros({3}, kFloat64)));
  EXPECT_THROW_PREFIX(nn::SyncBatchNorm(0), ValueError, "[SyncBatchNorm] num_features");
}

TEST(SyncBatchNorm, OneValuePerChannelAcrossTheGroupRaisesOnEveryRank) {
  // Rank 0 holds one sample, the others none: every rank raises, none hangs.
  nn::SyncBatchNorm sync(3, {}, nullptr, kDouble);
  const int64_t rows = world().rank() == 0 ? 1 : 0;
  EXPECT_THROW_CONTAINS(sync(zeros({rows, 3}, kFloat64)), ValueError,
                        "Expected more than 1 value per channel");
  EXPECT_EQ(sync.num_batches_tracked.item<int64_t>(), 0);
  EXPECT_TRUE(equal(sync.running_var, ones({3}, kFloat64)));
}

nn::CNNConfig small_cnn() {
  return {.in_channels = 2, .image_size = 8, .channels = {4, 6}, .hidden = 0, .classes = 3};
}

TEST(SyncBatchNorm, ConvertCNNKeepsKeysAndMatchesTheWholeBatch) {
  Generator g1(21), g2(21);
  auto converted = std::make_shared<nn::CNN>(small_cnn(), nn::Init{.gen = &g1, .dtype = kFloat64});
  nn::CNN ref(small_cnn(), nn::Init{.gen = &g2, .dtype = kFloat64});
  const nn::NamedTensors before = converted->state_dict();
  const Tensor first_weight = before[1].second;  // features.1.weight: kept, not copied
  EXPECT_EQ(nn::convert_sync_batchnorm(converted), converted);
  int syncs = 0;
  for (auto& [path, m] : converted->named_modules()) {
    EXPECT_EQ(dynamic_cast<nn::BatchNorm2d*>(m), nullptr) << path << " is still a BatchNorm2d";
    if (auto* s = dynamic_cast<nn::SyncBatchNorm*>(m)) {
      ++syncs;
      EXPECT_EQ(s->num_features, path == "features.1" ? 4 : 6);
      EXPECT_EQ(s->path(), path);
    }
  }
  EXPECT_EQ(syncs, 2);
  const nn::NamedTensors after = converted->state_dict();
  ASSERT_EQ(after.size(), before.size());
  for (size_t i = 0; i < after.size(); ++i) EXPECT_EQ(after[i].first, before[i].first);
  EXPECT_EQ(after[1].first, "features.1.weight");
  EXPECT_EQ(after[1].second.data_ptr(), first_weight.data_ptr());
  ref.load_state_dict(after);  // interchangeable with the unconverted model's

  // Training on the slices equals the whole batch through the unconverted model.
  Generator gen(22);
  Tensor x = randn({whole_rows(), 2, 8, 8}, &gen, kFloat64);
  Tensor xs = my_slice(x).clone().requires_grad_(), xr = x.clone().requires_grad_();
  Tensor ys = (*converted)(xs), yr = ref(xr);
  expect_close(ys, my_slice(yr), "CNN output");
  sum(ys * ys).backward();
  sum(yr * yr).backward();
  expect_close(xs.grad(), my_slice(xr.grad()), "CNN input gradient");
  auto ps = converted->named_parameters(), pr = ref.named_parameters();
  for (size_t i = 0; i < ps.size(); ++i)
    expect_close(distributed::all_reduce(ps[i].second.grad()), pr[i].second.grad(),
                 ps[i].first + " gradient");
  auto bs = converted->named_buffers(), br = ref.named_buffers();
  for (size_t i = 0; i < bs.size(); ++i) {
    if (is_floating(bs[i].second.dtype()))
      expect_close(bs[i].second, br[i].second, bs[i].first);
    else
      EXPECT_TRUE(equal(bs[i].second, br[i].second)) << bs[i].first;
  }
}

TEST(SyncBatchNorm, ConvertABareBatchNormAndKeepTheFlag) {
  auto bn = std::make_shared<nn::BatchNorm3d>(5, nn::BatchNormOptions{.eps = 1e-3});
  bn->eval();
  auto out = nn::convert_sync_batchnorm(bn);
  auto* s = dynamic_cast<nn::SyncBatchNorm*>(out.get());
  ASSERT_NE(s, nullptr);
  EXPECT_FALSE(s->is_training());
  EXPECT_EQ(s->options.eps, 1e-3);
  EXPECT_EQ(s->running_var.data_ptr(), bn->running_var.data_ptr());
  // Converting again changes nothing.
  EXPECT_EQ(nn::convert_sync_batchnorm(out), out);
}

// Holds its BatchNorm in a member its forward calls: it cannot swap it.
class Holder : public nn::UnaryModule {
 public:
  Holder() { bn = register_module("bn", std::make_shared<nn::BatchNorm1d>(2)); }
  Tensor forward(const Tensor& x) override { return (*bn)(x); }
  std::shared_ptr<nn::BatchNorm1d> bn;
};

TEST(SyncBatchNorm, ConvertRaisesWhereAParentCannotSwap) {
  auto holder = std::make_shared<Holder>();
  EXPECT_THROW_PREFIX(nn::convert_sync_batchnorm(holder), ValueError,
                      "[replace_module] Holder cannot swap its submodule 'bn' (BatchNorm1d) for a "
                      "SyncBatchNorm");
  EXPECT_THROW_PREFIX(holder->replace_module("nope", std::make_shared<nn::ReLU>()), ValueError,
                      "[replace_module] Holder has no submodule 'nope'");
}

}  // namespace
}  // namespace kiln::test

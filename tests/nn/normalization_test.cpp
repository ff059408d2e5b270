// kiln/nn/normalization.h: BatchNorm1d/2d and GroupNorm against torch::nn's modules on the same
// parameters (training steps updating the running stats, eval with them, no affine, no running
// stats), the buffers in state dicts and their round trip, a compiled training step whose
// replays update the running stats as eager steps do, and the errors.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "kiln/autograd/grad_mode.h"
#include "kiln/compile/compile.h"
#include "kiln/core/error.h"
#include "kiln/nn/normalization.h"
#include "kiln/ops/ops.h"
#include "tests/ops/aten_compare.h"

namespace kiln::test {
namespace {

testing::AssertionResult close(const Tensor& got, const torch::Tensor& want) {
  return close_to_aten(got, want, 1e-5, 1e-5);
}

Tensor randn_like_shape(IntArrayRef shape, Generator& gen) {
  return randn(shape, &gen, kFloat32, Device(kCPU));
}

// Gives torch's module kiln's parameters (random, so that affine matters).
template <class TorchBn>
void copy_params(nn::BatchNormNd& k, TorchBn& t, Generator& gen) {
  torch::NoGradGuard no_grad;
  autograd::NoGradGuard kiln_no_grad;
  if (!k.options.affine) return;
  k.weight.copy_(randn_like_shape({k.num_features}, gen));
  k.bias.copy_(randn_like_shape({k.num_features}, gen));
  t->weight.copy_(to_aten(k.weight));
  t->bias.copy_(to_aten(k.bias));
}

TEST(NormModuleTest, BatchNorm2dTrainThenEvalMatchesTorch) {
  Generator gen(7);
  nn::BatchNorm2d bn(3, {.momentum = 0.2});
  torch::nn::BatchNorm2d tb(torch::nn::BatchNormOptions(3).momentum(0.2));
  copy_params(bn, tb, gen);
  for (int step = 0; step < 3; ++step) {
    Tensor x = randn_like_shape({4, 3, 5, 6}, gen);
    Tensor y = bn(x);
    torch::Tensor ty = tb->forward(to_aten(x));
    EXPECT_TRUE(close(y, ty)) << "step " << step;
    EXPECT_TRUE(close(bn.running_mean, tb->running_mean)) << "step " << step;
    EXPECT_TRUE(close(bn.running_var, tb->running_var)) << "step " << step;
  }
  EXPECT_EQ(bn.num_batches_tracked.item<int64_t>(), 3);
  bn.eval();
  tb->eval();
  Tensor x = randn_like_shape({2, 3, 4, 4}, gen);
  Tensor before = clone(bn.running_mean);
  EXPECT_TRUE(close(bn(x), tb->forward(to_aten(x))));
  EXPECT_TRUE(same_values(bn.running_mean, before)) << "eval must not update the running stats";
  EXPECT_EQ(bn.num_batches_tracked.item<int64_t>(), 3);
}

TEST(NormModuleTest, BatchNorm1dOptionsMatchTorch) {
  Generator gen(8);
  struct Case {
    nn::BatchNormOptions opt;
    std::vector<int64_t> shape;
  };
  const std::vector<Case> cases = {
      {{}, {8, 4}},
      {{}, {3, 4, 5}},
      {{.affine = false}, {6, 4}},
      {{.track_running_stats = false}, {5, 4, 3}},
  };
  for (const Case& c : cases) {
    nn::BatchNorm1d bn(4, c.opt);
    torch::nn::BatchNorm1d tb(torch::nn::BatchNormOptions(4)
                                  .affine(c.opt.affine)
                                  .track_running_stats(c.opt.track_running_stats));
    copy_params(bn, tb, gen);
    Tensor x = randn_like_shape(c.shape, gen);
    EXPECT_TRUE(close(bn(x), tb->forward(to_aten(x))));
    bn.eval();
    tb->eval();
    // Without running stats eval still uses the batch's statistics, as torch's.
    EXPECT_TRUE(close(bn(x), tb->forward(to_aten(x))));
    EXPECT_EQ(bn.parameters().size(), c.opt.affine ? 2u : 0u);
    EXPECT_EQ(bn.named_buffers().size(), c.opt.track_running_stats ? 3u : 0u);
  }
}

TEST(NormModuleTest, BatchNormBuffersRoundTripThroughStateDicts) {
  Generator gen(9);
  nn::BatchNorm2d a(3);
  for (int i = 0; i < 2; ++i) a(randn_like_shape({4, 3, 2, 2}, gen));
  std::vector<std::string> names;
  for (auto& [n, t] : a.state_dict()) names.push_back(n);
  EXPECT_EQ(names, (std::vector<std::string>{"weight", "bias", "running_mean", "running_var",
                                             "num_batches_tracked"}));
  nn::BatchNorm2d b(3);
  b.load_state_dict(a.state_dict());
  EXPECT_TRUE(same_values(b.running_mean, a.running_mean));
  EXPECT_TRUE(same_values(b.running_var, a.running_var));
  EXPECT_EQ(b.num_batches_tracked.item<int64_t>(), 2);
  a.eval();
  b.eval();
  Tensor x = randn_like_shape({2, 3, 2, 2}, gen);
  EXPECT_TRUE(same_values(a(x), b(x)));
  // Gradients reach the parameters.
  Tensor loss = sum(mul(a(x), x));
  loss.backward();
  EXPECT_TRUE(a.weight.grad().defined());
  EXPECT_TRUE(a.bias.grad().defined());
}

TEST(NormModuleTest, CompiledTrainingStepsUpdateRunningStatsAsEager) {
  Generator gen(10);
  autograd::NoGradGuard no_grad;  // forward only: outputs without history
  nn::BatchNorm2d eager(4), compiled_bn(4);
  CompiledFunction f =
      compile([&](std::span<const Tensor> in) { return TensorList{compiled_bn(in[0])}; });
  for (int step = 0; step < 4; ++step) {
    Tensor x = randn_like_shape({3, 4, 3, 3}, gen);
    Tensor want = eager(x);
    Tensor got = f({x})[0];
    EXPECT_TRUE(same_values(got, want)) << "step " << step;
    EXPECT_TRUE(same_values(compiled_bn.running_mean, eager.running_mean)) << "step " << step;
    EXPECT_TRUE(same_values(compiled_bn.running_var, eager.running_var)) << "step " << step;
    EXPECT_EQ(compiled_bn.num_batches_tracked.item<int64_t>(), step + 1);
  }
  ASSERT_EQ(f.entries().size(), 1u);
  EXPECT_EQ(f.entries()[0].hits, 3) << f.explain();
}

// A whole compiled training step (forward, backward) against eager: the same loss, gradients
// and running stats after every replay.
TEST(NormModuleTest, CompiledBackwardStepsMatchEager) {
  Generator gen(12);
  nn::BatchNorm2d eager(3), compiled_bn(3);
  auto step = [](nn::BatchNorm2d& bn, const Tensor& x) {
    bn.zero_grad(false);  // gradients kept in place, as compiled steps need
    Tensor loss = sum(mul(bn(x), x));
    loss.backward();
    return loss;
  };
  // One eager step on each first: the gradients exist before compiling.
  Tensor warm = randn_like_shape({4, 3, 2, 3}, gen);
  step(eager, warm);
  step(compiled_bn, warm);
  CompiledFunction f = compile(
      [&](std::span<const Tensor> in) { return TensorList{step(compiled_bn, in[0]).detach()}; });
  for (int i = 0; i < 3; ++i) {
    Tensor x = randn_like_shape({4, 3, 2, 3}, gen);
    Tensor want = step(eager, x);
    Tensor got = f({x})[0];
    EXPECT_TRUE(same_values(got, want)) << "step " << i;
    EXPECT_TRUE(same_values(compiled_bn.weight.grad(), eager.weight.grad())) << "step " << i;
    EXPECT_TRUE(same_values(compiled_bn.bias.grad(), eager.bias.grad())) << "step " << i;
    EXPECT_TRUE(same_values(compiled_bn.running_var, eager.running_var)) << "step " << i;
  }
  EXPECT_EQ(f.entries()[0].hits, 2) << f.explain();
}

TEST(NormModuleTest, GroupNormMatchesTorch) {
  Generator gen(11);
  nn::GroupNorm gn(2, 6);
  torch::nn::GroupNorm tg(torch::nn::GroupNormOptions(2, 6));
  {
    torch::NoGradGuard no_grad;
    autograd::NoGradGuard kiln_no_grad;
    gn.weight.copy_(randn_like_shape({6}, gen));
    gn.bias.copy_(randn_like_shape({6}, gen));
    tg->weight.copy_(to_aten(gn.weight));
    tg->bias.copy_(to_aten(gn.bias));
  }
  for (std::vector<int64_t> shape : {std::vector<int64_t>{3, 6}, {2, 6, 5}, {2, 6, 3, 4}}) {
    Tensor x = randn_like_shape(shape, gen);
    EXPECT_TRUE(close(gn(x), tg->forward(to_aten(x))));
  }
  nn::GroupNorm plain(3, 6, 1e-3, false);
  EXPECT_EQ(plain.parameters().size(), 0u);
  Tensor x = randn_like_shape({2, 6, 4}, gen);
  EXPECT_TRUE(close(plain(x), torch::group_norm(to_aten(x), 3, {}, {}, 1e-3)));
}

TEST(NormModuleTest, Errors) {
  nn::BatchNorm2d bn(3);
  Tensor rm = clone(bn.running_mean);
  expect_value_error([&] { bn(ones({2, 3, 4})); }, {"[BatchNorm2d]", "4-D", "[2, 3, 4]"});
  expect_value_error(
      [&] {
        bn(ones({2, 5, 4, 4}));
      },
      {"[BatchNorm2d]", "3 channels", "[2, 5, 4, 4]"});
  expect_value_error(
      [&] {
        bn(ones({1, 3, 1, 1}));
      },
      {"[batch_norm]", "Expected more than 1 value per channel"});
  EXPECT_TRUE(same_values(bn.running_mean, rm));
  // Nothing is written when the op refuses: not even the batch count.
  EXPECT_EQ(bn.num_batches_tracked.item<int64_t>(), 0);
  nn::BatchNorm1d b1(4);
  expect_value_error([&] { b1(ones({2, 4, 3, 3})); }, {"[BatchNorm1d]", "2-D or 3-D"});
  expect_value_error([] { nn::BatchNorm1d(0); }, {"[BatchNorm1d]", "num_features", "0"});
  expect_value_error([] { nn::GroupNorm(4, 6); }, {"[GroupNorm]", "divisible", "6", "4"});
  nn::GroupNorm gn(2, 6);
  expect_value_error([&] { gn(ones({2, 4, 3})); }, {"[GroupNorm]", "[2, 4, 3]"});
}

}  // namespace
}  // namespace kiln::test

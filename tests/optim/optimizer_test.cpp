// kiln/optim/optimizer.h against torch::optim: SGD in each of its modes and AdamW, three steps
// on parameters of different shapes with fixed random gradients; skipped parameters, zero_grad,
// constructor errors, set_lr, clip_grad_norm_ against torch::nn::utils::clip_grad_norm_, and
// the learning-rate schedules against their closed forms.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <functional>
#include <numbers>
#include <string>
#include <vector>

#include "kiln/core/error.h"
#include "kiln/ops/ops.h"
#include "kiln/optim/optimizer.h"
#include "tests/ops/aten_compare.h"

namespace kiln::test {
namespace {

testing::AssertionResult close(const Tensor& got, const torch::Tensor& want, double rtol = 1e-05,
                               double atol = 1e-06) {
  return close_to_aten(got, want, rtol, atol);
}

// The same parameters in Kiln and libtorch: [3, 4], [5], [2, 3, 2], float32, N(0, 1).
struct Params {
  TensorList k;
  std::vector<torch::Tensor> t;
};
Params make_params(Generator& gen, DType dtype = kFloat32) {
  Params out;
  const std::vector<std::vector<int64_t>> shapes = {{3, 4}, {5}, {2, 3, 2}};
  for (const std::vector<int64_t>& shape : shapes) {
    Tensor k = randn(shape, &gen, dtype);
    out.t.push_back(to_aten(k).requires_grad_());
    k.requires_grad_();
    out.k.push_back(k);
  }
  return out;
}

// Sets the same fresh N(0, 1) gradient on parameter i in both; `skip` leaves it undefined.
void set_grads(Params& ps, Generator& gen, const std::vector<bool>& skip = {}) {
  for (size_t i = 0; i < ps.k.size(); ++i) {
    if (i < skip.size() && skip[i]) {
      ps.k[i].set_grad(Tensor());
      ps.t[i].mutable_grad() = torch::Tensor();
      continue;
    }
    Tensor g = randn(ps.k[i].sizes(), &gen, ps.k[i].dtype());
    ps.t[i].mutable_grad() = to_aten(g);
    ps.k[i].set_grad(g);
  }
}

void expect_match(const Params& ps, const std::string& when, double rtol = 1e-5,
                  double atol = 1e-6) {
  for (size_t i = 0; i < ps.k.size(); ++i)
    EXPECT_TRUE(close(ps.k[i], ps.t[i].detach(), rtol, atol)) << when << ", parameter " << i;
}

// Three SGD steps with the same options in both.
void check_sgd(const optim::SGDOptions& o) {
  Generator gen(100);
  Params ps = make_params(gen);
  optim::SGD opt(ps.k, o);
  torch::optim::SGD topt(ps.t, torch::optim::SGDOptions(o.lr)
                                   .momentum(o.momentum)
                                   .dampening(o.dampening)
                                   .weight_decay(o.weight_decay)
                                   .nesterov(o.nesterov));
  for (int step = 1; step <= 3; ++step) {
    set_grads(ps, gen);
    opt.step();
    topt.step();
    expect_match(ps, "step " + std::to_string(step));
  }
  EXPECT_EQ(opt.steps(), 3);
}

// ---------------------------------------------------------------- SGD vs torch::optim::SGD

TEST(SGDTorch, Plain) { check_sgd({.lr = 0.1}); }
TEST(SGDTorch, Momentum) { check_sgd({.lr = 0.1, .momentum = 0.9}); }
TEST(SGDTorch, Dampening) { check_sgd({.lr = 0.1, .momentum = 0.9, .dampening = 0.3}); }
TEST(SGDTorch, Nesterov) { check_sgd({.lr = 0.1, .momentum = 0.9, .nesterov = true}); }
TEST(SGDTorch, WeightDecay) { check_sgd({.lr = 0.1, .weight_decay = 0.05}); }
TEST(SGDTorch, EverythingTogether) {
  check_sgd({.lr = 0.05, .momentum = 0.8, .weight_decay = 0.01, .nesterov = true});
  check_sgd({.lr = 0.05, .momentum = 0.8, .dampening = 0.5, .weight_decay = 0.01});
}

TEST(SGDTorch, MomentumBuffersAreKept) {
  Generator gen(101);
  Params ps = make_params(gen);
  optim::SGD opt(ps.k, {.lr = 0.1, .momentum = 0.9});
  for (const Tensor& b : opt.momentum_buffers()) EXPECT_FALSE(b.defined());
  set_grads(ps, gen);
  TensorList first_grads;
  for (const Tensor& p : ps.k) first_grads.push_back(p.grad().clone());
  opt.step();
  // After one step the buffer is the gradient itself, and a separate tensor from it.
  for (size_t i = 0; i < ps.k.size(); ++i) {
    ASSERT_TRUE(opt.momentum_buffers()[i].defined());
    EXPECT_TRUE(same_values(opt.momentum_buffers()[i], first_grads[i]));
    EXPECT_NE(opt.momentum_buffers()[i].data_ptr(), ps.k[i].grad().data_ptr());
  }
}

TEST(SGDTorch, SkipsParametersWithoutGrad) {
  Generator gen(102);
  Params ps = make_params(gen);
  optim::SGD opt(ps.k, {.lr = 0.1, .momentum = 0.9});
  torch::optim::SGD topt(ps.t, torch::optim::SGDOptions(0.1).momentum(0.9));
  Tensor p1_before = ps.k[1].detach().clone();
  set_grads(ps, gen, {false, true, false});
  opt.step();
  topt.step();
  EXPECT_TRUE(same_values(ps.k[1], p1_before));
  EXPECT_FALSE(opt.momentum_buffers()[1].defined());  // no state for the skipped parameter
  expect_match(ps, "step 1");
  for (int step = 2; step <= 3; ++step) {
    set_grads(ps, gen);
    opt.step();
    topt.step();
    expect_match(ps, "step " + std::to_string(step));
  }
}

TEST(SGDTorch, NonContiguousGrad) {
  Generator gen(103);
  Params ps = make_params(gen);
  optim::SGD opt(ps.k, {.lr = 0.1, .momentum = 0.9, .weight_decay = 0.01});
  torch::optim::SGD topt(ps.t, torch::optim::SGDOptions(0.1).momentum(0.9).weight_decay(0.01));
  for (int step = 1; step <= 2; ++step) {
    set_grads(ps, gen);
    Tensor g = transpose(randn({4, 3}, &gen, kFloat32), 0, 1);  // [3, 4], strides [1, 3]
    ASSERT_FALSE(g.is_contiguous());
    ps.k[0].set_grad(g);
    ps.t[0].mutable_grad() = to_aten(g);
    opt.step();
    topt.step();
    expect_match(ps, "step " + std::to_string(step));
  }
}

// Float64 parameters are updated in float64 (a float32 computation would be off by ~1e-8).
TEST(SGDTorch, Float64) {
  Generator gen(104);
  Params ps = make_params(gen, kFloat64);
  optim::SGD opt(ps.k, {.lr = 0.1, .momentum = 0.9, .weight_decay = 0.01, .nesterov = true});
  torch::optim::SGD topt(
      ps.t, torch::optim::SGDOptions(0.1).momentum(0.9).weight_decay(0.01).nesterov(true));
  for (int step = 1; step <= 3; ++step) {
    set_grads(ps, gen);
    opt.step();
    topt.step();
    expect_match(ps, "step " + std::to_string(step), 1e-12, 1e-14);
  }
}

// ---------------------------------------------------------------- AdamW vs torch::optim::AdamW

void check_adamw(const optim::AdamWOptions& o) {
  Generator gen(200);
  Params ps = make_params(gen);
  optim::AdamW opt(ps.k, o);
  torch::optim::AdamW topt(ps.t, torch::optim::AdamWOptions(o.lr)
                                     .betas({o.beta1, o.beta2})
                                     .eps(o.eps)
                                     .weight_decay(o.weight_decay));
  for (int step = 1; step <= 3; ++step) {
    set_grads(ps, gen);
    opt.step();
    topt.step();
    expect_match(ps, "step " + std::to_string(step));
    EXPECT_EQ(opt.steps(), step);
  }
}

TEST(AdamWTorch, Defaults) { check_adamw({}); }
TEST(AdamWTorch, CustomBetasEpsDecay) {
  check_adamw({.lr = 1e-2, .beta1 = 0.8, .beta2 = 0.99, .eps = 1e-6, .weight_decay = 0.1});
}
TEST(AdamWTorch, NoWeightDecay) { check_adamw({.lr = 3e-3, .weight_decay = 0.0}); }

TEST(AdamWTorch, NonContiguousGrad) {
  Generator gen(201);
  Params ps = make_params(gen);
  optim::AdamW opt(ps.k, {.lr = 1e-2, .weight_decay = 0.1});
  torch::optim::AdamW topt(ps.t, torch::optim::AdamWOptions(1e-2).weight_decay(0.1));
  for (int step = 1; step <= 2; ++step) {
    set_grads(ps, gen);
    Tensor g = transpose(randn({4, 3}, &gen, kFloat32), 0, 1);
    ps.k[0].set_grad(g);
    ps.t[0].mutable_grad() = to_aten(g);
    opt.step();
    topt.step();
    expect_match(ps, "step " + std::to_string(step));
  }
}

TEST(AdamWTorch, Float64) {
  Generator gen(204);
  Params ps = make_params(gen, kFloat64);
  optim::AdamW opt(ps.k, {.lr = 1e-2, .weight_decay = 0.1});
  torch::optim::AdamW topt(ps.t, torch::optim::AdamWOptions(1e-2).weight_decay(0.1));
  for (int step = 1; step <= 3; ++step) {
    set_grads(ps, gen);
    opt.step();
    topt.step();
    expect_match(ps, "step " + std::to_string(step), 1e-12, 1e-14);
    for (const Tensor& m : opt.exp_avg()) EXPECT_EQ(m.dtype(), kFloat64);
  }
}

// A parameter without a gradient is not changed and its state does not advance: when it
// first gets a gradient (step 2 here), its update is a first step's update, as in PyTorch,
// where each parameter keeps its own step count.
TEST(AdamWTorch, SkipsParametersWithoutGrad) {
  Generator gen(202);
  Params ps = make_params(gen);
  optim::AdamW opt(ps.k, {.lr = 1e-2, .weight_decay = 0.1});
  torch::optim::AdamW topt(ps.t, torch::optim::AdamWOptions(1e-2).weight_decay(0.1));
  Tensor p1_before = ps.k[1].detach().clone();
  set_grads(ps, gen, {false, true, false});
  opt.step();
  topt.step();
  EXPECT_TRUE(same_values(ps.k[1], p1_before));
  EXPECT_TRUE(same_values(opt.exp_avg()[1], zeros({5}, kFloat32)));
  EXPECT_TRUE(same_values(opt.exp_avg_sq()[1], zeros({5}, kFloat32)));
  expect_match(ps, "step 1");
  for (int step = 2; step <= 3; ++step) {
    set_grads(ps, gen);
    opt.step();
    topt.step();
    expect_match(ps, "step " + std::to_string(step));
  }
}

TEST(AdamWTorch, SetLrBetweenSteps) {
  Generator gen(203);
  Params ps = make_params(gen);
  optim::AdamW opt(ps.k, {.lr = 1e-2, .weight_decay = 0.1});
  torch::optim::AdamW topt(ps.t, torch::optim::AdamWOptions(1e-2).weight_decay(0.1));
  for (int step = 1; step <= 3; ++step) {
    double lr = 1e-2 / step;
    opt.set_lr(lr);
    for (auto& group : topt.param_groups())
      static_cast<torch::optim::AdamWOptions&>(group.options()).lr(lr);
    EXPECT_EQ(opt.lr(), lr);
    set_grads(ps, gen);
    opt.step();
    topt.step();
    expect_match(ps, "step " + std::to_string(step));
  }
}

TEST(OptimizerTest, StepCountAdvancesOnlyWithGradients) {
  Generator gen(300);
  Params ps = make_params(gen);
  optim::AdamW adamw(ps.k, {});
  optim::SGD sgd(ps.k, {});
  EXPECT_EQ(adamw.steps(), 0);
  adamw.step();  // no gradients yet: nothing happens
  sgd.step();
  EXPECT_EQ(adamw.steps(), 0);
  EXPECT_EQ(sgd.steps(), 0);
  for (size_t i = 0; i < 3; ++i) EXPECT_TRUE(close(ps.k[i], ps.t[i].detach(), 0, 0)) << i;
  set_grads(ps, gen);
  for (int i = 1; i <= 4; ++i) {
    adamw.step();
    EXPECT_EQ(adamw.steps(), i);
  }
}

TEST(OptimizerTest, ZeroGradInPlaceAndSetToNone) {
  Generator gen(301);
  Params ps = make_params(gen);
  optim::SGD opt(ps.k, {});
  set_grads(ps, gen, {false, false, true});
  void* a0 = ps.k[0].grad().data_ptr();
  void* a1 = ps.k[1].grad().data_ptr();
  opt.zero_grad();
  EXPECT_EQ(ps.k[0].grad().data_ptr(), a0);
  EXPECT_EQ(ps.k[1].grad().data_ptr(), a1);
  EXPECT_TRUE(same_values(ps.k[0].grad(), zeros({3, 4}, kFloat32)));
  EXPECT_TRUE(same_values(ps.k[1].grad(), zeros({5}, kFloat32)));
  EXPECT_FALSE(ps.k[2].grad().defined());  // stays undefined
  opt.zero_grad(/*set_to_none=*/true);
  for (const Tensor& p : ps.k) EXPECT_FALSE(p.grad().defined());
}

TEST(OptimizerTest, ConstructorErrors) {
  Generator gen(302);
  Params ps = make_params(gen);
  expect_value_error([] { optim::SGD({}, {}); }, {"[optimizer]", "empty"});
  expect_value_error([] { optim::AdamW({}, {}); }, {"[optimizer]", "empty"});
  Tensor non_leaf = mul(ps.k[0], 2.0);
  ASSERT_FALSE(non_leaf.is_leaf());
  expect_value_error(
      [&] {
        optim::SGD({ps.k[1], non_leaf}, {});
      },
      {"[optimizer]", "parameter 1", "leaf"});
  Tensor no_grad = zeros({2}, kFloat32);
  expect_value_error([&] { optim::AdamW({no_grad}, {}); },
                     {"[optimizer]", "parameter 0", "requires grad"});
  expect_value_error([&] { optim::SGD({Tensor()}, {}); }, {"[optimizer]", "undefined"});
  expect_value_error(
      [&] {
        optim::SGD({ps.k[0], ps.k[1], ps.k[0]}, {});
      },
      {"[optimizer]", "parameter 2", "twice", "0"});
  expect_value_error([&] { optim::SGD(ps.k, {.lr = -0.1}); }, {"learning rate", "-0.1"});
  expect_value_error([&] { optim::AdamW(ps.k, {.lr = -1e-3}); }, {"learning rate", "-0.001"});
  expect_value_error([&] { optim::AdamW(ps.k, {.lr = std::nan("")}); }, {"learning rate"});
  expect_value_error([&] { optim::AdamW(ps.k, {.beta1 = 1.0}); }, {"[AdamW]", "betas", "1"});
  expect_value_error([&] { optim::AdamW(ps.k, {.beta2 = -0.1}); }, {"[AdamW]", "betas", "-0.1"});
  expect_value_error([&] { optim::AdamW(ps.k, {.beta2 = 1.5}); }, {"[AdamW]", "betas", "1.5"});
  expect_value_error([&] { optim::AdamW(ps.k, {.eps = -1e-8}); }, {"[AdamW]"});
  expect_value_error([&] { optim::AdamW(ps.k, {.weight_decay = -0.1}); }, {"[AdamW]"});
  expect_value_error([&] { optim::SGD(ps.k, {.nesterov = true}); }, {"[SGD]", "nesterov"});
  expect_value_error(
      [&] { optim::SGD(ps.k, {.momentum = 0.9, .dampening = 0.1, .nesterov = true}); },
      {"[SGD]", "nesterov"});
  expect_value_error([&] { optim::SGD(ps.k, {.momentum = -0.9}); }, {"[SGD]", "-0.9"});
  expect_value_error([&] { optim::SGD(ps.k, {.weight_decay = -1.0}); }, {"[SGD]"});
}

TEST(OptimizerTest, SetLr) {
  Generator gen(303);
  Params ps = make_params(gen);
  optim::SGD opt(ps.k, {.lr = 0.1});
  EXPECT_EQ(opt.lr(), 0.1);
  opt.set_lr(0.05);
  EXPECT_EQ(opt.lr(), 0.05);
  expect_value_error([&] { opt.set_lr(-1.0); }, {"learning rate", "-1"});
  expect_value_error([&] { opt.set_lr(INFINITY); }, {"learning rate"});
  EXPECT_EQ(opt.lr(), 0.05);  // unchanged by the failed calls
  set_grads(ps, gen);
  opt.step();
  torch::optim::SGD topt(ps.t, torch::optim::SGDOptions(0.05));
  topt.step();
  expect_match(ps, "after set_lr");
  opt.set_lr(0.0);  // allowed: a step then changes nothing
  Tensor before = ps.k[0].detach().clone();
  opt.step();
  EXPECT_TRUE(same_values(ps.k[0], before));
}

// ---------------------------------------------------------------- clip_grad_norm_

TEST(ClipGradNorm, ClipsLikeTorch) {
  Generator gen(400);
  Params ps = make_params(gen);
  set_grads(ps, gen);
  Tensor norm = optim::clip_grad_norm_(ps.k, 1.0);  // the norm of 29 N(0, 1) values is ~5
  double tnorm = torch::nn::utils::clip_grad_norm_(ps.t, 1.0);
  ASSERT_GT(tnorm, 1.0);
  EXPECT_EQ(norm.dim(), 0);
  EXPECT_EQ(norm.dtype(), kFloat32);
  EXPECT_NEAR(norm.item<double>(), tnorm, 1e-5 * tnorm);
  for (size_t i = 0; i < 3; ++i) EXPECT_TRUE(close(ps.k[i].grad(), ps.t[i].grad())) << i;
  // The clipped gradients have norm max_norm (up to the 1e-6 in the denominator).
  double sq = 0;
  for (const Tensor& p : ps.k)
    sq += to_aten(p.grad()).to(torch::kDouble).pow(2).sum().item<double>();
  EXPECT_NEAR(std::sqrt(sq), 1.0, 1e-5);
}

TEST(ClipGradNorm, BelowMaxChangesNothing) {
  Generator gen(401);
  Params ps = make_params(gen);
  set_grads(ps, gen);
  TensorList before;
  std::vector<void*> addresses;
  for (const Tensor& p : ps.k) {
    before.push_back(p.grad().clone());
    addresses.push_back(p.grad().data_ptr());
  }
  Tensor norm = optim::clip_grad_norm_(ps.k, 100.0);
  double tnorm = torch::nn::utils::clip_grad_norm_(ps.t, 100.0);
  EXPECT_NEAR(norm.item<double>(), tnorm, 1e-5 * tnorm);
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_TRUE(same_values(ps.k[i].grad(), before[i])) << i;
    EXPECT_EQ(ps.k[i].grad().data_ptr(), addresses[i]) << i;
    EXPECT_TRUE(close(ps.k[i].grad(), ps.t[i].grad())) << i;
  }
}

TEST(ClipGradNorm, SkipsParametersWithoutGrad) {
  Generator gen(402);
  Params ps = make_params(gen);
  set_grads(ps, gen, {false, true, false});
  Tensor norm = optim::clip_grad_norm_(ps.k, 0.5);
  double tnorm = torch::nn::utils::clip_grad_norm_(ps.t, 0.5);
  EXPECT_NEAR(norm.item<double>(), tnorm, 1e-5 * tnorm);
  EXPECT_FALSE(ps.k[1].grad().defined());
  EXPECT_TRUE(close(ps.k[0].grad(), ps.t[0].grad()));
  EXPECT_TRUE(close(ps.k[2].grad(), ps.t[2].grad()));
}

TEST(ClipGradNorm, Errors) {
  Generator gen(403);
  Params ps = make_params(gen);
  expect_value_error([&] { optim::clip_grad_norm_(ps.k, 1.0); }, {"[clip_grad_norm_]", "gradient"});
  set_grads(ps, gen);
  expect_value_error([&] { optim::clip_grad_norm_(ps.k, 0.0); }, {"[clip_grad_norm_]", "0"});
  expect_value_error([&] { optim::clip_grad_norm_(ps.k, -1.0); }, {"[clip_grad_norm_]", "-1"});
}

// ---------------------------------------------------------------- learning-rate schedules

// llm.c's schedule: max_lr (s + 1) / warmup during warm-up, then cosine from max_lr at `warmup`
// to min_lr at `total`, and min_lr after.
double closed_form(const optim::WarmupCosineLR& s, int64_t step) {
  if (step < s.warmup) return s.max_lr * double(step + 1) / double(s.warmup);
  if (step >= s.total) return s.min_lr;
  double progress = double(step - s.warmup) / double(s.total - s.warmup);
  return s.min_lr + 0.5 * (s.max_lr - s.min_lr) * (1.0 + std::cos(std::numbers::pi * progress));
}

TEST(LRSchedule, WarmupCosineClosedForm) {
  const optim::WarmupCosineLR s{.max_lr = 6e-4, .min_lr = 6e-5, .warmup = 10, .total = 110};
  EXPECT_DOUBLE_EQ(s(0), 6e-5);     // first warm-up step: max_lr / warmup
  EXPECT_DOUBLE_EQ(s(9), 6e-4);     // last warm-up step reaches max_lr
  EXPECT_DOUBLE_EQ(s(10), 6e-4);    // cosine starts at max_lr
  EXPECT_DOUBLE_EQ(s(60), 3.3e-4);  // halfway: (max + min) / 2
  EXPECT_DOUBLE_EQ(s(110), 6e-5);   // total: min_lr
  EXPECT_DOUBLE_EQ(s(1000), 6e-5);  // after total: min_lr
  for (int64_t step : {0, 1, 4, 9, 10, 11, 35, 60, 85, 109, 110, 111, 500})
    EXPECT_NEAR(s(step), closed_form(s, step), 1e-15) << step;
  for (int64_t step = 10; step < 110; ++step) EXPECT_GE(s(step), s(step + 1)) << step;
  for (int64_t step = 0; step < 9; ++step) EXPECT_LT(s(step), s(step + 1)) << step;
}

TEST(LRSchedule, NoWarmupAndConstant) {
  const optim::WarmupCosineLR s{.max_lr = 1.0, .min_lr = 0.0, .warmup = 0, .total = 4};
  EXPECT_DOUBLE_EQ(s(0), 1.0);
  EXPECT_DOUBLE_EQ(s(2), 0.5);
  EXPECT_NEAR(s(3), 0.5 * (1 + std::cos(std::numbers::pi * 0.75)), 1e-15);
  EXPECT_DOUBLE_EQ(s(4), 0.0);
  EXPECT_DOUBLE_EQ(s(9), 0.0);
  const optim::ConstantLR c{.lr = 0.25};
  EXPECT_EQ(c(0), 0.25);
  EXPECT_EQ(c(12345), 0.25);
}

}  // namespace
}  // namespace kiln::test

// kiln/amp/grad_scaler.h: the scale and unscale arithmetic, inf and NaN detection, skipped steps
// (AdamW and SGD with momentum leave everything bitwise unchanged), the dynamic scale, the state
// dict, a float16 training loop that needs loss scaling, compiled steps against eager ones with
// a skipped step, the errors; on the CPU and sim. Run as a world of one and on 2 ranks, where a
// single rank's inf (plain gradients and FSDP shards) must make both ranks skip.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "kiln/amp/autocast.h"
#include "kiln/amp/grad_scaler.h"
#include "kiln/compile/compile.h"
#include "kiln/core/error.h"
#include "kiln/distributed/collectives.h"
#include "kiln/distributed/init.h"
#include "kiln/dtensor/dtensor.h"
#include "kiln/nn/layers.h"
#include "kiln/ops/ops.h"
#include "kiln/optim/optimizer.h"
#include "kiln/parallel/fsdp.h"
#include "tests/backend/sim_util.h"
#include "tests/dtensor/dtensor_test_util.h"

namespace kiln::test {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

std::vector<float> values(const Tensor& t) {
  return t.to(Device(kCPU)).to(kFloat32).contiguous().to_vector<float>();
}
std::vector<std::vector<float>> snapshot(const TensorList& ts) {
  std::vector<std::vector<float>> out;
  for (const Tensor& t : ts)
    out.push_back(values(dtensor::is_dtensor(t) ? dtensor::to_local(t) : t));
  return out;
}

template <class F>
void expect_error(F f, const std::string& fragment) {
  try {
    f();
    ADD_FAILURE() << "no error; expected one containing: " << fragment;
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_EQ(what.rfind("[", 0), 0u) << what;
    EXPECT_NE(what.find(fragment), std::string::npos) << what;
  }
}

std::shared_ptr<nn::Linear> linear_on(Device d, uint64_t seed, int64_t in = 4, int64_t out = 3) {
  Generator g(seed);
  auto m = std::make_shared<nn::Linear>(in, out, true, nn::Init{.gen = &g});
  m->to(d);
  return m;
}

// Gradients g on every parameter of `m`, times `factor`.
void set_grads(nn::Module& m, double factor, uint64_t seed) {
  Generator g(seed);
  for (const Tensor& p : m.parameters())
    p.set_grad(mul(randn(p.sizes(), &g).to(p.device()), factor));
}

class GradScalerTest : public ::testing::TestWithParam<const char*> {
 protected:
  Device dev() const { return std::string(GetParam()) == "sim" ? sim() : Device(kCPU); }
};

TEST_P(GradScalerTest, ScaleMultipliesTheLoss) {
  amp::GradScaler scaler(dev(), {.init_scale = 1024});
  Tensor loss = full({}, 0.375, kFloat32, dev());
  EXPECT_EQ(values(scaler.scale(loss)), std::vector<float>{384.f});
  EXPECT_EQ(scaler.get_scale(), 1024.0);
  amp::GradScaler off(dev(), {.enabled = false});
  EXPECT_TRUE(off.scale(loss).is_same(loss));
  EXPECT_EQ(off.get_scale(), 1.0);
}

TEST_P(GradScalerTest, UnscaleDividesTheGradients) {
  auto m = linear_on(dev(), 1);
  optim::SGD opt(m->parameters(), {.lr = 0.1});
  set_grads(*m, 1.0, 2);
  TensorList grads;
  for (const Tensor& p : m->parameters()) grads.push_back(p.grad().clone());
  amp::GradScaler scaler(dev(), {.init_scale = 3.0});  // 1 / 3 rounded once to float32
  scaler.unscale_(opt);
  const float inv = static_cast<float>(1.0 / 3.0);
  for (size_t i = 0; i < grads.size(); ++i) {
    std::vector<float> want = values(grads[i]);
    for (float& v : want) v *= inv;
    EXPECT_EQ(values(m->parameters()[i].grad()), want) << i;
  }
}

// found_inf is set by an inf or a NaN in any tensor, in every float dtype, and never reset.
TEST_P(GradScalerTest, NonFiniteCheckFindsInfAndNaN) {
  for (DType d : {kFloat16, kBFloat16, kFloat32, kFloat64}) {
    for (float bad : {kInf, -kInf, std::nanf("")}) {
      TensorList g{ones({3}, d, dev()), ones({2, 2}, d, dev())};
      select(g[1], 0, 1).fill_(bad);
      Tensor found = zeros({}, kFloat32, dev());
      amp_non_finite_check_and_unscale_(g, found, full({}, 0.5, kFloat32, dev()));
      EXPECT_EQ(values(found)[0], 1.f) << name(d) << " " << bad;
      EXPECT_EQ(values(g[0]), std::vector<float>(3, 0.5f));
      amp_non_finite_check_and_unscale_({g[0]}, found, full({}, 1.0, kFloat32, dev()));
      EXPECT_EQ(values(found)[0], 1.f) << "reset";
    }
    TensorList fine{ones({3}, d, dev())};
    Tensor found = zeros({}, kFloat32, dev());
    amp_non_finite_check_and_unscale_(fine, found, full({}, 0.5, kFloat32, dev()));
    EXPECT_EQ(values(found)[0], 0.f) << name(d);
  }
}

// A step whose gradients overflowed leaves parameters, moments, buffers and the device step
// counts bitwise as they were, and halves the scale.
TEST_P(GradScalerTest, SkippedStepChangesNothing) {
  for (bool adamw : {true, false}) {
    SCOPED_TRACE(adamw ? "AdamW" : "SGD");
    auto m = linear_on(dev(), 3);
    std::unique_ptr<optim::Optimizer> opt;
    if (adamw)
      opt = std::make_unique<optim::AdamW>(m->parameters(), optim::AdamWOptions{.lr = 0.1});
    else
      opt = std::make_unique<optim::SGD>(
          m->parameters(), optim::SGDOptions{.lr = 0.1, .momentum = 0.9, .nesterov = true});
    amp::GradScaler scaler(dev(), {.init_scale = 256});
    for (int s = 0; s < 2; ++s) {  // two clean steps: moments and buffers exist
      set_grads(*m, 256, 10 + s);
      scaler.step(*opt);
      scaler.update();
    }
    TensorList state = m->parameters();
    if (auto* a = dynamic_cast<optim::AdamW*>(opt.get())) {
      for (const TensorList* l : {&a->exp_avg(), &a->exp_avg_sq(), &a->step_counts()})
        state.insert(state.end(), l->begin(), l->end());
    } else {
      auto* sgd = static_cast<optim::SGD*>(opt.get());
      state.insert(state.end(), sgd->momentum_buffers().begin(), sgd->momentum_buffers().end());
    }
    const auto before = snapshot(state);
    set_grads(*m, 256, 20);
    select(m->parameters()[1].grad(), 0, 2).fill_(kInf);
    scaler.step(*opt);
    scaler.update();
    EXPECT_EQ(snapshot(state), before);
    EXPECT_EQ(scaler.get_scale(), 128.0);
    EXPECT_EQ(values(scaler.growth_tracker())[0], 0.f);
    EXPECT_EQ(opt->steps(), 3);  // the host counts the call (Optimizer::step's contract)
    // The next clean step moves again.
    set_grads(*m, 128, 21);
    scaler.step(*opt);
    scaler.update();
    EXPECT_NE(snapshot(m->parameters()), decltype(before)(before.begin(), before.begin() + 2));
  }
}

TEST_P(GradScalerTest, ScaleGrowsAfterTheIntervalAndBacksOff) {
  auto m = linear_on(dev(), 4);
  optim::SGD opt(m->parameters(), {.lr = 0.0});
  amp::GradScaler scaler(dev(), {.init_scale = 8, .growth_interval = 3});
  std::vector<double> scales;
  for (int s = 0; s < 8; ++s) {
    set_grads(*m, 1.0, 30 + s);
    if (s == 4) select(m->parameters()[0].grad().view({-1}), 0, 0).fill_(std::nanf(""));
    scaler.step(opt);
    scaler.update();
    scales.push_back(scaler.get_scale());
  }
  // 3 clean steps double it; the NaN at step 4 halves it and restarts the count.
  EXPECT_EQ(scales, (std::vector<double>{8, 8, 16, 16, 8, 8, 8, 16}));
}

TEST_P(GradScalerTest, StateDictRoundTrip) {
  auto m = linear_on(dev(), 5);
  optim::SGD opt(m->parameters(), {.lr = 0.0});
  amp::GradScaler a(
      dev(), {.init_scale = 32, .growth_factor = 4, .backoff_factor = 0.25, .growth_interval = 5});
  for (int s = 0; s < 2; ++s) {
    set_grads(*m, 1.0, 40 + s);
    a.step(opt);
    a.update();
  }
  optim::StateDict sd = a.state_dict();
  amp::GradScaler b{Device(kCPU)};
  b.load_state_dict(sd);
  EXPECT_EQ(b.get_scale(), 32.0);
  EXPECT_EQ(values(b.growth_tracker())[0], 2.f);
  EXPECT_EQ(b.options().growth_factor, 4.0);
  EXPECT_EQ(b.options().backoff_factor, 0.25);
  EXPECT_EQ(b.options().growth_interval, 5);
  // Bad state dicts change nothing.
  amp::GradScaler c(Device(kCPU), {.init_scale = 7});
  optim::StateDict bad = sd;
  bad[0].second = full({}, -1.0);
  expect_error([&] { c.load_state_dict(bad); }, "init_scale");
  expect_error([&] { c.load_state_dict({sd[0]}); }, "missing keys [growth_tracker");
  optim::StateDict extra = sd;
  extra.emplace_back("step", zeros({}));
  expect_error([&] { c.load_state_dict(extra); }, "unexpected keys [step]");
  amp::GradScaler off(dev(), {.enabled = false});
  EXPECT_TRUE(off.state_dict().empty());
  expect_error([&] { c.load_state_dict(off.state_dict()); }, "disabled");
  EXPECT_EQ(c.get_scale(), 7.0);
  EXPECT_EQ(c.options().growth_interval, 2000);
}

TEST_P(GradScalerTest, Errors) {
  auto m = linear_on(dev(), 6);
  optim::SGD opt(m->parameters(), {.lr = 0.1});
  amp::GradScaler scaler(dev());
  set_grads(*m, 1.0, 50);
  expect_error([&] { scaler.update(); }, "no inf checks");
  scaler.unscale_(opt);
  expect_error([&] { scaler.unscale_(opt); }, "unscale_() has already been called");
  scaler.step(opt);
  expect_error([&] { scaler.unscale_(opt); }, "after step()");
  expect_error([&] { scaler.step(opt); }, "step() has already been called");
  scaler.update();
  scaler.step(opt);  // a new step
  scaler.update();
  expect_error([&] { amp::GradScaler(dev(), {.init_scale = 0}); }, "init_scale");
  expect_error([&] { amp::GradScaler(dev(), {.growth_factor = 1}); }, "growth_factor");
  expect_error([&] { amp::GradScaler(dev(), {.backoff_factor = 1}); }, "backoff_factor");
  expect_error([&] { amp::GradScaler(dev(), {.growth_interval = 0}); }, "growth_interval");
  expect_error([&] { opt.step(zeros({1}, kFloat32, dev())); }, "found_inf must be a 0-d float32");
  // A disabled scaler passes everything through: step() is the optimizer's, twice is fine.
  amp::GradScaler off(dev(), {.enabled = false});
  set_grads(*m, 1.0, 51);
  const auto before = snapshot(m->parameters());
  off.unscale_(opt);
  off.step(opt);
  off.step(opt);
  off.update();
  EXPECT_NE(snapshot(m->parameters()), before);
}

// One training step: forward under autocast (float16), the scaled loss's backward, step, update.
Tensor amp_step(nn::Linear& m, optim::Optimizer& opt, amp::GradScaler& scaler, const Tensor& x,
                const Tensor& y, bool autocast) {
  opt.zero_grad();
  Tensor loss;
  {
    amp::AutocastGuard guard(x.device(), kFloat16, autocast);
    loss = mean(pow(sub(m.forward(x), y), 2.0));
  }
  scaler.scale(loss).backward();
  scaler.step(opt);
  scaler.update();
  return loss.detach();
}

// Compiled steps (scale, backward, unscale_, step, update traced once) equal eager ones, a batch
// that overflows included: the replay skips and halves the scale by itself.
TEST_P(GradScalerTest, CompiledStepEqualsEagerWithASkippedStep) {
  auto eager = linear_on(dev(), 7, 8, 4), compiled = linear_on(dev(), 7, 8, 4);
  optim::AdamW eager_opt(eager->parameters(), {.lr = 1e-2});
  optim::AdamW opt(compiled->parameters(), {.lr = 1e-2});
  amp::GradScaler eager_scaler(dev(), {.init_scale = 1024, .growth_interval = 3});
  amp::GradScaler scaler(dev(), {.init_scale = 1024, .growth_interval = 3});
  CompiledFunction f =
      compile([&](const Tensor& x,
                  const Tensor& y) { return amp_step(*compiled, opt, scaler, x, y, false); },
              {.name = "scaled_step"});
  Generator data(8);
  for (int s = 1; s <= 9; ++s) {
    Tensor x = randn({5, 8}, &data), y = randn({5, 4}, &data);
    if (s == 6) select(x, 0, 0).fill_(1e30);  // the loss overflows float32
    x = x.to(dev());
    y = y.to(dev());
    const auto before = snapshot(compiled->parameters());
    Tensor want = amp_step(*eager, eager_opt, eager_scaler, x, y, false);
    Tensor got = f({x, y})[0];
    EXPECT_EQ(values(got), values(want)) << "loss at step " << s;
    EXPECT_EQ(snapshot(compiled->parameters()), snapshot(eager->parameters())) << "step " << s;
    EXPECT_EQ(scaler.get_scale(), eager_scaler.get_scale()) << "step " << s;
    if (s == 6) {
      EXPECT_EQ(snapshot(compiled->parameters()), before);
      EXPECT_EQ(scaler.get_scale(), 1024.0);  // grew to 2048 at step 3, halved now
    }
  }
  EXPECT_EQ(scaler.get_scale(), 2048.0);  // 3 clean steps after the skip
  EXPECT_TRUE(f.miss_reasons().empty()) << f.explain();
  ASSERT_EQ(f.entries().size(), 1u);
  EXPECT_EQ(f.entries()[0].hits, 7);  // the first call warmed up, the second traced
}

INSTANTIATE_TEST_SUITE_P(Devices, GradScalerTest, ::testing::Values("cpu", "sim"),
                         [](const auto& info) { return std::string(info.param); });

// The case loss scaling exists for: a small loss whose float16 gradients flush to zero without
// it (all-zero updates), and train with it.
TEST(GradScaler, Float16TrainingNeedsTheScale) {
  auto run = [](bool scaled) {
    auto m = linear_on(Device(kCPU), 9, 8, 4);
    // AdamW is invariant to the gradients' scale, so the tiny loss trains at a normal pace.
    optim::AdamW opt(m->parameters(), {.lr = 0.05, .eps = 1e-30, .weight_decay = 0});
    amp::GradScaler scaler(Device(kCPU), {.enabled = scaled});
    Generator data(10);
    Tensor x = randn({16, 8}, &data), w = randn({4, 8}, &data);
    Tensor y = mm(x, t(w));
    auto loss_of = [&] { return mean(pow(sub(m->forward(x), y), 2.0)).item<float>(); };
    const float first = loss_of();
    bool any_grad = false;
    for (int s = 0; s < 30; ++s) {
      opt.zero_grad();
      Tensor loss;
      {
        amp::AutocastGuard guard(Device(kCPU), kFloat16);
        loss = mul(mean(pow(sub(m->forward(x), y), 2.0)), 1e-8);  // gradients ~1e-9 < 2^-25
      }
      scaler.scale(loss).backward();
      any_grad = any_grad || any(ne(m->parameters()[0].grad(), 0)).item<bool>();
      scaler.step(opt);
      scaler.update();
    }
    return std::tuple{first, loss_of(), any_grad};
  };
  auto [first_plain, last_plain, grad_plain] = run(false);
  EXPECT_FALSE(grad_plain) << "float16 gradients did not underflow: the case shows nothing";
  EXPECT_EQ(last_plain, first_plain);
  auto [first, last, grad] = run(true);
  EXPECT_TRUE(grad);
  EXPECT_LT(last, 0.5f * first);
}

// ---------------------------------------------------------------- several ranks

int64_t world() { return distributed::world_size(); }

// Plain (replicated) parameters whose gradients differ: only the last rank sees an inf, and every
// rank skips and backs off.
TEST(GradScalerRanks, OneRanksInfSkipsEveryRank) {
  for (bool adamw : {true, false}) {
    auto m = linear_on(Device(kCPU), 11);
    std::unique_ptr<optim::Optimizer> opt;
    if (adamw)
      opt = std::make_unique<optim::AdamW>(m->parameters(), optim::AdamWOptions{.lr = 0.1});
    else
      opt = std::make_unique<optim::SGD>(m->parameters(),
                                         optim::SGDOptions{.lr = 0.1, .momentum = 0.9});
    amp::GradScaler scaler(Device(kCPU), {.init_scale = 64});
    set_grads(*m, 64, 60);
    scaler.step(*opt);
    scaler.update();
    const auto before = snapshot(m->parameters());
    set_grads(*m, 64, 61);
    if (distributed::rank() == world() - 1)
      select(m->parameters()[0].grad().view({-1}), 0, 1).fill_(kInf);
    scaler.step(*opt);
    scaler.update();
    EXPECT_EQ(snapshot(m->parameters()), before) << (adamw ? "AdamW" : "SGD");
    EXPECT_EQ(scaler.get_scale(), 32.0);
  }
}

// FSDP: each rank holds a shard of every gradient; an inf in the last rank's shard only.
TEST(GradScalerRanks, FsdpShardInfSkipsEveryRank) {
  auto m = std::make_shared<nn::Sequential>();
  m->push_back(linear_on(Device(kCPU), 12, 4, 2 * world()));
  parallel::fully_shard((*m)[0], mesh_1d(Device(kCPU)));
  parallel::fully_shard(*m, mesh_1d(Device(kCPU)));
  optim::AdamW opt(m->parameters(), {.lr = 0.1});
  amp::GradScaler scaler(Device(kCPU), {.init_scale = 64});
  Generator data(13);
  Tensor x = randn({3, 4}, &data);
  for (int s = 0; s < 2; ++s) {
    opt.zero_grad();
    scaler.scale(sum(m->forward(x))).backward();
    ASSERT_TRUE(dtensor::is_dtensor(m->parameters()[0].grad()));
    const auto before = snapshot(m->parameters());
    const bool poison = s == 1;
    if (poison && distributed::rank() == world() - 1)
      select(dtensor::to_local(m->parameters()[0].grad()).view({-1}), 0, 0).fill_(kInf);
    scaler.step(opt);
    scaler.update();
    if (poison) {
      EXPECT_EQ(snapshot(m->parameters()), before);
      EXPECT_EQ(scaler.get_scale(), 64.0 * 0.5);
    } else {
      EXPECT_NE(snapshot(m->parameters()), before);
    }
  }
}

}  // namespace
}  // namespace kiln::test

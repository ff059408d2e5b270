// kiln/optim/optimizer.h's state dicts: what AdamW's and SGD's hold, a run stopped, saved
// (through a safetensors file) and resumed into a fresh optimizer matching an uninterrupted one
// bitwise, loading in place, and every bad state dict raising before anything changes.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "kiln/autograd/grad_mode.h"
#include "kiln/core/error.h"
#include "kiln/io/safetensors.h"
#include "kiln/ops/ops.h"
#include "kiln/optim/optimizer.h"

namespace kiln::test {
namespace {

using optim::AdamW;
using optim::StateDict;

// Parameters [3, 4], [5], [2, 3] (float32, N(0, 1)), leaves that require grad.
TensorList make_params(uint64_t seed) {
  Generator gen(seed);
  TensorList ps;
  for (const std::vector<int64_t>& shape : {std::vector<int64_t>{3, 4}, {5}, {2, 3}})
    ps.push_back(randn(shape, &gen).requires_grad_());
  return ps;
}

// Step `step`'s gradients: a pure function of the step, so a resumed run sees the same ones.
// Parameter 1 has no gradient on odd steps, so the per-parameter step counts differ.
void set_grads(const TensorList& ps, int64_t step) {
  Generator gen(1000 + static_cast<uint64_t>(step));
  for (size_t i = 0; i < ps.size(); ++i) {
    Tensor g = randn(ps[i].sizes(), &gen);
    ps[i].set_grad(i == 1 && step % 2 == 1 ? Tensor() : g);
  }
}

// The learning rate of step `step` (it changes every step, as a schedule's does).
double lr_at(int64_t step) { return 1e-2 / static_cast<double>(step + 1); }

void run_steps(AdamW& opt, int64_t from, int64_t to) {
  for (int64_t s = from; s < to; ++s) {
    set_grads(opt.params(), s);
    opt.set_lr(lr_at(s));
    opt.step();
  }
}

bool bitwise_equal(const Tensor& a, const Tensor& b) {
  if (a.sizes() != b.sizes() || a.dtype() != b.dtype()) return false;
  Tensor ac = a.detach().contiguous(), bc = b.detach().contiguous();
  return std::memcmp(ac.data_ptr(), bc.data_ptr(), ac.nbytes()) == 0;
}

TensorList copies(const TensorList& ts) {
  TensorList out;
  for (const Tensor& t : ts) out.push_back(t.detach().clone().requires_grad_());
  return out;
}

const Tensor& entry(const StateDict& state, const std::string& name) {
  for (const auto& [n, t] : state)
    if (n == name) return t;
  throw std::runtime_error("no entry " + name);
}

std::string temp_path(const std::string& name) {
  return (std::filesystem::temp_directory_path() /
          fmt::format("kiln_optim_{}_{}.safetensors", name, ::getpid()))
      .string();
}

// The message of the ValueError that `f` raises ("" when it raises none).
template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const ValueError& e) {
    return e.what();
  }
  return "";
}

TEST(OptimizerState, AdamWNamesShapesAndValues) {
  TensorList ps = make_params(0);
  AdamW opt(ps, {.lr = 1e-3});
  run_steps(opt, 0, 3);
  opt.set_lr(0.25);
  StateDict state = opt.state_dict();
  std::vector<std::string> names;
  for (const auto& [n, t] : state) names.push_back(n);
  EXPECT_EQ(names, (std::vector<std::string>{"lr", "steps", "exp_avg.0", "exp_avg_sq.0", "step.0",
                                             "exp_avg.1", "exp_avg_sq.1", "step.1", "exp_avg.2",
                                             "exp_avg_sq.2", "step.2"}));
  EXPECT_EQ(entry(state, "lr").dim(), 0);
  EXPECT_EQ(entry(state, "lr").item<double>(), 0.25);
  EXPECT_EQ(entry(state, "steps").dtype(), kInt64);
  EXPECT_EQ(entry(state, "steps").item<int64_t>(), 3);
  // Parameter 1 had no gradient on step 1: two updates, the others three.
  EXPECT_EQ(entry(state, "step.0").item<double>(), 3.0);
  EXPECT_EQ(entry(state, "step.1").item<double>(), 2.0);
  EXPECT_TRUE(bitwise_equal(entry(state, "exp_avg.2"), opt.exp_avg()[2]));
  EXPECT_EQ(entry(state, "exp_avg_sq.0").data_ptr(), opt.exp_avg_sq()[0].data_ptr());  // shared
}

// A run of 6 steps, and one stopped after 3, saved to a file, loaded into a fresh optimizer
// (over parameters restored from the same file) and run to 6: bitwise the same.
TEST(OptimizerState, ResumedAdamWMatchesUninterruptedBitwise) {
  TensorList full_ps = make_params(0);
  AdamW full(full_ps, {.lr = 1e-3, .weight_decay = 0.1});
  run_steps(full, 0, 6);

  TensorList first_ps = make_params(0);
  AdamW first(first_ps, {.lr = 1e-3, .weight_decay = 0.1});
  run_steps(first, 0, 3);
  StateDict saved = first.state_dict();
  for (size_t i = 0; i < first_ps.size(); ++i)
    saved.emplace_back(fmt::format("param.{}", i), first_ps[i].detach());
  const std::string path = temp_path("resume");
  io::save_safetensors(saved, path);
  StateDict loaded = io::load_safetensors(path);
  std::filesystem::remove(path);

  TensorList resumed_ps = make_params(7);  // other values: the load must overwrite them
  StateDict opt_state;
  for (const auto& [n, t] : loaded) {
    if (n.starts_with("param.")) {
      autograd::NoGradGuard no_grad;
      resumed_ps[std::stoul(n.substr(6))].copy_(t);
    } else {
      opt_state.emplace_back(n, t);
    }
  }
  AdamW resumed(resumed_ps, {.lr = 5.0, .weight_decay = 0.1});
  resumed.load_state_dict(opt_state);
  EXPECT_EQ(resumed.steps(), 3);
  EXPECT_EQ(resumed.lr(), lr_at(2));
  run_steps(resumed, 3, 6);

  EXPECT_EQ(resumed.steps(), full.steps());
  for (size_t i = 0; i < full_ps.size(); ++i) {
    EXPECT_TRUE(bitwise_equal(resumed_ps[i], full_ps[i])) << "parameter " << i;
    EXPECT_TRUE(bitwise_equal(resumed.exp_avg()[i], full.exp_avg()[i])) << "exp_avg " << i;
    EXPECT_TRUE(bitwise_equal(resumed.exp_avg_sq()[i], full.exp_avg_sq()[i])) << "exp_avg_sq " << i;
    EXPECT_TRUE(bitwise_equal(resumed.step_counts()[i], full.step_counts()[i])) << "step " << i;
  }
}

// A compiled step holds the optimizer's tensors by identity: loading writes into them.
TEST(OptimizerState, LoadsInPlace) {
  TensorList ps = make_params(0);
  AdamW src(copies(ps), {});
  run_steps(src, 0, 2);
  AdamW dst(ps, {});
  const Tensor m0 = dst.exp_avg()[0], lr = dst.lr_tensor();
  const void* m0_data = m0.data_ptr();
  dst.load_state_dict(src.state_dict());
  EXPECT_TRUE(dst.exp_avg()[0].is_same(m0));
  EXPECT_EQ(dst.exp_avg()[0].data_ptr(), m0_data);
  EXPECT_TRUE(dst.lr_tensor().is_same(lr));
  EXPECT_EQ(lr.item<double>(), lr_at(1));
  EXPECT_TRUE(bitwise_equal(dst.exp_avg()[0], src.exp_avg()[0]));
}

// Each bad state dict raises a ValueError naming what is wrong, and changes nothing.
TEST(OptimizerState, BadStateDictsRaiseBeforeAnyChange) {
  TensorList ps = make_params(0);
  AdamW src(copies(ps), {});
  run_steps(src, 0, 2);
  const StateDict good = src.state_dict();
  AdamW dst(ps, {.lr = 0.5});
  auto with = [&](const std::string& name, const Tensor& t) {
    StateDict s;
    for (const auto& [n, v] : good) s.emplace_back(n, n == name ? t : v);
    return s;
  };
  auto without = [&](const std::string& name) {
    StateDict s;
    for (const auto& [n, v] : good)
      if (n != name) s.emplace_back(n, v);
    return s;
  };
  auto load = [&](const StateDict& s) { return error_of([&] { dst.load_state_dict(s); }); };

  EXPECT_EQ(load(without("exp_avg.1")),
            "[optimizer] load_state_dict: missing keys [exp_avg.1]; unexpected keys []");
  EXPECT_EQ(load(without("steps")),
            "[optimizer] load_state_dict: missing keys [steps]; unexpected keys []");
  StateDict extra = good;
  extra.emplace_back("exp_avg.3", zeros({2}));
  EXPECT_EQ(load(extra),
            "[optimizer] load_state_dict: missing keys []; unexpected keys [exp_avg.3]");
  StateDict twice = good;
  twice.emplace_back("exp_avg.0", zeros({3, 4}));
  EXPECT_EQ(load(twice), "[optimizer] load_state_dict: duplicate entries [exp_avg.0]");
  EXPECT_EQ(load(with("exp_avg_sq.0", zeros({4, 3}))),
            "[optimizer] load_state_dict: size mismatch for exp_avg_sq.0: state dict has [4, 3], "
            "optimizer has [3, 4]");
  EXPECT_EQ(load(with("lr", zeros({1}, kFloat64))),
            "[optimizer] load_state_dict: size mismatch for lr: state dict has [1], optimizer "
            "has []");
  EXPECT_EQ(load(with("lr", scalar_tensor(-1.0, kFloat64))),
            "[optimizer] load_state_dict: invalid learning rate -1");
  EXPECT_EQ(load(with("steps", scalar_tensor(1.5, kFloat64))),
            "[optimizer] load_state_dict: 'steps' must be a count >= 0, got 1.5");
  EXPECT_EQ(load(with("step.2", Tensor())),
            "[optimizer] load_state_dict: entry 'step.2' is undefined");

  EXPECT_EQ(dst.lr(), 0.5);
  EXPECT_EQ(dst.lr_tensor().item<double>(), 0.5);
  EXPECT_EQ(dst.steps(), 0);
  for (size_t i = 0; i < ps.size(); ++i) {
    EXPECT_TRUE(bitwise_equal(dst.exp_avg()[i], zeros_like(ps[i]))) << i;
    EXPECT_EQ(dst.step_counts()[i].item<double>(), 0.0) << i;
  }
  EXPECT_EQ(load(good), "");
  EXPECT_EQ(dst.steps(), 2);
}

// SGD's momentum buffers are made on the first step: a fresh SGD loading a stepped one's
// state makes them, and continues bitwise as the uninterrupted run does.
TEST(OptimizerState, ResumedSGDMatchesUninterruptedBitwise) {
  const optim::SGDOptions options{.lr = 0.1, .momentum = 0.9, .weight_decay = 0.01};
  TensorList full_ps = make_params(0);
  optim::SGD full(full_ps, options);
  TensorList first_ps = make_params(0);
  optim::SGD first(first_ps, options);
  for (int64_t s = 0; s < 6; ++s) {
    set_grads(full_ps, s);
    full.set_lr(lr_at(s));
    full.step();
    if (s < 3) {
      set_grads(first_ps, s);
      first.set_lr(lr_at(s));
      first.step();
    }
  }
  StateDict state = first.state_dict();
  std::vector<std::string> names;
  for (const auto& [n, t] : state) names.push_back(n);
  EXPECT_EQ(names, (std::vector<std::string>{"lr", "steps", "momentum_buffer.0",
                                             "momentum_buffer.1", "momentum_buffer.2"}));
  TensorList resumed_ps = copies(first_ps);
  optim::SGD resumed(resumed_ps, options);
  resumed.load_state_dict(state);
  EXPECT_FALSE(resumed.momentum_buffers()[0].is_same(first.momentum_buffers()[0]));  // a copy
  for (int64_t s = 3; s < 6; ++s) {
    set_grads(resumed_ps, s);
    resumed.set_lr(lr_at(s));
    resumed.step();
  }
  EXPECT_EQ(resumed.steps(), full.steps());
  for (size_t i = 0; i < full_ps.size(); ++i) {
    EXPECT_TRUE(bitwise_equal(resumed_ps[i], full_ps[i])) << "parameter " << i;
    EXPECT_TRUE(bitwise_equal(resumed.momentum_buffers()[i], full.momentum_buffers()[i])) << i;
  }
  // A state saved before the first step has no buffers: loading it drops the ones made since.
  optim::SGD fresh(copies(first_ps), options);
  resumed.load_state_dict(fresh.state_dict());
  for (const Tensor& b : resumed.momentum_buffers()) EXPECT_FALSE(b.defined());
}

TEST(OptimizerState, BadSGDStateDicts) {
  TensorList ps = make_params(0);
  optim::SGD sgd(ps, {.lr = 0.1, .momentum = 0.9});
  StateDict good = sgd.state_dict();
  auto load = [&](const std::string& name, const Tensor& t) {
    StateDict s = good;
    s.emplace_back(name, t);
    return error_of([&] { sgd.load_state_dict(s); });
  };
  EXPECT_EQ(load("momentum_buffer.3", zeros({2})),
            "[optimizer] load_state_dict: unexpected key momentum_buffer.3 (3 parameters)");
  EXPECT_EQ(load("momentum_buffer.x", zeros({2})),
            "[optimizer] load_state_dict: unexpected key momentum_buffer.x (3 parameters)");
  EXPECT_EQ(load("momentum_buffer.1", zeros({4})),
            "[optimizer] load_state_dict: size mismatch for momentum_buffer.1: state dict has "
            "[4], optimizer has [5]");
  EXPECT_EQ(load("velocity.0", zeros({3, 4})),
            "[optimizer] load_state_dict: missing keys []; unexpected keys [velocity.0]");
  for (const Tensor& b : sgd.momentum_buffers()) EXPECT_FALSE(b.defined());
}

}  // namespace
}  // namespace kiln::test

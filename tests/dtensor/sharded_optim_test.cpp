// Optimizers and clip_grad_norm_ over parameter lists that mix DTensors and plain tensors (Note
// [Parameter groups] in kiln/optim/optimizer.cpp), as a tensor-parallel model has them: SGD with
// momentum and AdamW step every parameter as the same optimizer over the whole tensors does,
// eager and compiled, each state tensor beside its parameter; the clip scales by the global norm
// (DTensor parts over their global values, plain parts counted once). DTensors on the 1-D mesh
// (Shard(0) uneven at 2 and 3 ranks, Replicate, Shard(1)) and on the 2-D mesh's [R, S(0)] in one
// list. On CPU and sim; a world of one, 2 and 3 ranks.
#include <gtest/gtest.h>

#include <memory>

#include "kiln/autograd/grad_mode.h"
#include "kiln/compile/compile.h"
#include "kiln/optim/optimizer.h"
#include "tests/dtensor/dtensor_test_util.h"

namespace kiln::test {
namespace {

class ShardedOptim : public ::testing::TestWithParam<std::string> {
 protected:
  Device dev() const { return device_named(GetParam()); }
};
INSTANTIATE_TEST_SUITE_P(Devices, ShardedOptim, ::testing::ValuesIn(device_names()),
                         [](const auto& info) { return info.param; });

::testing::AssertionResult close(const Tensor& got, const Tensor& want) {
  return all_close(got, want, 1e-5);
}

// One parameter of the mixed list: its shape and layout (no mesh: a plain tensor).
struct Slot {
  Shape shape;
  const dt::DeviceMesh* mesh;
  dt::Placements placements;
};

std::vector<Slot> slots(Device d) {
  const dt::DeviceMesh& m1 = mesh_1d(d);
  const dt::DeviceMesh& m2 = mesh_2d(d);
  return {
      {{5, 6}, &m1, {dt::Shard(0)}},                  // uneven at 2 and 3 ranks
      {{6}, nullptr, {}},                             // a LayerNorm's gain
      {{3}, &m1, {dt::Replicate()}},                  // a rowwise Linear's bias
      {{2, 3}, nullptr, {}},                          // the position embedding
      {{3, 5}, &m1, {dt::Shard(1)}},                  // a rowwise Linear's weight
      {{4, 3}, &m2, {dt::Replicate(), dt::Shard(0)}}  // another mesh
  };
}

Tensor lay_out(const Tensor& whole, const Slot& s) {
  return s.mesh ? dt::distribute_tensor(whole, *s.mesh, s.placements) : whole.clone();
}
Tensor whole_of(const Tensor& t) { return dt::is_dtensor(t) ? dt::full_tensor(t) : t; }

// The same parameters twice: whole (plain) and laid out by `slots`.
struct Params {
  TensorList whole, mixed;
};
Params make_params(Device d) {
  Params p;
  const std::vector<Slot> ss = slots(d);
  for (size_t i = 0; i < ss.size(); ++i) {
    Tensor w = div(global_tensor(ss[i].shape, kFloat32, d, static_cast<int64_t>(i)), 7.0);
    p.whole.push_back(w.detach().requires_grad_(true));
    p.mixed.push_back(lay_out(w, ss[i]).requires_grad_(true));
  }
  return p;
}

// Gradients of step `step` (parameter 3 gets none on step 1: it is not stepped then).
void set_grads(Params& p, Device d, int step) {
  const std::vector<Slot> ss = slots(d);
  for (size_t i = 0; i < ss.size(); ++i) {
    if (i == 3 && step == 1) {
      p.whole[i].set_grad(Tensor());
      p.mixed[i].set_grad(Tensor());
      continue;
    }
    Tensor g =
        sub(div(global_tensor(ss[i].shape, kFloat32, d, 5 * step + static_cast<int64_t>(i)), 13.0),
            1.0);
    p.whole[i].set_grad(g.clone());
    p.mixed[i].set_grad(lay_out(g, ss[i]));
  }
}

std::unique_ptr<optim::Optimizer> make_optimizer(bool adamw, const TensorList& params) {
  if (adamw)
    return std::make_unique<optim::AdamW>(params,
                                          optim::AdamWOptions{.lr = 0.05, .weight_decay = 0.1});
  return std::make_unique<optim::SGD>(
      params, optim::SGDOptions{.lr = 0.05, .momentum = 0.9, .weight_decay = 0.01});
}

TEST_P(ShardedOptim, MixedListStepsLikeTheWholeTensors) {
  const Device d = dev();
  const std::vector<Slot> ss = slots(d);
  for (bool adamw : {false, true}) {
    const char* name = adamw ? "AdamW" : "SGD";
    Params p = make_params(d);
    auto want = make_optimizer(adamw, p.whole);
    auto got = make_optimizer(adamw, p.mixed);
    // The rate beside parameter 0 is a replicated DTensor on its mesh.
    ASSERT_TRUE(dt::is_dtensor(got->lr_tensor())) << name;
    EXPECT_TRUE(dt::spec_of(got->lr_tensor())->is_replicated());
    for (int step = 0; step < 4; ++step) {
      if (step == 2) {  // reaches every group's rate
        want->set_lr(0.02);
        got->set_lr(0.02);
      }
      set_grads(p, d, step);
      want->step();
      got->step();
      for (size_t i = 0; i < ss.size(); ++i) {
        ASSERT_EQ(dt::is_dtensor(p.mixed[i]), ss[i].mesh != nullptr);
        if (ss[i].mesh) {
          EXPECT_EQ(&dt::spec_of(p.mixed[i])->mesh(), ss[i].mesh);
          EXPECT_EQ(dt::spec_of(p.mixed[i])->placements(), ss[i].placements);
        }
        EXPECT_TRUE(close(whole_of(p.mixed[i]), p.whole[i]))
            << name << " step " << step << " param " << i;
      }
    }
    EXPECT_EQ(got->steps(), want->steps());
    // Each state tensor lives beside its parameter: a DTensor of the parameter's layout (the
    // step counts replicated on its mesh), or plain.
    const optim::StateDict state = got->state_dict();
    const optim::StateDict state_whole = want->state_dict();
    ASSERT_EQ(state.size(), state_whole.size());
    for (size_t k = 0; k < state.size(); ++k) {
      const auto& [key, t] = state[k];
      ASSERT_EQ(key, state_whole[k].first);
      if (key == "lr" || key == "steps") {
        EXPECT_FALSE(dt::is_dtensor(t)) << key;
        continue;
      }
      const size_t i = std::stoul(key.substr(key.find('.') + 1));
      EXPECT_EQ(dt::is_dtensor(t), ss[i].mesh != nullptr) << name << " " << key;
      if (ss[i].mesh && !key.starts_with("step.")) {
        EXPECT_EQ(dt::spec_of(t)->placements(), ss[i].placements) << name << " " << key;
      }
      EXPECT_TRUE(close(whole_of(t), state_whole[k].second)) << name << " " << key;
    }
  }
}

// A compiled step (zero_grad in place, the gradients copied in outside) over a mixed list equals
// the eager one, replayed from one cache entry.
TEST_P(ShardedOptim, CompiledMixedStepEqualsEager) {
  const Device d = dev();
  const std::vector<Slot> ss = slots(d);
  for (bool adamw : {false, true}) {
    Params eager = make_params(d), traced = make_params(d);
    auto eager_opt = make_optimizer(adamw, eager.mixed);
    auto traced_opt = make_optimizer(adamw, traced.mixed);
    // The gradients and the optimizer state exist before the step is compiled.
    set_grads(eager, d, 0);
    set_grads(traced, d, 0);
    eager_opt->step();
    traced_opt->step();
    auto step = compile(
        [&](std::span<const Tensor>) -> TensorList {
          traced_opt->step();
          return {};
        },
        {.name = "mixed_step"});
    for (int s = 2; s < 6; ++s) {
      Params fresh = make_params(d);
      set_grads(fresh, d, s);
      autograd::NoGradGuard no_grad;
      for (size_t i = 0; i < ss.size(); ++i) {
        Tensor(eager.mixed[i].grad()).copy_(fresh.mixed[i].grad());
        Tensor(traced.mixed[i].grad()).copy_(fresh.mixed[i].grad());
      }
      eager_opt->set_lr(0.05 / s);
      traced_opt->set_lr(0.05 / s);
      eager_opt->step();
      step(std::span<const Tensor>());
      for (size_t i = 0; i < ss.size(); ++i)
        EXPECT_TRUE(bitwise_equal(whole_of(traced.mixed[i]), whole_of(eager.mixed[i])))
            << (adamw ? "AdamW" : "SGD") << " step " << s << " param " << i;
    }
    ASSERT_EQ(step.entries().size(), 1u) << step.explain();
    EXPECT_GE(step.entries().at(0).hits, 2) << step.explain();
  }
}

// clip_grad_norm_ over mixed gradients clips by the norm of the whole gradients: returned as a
// plain tensor, the same on every rank; each gradient keeps its layout.
TEST_P(ShardedOptim, ClipGradNormOverAMixedListUsesTheGlobalNorm) {
  const Device d = dev();
  const std::vector<Slot> ss = slots(d);
  for (double max_norm : {1.5, 1e3}) {  // clips, does not clip
    Params p = make_params(d);
    set_grads(p, d, 3);
    Tensor want = optim::clip_grad_norm_(p.whole, max_norm);
    Tensor got = optim::clip_grad_norm_(p.mixed, max_norm);
    ASSERT_FALSE(dt::is_dtensor(got));
    EXPECT_TRUE(close(got, want)) << "max_norm " << max_norm;
    for (size_t i = 0; i < ss.size(); ++i) {
      if (ss[i].mesh) {
        EXPECT_EQ(dt::spec_of(p.mixed[i].grad())->placements(), ss[i].placements);
      }
      EXPECT_TRUE(close(whole_of(p.mixed[i].grad()), p.whole[i].grad()))
          << "max_norm " << max_norm << " param " << i;
    }
  }
  // Gradients on one mesh alone keep returning the norm as a replicated DTensor there.
  Params p = make_params(d);
  set_grads(p, d, 3);
  TensorList on_mesh{p.mixed[0], p.mixed[2], p.mixed[4]};
  Tensor norm = optim::clip_grad_norm_(on_mesh, 1.5);
  ASSERT_TRUE(dt::is_dtensor(norm));
  EXPECT_TRUE(dt::spec_of(norm)->is_replicated());
  // The errors stay: no gradient at all, a bad max_norm.
  for (Tensor& t : p.mixed) t.set_grad(Tensor());
  EXPECT_THROW_PREFIX(optim::clip_grad_norm_(p.mixed, 1.0), ValueError,
                      "[clip_grad_norm_] no parameter has a gradient");
  EXPECT_THROW_PREFIX(optim::clip_grad_norm_(p.mixed, 0.0), ValueError,
                      "[clip_grad_norm_] max_norm must be > 0, got 0");
}

}  // namespace
}  // namespace kiln::test

// kiln::compile over DTensors (Note [Wrapped tensors in compiled functions] in
// kiln/compile/compile.cpp): a compiled function of DTensors replays on other DTensors of the
// same specs (never on the traced ones' shards), a new spec is a new cache entry with a reason,
// results come back as DTensors, and a compiled tensor-parallel training step (forward,
// backward, in-place update) equals the eager one step for step; on sim it is captured into a
// device graph. A world of one, 2 and 3 ranks.
#include <gtest/gtest.h>

#include "kiln/autograd/grad_mode.h"
#include "kiln/compile/compile.h"
#include "tests/dtensor/dtensor_test_util.h"

namespace kiln::test {
namespace {

class ShardedCompile : public ::testing::TestWithParam<std::string> {
 protected:
  Device dev() const { return device_named(GetParam()); }
};
INSTANTIATE_TEST_SUITE_P(Devices, ShardedCompile, ::testing::ValuesIn(device_names()),
                         [](const auto& info) { return info.param; });

Tensor dist(const Tensor& whole, const dt::DeviceMesh& mesh, dt::Placement p) {
  return dt::distribute_tensor(whole, mesh, {p});
}

TEST_P(ShardedCompile, ReplaysOnTheDTensorsOfEachCall) {
  const Device d = dev();
  const dt::DeviceMesh& mesh = mesh_1d(d);
  auto f = compile(
      [](std::span<const Tensor> in) -> TensorList {
        return {relu(mm(in[0], in[1])), sum(in[0], {1})};
      },
      {.name = "dtensor_fn"});
  for (int call = 0; call < 4; ++call) {
    Tensor x = div(global_tensor({6, 4}, kFloat32, d, call), 10.0);
    Tensor w = sub(div(global_tensor({4, 5}, kFloat32, d, 2 * call), 10.0), 1.0);
    TensorList got = f({dist(x, mesh, dt::Shard(0)), dist(w, mesh, dt::Replicate())});
    ASSERT_EQ(got.size(), 2u);
    ASSERT_TRUE(dt::is_dtensor(got[0]) && dt::is_dtensor(got[1]));
    EXPECT_EQ(dt::spec_of(got[0])->placements()[0], dt::Placement(dt::Shard(0)));
    EXPECT_TRUE(bitwise_equal(dt::full_tensor(got[0]), relu(mm(x, w)))) << "call " << call;
    EXPECT_TRUE(bitwise_equal(dt::full_tensor(got[1]), sum(x, {1}))) << "call " << call;
  }
  ASSERT_EQ(f.entries().size(), 1u) << f.explain();
  // Another placement of the same global shapes is another entry, and says why.
  Tensor x = global_tensor({6, 4}, kFloat32, d);
  Tensor w = global_tensor({4, 5}, kFloat32, d);
  TensorList got = f({dist(x, mesh, dt::Replicate()), dist(w, mesh, dt::Replicate())});
  EXPECT_TRUE(bitwise_equal(dt::full_tensor(got[0]), relu(mm(x, w))));
  ASSERT_EQ(f.entries().size(), 2u);
  ASSERT_FALSE(f.miss_reasons().empty());
  EXPECT_TRUE(kiln_test::contains(f.miss_reasons().back(), "input 0 is laid out as Spec([R]"))
      << f.miss_reasons().back();
}

// Megatron's MLP trained with SGD, compiled against eager, five steps each from the same start.
TEST_P(ShardedCompile, TensorParallelTrainingStepEqualsEager) {
  const Device d = dev();
  const dt::DeviceMesh& mesh = mesh_1d(d);
  Tensor w1 = div(global_tensor({6, 8}, kFloat32, d, 2), 40.0);
  Tensor w2 = sub(div(global_tensor({8, 5}, kFloat32, d, 9), 50.0), 0.5);
  auto make_params = [&] {
    return TensorList{dist(w1, mesh, dt::Shard(1)).requires_grad_(true),
                      dist(w2, mesh, dt::Shard(0)).requires_grad_(true)};
  };
  TensorList eager_p = make_params(), compiled_p = make_params();
  // The gradients live across steps (zeroed in place), as an optimizer keeps them.
  auto step_on = [](TensorList& p, const Tensor& x) {
    for (Tensor& t : p)
      if (t.grad().defined()) const_cast<Tensor&>(t.grad()).zero_();
    Tensor loss = sum(relu(mm(relu(mm(x, p[0])), p[1])));
    loss.backward();
    autograd::NoGradGuard no_grad;
    for (Tensor& t : p) sub_(t, mul(t.grad(), 0.1));
    return loss.detach();
  };
  auto step = compile(
      [&](std::span<const Tensor> in) -> TensorList { return {step_on(compiled_p, in[0])}; },
      {.name = "tp_step"});
  for (int i = 0; i < 5; ++i) {
    Tensor x = dist(div(global_tensor({4, 6}, kFloat32, d, i), 30.0), mesh, dt::Replicate());
    Tensor a = step_on(eager_p, x);
    Tensor b = step({x})[0];
    EXPECT_TRUE(bitwise_equal(dt::full_tensor(b), dt::full_tensor(a))) << "step " << i;
    for (size_t k = 0; k < 2; ++k)
      EXPECT_TRUE(bitwise_equal(dt::full_tensor(compiled_p[k]), dt::full_tensor(eager_p[k])))
          << "step " << i << " param " << k;
  }
  EXPECT_GE(step.entries().at(0).hits, 2) << step.explain();
  if (!d.is_cpu()) {
    EXPECT_GE(step.entries().at(0).captures, 1) << step.explain();
  }
}

// A compiled step may return a DTensor made inside it, also when its inputs are plain tensors
// (a tensor-parallel training step takes plain token ids, and the styles make DTensors of them):
// a loss over class-sharded logits, detached, made as loss_parallel_cross_entropy's is (a
// Partial(sum) reduction, then a redistribute to Replicate), with and without a backward. The
// result is a replicated DTensor equal to the eager one, and nothing made inside escapes (the
// DTensor's local tensor is the executable's output).
TEST_P(ShardedCompile, ReturnsTheDetachOfAReducedLoss) {
  const Device d = dev();
  const dt::DeviceMesh& mesh = mesh_1d(d);
  Tensor w = dist(div(global_tensor({4, 5}, kFloat32, d, 3), 20.0), mesh, dt::Shard(1))
                 .requires_grad_(true);
  for (bool plain_input : {true, false}) {
    for (bool backward : {false, true}) {
      auto loss_of = [&](const Tensor& x) {
        Tensor xd = dt::is_dtensor(x) ? x : dt::from_local(x, mesh, {dt::Replicate()});
        Tensor logits = mm(xd, w);  // [6, 5] sharded over the classes
        Tensor loss = dt::redistribute(sum(mul(logits, logits)), {dt::Replicate()});
        if (backward) loss.backward();
        return loss.detach();
      };
      auto f = compile([&](std::span<const Tensor> in) -> TensorList { return {loss_of(in[0])}; },
                       {.name = "detach_of_loss"});
      for (int call = 0; call < 4; ++call) {
        if (w.grad().defined()) const_cast<Tensor&>(w.grad()).zero_();
        Tensor x = div(global_tensor({6, 4}, kFloat32, d, call), 10.0);
        if (!plain_input) x = dist(x, mesh, dt::Replicate());
        TensorList got = f({x});
        const std::string where =
            fmt::format("call {}, plain input {}, backward {}", call, plain_input, backward);
        ASSERT_TRUE(dt::is_dtensor(got.at(0))) << where;
        EXPECT_TRUE(dt::spec_of(got[0])->is_replicated()) << where;
        EXPECT_TRUE(bitwise_equal(dt::full_tensor(got[0]), dt::full_tensor(loss_of(x)))) << where;
      }
      EXPECT_EQ(f.entries().size(), 1u) << f.explain();
      EXPECT_GE(f.entries().at(0).hits, 2) << f.explain();
    }
  }
}

}  // namespace
}  // namespace kiln::test

// Autograd through DTensors (Note [Gradients of DTensors] in kiln/dtensor/dtensor_autograd.cpp):
// a table of differentiable calls, each on every combination of its inputs' placements on a
// 1-D mesh, whose input gradients must equal the gradients of the same call on the whole
// tensors and carry the inputs' placements; redistribute, to_local and from_local in the
// middle of a graph; and a tensor-parallel MLP (column- then row-sharded weights). On CPU and
// sim; a world of one, 2 and 3 ranks.
#include <gtest/gtest.h>

#include <functional>

#include "kiln/optim/optimizer.h"
#include "tests/dtensor/dtensor_test_util.h"

namespace kiln::test {
namespace {

using Fn = std::function<Tensor(const TensorList&)>;

struct GradCase {
  std::string name;
  std::vector<Shape> shapes;
  Fn fn;
};

std::vector<GradCase> grad_cases() {
  return {
      {"add_broadcast", {{4, 6}, {6}}, [](auto& x) { return add(x[0], x[1]); }},
      {"sub_alpha", {{4, 6}, {4, 6}}, [](auto& x) { return sub(x[0], x[1], 2.0); }},
      {"mul", {{4, 6}, {4, 6}}, [](auto& x) { return mul(x[0], x[1]); }},
      {"div", {{4, 6}, {6}}, [](auto& x) { return div(x[0], add(x[1], 10.0)); }},
      {"relu", {{4, 6}}, [](auto& x) { return relu(sub(x[0], 10.0)); }},
      {"exp", {{4, 6}}, [](auto& x) { return exp(div(x[0], 20.0)); }},
      {"sum_dim1", {{4, 6}}, [](auto& x) { return sum(x[0], {1}); }},
      {"mean_all", {{4, 6}}, [](auto& x) { return mean(x[0]); }},
      {"softmax", {{4, 6}}, [](auto& x) { return softmax(div(x[0], 20.0), 1); }},
      {"log_softmax", {{4, 6}}, [](auto& x) { return log_softmax(div(x[0], 20.0), 0); }},
      {"mm", {{4, 6}, {6, 8}}, [](auto& x) { return mm(x[0], x[1]); }},
      {"bmm", {{2, 4, 6}, {2, 6, 4}}, [](auto& x) { return bmm(x[0], x[1]); }},
      {"addmm", {{8}, {4, 6}, {6, 8}}, [](auto& x) { return addmm(x[0], x[1], x[2], 0.5, 2.0); }},
  };
}

std::vector<dt::Placement> placements_for(const Shape& shape) {
  return placements_of_rank(static_cast<int64_t>(shape.size()), true);
}

::testing::AssertionResult close(const Tensor& got, const Tensor& want) {
  return all_close(got, want, 1e-4);  // gradients sum more terms
}

// The loss: every result element weighed by a fixed, distinct factor.
Tensor weighed(const Tensor& out, const Tensor& w) { return sum(mul(out, w)); }
Tensor weights_for(IntArrayRef shape, Device d) {
  return div(global_tensor(shape, kFloat32, d, 3), 10.0);
}

class ShardedAutograd : public ::testing::TestWithParam<std::string> {
 protected:
  Device dev() const { return device_named(GetParam()); }
};
INSTANTIATE_TEST_SUITE_P(Devices, ShardedAutograd, ::testing::ValuesIn(device_names()),
                         [](const auto& info) { return info.param; });

TEST_P(ShardedAutograd, EveryPlacementCombinationGivesTheWholeGradients) {
  const Device d = dev();
  const dt::DeviceMesh& mesh = mesh_1d(d);
  for (const GradCase& c : grad_cases()) {
    TensorList whole, leaves;
    for (size_t i = 0; i < c.shapes.size(); ++i) {
      whole.push_back(
          div(global_tensor(c.shapes[i], kFloat32, d, static_cast<int64_t>(5 * i)), 7.0));
      leaves.push_back(whole.back().detach().requires_grad_(true));
    }
    Tensor out = c.fn(leaves);
    Tensor w = weights_for(out.sizes(), d);
    weighed(out, w).backward();
    std::vector<std::vector<dt::Placement>> choices;
    for (const Shape& s : c.shapes) choices.push_back(placements_for(s));
    std::vector<size_t> pick(c.shapes.size(), 0);
    while (true) {
      TensorList in;
      std::string label = c.name + " [";
      for (size_t i = 0; i < pick.size(); ++i) {
        const dt::Placement p = choices[i][pick[i]];
        in.push_back(dt::distribute_tensor(whole[i], mesh, {p}).requires_grad_(true));
        label += (i ? ", " : "") + p.str();
      }
      label += "]";
      try {
        Tensor got = c.fn(in);
        Tensor wd = dt::distribute_tensor(w, mesh, {dt::Replicate()});
        weighed(got, wd).backward();
        for (size_t i = 0; i < in.size(); ++i) {
          ASSERT_TRUE(in[i].grad().defined()) << label << " input " << i;
          ASSERT_TRUE(dt::is_dtensor(in[i].grad())) << label << " input " << i;
          EXPECT_EQ(dt::spec_of(in[i].grad())->placements(), dt::spec_of(in[i])->placements())
              << label << " input " << i;
          EXPECT_TRUE(close(dt::full_tensor(in[i].grad()), leaves[i].grad()))
              << label << " input " << i;
        }
      } catch (const std::exception& e) {
        ADD_FAILURE() << label << " raised: " << e.what();
      }
      std::vector<size_t> counts;
      for (const auto& ch : choices) counts.push_back(ch.size());
      if (!next_pick(pick, counts)) break;
    }
  }
}

// x: Shard(0) -> redistribute -> Replicate -> to_local -> plain ops -> from_local -> loss.
TEST_P(ShardedAutograd, RedistributeToLocalAndFromLocalCarryGradients) {
  const Device d = dev();
  const dt::DeviceMesh& mesh = mesh_1d(d);
  Tensor whole = div(global_tensor({4, 6}, kFloat32, d), 5.0);
  Tensor x = dt::distribute_tensor(whole, mesh, {dt::Shard(0)}).requires_grad_(true);
  Tensor r = dt::redistribute(x, {dt::Replicate()});
  Tensor local = dt::to_local(r);  // the whole tensor on every rank
  Tensor y = dt::from_local(mul(local, local), mesh, {dt::Replicate()});
  sum(y).backward();
  ASSERT_TRUE(dt::is_dtensor(x.grad()));
  EXPECT_EQ(dt::spec_of(x.grad())->placements()[0], dt::Placement(dt::Shard(0)));
  EXPECT_TRUE(close(dt::full_tensor(x.grad()), mul(whole, 2.0)));
}

// Megatron's MLP: W1 column-sharded, W2 row-sharded, the product a Partial(sum) reduced once.
TEST_P(ShardedAutograd, TensorParallelMlpMatchesOneProcess) {
  const Device d = dev();
  const dt::DeviceMesh& mesh = mesh_1d(d);
  Tensor x = div(global_tensor({4, 6}, kFloat32, d), 30.0);
  Tensor w1 = div(global_tensor({6, 8}, kFloat32, d, 2), 40.0);
  Tensor w2 = div(global_tensor({8, 5}, kFloat32, d, 9), 50.0);
  Tensor a1 = w1.detach().requires_grad_(true), a2 = w2.detach().requires_grad_(true);
  sum(relu(mm(relu(mm(x, a1)), a2))).backward();
  Tensor X = dt::distribute_tensor(x, mesh, {dt::Replicate()});
  Tensor W1 = dt::distribute_tensor(w1, mesh, {dt::Shard(1)}).requires_grad_(true);
  Tensor W2 = dt::distribute_tensor(w2, mesh, {dt::Shard(0)}).requires_grad_(true);
  Tensor h = relu(mm(X, W1));
  EXPECT_EQ(dt::spec_of(h)->placements()[0], dt::Placement(dt::Shard(1)));
  Tensor z = mm(h, W2);
  if (dist::world_size() > 1) {
    EXPECT_TRUE(dt::spec_of(z)->placements()[0].is_partial()) << dt::spec_of(z)->str();
  }
  sum(relu(z)).backward();
  EXPECT_EQ(dt::spec_of(W1.grad())->placements()[0], dt::Placement(dt::Shard(1)));
  EXPECT_EQ(dt::spec_of(W2.grad())->placements()[0], dt::Placement(dt::Shard(0)));
  EXPECT_TRUE(close(dt::full_tensor(W1.grad()), a1.grad()));
  EXPECT_TRUE(close(dt::full_tensor(W2.grad()), a2.grad()));
}

TEST_P(ShardedAutograd, LikeFactoriesOfDTensorsAreDTensors) {
  const Device d = dev();
  Tensor p = dt::distribute_tensor(global_tensor({4, 6}, kFloat32, d), mesh_1d(d), {dt::Partial()});
  Tensor o = ones_like(p);  // a fill never stays Partial: it would sum to the mesh size
  ASSERT_TRUE(dt::is_dtensor(o));
  EXPECT_EQ(dt::spec_of(o)->placements()[0], dt::Placement(dt::Replicate()));
  EXPECT_TRUE(close(dt::full_tensor(o), ones({4, 6}, kFloat32, d)));
  Tensor s = dt::distribute_tensor(global_tensor({4, 6}, kFloat32, d), mesh_1d(d), {dt::Shard(1)});
  EXPECT_EQ(dt::spec_of(zeros_like(s))->placements()[0], dt::Placement(dt::Shard(1)));
  EXPECT_EQ(dt::spec_of(rand_like(s))->placements()[0], dt::Placement(dt::Shard(1)));
  EXPECT_EQ(dt::spec_of(randn_like(p))->placements()[0], dt::Placement(dt::Replicate()));
}

// clip_grad_norm_ over DTensor gradients of several placements clips by the global norm.
TEST_P(ShardedAutograd, ClipGradNormUsesTheGlobalNorm) {
  const Device d = dev();
  const dt::DeviceMesh& mesh = mesh_1d(d);
  const std::vector<Shape> shapes{{4, 6}, {6}, {3, 5}};
  const std::vector<dt::Placement> ps{dt::Shard(0), dt::Replicate(), dt::Shard(1)};
  TensorList plain, sharded;
  for (size_t i = 0; i < shapes.size(); ++i) {
    Tensor w = global_tensor(shapes[i], kFloat32, d, static_cast<int64_t>(i));
    Tensor g = div(global_tensor(shapes[i], kFloat32, d, 3 * static_cast<int64_t>(i)), 9.0);
    plain.push_back(w.detach().requires_grad_(true));
    plain.back().set_grad(g.clone());
    sharded.push_back(dt::distribute_tensor(w, mesh, {ps[i]}).requires_grad_(true));
    sharded.back().set_grad(dt::distribute_tensor(g, mesh, {ps[i]}));
  }
  Tensor want = optim::clip_grad_norm_(plain, 1.5);
  Tensor got = optim::clip_grad_norm_(sharded, 1.5);
  EXPECT_TRUE(close(dt::full_tensor(got), want));
  for (size_t i = 0; i < shapes.size(); ++i) {
    EXPECT_EQ(dt::spec_of(sharded[i].grad())->placements()[0], ps[i]);
    EXPECT_TRUE(close(dt::full_tensor(sharded[i].grad()), plain[i].grad())) << "param " << i;
  }
}

// AdamW and SGD over DTensor parameters (their lr and step counts replicated DTensors on the
// mesh) match the same optimizer on the whole tensors, three steps from the same start.
TEST_P(ShardedAutograd, OptimizersStepDTensorParameters) {
  const Device d = dev();
  const dt::DeviceMesh& mesh = mesh_1d(d);
  const std::vector<Shape> shapes{{4, 6}, {6}, {3, 5}};
  const std::vector<dt::Placement> ps{dt::Shard(0), dt::Replicate(), dt::Shard(1)};
  for (bool adamw : {true, false}) {
    TensorList plain, sharded;
    for (size_t i = 0; i < shapes.size(); ++i) {
      Tensor w = div(global_tensor(shapes[i], kFloat32, d, static_cast<int64_t>(i)), 7.0);
      plain.push_back(w.detach().requires_grad_(true));
      sharded.push_back(dt::distribute_tensor(w, mesh, {ps[i]}).requires_grad_(true));
    }
    std::unique_ptr<optim::Optimizer> a, b;
    if (adamw) {
      a = std::make_unique<optim::AdamW>(plain, optim::AdamWOptions{.lr = 0.05});
      b = std::make_unique<optim::AdamW>(sharded, optim::AdamWOptions{.lr = 0.05});
    } else {
      a = std::make_unique<optim::SGD>(plain, optim::SGDOptions{.lr = 0.05, .momentum = 0.9});
      b = std::make_unique<optim::SGD>(sharded, optim::SGDOptions{.lr = 0.05, .momentum = 0.9});
    }
    for (int step = 0; step < 3; ++step) {
      a->zero_grad();
      b->zero_grad();
      Tensor la, lb;
      for (size_t i = 0; i < shapes.size(); ++i) {
        Tensor ta = sum(mul(plain[i], plain[i])), tb = sum(mul(sharded[i], sharded[i]));
        la = la.defined() ? add(la, ta) : ta;
        lb = lb.defined() ? add(lb, tb) : tb;
      }
      la.backward();
      lb.backward();
      a->step();
      b->step();
      for (size_t i = 0; i < shapes.size(); ++i) {
        EXPECT_EQ(dt::spec_of(sharded[i])->placements()[0], ps[i]);
        EXPECT_TRUE(close(dt::full_tensor(sharded[i]), plain[i]))
            << (adamw ? "AdamW" : "SGD") << " step " << step << " param " << i;
      }
    }
  }
}

}  // namespace
}  // namespace kiln::test

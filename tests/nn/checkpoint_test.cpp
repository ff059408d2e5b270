// kiln/nn/checkpoint.h: a checkpointed segment against the same segment run plainly (whose
// gradients kiln_nn_test and kiln_op_test check against libtorch): the same outputs and
// gradients (bitwise: the recomputation does the same arithmetic), dropout inside drawing the
// same mask, the generators left where the plain run leaves them, a smaller forward peak, and
// the errors.
#include <gtest/gtest.h>

#include "kiln/autograd/engine.h"
#include "kiln/autograd/grad_mode.h"
#include "kiln/core/error.h"
#include "kiln/core/storage.h"
#include "kiln/nn/checkpoint.h"
#include "kiln/nn/layers.h"
#include "kiln/ops/ops.h"

namespace kiln::test {
namespace {

bool same(const Tensor& a, const Tensor& b) {
  return a.sizes() == b.sizes() && a.dtype() == b.dtype() && all(eq(a, b)).item<bool>();
}

// Linear, GELU, Dropout and Linear: a block with parameters and a random draw inside.
std::shared_ptr<nn::Sequential> block(uint64_t seed, int64_t width, double p) {
  Generator gen(seed);
  nn::Init init{.gen = &gen};
  auto m = std::make_shared<nn::Sequential>();
  m->push_back(std::make_shared<nn::Linear>(width, width, true, init));
  m->push_back(std::make_shared<nn::GELU>());
  m->push_back(std::make_shared<nn::Dropout>(p));
  m->push_back(std::make_shared<nn::Linear>(width, width, true, init));
  return m;
}

TEST(Checkpoint, GradientsAndDropoutMasksEqualThePlainRun) {
  auto plain = block(1, 16, 0.3), ckpt = block(1, 16, 0.3);
  Tensor x = randn({8, 16});
  Tensor xp = x.detach().requires_grad_(true), xc = x.detach().requires_grad_(true);
  manual_seed(7);
  Tensor yp = (*plain)(xp);
  sum(mul(yp, yp)).backward();
  const uint64_t plain_offset = default_generator().offset();
  manual_seed(7);
  Tensor yc = nn::checkpoint([&](const Tensor& t) { return (*ckpt)(t); }, xc);
  EXPECT_TRUE(yc.requires_grad());
  EXPECT_EQ(yc.grad_fn_name(), "CheckpointBackward");
  EXPECT_TRUE(same(yc, yp));
  (void)rand({5});  // a draw between forward and backward: the replay must not see it
  const uint64_t before_backward = default_generator().offset();
  sum(mul(yc, yc)).backward();
  // The backward put the generator back where it found it.
  EXPECT_EQ(default_generator().offset(), before_backward);
  EXPECT_GT(before_backward, plain_offset);
  EXPECT_TRUE(same(xc.grad(), xp.grad()));
  auto a = plain->parameters(), b = ckpt->parameters();
  for (size_t i = 0; i < a.size(); ++i) EXPECT_TRUE(same(b[i].grad(), a[i].grad())) << i;
}

TEST(Checkpoint, ExplicitGeneratorsAreReplayedToo) {
  Generator g1(3), g2(3);
  auto fn = [](Generator* g) { return [g](const Tensor& t) { return dropout(t, 0.5, true, g); }; };
  Tensor x = randn({64});
  Tensor xp = x.detach().requires_grad_(true), xc = x.detach().requires_grad_(true);
  sum(fn(&g1)(xp)).backward();
  Tensor yc = nn::checkpoint(fn(&g2), xc, {.generators = {&g2}});
  sum(yc).backward();
  EXPECT_TRUE(same(xc.grad(), xp.grad()));
  EXPECT_EQ(g2.offset(), g1.offset());
}

TEST(Checkpoint, SeveralInputsAndOutputsSomeWithoutGradients) {
  Tensor a = randn({3, 4}).requires_grad_(true), b = randn({3, 4});
  Tensor idx = from_vector<int64_t>({2, 0, 1});
  auto fn = [](const TensorList& x) {
    return TensorList{mul(x[0], x[1]), index_select(x[0], 0, x[2]), argmax(x[0], 1)};
  };
  TensorList got = nn::checkpoint(fn, {a, b, idx});
  ASSERT_EQ(got.size(), 3u);
  EXPECT_FALSE(got[2].requires_grad());  // an integer result
  sum(add(got[0], got[1])).backward();
  Tensor a2 = a.detach().requires_grad_(true);
  TensorList want = fn({a2, b, idx});
  sum(add(want[0], want[1])).backward();
  EXPECT_TRUE(same(a.grad(), a2.grad()));
}

TEST(Checkpoint, KeepsLessForBackwardThanThePlainRun) {
  constexpr int kBlocks = 6;
  constexpr int64_t kWidth = 256, kRows = 512;  // activations [512, 256]: 512 KiB each
  std::vector<std::shared_ptr<nn::Sequential>> blocks;
  for (int i = 0; i < kBlocks; ++i) blocks.push_back(block(10 + i, kWidth, 0.0));
  Tensor x = randn({kRows, kWidth}).requires_grad_(true);
  auto forward = [&](bool ckpt) {
    Tensor h = x;
    for (auto& b : blocks)
      h = ckpt ? nn::checkpoint([b](const Tensor& t) { return (*b)(t); }, h) : (*b)(h);
    return sum(h);
  };
  TensorList grads[2];
  size_t peak[2];
  for (int ckpt : {0, 1}) {
    for (auto& b : blocks) b->zero_grad();
    x.set_grad(Tensor());
    begin_cpu_peak();
    Tensor loss = forward(ckpt);
    peak[ckpt] = end_cpu_peak();
    loss.backward();
    grads[ckpt].push_back(x.grad().clone());
    for (auto& b : blocks)
      for (const Tensor& p : b->parameters()) grads[ckpt].push_back(p.grad().clone());
  }
  const size_t activation = kRows * kWidth * 4;
  // Plain: each block keeps its input, the GELU's input and the second Linear's input; a
  // checkpointed block keeps nothing but its output (the next block's saved input).
  EXPECT_GE(peak[0], 3 * kBlocks * activation);
  EXPECT_LE(peak[1], (kBlocks + 2) * activation);
  for (size_t i = 0; i < grads[0].size(); ++i) EXPECT_TRUE(same(grads[1][i], grads[0][i])) << i;
}

TEST(Checkpoint, WithoutGradModeItIsJustTheFunction) {
  autograd::NoGradGuard no_grad;
  Tensor x = randn({4}).requires_grad_(true);
  Tensor y = nn::checkpoint([](const Tensor& t) { return mul(t, 2.0); }, x);
  EXPECT_FALSE(y.requires_grad());
}

TEST(Checkpoint, Errors) {
  Tensor x = randn({4}).requires_grad_(true);
  // An input changed in place between forward and backward.
  Tensor base = randn({4});
  Tensor y =
      nn::checkpoint([](const TensorList& t) { return TensorList{mul(t[0], t[1])}; }, {x, base})[0];
  {
    autograd::NoGradGuard no_grad;
    add_(base, 1.0);
  }
  try {
    sum(y).backward();
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("[checkpoint] input 1 was changed in place"),
              std::string::npos)
        << e.what();
  }
  EXPECT_THROW(nn::checkpoint(std::function<Tensor(const Tensor&)>(), x), Error);
  EXPECT_THROW(nn::checkpoint([](const Tensor& t) { return t; }, x, {.generators = {nullptr}}),
               Error);
  // A second backward through a freed checkpoint.
  Tensor z = nn::checkpoint([](const Tensor& t) { return mul(t, t); }, x);
  sum(z).backward();
  EXPECT_THROW(sum(z).backward(), Error);
}

}  // namespace
}  // namespace kiln::test

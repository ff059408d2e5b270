// nn::Embedding's padding_idx and nn::EmbeddingBag (kiln/nn/embedding_bag.h) against
// torch::nn's modules and functional forms on the same weights: forward values and weight (and
// per_sample_weights) gradients through libtorch's autograd, with padding_idx and
// scale_grad_by_freq (whose gradients gradcheck cannot check: they differ from the derivative on
// purpose), and the constructor errors.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "kiln/core/error.h"
#include "kiln/nn/embedding_bag.h"
#include "kiln/ops/op_list.h"
#include "kiln/ops/ops.h"
#include "tests/ops/aten_compare.h"

namespace kiln::test {
namespace {

namespace F = torch::nn::functional;

testing::AssertionResult close(const Tensor& got, const torch::Tensor& want) {
  return close_to_aten(got, want, 1e-10, 1e-12);
}

TEST(EmbeddingModuleTest, PaddingIdxRowStartsAtZeroAndGetsNoGradient) {
  Generator gen(70);
  nn::Embedding emb(10, 4, {.gen = &gen, .dtype = kFloat64}, -2);
  ASSERT_TRUE(emb.padding_idx.has_value());
  EXPECT_EQ(*emb.padding_idx, 8);
  EXPECT_TRUE(close(select(emb.weight, 0, 8), torch::zeros({4}, torch::kFloat64)));
  Tensor idx = from_vector<int64_t>({8, 1, 3, 8, 1, 1}, {2, 3});
  Tensor coef = randn({2, 3, 4}, &gen, kFloat64);
  sum(mul(emb(idx), coef)).backward();
  torch::Tensor w = to_aten(emb.weight.detach()).requires_grad_(true);
  torch::nn::Embedding ref(torch::nn::EmbeddingOptions(10, 4).padding_idx(8));
  ref->weight.set_data(w.detach().clone());
  (ref->forward(to_aten(idx)) * to_aten(coef)).sum().backward();
  EXPECT_TRUE(close(emb.weight.grad(), ref->weight.grad()));
}

TEST(EmbeddingModuleTest, ScaleGradByFreqAndPaddingMatchTorch) {
  Generator gen(71);
  Tensor idx = from_vector<int64_t>({0, 3, 0, 2, 3, 3, 5}, {7});
  for (int64_t pad : {-1, 3}) {
    for (bool scale : {false, true}) {
      Tensor w = randn({6, 3}, &gen, kFloat64).requires_grad_(true);
      Tensor coef = randn({7, 3}, &gen, kFloat64);
      sum(mul(embedding(w, idx, pad, scale), coef)).backward();
      torch::Tensor aw = to_aten(w.detach()).requires_grad_(true);
      // libtorch's own: padding_idx reaches at::embedding as -1 for none.
      (torch::embedding(aw, to_aten(idx), pad, scale) * to_aten(coef)).sum().backward();
      EXPECT_TRUE(close(w.grad(), aw.grad())) << pad << " " << scale;
    }
  }
}

struct BagCase {
  const char* mode;
  torch::nn::EmbeddingBagMode torch_mode;
  bool scale, include_last, weighted;
  std::optional<int64_t> padding_idx;
};

TEST(EmbeddingModuleTest, EmbeddingBagMatchesTorchForwardAndGradients) {
  Generator gen(72);
  const std::vector<BagCase> cases = {
      {"sum", torch::kSum, false, false, false, std::nullopt},
      {"sum", torch::kSum, true, true, true, 2},
      {"mean", torch::kMean, false, false, false, -1},
      {"mean", torch::kMean, true, true, false, 3},
      {"max", torch::kMax, false, false, false, std::nullopt},
      {"max", torch::kMax, false, true, false, 0},
  };
  Tensor idx = from_vector<int64_t>({2, 5, 2, 0, 7, 3, 3, 1, 6, 2}, {10});
  for (const BagCase& c : cases) {
    Tensor offs = from_vector<int64_t>(
        c.include_last ? std::vector<int64_t>{0, 3, 3, 6, 10} : std::vector<int64_t>{0, 3, 3, 6},
        {c.include_last ? 5 : 4});
    nn::EmbeddingBag bag(8, 4,
                         {.mode = c.mode,
                          .scale_grad_by_freq = c.scale,
                          .include_last_offset = c.include_last,
                          .padding_idx = c.padding_idx},
                         {.gen = &gen, .dtype = kFloat64});
    Tensor psw = c.weighted ? randn({10}, &gen, kFloat64).requires_grad_(true) : Tensor();
    Tensor out = bag.forward(idx, offs, psw);
    Tensor coef = randn(out.sizes(), &gen, kFloat64);
    sum(mul(out, coef)).backward();

    auto opts = torch::nn::EmbeddingBagOptions(8, 4)
                    .mode(c.torch_mode)
                    .scale_grad_by_freq(c.scale)
                    .include_last_offset(c.include_last);
    if (c.padding_idx) opts = opts.padding_idx(*c.padding_idx);
    torch::nn::EmbeddingBag ref(opts);
    ref->weight.set_data(to_aten(bag.weight.detach()));
    torch::Tensor apsw = c.weighted ? to_aten(psw.detach()).requires_grad_(true) : torch::Tensor();
    torch::Tensor aout = ref->forward(to_aten(idx), to_aten(offs), apsw);
    EXPECT_TRUE(close(out, aout)) << c.mode;
    torch::Tensor want_grad;
    if (!c.scale) {
      (aout * to_aten(coef)).sum().backward();
      want_grad = ref->weight.grad();
    } else {
      // libtorch 1.13's CPU embedding_bag backward divides by the wrong index's count
      // (pytorch/pytorch#190063, fixed upstream in 2026), so the reference is the bags summed
      // from torch::embedding's rows, whose backward scales by each index's own count.
      torch::Tensor aw = to_aten(bag.weight.detach()).requires_grad_(true);
      auto [o, offset2bag, bag_size, m] = ops::op_embedding_bag(
          bag.weight.detach(), idx, offs, false, std::string(c.mode) == "sum" ? 0 : 1, false,
          Tensor(), c.include_last, bag.options.padding_idx.value_or(-1));
      torch::Tensor rows =
          torch::embedding(aw, to_aten(idx), bag.options.padding_idx.value_or(-1), true);
      if (c.weighted) rows = rows * apsw.unsqueeze(1);
      torch::Tensor sums =
          torch::zeros({out.size(0), 4}, torch::kFloat64).index_add(0, to_aten(offset2bag), rows);
      if (std::string(c.mode) == "mean")
        sums = sums / to_aten(bag_size).clamp_min(1).unsqueeze(1).to(torch::kFloat64);
      (sums * to_aten(coef)).sum().backward();
      want_grad = aw.grad();
    }
    EXPECT_TRUE(close(bag.weight.grad(), want_grad)) << c.mode;
    if (c.weighted) {
      EXPECT_TRUE(close(psw.grad(), apsw.grad())) << c.mode;
    }
  }
}

TEST(EmbeddingModuleTest, EmbeddingBagTwoDimensionalInput) {
  Generator gen(73);
  nn::EmbeddingBag bag(9, 3, {.mode = "max"}, {.gen = &gen, .dtype = kFloat64});
  Tensor idx = from_vector<int64_t>({1, 8, 2, 0, 0, 5}, {2, 3});
  torch::Tensor want = F::embedding_bag(to_aten(idx), to_aten(bag.weight.detach()),
                                        F::EmbeddingBagFuncOptions().mode(torch::kMax));
  EXPECT_TRUE(close(bag(idx), want));
}

TEST(EmbeddingModuleTest, ConstructorErrors) {
  auto expect_error = [](const std::function<void()>& f, const char* op, const char* what) {
    try {
      f();
      ADD_FAILURE() << "no error for " << what;
    } catch (const ValueError& e) {
      EXPECT_TRUE(std::string(e.what()).starts_with(op)) << e.what();
      EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
    }
  };
  expect_error([] { nn::Embedding(5, 2, {}, 5); }, "[Embedding]", "[-5, 5), got 5");
  expect_error([] { nn::Embedding(5, 2, {}, -6); }, "[Embedding]", "got -6");
  expect_error([] { nn::EmbeddingBag(5, 2, {.mode = "avg"}); }, "[EmbeddingBag]", "'avg'");
  expect_error([] { nn::EmbeddingBag(5, 2, {.mode = "max", .scale_grad_by_freq = true}); },
               "[EmbeddingBag]", "scale_grad_by_freq");
  expect_error([] { nn::EmbeddingBag(5, 2, {.padding_idx = 7}); }, "[EmbeddingBag]", "got 7");
  expect_error([] { nn::EmbeddingBag(0, 2); }, "[EmbeddingBag]", "positive");
}

}  // namespace
}  // namespace kiln::test

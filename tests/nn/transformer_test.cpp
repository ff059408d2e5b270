// kiln/nn/transformer.h against the same GPT written by hand in libtorch (functional ops on
// tensors copied from Kiln's initialised parameters, by name): logits, loss, every gradient
// (the head is tied to the token embedding) and the parameters after two AdamW steps. libtorch
// 1.13 has no scaled_dot_product_attention, so attention is softmax(q k^T / sqrt(d) + causal
// mask) v, written out.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "kiln/core/error.h"
#include "kiln/nn/transformer.h"
#include "kiln/ops/ops.h"
#include "kiln/optim/optimizer.h"
#include "tests/ops/aten_compare.h"

namespace kiln::test {
namespace {

testing::AssertionResult close(const Tensor& got, const torch::Tensor& want, double rtol = 0.0001,
                               double atol = 1e-05) {
  return close_to_aten(got, want, rtol, atol);
}

nn::GPTConfig config() {
  nn::GPTConfig c;
  c.vocab_size = 32;
  c.context = 16;
  c.width = 32;
  c.layers = 2;
  c.heads = 4;
  return c;
}

// The reference GPT: nanoGPT's forward on a name -> leaf map of libtorch tensors.
class TorchGPT {
 public:
  explicit TorchGPT(const nn::GPT& gpt) : c_(gpt.config()) {
    for (const auto& [name, p] : gpt.named_parameters()) {
      names_.push_back(name);
      params_[name] = to_aten(p).requires_grad_();
    }
  }
  const torch::Tensor& operator[](const std::string& name) const { return params_.at(name); }
  std::vector<torch::Tensor> parameters() const {
    std::vector<torch::Tensor> out;
    for (const std::string& n : names_) out.push_back(params_.at(n));
    return out;
  }

  // idx [B, T] -> logits [B, T, V]
  torch::Tensor forward(const torch::Tensor& idx) const {
    namespace F = torch::nn::functional;
    const int64_t B = idx.size(0), T = idx.size(1), C = c_.width, H = c_.heads, D = C / H;
    auto p = [&](const std::string& n) { return params_.at(n); };
    torch::Tensor x = torch::embedding(p("transformer.wte.weight"), idx) +
                      torch::embedding(p("transformer.wpe.weight"), torch::arange(T));
    torch::Tensor future = torch::ones({T, T}, torch::kBool).triu(1);
    for (int64_t i = 0; i < c_.layers; ++i) {
      std::string h = "transformer.h." + std::to_string(i) + ".";
      // attention: qkv [B, T, 3C] -> q, k, v [B, H, T, D]
      torch::Tensor a = torch::layer_norm(x, {C}, p(h + "ln_1.weight"), p(h + "ln_1.bias"), 1e-5);
      auto qkv = F::linear(a, p(h + "attn.c_attn.weight"), p(h + "attn.c_attn.bias")).split(C, 2);
      auto heads = [&](const torch::Tensor& t) { return t.view({B, T, H, D}).transpose(1, 2); };
      torch::Tensor q = heads(qkv[0]), k = heads(qkv[1]), v = heads(qkv[2]);
      torch::Tensor att = torch::matmul(q, k.transpose(-2, -1)) / std::sqrt(double(D));
      att = torch::softmax(att.masked_fill(future, -INFINITY), -1);
      torch::Tensor y = torch::matmul(att, v).transpose(1, 2).contiguous().view({B, T, C});
      x = x + F::linear(y, p(h + "attn.c_proj.weight"), p(h + "attn.c_proj.bias"));
      // MLP
      torch::Tensor m = torch::layer_norm(x, {C}, p(h + "ln_2.weight"), p(h + "ln_2.bias"), 1e-5);
      m = torch::gelu(F::linear(m, p(h + "mlp.c_fc.weight"), p(h + "mlp.c_fc.bias")), "tanh");
      x = x + F::linear(m, p(h + "mlp.c_proj.weight"), p(h + "mlp.c_proj.bias"));
    }
    x = torch::layer_norm(x, {C}, p("transformer.ln_f.weight"), p("transformer.ln_f.bias"), 1e-5);
    return torch::matmul(x, p("transformer.wte.weight").t());
  }
  torch::Tensor loss(const torch::Tensor& idx, const torch::Tensor& targets) const {
    return torch::nn::functional::cross_entropy(forward(idx).view({-1, c_.vocab_size}),
                                                targets.view({-1}));
  }

 private:
  nn::GPTConfig c_;
  std::vector<std::string> names_;
  std::map<std::string, torch::Tensor> params_;
};

struct Batch {
  Tensor idx, targets;
};
Batch batch(Generator& gen, int64_t B = 2, int64_t T = 8) {
  return {randint(0, 32, {B, T}, &gen, kInt64), randint(0, 32, {B, T}, &gen, kInt64)};
}

void expect_params_match(const nn::GPT& gpt, const TorchGPT& ref, const char* when) {
  for (const auto& [name, p] : gpt.named_parameters())
    EXPECT_TRUE(close(p, ref[name].detach())) << when << ": " << name;
}
void expect_grads_match(const nn::GPT& gpt, const TorchGPT& ref, const char* when) {
  for (const auto& [name, p] : gpt.named_parameters()) {
    ASSERT_TRUE(ref[name].grad().defined()) << name;
    EXPECT_TRUE(close(p.grad(), ref[name].grad())) << when << ": grad of " << name;
  }
}

TEST(GPTTorch, LogitsMatch) {
  Generator gen(1);
  nn::GPT gpt(config(), {.gen = &gen});
  TorchGPT ref(gpt);
  Batch b = batch(gen);
  Tensor logits = gpt.forward(b.idx);
  EXPECT_EQ(logits.sizes(), IntArrayRef({2, 8, 32}));
  EXPECT_EQ(logits.dtype(), kFloat32);
  EXPECT_TRUE(close(logits, ref.forward(to_aten(b.idx)).detach()));
}

TEST(GPTTorch, LogitsMatchAtFullContextAndBatchOne) {
  Generator gen(2);
  nn::GPT gpt(config(), {.gen = &gen});
  TorchGPT ref(gpt);
  for (auto [B, T] : {std::pair<int64_t, int64_t>{1, 16}, {3, 1}, {1, 5}}) {
    Batch b = batch(gen, B, T);
    EXPECT_TRUE(close(gpt.forward(b.idx), ref.forward(to_aten(b.idx)).detach()))
        << "B=" << B << " T=" << T;
  }
}

TEST(GPTTorch, LossMatches) {
  Generator gen(3);
  nn::GPT gpt(config(), {.gen = &gen});
  TorchGPT ref(gpt);
  Batch b = batch(gen);
  Tensor loss = gpt.loss(b.idx, b.targets);
  EXPECT_EQ(loss.dim(), 0);
  torch::Tensor tloss = ref.loss(to_aten(b.idx), to_aten(b.targets));
  EXPECT_TRUE(close(loss, tloss.detach()));
  // Near log(vocab) at initialisation (weights are small).
  EXPECT_NEAR(loss.item<double>(), std::log(32.0), 0.3);
}

TEST(GPTTorch, GradientsMatchIncludingTiedHead) {
  Generator gen(4);
  nn::GPT gpt(config(), {.gen = &gen});
  TorchGPT ref(gpt);
  Batch b = batch(gen);
  gpt.loss(b.idx, b.targets).backward();
  ref.loss(to_aten(b.idx), to_aten(b.targets)).backward();
  expect_grads_match(gpt, ref, "after backward");
  // Rows of wpe past T get no gradient: exactly zero in both.
  torch::Tensor wpe_grad = to_aten(gpt.named_parameters()[1].second.grad());
  EXPECT_EQ(wpe_grad.slice(0, 8).abs().max().item<double>(), 0.0);
}

TEST(GPTTorch, TwoAdamWStepsMatch) {
  Generator gen(5);
  nn::GPT gpt(config(), {.gen = &gen});
  TorchGPT ref(gpt);
  optim::AdamWOptions ko;
  ko.lr = 1e-3;
  ko.weight_decay = 0.1;
  optim::AdamW opt(gpt.parameters(), ko);
  torch::optim::AdamW topt(ref.parameters(), torch::optim::AdamWOptions(1e-3).weight_decay(0.1));

  for (int step = 1; step <= 2; ++step) {
    std::string when = "step " + std::to_string(step);
    Batch b = batch(gen);
    opt.zero_grad();
    topt.zero_grad();
    Tensor loss = gpt.loss(b.idx, b.targets);
    torch::Tensor tloss = ref.loss(to_aten(b.idx), to_aten(b.targets));
    EXPECT_TRUE(close(loss, tloss.detach())) << when << ": loss";
    loss.backward();
    tloss.backward();
    expect_grads_match(gpt, ref, when.c_str());
    opt.step();
    topt.step();
    EXPECT_EQ(opt.steps(), step);
    expect_params_match(gpt, ref, when.c_str());
  }
  // And the models still agree after the updates.
  Batch b = batch(gen);
  EXPECT_TRUE(close(gpt.forward(b.idx), ref.forward(to_aten(b.idx)).detach()));
}

TEST(GPTTorch, EvalForwardIsDeterministic) {
  Generator gen(6);
  nn::GPT gpt(config(), {.gen = &gen});
  Batch b = batch(gen);
  Tensor a = gpt.forward(b.idx);
  gpt.eval();
  EXPECT_TRUE(to_aten(gpt.forward(b.idx)).equal(to_aten(a)));
}

TEST(GPTErrors, SequenceLongerThanContext) {
  nn::GPT gpt(config());
  Tensor idx = zeros({2, 17}, kInt64);
  expect_value_error([&] { gpt.forward(idx); }, {"[GPT]", "17", "16"});
  expect_value_error([&] { gpt.loss(idx, idx); }, {"[GPT]", "17", "16"});
}

TEST(GPTErrors, IdxNotTwoDim) {
  nn::GPT gpt(config());
  expect_value_error([&] { gpt.forward(zeros({8}, kInt64)); }, {"[GPT]", "[8]"});
  expect_value_error([&] { gpt.forward(zeros({2, 8, 1}, kInt64)); }, {"[GPT]", "[2, 8, 1]"});
}

TEST(GPTErrors, AttentionNeedsThreeDims) {
  nn::CausalSelfAttention attn(32, 4);
  expect_value_error(
      [&] {
        attn.forward(zeros({8, 32}, kFloat32));
      },
      {"[CausalSelfAttention]", "[8, 32]"});
}

}  // namespace
}  // namespace kiln::test

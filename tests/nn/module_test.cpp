// kiln/nn/module.h and kiln/nn/layers.h: parameter naming and order, state dicts (round trip,
// every load error, and that a failing load changes nothing), train/eval, dtype casts,
// zero_grad, each layer's forward against libtorch's functional ops on copied weights,
// constructor errors and initialisation statistics.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "kiln/autograd/grad_mode.h"
#include "kiln/core/error.h"
#include "kiln/nn/layers.h"
#include "kiln/nn/transformer.h"
#include "kiln/ops/ops.h"
#include "tests/ops/aten_compare.h"

namespace kiln::test {
namespace {

testing::AssertionResult close(const Tensor& got, const torch::Tensor& want, double rtol = 1e-05,
                               double atol = 1e-06) {
  return close_to_aten(got, want, rtol, atol);
}

using nn::NamedTensors;

std::vector<std::string> names_of(const NamedTensors& named) {
  std::vector<std::string> out;
  for (const auto& [name, t] : named) out.push_back(name);
  return out;
}

// Copies of every parameter's values, to check later that nothing changed.
std::vector<Tensor> snapshot(const nn::Module& m) {
  std::vector<Tensor> out;
  for (const Tensor& p : m.parameters()) out.push_back(p.detach().clone());
  return out;
}
void expect_unchanged(const nn::Module& m, const std::vector<Tensor>& before) {
  TensorList now = m.parameters();
  ASSERT_EQ(now.size(), before.size());
  for (size_t i = 0; i < now.size(); ++i) EXPECT_TRUE(same_values(now[i], before[i])) << i;
}

nn::GPTConfig small_gpt() {
  nn::GPTConfig c;
  c.vocab_size = 32;
  c.context = 16;
  c.width = 32;
  c.layers = 2;
  c.heads = 4;
  return c;
}

// Linear(3, 4) -> GELU -> Linear(4, 2, no bias), seeded.
std::shared_ptr<nn::Sequential> small_mlp(Generator& gen) {
  return std::make_shared<nn::Sequential>(std::vector<std::shared_ptr<nn::UnaryModule>>{
      std::make_shared<nn::Linear>(3, 4, true, nn::Init{.gen = &gen}), std::make_shared<nn::GELU>(),
      std::make_shared<nn::Linear>(4, 2, false, nn::Init{.gen = &gen})});
}

// ---------------------------------------------------------------- names and bookkeeping

TEST(ModuleTest, SequentialNamesOrderAndLeaves) {
  Generator gen(1);
  auto seq = small_mlp(gen);
  NamedTensors named = seq->named_parameters();
  EXPECT_EQ(names_of(named), (std::vector<std::string>{"0.weight", "0.bias", "2.weight"}));
  EXPECT_EQ(named[0].second.sizes(), IntArrayRef({4, 3}));
  EXPECT_EQ(named[1].second.sizes(), IntArrayRef({4}));
  EXPECT_EQ(named[2].second.sizes(), IntArrayRef({2, 4}));
  TensorList params = seq->parameters();
  ASSERT_EQ(params.size(), named.size());
  for (size_t i = 0; i < params.size(); ++i) {
    EXPECT_TRUE(params[i].is_same(named[i].second)) << named[i].first;
    EXPECT_TRUE(params[i].requires_grad()) << named[i].first;
    EXPECT_TRUE(params[i].is_leaf()) << named[i].first;
  }
  EXPECT_EQ(seq->num_parameters(), 4 * 3 + 4 + 2 * 4);
  EXPECT_EQ(seq->size(), 3u);
  EXPECT_TRUE(seq->named_buffers().empty());
}

TEST(ModuleTest, GPTNamesFollowNanoGPT) {
  const nn::GPTConfig c = small_gpt();
  const int64_t C = c.width;
  nn::GPT gpt(c);
  std::vector<std::pair<std::string, std::vector<int64_t>>> want = {
      {"transformer.wte.weight", {c.vocab_size, C}}, {"transformer.wpe.weight", {c.context, C}}};
  for (int64_t i = 0; i < c.layers; ++i) {
    std::string h = "transformer.h." + std::to_string(i) + ".";
    std::vector<std::pair<std::string, std::vector<int64_t>>> block = {
        {h + "ln_1.weight", {C}},
        {h + "ln_1.bias", {C}},
        {h + "attn.c_attn.weight", {3 * C, C}},
        {h + "attn.c_attn.bias", {3 * C}},
        {h + "attn.c_proj.weight", {C, C}},
        {h + "attn.c_proj.bias", {C}},
        {h + "ln_2.weight", {C}},
        {h + "ln_2.bias", {C}},
        {h + "mlp.c_fc.weight", {4 * C, C}},
        {h + "mlp.c_fc.bias", {4 * C}},
        {h + "mlp.c_proj.weight", {C, 4 * C}},
        {h + "mlp.c_proj.bias", {C}}};
    want.insert(want.end(), block.begin(), block.end());
  }
  want.push_back({"transformer.ln_f.weight", {C}});
  want.push_back({"transformer.ln_f.bias", {C}});

  NamedTensors named = gpt.named_parameters();
  ASSERT_EQ(named.size(), want.size());
  int64_t total = 0;
  for (size_t i = 0; i < named.size(); ++i) {
    EXPECT_EQ(named[i].first, want[i].first) << i;
    EXPECT_EQ(named[i].second.sizes(), IntArrayRef(want[i].second)) << want[i].first;
    EXPECT_TRUE(named[i].second.requires_grad()) << want[i].first;
    EXPECT_TRUE(named[i].second.is_leaf()) << want[i].first;
    EXPECT_EQ(named[i].second.dtype(), kFloat32);
    total += named[i].second.numel();
  }
  // V C + T C + L (12 C^2 + 13 C) + 2 C; the head is tied to wte (no separate parameter).
  const int64_t closed_form =
      c.vocab_size * C + c.context * C + c.layers * (12 * C * C + 13 * C) + 2 * C;
  EXPECT_EQ(gpt.num_parameters(), closed_form);
  EXPECT_EQ(total, closed_form);
}

TEST(ModuleTest, GPTWithoutBiasHasNoBiases) {
  nn::GPTConfig c = small_gpt();
  c.bias = false;
  nn::GPT gpt(c);
  NamedTensors named = gpt.named_parameters();
  EXPECT_EQ(named.size(), static_cast<size_t>(2 + 6 * c.layers + 1));
  for (const auto& [name, p] : named) EXPECT_TRUE(name.ends_with(".weight")) << name;
  const int64_t C = c.width;
  EXPECT_EQ(gpt.num_parameters(),
            c.vocab_size * C + c.context * C + c.layers * (12 * C * C + 2 * C) + C);
  Tensor idx = zeros({1, 4}, kInt64);
  EXPECT_EQ(gpt.forward(idx).sizes(), IntArrayRef({1, 4, 32}));
}

TEST(ModuleTest, StateDictIsDetachedAndSharesStorage) {
  Generator gen(2);
  auto seq = small_mlp(gen);
  NamedTensors sd = seq->state_dict();
  NamedTensors named = seq->named_parameters();
  ASSERT_EQ(names_of(sd), names_of(named));
  for (size_t i = 0; i < sd.size(); ++i) {
    EXPECT_FALSE(sd[i].second.requires_grad()) << sd[i].first;
    EXPECT_EQ(sd[i].second.data_ptr(), named[i].second.data_ptr()) << sd[i].first;
  }
}

TEST(ModuleTest, StateDictRoundTripCopiesInPlace) {
  Generator g1(11), g2(22);
  nn::GPT a(small_gpt(), {.gen = &g1});
  nn::GPT b(small_gpt(), {.gen = &g2});
  TensorList pb = b.parameters();
  std::vector<void*> addresses;
  for (const Tensor& p : pb) addresses.push_back(p.data_ptr());
  ASSERT_FALSE(same_values(a.parameters()[0], pb[0]));  // different seeds, different weights

  b.load_state_dict(a.state_dict());
  NamedTensors na = a.named_parameters(), nb = b.named_parameters();
  ASSERT_EQ(na.size(), nb.size());
  for (size_t i = 0; i < na.size(); ++i) {
    EXPECT_TRUE(same_values(na[i].second, nb[i].second)) << na[i].first;
    EXPECT_TRUE(nb[i].second.is_same(pb[i])) << nb[i].first;
    EXPECT_EQ(nb[i].second.data_ptr(), addresses[i]) << nb[i].first;
    EXPECT_TRUE(nb[i].second.is_leaf() && nb[i].second.requires_grad()) << nb[i].first;
  }
  // The loaded module computes what the original does.
  Tensor idx = randint(0, 32, {2, 8}, &g1, kInt64);
  EXPECT_TRUE(same_values(a.forward(idx), b.forward(idx)));
}

TEST(ModuleTest, LoadOwnStateDictIsANoOp) {
  Generator gen(15);
  auto seq = small_mlp(gen);
  auto before = snapshot(*seq);
  seq->load_state_dict(seq->state_dict());  // every source aliases its destination
  expect_unchanged(*seq, before);
}

TEST(ModuleTest, LoadStateDictCastsDtype) {
  Generator gen(3);
  auto a = small_mlp(gen);
  auto b = small_mlp(gen);
  NamedTensors sd;
  for (auto& [name, t] : a->state_dict()) sd.emplace_back(name, t.to(kFloat64));
  b->load_state_dict(sd);
  for (size_t i = 0; i < sd.size(); ++i) {
    EXPECT_EQ(b->parameters()[i].dtype(), kFloat32);
    EXPECT_TRUE(same_values(b->parameters()[i], a->parameters()[i]));
  }
}

TEST(ModuleTest, LoadStateDictMissingKey) {
  Generator gen(4);
  auto a = small_mlp(gen);
  auto b = small_mlp(gen);
  NamedTensors sd = a->state_dict();
  sd.erase(sd.begin() + 1);  // drop "0.bias"
  auto before = snapshot(*b);
  expect_value_error([&] { b->load_state_dict(sd); }, {"[load_state_dict]", "missing", "0.bias"});
  expect_unchanged(*b, before);

  // Non-strict: the present entries are copied, the missing one is left as it was.
  b->load_state_dict(sd, /*strict=*/false);
  TensorList pa = a->parameters(), pb = b->parameters();
  EXPECT_TRUE(same_values(pb[0], pa[0]));
  EXPECT_TRUE(same_values(pb[1], before[1]));
  EXPECT_TRUE(same_values(pb[2], pa[2]));
}

TEST(ModuleTest, LoadStateDictUnexpectedKey) {
  Generator gen(5);
  auto a = small_mlp(gen);
  auto b = small_mlp(gen);
  NamedTensors sd = a->state_dict();
  sd.emplace_back("3.weight", zeros({2, 2}));
  auto before = snapshot(*b);
  expect_value_error([&] { b->load_state_dict(sd); },
                     {"[load_state_dict]", "unexpected", "3.weight"});
  expect_unchanged(*b, before);

  b->load_state_dict(sd, /*strict=*/false);
  for (size_t i = 0; i < 3; ++i) EXPECT_TRUE(same_values(b->parameters()[i], a->parameters()[i]));
}

TEST(ModuleTest, LoadStateDictShapeMismatchNamesKeyAndShapes) {
  Generator gen(6);
  auto a = small_mlp(gen);
  auto b = small_mlp(gen);
  NamedTensors sd = a->state_dict();
  sd[0].second = zeros({3, 4});  // "0.weight" is [4, 3]
  auto before = snapshot(*b);
  expect_value_error([&] { b->load_state_dict(sd); },
                     {"[load_state_dict]", "0.weight", "[3, 4]", "[4, 3]"});
  expect_unchanged(*b, before);  // "0.bias" and "2.weight" were valid, but are not copied either
  // A shape mismatch is an error even when not strict.
  expect_value_error([&] { b->load_state_dict(sd, false); }, {"0.weight", "[3, 4]", "[4, 3]"});
  expect_unchanged(*b, before);
}

TEST(ModuleTest, LoadStateDictDuplicateKey) {
  Generator gen(7);
  auto a = small_mlp(gen);
  auto b = small_mlp(gen);
  NamedTensors sd = a->state_dict();
  sd.push_back(sd[2]);
  auto before = snapshot(*b);
  expect_value_error([&] { b->load_state_dict(sd); },
                     {"[load_state_dict]", "duplicate", "2.weight"});
  expect_unchanged(*b, before);
  expect_value_error([&] { b->load_state_dict(sd, false); }, {"duplicate", "2.weight"});
  expect_unchanged(*b, before);
}

TEST(ModuleTest, LoadStateDictUndefinedEntry) {
  Generator gen(8);
  auto b = small_mlp(gen);
  NamedTensors sd = b->state_dict();
  auto before = snapshot(*b);
  for (auto& [name, t] : sd) t = t.clone().fill_(1.0);
  sd[1].second = Tensor();
  expect_value_error([&] { b->load_state_dict(sd); }, {"[load_state_dict]", "0.bias"});
  expect_unchanged(*b, before);
}

TEST(ModuleTest, TrainEvalPropagatesAndDropoutIsIdentityInEval) {
  Generator gen(9);
  auto drop = std::make_shared<nn::Dropout>(0.5, &gen);
  auto inner = std::make_shared<nn::Sequential>(
      std::vector<std::shared_ptr<nn::UnaryModule>>{std::make_shared<nn::Linear>(4, 4), drop});
  nn::Sequential outer({inner, std::make_shared<nn::SiLU>()});
  EXPECT_TRUE(outer.is_training() && inner->is_training() && drop->is_training());

  Tensor x = randn({64, 4}, &gen, kFloat32);
  Tensor y = drop->forward(x);
  std::vector<float> xs = x.to_vector<float>(), ys = y.to_vector<float>();
  int zeros_seen = 0;
  for (size_t i = 0; i < xs.size(); ++i) {
    if (ys[i] == 0.0f)
      ++zeros_seen;
    else
      EXPECT_NEAR(ys[i], 2.0f * xs[i], 1e-6f) << i;  // survivors scaled by 1 / (1 - p)
  }
  EXPECT_GT(zeros_seen, 64);  // 256 elements, p = 0.5
  EXPECT_LT(zeros_seen, 192);

  outer.eval();
  EXPECT_FALSE(outer.is_training());
  EXPECT_FALSE(inner->is_training());
  EXPECT_FALSE(drop->is_training());
  EXPECT_FALSE(outer[1].is_training());
  EXPECT_TRUE(same_values(drop->forward(x), x));

  outer.train();
  EXPECT_TRUE(inner->is_training() && drop->is_training() && outer[1].is_training());

  nn::Block block(32, 4);
  block.eval();
  EXPECT_FALSE(block.attn->c_attn->is_training());
  EXPECT_FALSE(block.mlp->c_proj->is_training());
  EXPECT_FALSE(block.ln_2->is_training());
}

TEST(ModuleTest, DropoutEdgeProbabilities) {
  Generator gen(10);
  Tensor x = randn({8, 8}, &gen, kFloat32);
  nn::Dropout none(0.0, &gen);
  EXPECT_TRUE(same_values(none.forward(x), x));
  nn::Dropout all(1.0, &gen);
  EXPECT_TRUE(same_values(all.forward(x), zeros({8, 8}, kFloat32)));
}

TEST(ModuleTest, ToFloat64CastsParametersAndKeepsLeaves) {
  Generator gen(12);
  auto seq = small_mlp(gen);
  std::vector<Tensor> before = snapshot(*seq);
  seq->to(kFloat64);
  TensorList params = seq->parameters();
  for (size_t i = 0; i < params.size(); ++i) {
    EXPECT_EQ(params[i].dtype(), kFloat64);
    EXPECT_TRUE(params[i].is_leaf());
    EXPECT_TRUE(params[i].requires_grad());
    EXPECT_TRUE(same_values(params[i], before[i].to(kFloat64)));
  }
  // The module's members are what it now registers: forward and backward run in float64.
  Tensor x = randn({5, 3}, &gen, kFloat64);
  Tensor y = seq->forward(x);
  EXPECT_EQ(y.dtype(), kFloat64);
  sum(y).backward();
  for (const Tensor& p : seq->parameters()) {
    ASSERT_TRUE(p.grad().defined());
    EXPECT_EQ(p.grad().dtype(), kFloat64);
  }
  // And back to float32.
  seq->to(kFloat32);
  for (const Tensor& p : seq->parameters()) {
    EXPECT_EQ(p.dtype(), kFloat32);
    EXPECT_TRUE(p.is_leaf() && p.requires_grad());
  }
}

TEST(ModuleTest, GPTToFloat64MatchesFloat32) {
  Generator gen(13);
  nn::GPT gpt(small_gpt(), {.gen = &gen});
  Tensor idx = randint(0, 32, {2, 8}, &gen, kInt64);
  Tensor logits32 = gpt.forward(idx);
  gpt.to(kFloat64);
  for (const Tensor& p : gpt.parameters()) EXPECT_EQ(p.dtype(), kFloat64);
  Tensor logits64 = gpt.forward(idx);
  EXPECT_EQ(logits64.dtype(), kFloat64);
  EXPECT_TRUE(close(logits32, to_aten(logits64).to(torch::kFloat), 1e-4, 1e-5));
}

TEST(ModuleTest, ZeroGradInPlaceAndSetToNone) {
  Generator gen(14);
  auto seq = small_mlp(gen);
  Tensor x = randn({5, 3}, &gen, kFloat32);
  sum(seq->forward(x)).backward();
  TensorList params = seq->parameters();
  std::vector<void*> grad_addresses;
  for (const Tensor& p : params) {
    ASSERT_TRUE(p.grad().defined());
    grad_addresses.push_back(p.grad().data_ptr());
  }
  seq->zero_grad();
  for (size_t i = 0; i < params.size(); ++i) {
    ASSERT_TRUE(params[i].grad().defined());
    EXPECT_EQ(params[i].grad().data_ptr(), grad_addresses[i]);
    EXPECT_TRUE(same_values(params[i].grad(), zeros_like(params[i])));
  }
  // A second backward accumulates into the zeroed buffers.
  sum(seq->forward(x)).backward();
  for (size_t i = 0; i < params.size(); ++i)
    EXPECT_EQ(params[i].grad().data_ptr(), grad_addresses[i]);

  seq->zero_grad(/*set_to_none=*/true);
  for (const Tensor& p : params) EXPECT_FALSE(p.grad().defined());
  seq->zero_grad();  // no gradients: nothing to do
  for (const Tensor& p : params) EXPECT_FALSE(p.grad().defined());
}

// ---------------------------------------------------------------- layers vs libtorch

TEST(LayerTest, LinearWithBias) {
  Generator gen(20);
  nn::Linear lin(5, 3, true, {.gen = &gen});
  Tensor x = randn({4, 5}, &gen, kFloat32);
  torch::Tensor want =
      torch::nn::functional::linear(to_aten(x), to_aten(lin.weight), to_aten(lin.bias));
  EXPECT_TRUE(close(lin.forward(x), want));
  EXPECT_TRUE(close(lin(x), want));
}

TEST(LayerTest, LinearWithoutBias) {
  Generator gen(21);
  nn::Linear lin(5, 3, false, {.gen = &gen});
  EXPECT_FALSE(lin.bias.defined());
  EXPECT_EQ(lin.named_parameters().size(), 1u);
  Tensor x = randn({4, 5}, &gen, kFloat32);
  EXPECT_TRUE(
      close(lin.forward(x), torch::nn::functional::linear(to_aten(x), to_aten(lin.weight))));
}

TEST(LayerTest, LinearThreeDimInput) {
  Generator gen(22);
  nn::Linear lin(6, 7, true, {.gen = &gen});
  Tensor x = randn({2, 3, 6}, &gen, kFloat32);
  torch::Tensor want =
      torch::nn::functional::linear(to_aten(x), to_aten(lin.weight), to_aten(lin.bias));
  Tensor got = lin.forward(x);
  EXPECT_EQ(got.sizes(), IntArrayRef({2, 3, 7}));
  EXPECT_TRUE(close(got, want));
}

TEST(LayerTest, LinearFloat64) {
  Generator gen(23);
  nn::Linear lin(4, 2, true, {.gen = &gen, .dtype = kFloat64});
  EXPECT_EQ(lin.weight.dtype(), kFloat64);
  Tensor x = randn({3, 4}, &gen, kFloat64);
  EXPECT_TRUE(
      close(lin.forward(x),
            torch::nn::functional::linear(to_aten(x), to_aten(lin.weight), to_aten(lin.bias)),
            1e-12, 1e-12));
}

TEST(LayerTest, Embedding) {
  Generator gen(24);
  nn::Embedding emb(10, 4, {.gen = &gen});
  Tensor idx = from_vector(std::vector<int64_t>{0, 9, 3, 3, 7, 1}, IntArrayRef({2, 3}));
  Tensor got = emb.forward(idx);
  EXPECT_EQ(got.sizes(), IntArrayRef({2, 3, 4}));
  EXPECT_TRUE(close(got, torch::embedding(to_aten(emb.weight), to_aten(idx)), 0, 0));
}

// Random weight and bias (the defaults are ones and zeros, which would hide a mix-up).
void randomise(const nn::Module& m, Generator& gen) {
  autograd::NoGradGuard no_grad;
  for (Tensor p : m.parameters()) p.copy_(randn(p.sizes(), &gen, p.dtype()));
}

TEST(LayerTest, LayerNorm) {
  Generator gen(25);
  nn::LayerNorm ln(6, 1e-5, true);
  randomise(ln, gen);
  Tensor x = randn({2, 3, 6}, &gen, kFloat32) * 3.0 + 1.0;
  torch::Tensor want =
      torch::layer_norm(to_aten(x), {6}, to_aten(ln.weight), to_aten(ln.bias), 1e-5);
  EXPECT_TRUE(close(ln.forward(x), want, 1e-5, 1e-5));

  nn::LayerNorm no_bias(6, 1e-3, false);
  EXPECT_FALSE(no_bias.bias.defined());
  EXPECT_EQ(no_bias.named_parameters().size(), 1u);
  randomise(no_bias, gen);
  torch::Tensor want2 = torch::layer_norm(to_aten(x), {6}, to_aten(no_bias.weight), {}, 1e-3);
  EXPECT_TRUE(close(no_bias.forward(x), want2, 1e-5, 1e-5));
}

TEST(LayerTest, RMSNorm) {
  Generator gen(26);
  nn::RMSNorm rms(8);
  EXPECT_EQ(rms.eps, 1e-6);
  randomise(rms, gen);
  Tensor x = randn({3, 2, 8}, &gen, kFloat32) * 2.0;
  // libtorch 1.13 has no rms_norm: x / sqrt(mean(x^2) + eps) * weight.
  torch::Tensor tx = to_aten(x);
  torch::Tensor want = tx * torch::rsqrt(tx.pow(2).mean(-1, true) + 1e-6) * to_aten(rms.weight);
  EXPECT_TRUE(close(rms.forward(x), want, 1e-5, 1e-5));

  nn::RMSNorm rms_eps(8, 0.5);
  torch::Tensor want2 = tx * torch::rsqrt(tx.pow(2).mean(-1, true) + 0.5);
  EXPECT_TRUE(close(rms_eps.forward(x), want2, 1e-5, 1e-5));
}

TEST(LayerTest, GELUBothModes) {
  Generator gen(27);
  Tensor x = randn({5, 7}, &gen, kFloat32) * 3.0;
  EXPECT_TRUE(close(nn::GELU().forward(x), torch::gelu(to_aten(x), "none")));
  EXPECT_TRUE(close(nn::GELU(true).forward(x), torch::gelu(to_aten(x), "tanh")));
  // The two modes differ: check that the flag is used.
  EXPECT_FALSE(same_values(nn::GELU().forward(x), nn::GELU(true).forward(x)));
}

TEST(LayerTest, SiLU) {
  Generator gen(28);
  Tensor x = randn({5, 7}, &gen, kFloat32) * 3.0;
  EXPECT_TRUE(close(nn::SiLU().forward(x), torch::silu(to_aten(x))));
}

TEST(LayerTest, LeakyReLUHardtanhAndFlatten) {
  Generator gen(30);
  Tensor x = randn({2, 3, 4, 5}, &gen, kFloat32) * 3.0;
  EXPECT_TRUE(close(nn::LeakyReLU().forward(x), torch::leaky_relu(to_aten(x))));
  EXPECT_TRUE(close(nn::LeakyReLU(0.2).forward(x), torch::leaky_relu(to_aten(x), 0.2)));
  EXPECT_TRUE(close(nn::Hardtanh().forward(x), torch::hardtanh(to_aten(x))));
  EXPECT_TRUE(close(nn::Hardtanh(-2, 0.5).forward(x), torch::hardtanh(to_aten(x), -2, 0.5)));
  Tensor f = nn::Flatten().forward(x);
  EXPECT_EQ(f.dim(), 2);
  EXPECT_EQ(f.size(0), 2);
  EXPECT_EQ(f.size(1), 60);
  EXPECT_TRUE(close(nn::Flatten(1, 2).forward(x), torch::flatten(to_aten(x), 1, 2)));
  EXPECT_TRUE(close(nn::Flatten(0).forward(x), torch::flatten(to_aten(x))));
  EXPECT_THROW(nn::Flatten(5).forward(x), Error);
}

TEST(LayerTest, ELU) {
  Generator gen(31);
  Tensor x = randn({2, 3, 4}, &gen, kFloat32) * 3.0;
  EXPECT_TRUE(close(nn::ELU().forward(x), torch::elu(to_aten(x))));
  EXPECT_TRUE(close(nn::ELU(0.3).forward(x), torch::elu(to_aten(x), 0.3)));
  EXPECT_THROW(nn::ELU().forward(ones({3}, kInt64)), TypeError);
}

TEST(LayerTest, Sequential) {
  Generator gen(29);
  auto seq = small_mlp(gen);
  auto* l0 = dynamic_cast<nn::Linear*>(&(*seq)[0]);
  auto* l2 = dynamic_cast<nn::Linear*>(&(*seq)[2]);
  ASSERT_TRUE(l0 && l2);
  EXPECT_TRUE(dynamic_cast<nn::GELU*>(&(*seq)[1]) != nullptr);
  Tensor x = randn({4, 3}, &gen, kFloat32);
  namespace F = torch::nn::functional;
  torch::Tensor want =
      F::linear(torch::gelu(F::linear(to_aten(x), to_aten(l0->weight), to_aten(l0->bias))),
                to_aten(l2->weight));
  EXPECT_TRUE(close(seq->forward(x), want));
  EXPECT_TRUE(same_values(nn::Sequential().forward(x), x));  // empty: identity
}

// ---------------------------------------------------------------- constructor errors

TEST(LayerTest, ConstructorErrors) {
  expect_value_error([] { nn::Linear(0, 3); }, {"[Linear]", "in=0", "out=3"});
  expect_value_error([] { nn::Linear(3, -1); }, {"[Linear]", "out=-1"});
  expect_value_error([] { nn::Embedding(0, 4); }, {"[Embedding]"});
  expect_value_error([] { nn::CausalSelfAttention(32, 5); }, {"[CausalSelfAttention]", "32", "5"});
  expect_value_error([] { nn::CausalSelfAttention(32, 0); }, {"[CausalSelfAttention]"});
  expect_value_error([] { nn::Block(30, 4); }, {"[CausalSelfAttention]", "30", "4"});
  expect_value_error([] { nn::Dropout(1.5); }, {"[Dropout]", "1.5"});
  expect_value_error([] { nn::Dropout(-0.1); }, {"[Dropout]", "-0.1"});
  expect_value_error([] { nn::Sequential().push_back(nullptr); }, {"[Sequential]"});
  nn::GPTConfig bad = small_gpt();
  bad.heads = 5;
  expect_value_error([&] { nn::GPT{bad}; }, {"[CausalSelfAttention]", "32", "5"});
  bad = small_gpt();
  bad.vocab_size = 0;
  expect_value_error([&] { nn::GPT{bad}; }, {"[GPT]"});
}

// ---------------------------------------------------------------- initialisation

double mean_of(const Tensor& t) { return to_aten(t).to(torch::kDouble).mean().item<double>(); }
double std_of(const Tensor& t) { return to_aten(t).to(torch::kDouble).std().item<double>(); }

TEST(InitTest, LinearUniformBounds) {
  Generator gen(30);
  nn::Linear lin(64, 48, true, {.gen = &gen});
  const double bound = 1.0 / 8.0;
  for (const Tensor* t : {&lin.weight, &lin.bias}) {
    torch::Tensor a = to_aten(*t);
    EXPECT_LE(a.abs().max().item<double>(), bound);
    EXPECT_GT(a.abs().max().item<double>(), 0.8 * bound);  // fills the range
  }
  // U(-b, b): mean 0, std b / sqrt(3).
  EXPECT_NEAR(mean_of(lin.weight), 0.0, 0.01);
  EXPECT_NEAR(std_of(lin.weight), bound / std::sqrt(3.0), 0.1 * bound / std::sqrt(3.0));
}

TEST(InitTest, EmbeddingStandardNormal) {
  Generator gen(31);
  nn::Embedding emb(100, 64, {.gen = &gen});
  EXPECT_NEAR(mean_of(emb.weight), 0.0, 0.05);
  EXPECT_NEAR(std_of(emb.weight), 1.0, 0.05);
}

TEST(InitTest, LayerNormOnesAndZeros) {
  nn::LayerNorm ln(10);
  EXPECT_TRUE(same_values(ln.weight, ones({10}, kFloat32)));
  EXPECT_TRUE(same_values(ln.bias, zeros({10}, kFloat32)));
  nn::RMSNorm rms(10);
  EXPECT_TRUE(same_values(rms.weight, ones({10}, kFloat32)));
}

TEST(InitTest, GPTLikeGPT2) {
  Generator gen(32);
  nn::GPTConfig c = small_gpt();
  c.vocab_size = 256;  // more elements for the statistics
  c.width = 64;
  nn::GPT gpt(c, {.gen = &gen});
  const double proj_std = 0.02 / std::sqrt(2.0 * static_cast<double>(c.layers));
  for (const auto& [name, p] : gpt.named_parameters()) {
    SCOPED_TRACE(name);
    bool is_bias = name.ends_with(".bias");
    bool is_norm = name.find(".ln_") != std::string::npos;
    if (is_norm && !is_bias) {
      EXPECT_TRUE(same_values(p, ones_like(p)));
    } else if (is_bias) {
      EXPECT_TRUE(same_values(p, zeros_like(p)));
    } else {
      double want = name.ends_with("c_proj.weight") ? proj_std : 0.02;
      EXPECT_NEAR(mean_of(p), 0.0, 0.2 * want);
      EXPECT_NEAR(std_of(p), want, 0.15 * want);
    }
  }
}

TEST(InitTest, SameSeedSameModel) {
  Generator g1(77), g2(77), g3(78);
  nn::GPT a(small_gpt(), {.gen = &g1}), b(small_gpt(), {.gen = &g2}), c(small_gpt(), {.gen = &g3});
  TensorList pa = a.parameters(), pb = b.parameters(), pc = c.parameters();
  bool any_differs = false;
  for (size_t i = 0; i < pa.size(); ++i) {
    EXPECT_TRUE(same_values(pa[i], pb[i])) << i;
    if (!same_values(pa[i], pc[i])) any_differs = true;
  }
  EXPECT_TRUE(any_differs);

  Generator h1(5), h2(5);
  auto s1 = small_mlp(h1);
  auto s2 = small_mlp(h2);
  for (size_t i = 0; i < 3; ++i) EXPECT_TRUE(same_values(s1->parameters()[i], s2->parameters()[i]));
}

}  // namespace
}  // namespace kiln::test

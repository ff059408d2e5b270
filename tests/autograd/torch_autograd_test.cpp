// Kiln's gradients against libtorch's autograd on the same weights and inputs, in float32: small
// models end to end, and the cases finite differences cannot check (ties, dtype casts). The
// only file of the autograd tests that includes <torch/torch.h> (slow to compile): keep it small.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <string>
#include <vector>

#include "kiln/autograd/engine.h"
#include "kiln/ops/ops.h"
#include "tests/ops/aten_compare.h"

namespace kiln::test {
namespace {

testing::AssertionResult close(const Tensor& got, const torch::Tensor& want, double rtol = 0.0001,
                               double atol = 1e-05) {
  return close_to_aten(got, want, rtol, atol);
}

// A float32 leaf drawn from N(0, scale^2), and the same values as a libtorch leaf.
struct Param {
  Tensor k;
  torch::Tensor t;
};
Param param(Generator& gen, IntArrayRef shape, double scale = 0.5) {
  Tensor k = randn(shape, &gen, kFloat32) * scale;
  torch::Tensor t = to_aten(k).requires_grad_();
  k.requires_grad_();
  return {k, t};
}

TEST(TorchAutograd, MlpGeluCrossEntropy) {
  Generator gen(1);
  Param x = param(gen, {4, 5}, 1.0), w1 = param(gen, {8, 5}), b1 = param(gen, {8}),
        w2 = param(gen, {3, 8}), b2 = param(gen, {3});
  std::vector<int64_t> tgt = {2, 0, 1, 2};
  Tensor kt = from_vector(tgt);
  Tensor loss = cross_entropy(linear(gelu(linear(x.k, w1.k, b1.k)), w2.k, b2.k), kt);
  loss.backward();
  torch::Tensor tl = torch::nn::functional::cross_entropy(
      torch::nn::functional::linear(torch::gelu(torch::nn::functional::linear(x.t, w1.t, b1.t)),
                                    w2.t, b2.t),
      to_aten(kt));
  tl.backward();
  EXPECT_TRUE(close(loss, tl.detach()));
  for (const Param* p : {&x, &w1, &b1, &w2, &b2}) EXPECT_TRUE(close(p->k.grad(), p->t.grad()));
}

TEST(TorchAutograd, CausalAttentionBlock) {
  const int64_t B = 2, L = 4, D = 6, H = 2, E = D / H;
  Generator gen(2);
  Param x = param(gen, {B, L, D}, 1.0), wq = param(gen, {D, D}), bq = param(gen, {D}),
        wk = param(gen, {D, D}), bk = param(gen, {D}), wv = param(gen, {D, D}),
        bv = param(gen, {D}), wo = param(gen, {D, D}), bo = param(gen, {D}),
        gamma = param(gen, {D}), beta = param(gen, {D});
  Tensor probe = randn({B, L, D}, &gen, kFloat32);  // loss = sum(out * probe)

  auto heads = [&](const Tensor& t) { return transpose(t.reshape({B, L, H, E}), 1, 2); };
  Tensor q = heads(linear(x.k, wq.k, bq.k)), k = heads(linear(x.k, wk.k, bk.k)),
         v = heads(linear(x.k, wv.k, bv.k));
  Tensor a = scaled_dot_product_attention(q, k, v, {}, true);
  Tensor o = linear(transpose(a, 1, 2).reshape({B, L, D}), wo.k, bo.k);
  Tensor y = layer_norm(x.k + o, {D}, gamma.k, beta.k);
  Tensor loss = sum(y * probe);
  loss.backward();

  namespace F = torch::nn::functional;
  auto theads = [&](const torch::Tensor& t) { return t.reshape({B, L, H, E}).transpose(1, 2); };
  torch::Tensor tq = theads(F::linear(x.t, wq.t, bq.t)), tk = theads(F::linear(x.t, wk.t, bk.t)),
                tv = theads(F::linear(x.t, wv.t, bv.t));
  torch::Tensor scores = torch::matmul(tq, tk.transpose(-2, -1)) / std::sqrt(double(E));
  torch::Tensor future = torch::ones({L, L}, torch::kBool).triu(1);
  torch::Tensor ta = torch::matmul(torch::softmax(scores.masked_fill(future, -INFINITY), -1), tv);
  torch::Tensor to = F::linear(ta.transpose(1, 2).reshape({B, L, D}), wo.t, bo.t);
  torch::Tensor ty = torch::layer_norm(x.t + to, {D}, gamma.t, beta.t);
  torch::Tensor tloss = (ty * to_aten(probe)).sum();
  tloss.backward();

  EXPECT_TRUE(close(loss, tloss.detach(), 1e-4, 1e-4));
  for (const Param* p : {&x, &wq, &bq, &wk, &bk, &wv, &bv, &wo, &bo, &gamma, &beta})
    EXPECT_TRUE(close(p->k.grad(), p->t.grad()));
}

TEST(TorchAutograd, EmbeddingRmsNormLinearNllLoss) {
  const int64_t V = 7, D = 4, C = 5;
  Generator gen(3);
  Param emb = param(gen, {V, D}, 1.0), w = param(gen, {D}), proj = param(gen, {C, D}),
        bias = param(gen, {C});
  // Repeated tokens; one target row ignored.
  Tensor tokens = from_vector(std::vector<int64_t>{3, 1, 3, 6, 0, 3}, IntArrayRef({2, 3}));
  Tensor target = from_vector(std::vector<int64_t>{4, -100, 0, 2, 2, 1});
  const double eps = 1e-6;
  Tensor h = rms_norm(embedding(emb.k, tokens), {D}, w.k, eps);
  Tensor logp = log_softmax(linear(h, proj.k, bias.k), -1);
  Tensor loss = nll_loss(logp.reshape({-1, C}), target);
  loss.backward();

  torch::Tensor th = torch::embedding(emb.t, to_aten(tokens));
  th = th * torch::rsqrt(th.pow(2).mean(-1, true) + eps) * w.t;
  torch::Tensor tlogp = torch::log_softmax(torch::nn::functional::linear(th, proj.t, bias.t), -1);
  torch::Tensor tloss = torch::nll_loss(tlogp.reshape({-1, C}), to_aten(target));
  tloss.backward();

  EXPECT_TRUE(close(loss, tloss.detach()));
  for (const Param* p : {&emb, &w, &proj, &bias}) EXPECT_TRUE(close(p->k.grad(), p->t.grad()));
}

// Ties make finite differences invalid: the gradient is split evenly among the tied elements,
// as libtorch does.
TEST(TorchAutograd, AmaxAminTiesSplitEvenly) {
  Tensor base = from_vector(std::vector<float>{1, 3, 3, 2, 2, 2, -1, 0, -1}, IntArrayRef({3, 3}));
  Tensor seed = from_vector(std::vector<float>{1, 2, 3});
  struct Case {
    std::string name;
    std::function<Tensor(const Tensor&)> k;
    std::function<torch::Tensor(const torch::Tensor&)> t;
  };
  const std::vector<Case> cases = {
      {"amax_dim1", [](const Tensor& x) { return amax(x, {1}); },
       [](const torch::Tensor& x) { return x.amax({1}); }},
      {"amin_dim1", [](const Tensor& x) { return amin(x, {1}); },
       [](const torch::Tensor& x) { return x.amin({1}); }},
      {"amax_all", [](const Tensor& x) { return amax(x) * 3.0; },
       [](const torch::Tensor& x) { return x.amax() * 3.0; }},
      {"amin_all_keepdim", [](const Tensor& x) { return amin(x, {}, true) * 2.0; },
       [](const torch::Tensor& x) {
         return x.amin({0, 1}, true) * 2.0;
       }},
      {"amax_dim0_keepdim", [](const Tensor& x) { return amax(x, {0}, true); },
       [](const torch::Tensor& x) { return x.amax({0}, true); }},
      {"maximum_ties", [](const Tensor& x) { return maximum(x, full({3}, 2.0f, kFloat32)); },
       [](const torch::Tensor& x) { return torch::maximum(x, torch::full({3}, 2.0f)); }},
      {"minimum_ties", [](const Tensor& x) { return minimum(x, full({3}, 2.0f, kFloat32)); },
       [](const torch::Tensor& x) { return torch::minimum(x, torch::full({3}, 2.0f)); }},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    Tensor x = base.clone();
    x.requires_grad_();
    Tensor y = c.k(x);
    torch::Tensor tx = to_aten(base).requires_grad_();
    torch::Tensor ty = c.t(tx);
    Tensor g = y.numel() == 3 ? seed.reshape(y.sizes()) : ones_like(y);
    y.backward(g);
    ty.backward(to_aten(g));
    EXPECT_TRUE(close(x.grad(), tx.grad(), 0, 0));
  }
}

// Casts: the gradient comes back in the input's dtype (float32 -> float64 -> float32 and back).
TEST(TorchAutograd, DtypeCastGradients) {
  Generator gen(4);
  Param x = param(gen, {2, 3}, 1.0);
  Tensor w64 = randn({2, 3}, &gen, kFloat64);
  Tensor y = sum(exp(x.k.to(kFloat64)) * w64);
  y.backward();
  torch::Tensor ty = (x.t.to(torch::kDouble).exp() * to_aten(w64)).sum();
  ty.backward();
  ASSERT_TRUE(x.k.grad().defined());
  EXPECT_EQ(x.k.grad().dtype(), kFloat32);
  EXPECT_TRUE(close(x.k.grad(), x.t.grad(), 1e-6, 1e-7));

  Tensor d = randn({3}, &gen, kFloat64);
  d.requires_grad_();
  torch::Tensor td = to_aten(d).requires_grad_();
  Tensor z = sum(sin(d.to(kFloat32)) * 2.0f);
  z.backward();
  torch::Tensor tz = (td.to(torch::kFloat).sin() * 2.0f).sum();
  tz.backward();
  EXPECT_EQ(d.grad().dtype(), kFloat64);
  EXPECT_TRUE(close(d.grad(), td.grad(), 1e-6, 1e-7));
}

}  // namespace
}  // namespace kiln::test

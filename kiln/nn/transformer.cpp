#include "kiln/nn/transformer.h"

#include <cmath>

#include "kiln/autograd/grad_mode.h"
#include "kiln/core/error.h"
#include "kiln/ops/ops.h"

namespace kiln::nn {

CausalSelfAttention::CausalSelfAttention(int64_t width, int64_t heads, bool bias, const Init& init)
    : heads(heads) {
  KILN_CHECK(heads > 0 && width % heads == 0,
             "[CausalSelfAttention] width {} must be a positive multiple of heads {}", width,
             heads);
  c_attn = register_module("c_attn", std::make_shared<Linear>(width, 3 * width, bias, init));
  c_proj = register_module("c_proj", std::make_shared<Linear>(width, width, bias, init));
}

Tensor CausalSelfAttention::forward(const Tensor& x) {
  KILN_CHECK(x.dim() == 3, "[CausalSelfAttention] expected x of shape [B, T, C], got [{}]",
             fmt::join(x.sizes(), ", "));
  int64_t b = x.size(0), t = x.size(1), d = x.size(2) / heads;
  // qkv [B, T, 3C] -> q, k, v [B, H, T, D]. Under tensor parallel c_attn gives this rank's
  // heads only (kiln/parallel/tensor_parallel.h), so the width and heads are taken from qkv.
  Tensor qkv_all = (*c_attn)(x);
  int64_t c = qkv_all.size(2) / 3, h = c / d;
  std::vector<Tensor> qkv = split(qkv_all, c, 2);
  auto heads_first = [&](const Tensor& y) { return transpose(y.view({b, t, h, d}), 1, 2); };
  Tensor y = scaled_dot_product_attention(heads_first(qkv[0]), heads_first(qkv[1]),
                                          heads_first(qkv[2]), {}, true);
  return (*c_proj)(transpose(y, 1, 2).contiguous().view({b, t, c}));
}

MLP::MLP(int64_t width, bool bias, const Init& init) {
  c_fc = register_module("c_fc", std::make_shared<Linear>(width, 4 * width, bias, init));
  c_proj = register_module("c_proj", std::make_shared<Linear>(4 * width, width, bias, init));
}
Tensor MLP::forward(const Tensor& x) { return (*c_proj)(gelu((*c_fc)(x), true)); }

Block::Block(int64_t width, int64_t heads, bool bias, const Init& init) {
  ln_1 = register_module("ln_1", std::make_shared<LayerNorm>(width, 1e-5, bias, init));
  attn = register_module("attn", std::make_shared<CausalSelfAttention>(width, heads, bias, init));
  ln_2 = register_module("ln_2", std::make_shared<LayerNorm>(width, 1e-5, bias, init));
  mlp = register_module("mlp", std::make_shared<MLP>(width, bias, init));
}
Tensor Block::forward(const Tensor& x) {
  Tensor y = add(x, (*attn)((*ln_1)(x)));
  return add(y, (*mlp)((*ln_2)(y)));
}

GPTConfig GPTConfig::tiny(int64_t vocab) { return {vocab, 64, 64, 2, 4, true}; }
GPTConfig GPTConfig::small(int64_t vocab) { return {vocab, 128, 128, 4, 4, true}; }
GPTConfig GPTConfig::bench() { return {512, 128, 256, 4, 4, true}; }

namespace {
void zero_(const Tensor& t) {
  autograd::NoGradGuard no_grad;
  Tensor(t).zero_();
}
// A module that only groups submodules under one name prefix.
class Container : public Module {
 public:
  using Module::register_module;
};
}  // namespace

GPT::GPT(const GPTConfig& cfg, const Init& init) : config_(cfg) {
  KILN_CHECK(cfg.vocab_size > 0 && cfg.context > 0 && cfg.layers > 0,
             "[GPT] vocab_size, context and layers must be positive, got {}, {}, {}",
             cfg.vocab_size, cfg.context, cfg.layers);
  auto tr = std::make_shared<Container>();
  transformer_ = register_module("transformer", tr);
  wte_ = tr->register_module("wte", std::make_shared<Embedding>(cfg.vocab_size, cfg.width, init));
  wpe_ = tr->register_module("wpe", std::make_shared<Embedding>(cfg.context, cfg.width, init));
  auto blocks = tr->register_module("h", std::make_shared<Container>());
  for (int64_t i = 0; i < cfg.layers; ++i)
    h_.push_back(blocks->register_module(
        std::to_string(i), std::make_shared<Block>(cfg.width, cfg.heads, cfg.bias, init)));
  ln_f_ = tr->register_module("ln_f", std::make_shared<LayerNorm>(cfg.width, 1e-5, cfg.bias, init));

  const double proj_std = 0.02 / std::sqrt(2.0 * static_cast<double>(cfg.layers));
  for (auto& [name, p] : named_parameters()) {
    bool is_weight = name.size() >= 6 && name.compare(name.size() - 6, 6, "weight") == 0;
    if (name.find(".ln_") != std::string::npos) continue;  // LayerNorms keep ones / zeros
    if (!is_weight)
      zero_(p);
    else if (name.find("c_proj.weight") != std::string::npos)
      normal_(p, 0.0, proj_std, init.gen);
    else
      normal_(p, 0.0, 0.02, init.gen);
  }
}

Tensor GPT::forward(const Tensor& idx) {
  KILN_CHECK(idx.dim() == 2, "[GPT] expected token ids of shape [B, T], got [{}]",
             fmt::join(idx.sizes(), ", "));
  int64_t t = idx.size(1);
  KILN_CHECK(t <= config_.context, "[GPT] sequence length {} exceeds the context {}", t,
             config_.context);
  Tensor pos = arange(t, kInt64, idx.device());
  Tensor x = add((*wte_)(idx), (*wpe_)(pos));
  for (auto& block : h_) x = (*block)(x);
  x = (*ln_f_)(x);
  return matmul(x, kiln::t(wte_->weight));  // [B, T, V], head tied to the token embedding
}

Tensor GPT::loss(const Tensor& idx, const Tensor& targets) {
  Tensor logits = (*this)(idx);
  return cross_entropy(logits.reshape({-1, config_.vocab_size}), targets.reshape({-1}));
}

}  // namespace kiln::nn

#pragma once
// A GPT-2 style decoder: causal self-attention, MLP, pre-norm Transformer blocks, and the
// GPT model. Parameter names follow nanoGPT ("transformer.h.0.attn.c_attn.weight"), so its
// checkpoints map onto Kiln's one to one.
#include "kiln/nn/layers.h"

namespace kiln::nn {

// Multi-head causal self-attention over x [B, T, C]: one [3C, C] projection for q, k, v,
// scaled dot-product attention with a causal mask, and an output projection.
class CausalSelfAttention : public UnaryModule {
 public:
  CausalSelfAttention(int64_t width, int64_t heads, bool bias = true, const Init& init = {});
  Tensor forward(const Tensor& x) override;
  std::shared_ptr<Linear> c_attn, c_proj;
  int64_t heads;
};

// width -> 4 width -> GELU (tanh approximation, as GPT-2) -> width.
class MLP : public UnaryModule {
 public:
  explicit MLP(int64_t width, bool bias = true, const Init& init = {});
  Tensor forward(const Tensor& x) override;
  std::shared_ptr<Linear> c_fc, c_proj;
};

// x + attn(ln_1(x)), then + mlp(ln_2(.)).
class Block : public UnaryModule {
 public:
  Block(int64_t width, int64_t heads, bool bias = true, const Init& init = {});
  Tensor forward(const Tensor& x) override;
  std::shared_ptr<LayerNorm> ln_1, ln_2;
  std::shared_ptr<CausalSelfAttention> attn;
  std::shared_ptr<MLP> mlp;
};

struct GPTConfig {
  int64_t vocab_size = 256;
  int64_t context = 128;  // longest sequence (rows of the position embedding)
  int64_t width = 128;
  int64_t layers = 4;
  int64_t heads = 4;
  bool bias = true;
  // Named sizes used by `kiln train --config` and the benchmarks.
  static GPTConfig tiny(int64_t vocab_size);
  static GPTConfig small(int64_t vocab_size);
  // The `gpt` workload of BENCHMARKS.md: vocab 512, context 128, width 256, 4 layers, 4 heads.
  static GPTConfig bench();
};

// Token + position embeddings, blocks, a final LayerNorm and a language-model head tied to
// the token embedding. Initialised like GPT-2: N(0, 0.02), residual projections
// N(0, 0.02 / sqrt(2 layers)), zero biases.
class GPT : public UnaryModule {
 public:
  explicit GPT(const GPTConfig& config, const Init& init = {});
  // idx [B, T] int64 token ids (T <= context) -> logits [B, T, vocab].
  Tensor forward(const Tensor& idx) override;
  // Mean cross-entropy of (*this)(idx) (forward between the hooks) against targets [B, T].
  Tensor loss(const Tensor& idx, const Tensor& targets);
  const GPTConfig& config() const { return config_; }

 private:
  GPTConfig config_;
  std::shared_ptr<Module> transformer_;
  std::shared_ptr<Embedding> wte_, wpe_;
  std::vector<std::shared_ptr<Block>> h_;
  std::shared_ptr<LayerNorm> ln_f_;
};

}  // namespace kiln::nn

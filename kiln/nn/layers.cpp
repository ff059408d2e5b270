#include "kiln/nn/layers.h"

#include <cmath>

#include "kiln/autograd/grad_mode.h"
#include "kiln/core/error.h"
#include "kiln/ops/ops.h"

namespace kiln::nn {

void normal_(const Tensor& t, double mean, double std, Generator* gen) {
  autograd::NoGradGuard no_grad;
  Tensor(t).copy_(add(mul(randn(t.sizes(), gen, t.dtype(), t.device()), std), mean));
}
void uniform_(const Tensor& t, double low, double high, Generator* gen) {
  autograd::NoGradGuard no_grad;
  Tensor(t).copy_(add(mul(rand(t.sizes(), gen, t.dtype(), t.device()), high - low), low));
}

Linear::Linear(int64_t in, int64_t out, bool has_bias, const Init& init) {
  KILN_CHECK(in > 0 && out > 0, "[Linear] sizes must be positive, got in={} out={}", in, out);
  double bound = 1.0 / std::sqrt(static_cast<double>(in));
  weight = empty({out, in}, init.dtype, init.device);
  uniform_(weight, -bound, bound, init.gen);
  register_parameter("weight", &weight);
  if (has_bias) {
    bias = empty({out}, init.dtype, init.device);
    uniform_(bias, -bound, bound, init.gen);
    register_parameter("bias", &bias);
  }
}
Tensor Linear::forward(const Tensor& x) { return linear(x, weight, bias); }

Embedding::Embedding(int64_t num, int64_t dim, const Init& init, std::optional<int64_t> padding) {
  KILN_CHECK(num > 0 && dim > 0, "[Embedding] sizes must be positive, got num={} dim={}", num, dim);
  if (padding) {
    KILN_CHECK(*padding >= -num && *padding < num,
               "[Embedding] padding_idx must be within [-{}, {}), got {}", num, num, *padding);
    padding_idx = *padding < 0 ? *padding + num : *padding;
  }
  weight = randn({num, dim}, init.gen, init.dtype, init.device);
  if (padding_idx) select(weight, 0, *padding_idx).fill_(0);  // as torch.nn.Embedding
  register_parameter("weight", &weight);
}
Tensor Embedding::forward(const Tensor& indices) {
  return embedding(weight, indices, padding_idx.value_or(-1));
}

LayerNorm::LayerNorm(int64_t dim, double eps, bool has_bias, const Init& init) : eps(eps) {
  weight = ones({dim}, init.dtype, init.device);
  register_parameter("weight", &weight);
  if (has_bias) {
    bias = zeros({dim}, init.dtype, init.device);
    register_parameter("bias", &bias);
  }
}
Tensor LayerNorm::forward(const Tensor& x) {
  return layer_norm(x, {weight.size(0)}, weight, bias, eps);
}

RMSNorm::RMSNorm(int64_t dim, double eps, const Init& init) : eps(eps) {
  weight = ones({dim}, init.dtype, init.device);
  register_parameter("weight", &weight);
}
Tensor RMSNorm::forward(const Tensor& x) { return rms_norm(x, {weight.size(0)}, weight, eps); }

Dropout::Dropout(double p, Generator* gen) : p(p), gen(gen) {
  KILN_CHECK(p >= 0 && p <= 1, "[Dropout] p must be in [0, 1], got {}", p);
}
Tensor Dropout::forward(const Tensor& x) { return dropout(x, p, is_training(), gen); }

Tensor GELU::forward(const Tensor& x) { return gelu(x, approximate_tanh); }
Tensor SiLU::forward(const Tensor& x) { return silu(x); }
Tensor ReLU::forward(const Tensor& x) { return relu(x); }
Tensor LeakyReLU::forward(const Tensor& x) { return leaky_relu(x, negative_slope); }
Tensor Hardtanh::forward(const Tensor& x) { return hardtanh(x, min_val, max_val); }
Tensor ELU::forward(const Tensor& x) { return elu(x, alpha); }
Tensor Flatten::forward(const Tensor& x) { return flatten(x, start_dim, end_dim); }

Sequential::Sequential(std::vector<std::shared_ptr<UnaryModule>> modules) {
  for (auto& m : modules) push_back(std::move(m));
}
void Sequential::push_back(std::shared_ptr<UnaryModule> m) {
  KILN_CHECK(m != nullptr, "[Sequential] module {} is null", modules_.size());
  register_module(std::to_string(modules_.size()), m);
  modules_.push_back(std::move(m));
}
bool Sequential::on_replace_module(const std::string& name,
                                   const std::shared_ptr<Module>& replacement) {
  auto unary = std::dynamic_pointer_cast<UnaryModule>(replacement);
  if (unary == nullptr) return false;
  modules_.at(std::stoul(name)) = std::move(unary);  // children are named by index
  return true;
}
Tensor Sequential::forward(const Tensor& x) {
  Tensor y = x;
  for (auto& m : modules_) y = (*m)(y);
  return y;
}

}  // namespace kiln::nn

#pragma once
// Layers: Linear, Embedding, LayerNorm, RMSNorm, Dropout, GELU, SiLU, Sequential.
// Initialisation follows PyTorch's defaults; `gen` (optional) makes it reproducible.
#include <optional>

#include "kiln/core/generator.h"
#include "kiln/nn/module.h"

namespace kiln::nn {

// Options shared by layers that create parameters.
struct Init {
  Generator* gen = nullptr;
  DType dtype = kFloat32;
  Device device = Device(kCPU);
};

// y = x W^T + b; W is [out, in], b is [out]. W and b ~ U(-1/sqrt(in), 1/sqrt(in)).
class Linear : public UnaryModule {
 public:
  Linear(int64_t in, int64_t out, bool bias = true, const Init& init = {});
  Tensor forward(const Tensor& x) override;
  Tensor weight, bias;
};

// Rows of a [num, dim] table picked by integer indices; W ~ N(0, 1).
// Rows of weight [num, dim], N(0, 1) at init. padding_idx (negative: counted from num, as
// torch.nn.Embedding's) names a row that starts at zero and gets no gradient.
class Embedding : public UnaryModule {
 public:
  Embedding(int64_t num, int64_t dim, const Init& init = {},
            std::optional<int64_t> padding_idx = std::nullopt);
  Tensor forward(const Tensor& indices) override;
  Tensor weight;
  std::optional<int64_t> padding_idx;  // in [0, num) when set
};

// Normalises over the last dim: weight ones, bias zeros (or no bias).
class LayerNorm : public UnaryModule {
 public:
  explicit LayerNorm(int64_t dim, double eps = 1e-5, bool bias = true, const Init& init = {});
  Tensor forward(const Tensor& x) override;
  Tensor weight, bias;
  double eps;
};

class RMSNorm : public UnaryModule {
 public:
  explicit RMSNorm(int64_t dim, double eps = 1e-6, const Init& init = {});
  Tensor forward(const Tensor& x) override;
  Tensor weight;
  double eps;
};

// Zeroes elements with probability p while training; identity in eval(). A compiled function
// that ran it is guarded by its training flag (See Note [Host values steer traces] in
// kiln/compile/host_guard.cpp).
class Dropout : public UnaryModule {
 public:
  explicit Dropout(double p = 0.5, Generator* gen = nullptr);
  Tensor forward(const Tensor& x) override;
  double p;
  Generator* gen;
};

class GELU : public UnaryModule {
 public:
  explicit GELU(bool approximate_tanh = false) : approximate_tanh(approximate_tanh) {}
  Tensor forward(const Tensor& x) override;
  bool approximate_tanh;
};

class SiLU : public UnaryModule {
 public:
  Tensor forward(const Tensor& x) override;
};

class ReLU : public UnaryModule {
 public:
  Tensor forward(const Tensor& x) override;
};

class LeakyReLU : public UnaryModule {
 public:
  explicit LeakyReLU(double negative_slope = 0.01) : negative_slope(negative_slope) {}
  Tensor forward(const Tensor& x) override;
  double negative_slope;
};

class Hardtanh : public UnaryModule {
 public:
  explicit Hardtanh(double min_val = -1, double max_val = 1) : min_val(min_val), max_val(max_val) {}
  Tensor forward(const Tensor& x) override;
  double min_val, max_val;
};

// scale * (x > 0 ? x : alpha * (exp(input_scale * x) - 1)); PyTorch's nn.ELU is scale and
// input_scale 1.
class ELU : public UnaryModule {
 public:
  explicit ELU(double alpha = 1) : alpha(alpha) {}
  Tensor forward(const Tensor& x) override;
  double alpha;
};

// Merges dims start_dim..end_dim into one (PyTorch's nn.Flatten: from dim 1, so the batch stays).
class Flatten : public UnaryModule {
 public:
  explicit Flatten(int64_t start_dim = 1, int64_t end_dim = -1)
      : start_dim(start_dim), end_dim(end_dim) {}
  Tensor forward(const Tensor& x) override;
  int64_t start_dim, end_dim;
};

// Runs its modules in order; they are registered as "0", "1", ...
class Sequential : public UnaryModule {
 public:
  Sequential() = default;
  explicit Sequential(std::vector<std::shared_ptr<UnaryModule>> modules);
  void push_back(std::shared_ptr<UnaryModule> m);
  Tensor forward(const Tensor& x) override;
  size_t size() const { return modules_.size(); }
  UnaryModule& operator[](size_t i) { return *modules_.at(i); }

 protected:
  // Child "<i>" becomes the replacement (a UnaryModule; anything else is refused).
  bool on_replace_module(const std::string& name,
                         const std::shared_ptr<Module>& replacement) override;

 private:
  std::vector<std::shared_ptr<UnaryModule>> modules_;
};

// In-place initialisers (under no grad): N(mean, std) and U(low, high).
void normal_(const Tensor& t, double mean, double std, Generator* gen = nullptr);
void uniform_(const Tensor& t, double low, double high, Generator* gen = nullptr);

}  // namespace kiln::nn

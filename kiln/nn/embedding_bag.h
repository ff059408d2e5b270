#pragma once
// nn::EmbeddingBag, as torch.nn.EmbeddingBag, over embedding_bag (kiln/ops/embedding_bag.h): the
// sum, mean or max of weight's rows over bags of indices.
#include <optional>
#include <string>

#include "kiln/nn/layers.h"

namespace kiln::nn {

struct EmbeddingBagOptions {
  std::string mode = "mean";  // "sum", "mean" or "max"
  bool scale_grad_by_freq = false;
  bool include_last_offset = false;
  // A row left out of every bag, zero at init, with no gradient (negative: counted from num).
  std::optional<int64_t> padding_idx = std::nullopt;
};

class EmbeddingBag : public UnaryModule {
 public:
  // weight [num, dim], N(0, 1) at init as torch's; the options are checked here.
  EmbeddingBag(int64_t num, int64_t dim, const EmbeddingBagOptions& options = {},
               const Init& init = {});
  // input [B, L]: B bags of L indices.
  Tensor forward(const Tensor& input) override;
  // input [N] with offsets [B] (bag b starts at offsets[b]); per_sample_weights [N] scale the
  // rows (mode "sum" only).
  Tensor forward(const Tensor& input, const Tensor& offsets, const Tensor& per_sample_weights = {});
  Tensor weight;
  EmbeddingBagOptions options;
};

}  // namespace kiln::nn

#pragma once
// Bags of embeddings as torch.nn.functional.embedding_bag, over the embedding_bag op (Note
// [embedding_bag] in kiln/ops/embedding_meta.cpp), and embedding's gradient op.
#include <optional>
#include <string_view>

#include "kiln/core/tensor.h"

namespace kiln {

// The sum, mean or max (mode "sum", "mean", "max") of weight's rows over each bag of input:
// input 1-D with offsets (bag b starts at offsets[b]; include_last_offset: offsets ends with
// input's length), or 2-D [B, L] without offsets (B bags of L). per_sample_weights (input's
// shape, mode "sum" only) scale each row; rows at padding_idx (negative: counted from the end of
// weight, as torch's) are left out. Returns [B, weight.size(1)].
Tensor embedding_bag(const Tensor& input, const Tensor& weight, const Tensor& offsets = {},
                     bool scale_grad_by_freq = false, std::string_view mode = "mean",
                     const Tensor& per_sample_weights = {}, bool include_last_offset = false,
                     std::optional<int64_t> padding_idx = std::nullopt);

// embedding's gradient with respect to weight (Note [Embedding gradients]): grad_output's rows
// summed into a [num_weights, D] tensor at indices, padding_idx's row left zero.
Tensor embedding_dense_backward(const Tensor& grad_output, const Tensor& indices,
                                int64_t num_weights, int64_t padding_idx = -1,
                                bool scale_grad_by_freq = false);

}  // namespace kiln

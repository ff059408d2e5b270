// nn::EmbeddingBag (kiln/nn/embedding_bag.h).
#include "kiln/nn/embedding_bag.h"

#include "kiln/core/error.h"
#include "kiln/ops/embedding_bag.h"
#include "kiln/ops/ops.h"

namespace kiln::nn {

EmbeddingBag::EmbeddingBag(int64_t num, int64_t dim, const EmbeddingBagOptions& opts,
                           const Init& init)
    : options(opts) {
  KILN_CHECK(num > 0 && dim > 0, "[EmbeddingBag] sizes must be positive, got num={} dim={}", num,
             dim);
  KILN_CHECK(options.mode == "sum" || options.mode == "mean" || options.mode == "max",
             "[EmbeddingBag] mode must be 'sum', 'mean' or 'max', got '{}'", options.mode);
  KILN_CHECK(!(options.scale_grad_by_freq && options.mode == "max"),
             "[EmbeddingBag] scale_grad_by_freq is not supported with mode 'max'");
  if (options.padding_idx) {
    const int64_t p = *options.padding_idx;
    KILN_CHECK(p >= -num && p < num, "[EmbeddingBag] padding_idx must be within [-{}, {}), got {}",
               num, num, p);
    options.padding_idx = p < 0 ? p + num : p;
  }
  weight = randn({num, dim}, init.gen, init.dtype, init.device);
  if (options.padding_idx) select(weight, 0, *options.padding_idx).fill_(0);
  register_parameter("weight", &weight);
}

Tensor EmbeddingBag::forward(const Tensor& input) { return forward(input, Tensor()); }

Tensor EmbeddingBag::forward(const Tensor& input, const Tensor& offsets,
                             const Tensor& per_sample_weights) {
  return embedding_bag(input, weight, offsets, options.scale_grad_by_freq, options.mode,
                       per_sample_weights, options.include_last_offset, options.padding_idx);
}

}  // namespace kiln::nn

// embedding_bag and embedding_dense_backward (kiln/ops/embedding_bag.h).
#include "kiln/ops/embedding_bag.h"

#include "kiln/core/error.h"
#include "kiln/ops/op_list.h"
#include "kiln/ops/ops.h"

namespace kiln {

Tensor embedding_bag(const Tensor& input, const Tensor& weight, const Tensor& offsets,
                     bool scale_grad_by_freq, std::string_view mode,
                     const Tensor& per_sample_weights, bool include_last_offset,
                     std::optional<int64_t> padding_idx) {
  int64_t m = 0;
  if (mode == "sum")
    m = 0;
  else if (mode == "mean")
    m = 1;
  else if (mode == "max")
    m = 2;
  else
    KILN_CHECK(false, "[embedding_bag] mode must be 'sum', 'mean' or 'max', got '{}'", mode);
  KILN_CHECK(input.defined() && weight.defined(),
             "[embedding_bag] input and weight must be defined");
  KILN_CHECK(weight.dim() == 2, "[embedding_bag] weight must be 2-D, got shape [{}]",
             fmt::join(weight.sizes(), ", "));
  int64_t pad = -1;
  if (padding_idx) {
    const int64_t V = weight.size(0);
    KILN_CHECK(*padding_idx >= -V && *padding_idx < V,
               "[embedding_bag] padding_idx must be within [-{}, {}), got {}", V, V, *padding_idx);
    pad = *padding_idx < 0 ? *padding_idx + V : *padding_idx;
  }
  Tensor idx = input, offs = offsets, psw = per_sample_weights;
  if (input.dim() == 2) {
    KILN_CHECK(!offsets.defined(),
               "[embedding_bag] offsets must be undefined for a 2-D input (each row is a bag)");
    const int64_t B = input.size(0), L = input.size(1);
    offs = arange(0, B * L, L == 0 ? 1 : L, input.dtype(), input.device());
    if (L == 0) offs = zeros({B}, input.dtype(), input.device());
    idx = input.reshape({-1});
    if (psw.defined()) psw = psw.reshape({-1});
  } else {
    KILN_CHECK(input.dim() == 1, "[embedding_bag] input must be 1-D or 2-D, got shape [{}]",
               fmt::join(input.sizes(), ", "));
    KILN_CHECK(offsets.defined(), "[embedding_bag] a 1-D input needs offsets");
  }
  return std::get<0>(ops::op_embedding_bag(weight, idx, offs, scale_grad_by_freq, m, false, psw,
                                           include_last_offset, pad));
}

Tensor embedding_dense_backward(const Tensor& grad_output, const Tensor& indices,
                                int64_t num_weights, int64_t padding_idx, bool scale_grad_by_freq) {
  return ops::op_embedding_dense_backward(grad_output, indices, num_weights, padding_idx,
                                          scale_grad_by_freq);
}

}  // namespace kiln

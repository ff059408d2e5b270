#pragma once
// Sliding blocks as torch.nn.functional.unfold and fold, over the im2col and col2im ops
// (Note [im2col and col2im] in kiln/ops/fold_meta.cpp). Sizes given as one value apply to both
// spatial dims.
#include "kiln/core/tensor.h"

namespace kiln {

// input [N, C, H, W] or [C, H, W]: the blocks as columns [N, C kh kw, L] ([C kh kw, L]), L the
// number of block positions; padding pads with zeros.
Tensor unfold(const Tensor& input, IntArrayRef kernel_size, IntArrayRef dilation = {1},
              IntArrayRef padding = {0}, IntArrayRef stride = {1});
// input [N, C kh kw, L] or [C kh kw, L]: the columns summed back into [N, C, *output_size]
// ([C, *output_size]), overlapping entries added (unfold's adjoint).
Tensor fold(const Tensor& input, IntArrayRef output_size, IntArrayRef kernel_size,
            IntArrayRef dilation = {1}, IntArrayRef padding = {0}, IntArrayRef stride = {1});

}  // namespace kiln

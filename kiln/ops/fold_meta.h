#pragma once
// im2col and col2im (Note [im2col and col2im] in kiln/ops/fold_meta.cpp): meta functions and
// the geometry the CPU and CUDA kernels share. Internal.
#include "kiln/ops/fold_math.h"
#include "kiln/ops/meta.h"

namespace kiln::meta {

// self [N, C, H, W] or [C, H, W] (non-empty but for N, floating), 2-element kernel_size,
// dilation, padding and stride: the columns [N, C kh kw, L] (unbatched [C kh kw, L]), L the
// number of blocks.
TensorSpec im2col(const Tensor& self, IntArrayRef kernel_size, IntArrayRef dilation,
                  IntArrayRef padding, IntArrayRef stride);
// self [N, C kh kw, L] or [C kh kw, L] with L the number of blocks of output_size [H, W]: the
// image [N, C, H, W] (unbatched [C, H, W]).
TensorSpec col2im(const Tensor& self, IntArrayRef output_size, IntArrayRef kernel_size,
                  IntArrayRef dilation, IntArrayRef padding, IntArrayRef stride);

}  // namespace kiln::meta

namespace kiln::detail {

// The geometry of one call: N images (1 when unbatched) of FoldDims.
struct FoldGeom {
  int64_t N = 1;
  FoldDims d;
};
// For im2col(self, ...) (an image input) and col2im(self, output_size, ...) (a columns input);
// the arguments are valid (the meta function has run).
FoldGeom im2col_geom(const Tensor& self, IntArrayRef kernel_size, IntArrayRef dilation,
                     IntArrayRef padding, IntArrayRef stride);
FoldGeom col2im_geom(const Tensor& self, IntArrayRef output_size, IntArrayRef kernel_size,
                     IntArrayRef dilation, IntArrayRef padding, IntArrayRef stride);

}  // namespace kiln::detail

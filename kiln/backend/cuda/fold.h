#pragma once
// Launchers of the CUDA kernels of im2col and col2im (Note [im2col and col2im] in
// kiln/ops/fold_meta.cpp). Data pointers are device memory of contiguous tensors of the
// accumulating type: float (f64 false) or double (f64 true). One thread per result element,
// col2im's a gather (no atomics). Internal to kiln/backend/cuda.
#include <cuda_runtime.h>

#include "kiln/ops/fold_math.h"

namespace kiln::cuda {

// cols [N, C kh kw, L] from im [N, C, H, W].
void launch_im2col(bool f64, const void* im, void* cols, int64_t N, const detail::FoldDims& g,
                   cudaStream_t stream);
// im [N, C, H, W] from cols [N, C kh kw, L].
void launch_col2im(bool f64, const void* cols, void* im, int64_t N, const detail::FoldDims& g,
                   cudaStream_t stream);

}  // namespace kiln::cuda

#pragma once
// The index arithmetic of im2col and col2im (Note [im2col and col2im] in
// kiln/ops/fold_meta.cpp), shared by the CPU and CUDA kernels. A is float or double. No CUDA
// header: nvcc defines __CUDACC__.
#include <cstdint>

#ifdef __CUDACC__
#define KILN_FOLD_HD __host__ __device__
#else
#define KILN_FOLD_HD
#endif

namespace kiln::detail {

// One image [C, H, W] and its columns [C kh kw, bh bw]: the kernel's size, dilation, padding
// and stride per spatial dim and the number of blocks (sliding positions) per spatial dim.
struct FoldDims {
  int64_t C = 0, H = 0, W = 0;
  int64_t kh = 1, kw = 1, dh = 1, dw = 1, ph = 0, pw = 0, sh = 1, sw = 1;
  int64_t bh = 0, bw = 0;
  KILN_FOLD_HD int64_t rows() const { return C * kh * kw; }
  KILN_FOLD_HD int64_t blocks() const { return bh * bw; }
};

// cols[row, l] of one image: the element the kernel tap of `row` reads in block l, 0 where it
// falls in the padding.
template <class A>
KILN_FOLD_HD inline A im2col_at(const A* im, const FoldDims& g, int64_t row, int64_t l) {
  const int64_t kk = g.kh * g.kw, c = row / kk, ki = (row % kk) / g.kw, kj = row % g.kw;
  const int64_t h = (l / g.bw) * g.sh - g.ph + ki * g.dh;
  const int64_t w = (l % g.bw) * g.sw - g.pw + kj * g.dw;
  return h >= 0 && h < g.H && w >= 0 && w < g.W ? im[(c * g.H + h) * g.W + w] : A(0);
}

// image[c, h, w] of col2im: the sum of the column entries whose tap reads (h, w), in ATen's
// CPU order (taps row-major), a gather (no two threads write one element).
template <class A>
KILN_FOLD_HD inline A col2im_at(const A* col, const FoldDims& g, int64_t c, int64_t h, int64_t w) {
  const int64_t L = g.blocks();
  A sum = 0;
  for (int64_t ki = 0; ki < g.kh; ++ki) {
    const int64_t t = h + g.ph - ki * g.dh;
    if (t < 0 || t % g.sh != 0 || t / g.sh >= g.bh) continue;
    for (int64_t kj = 0; kj < g.kw; ++kj) {
      const int64_t u = w + g.pw - kj * g.dw;
      if (u < 0 || u % g.sw != 0 || u / g.sw >= g.bw) continue;
      sum += col[((c * g.kh + ki) * g.kw + kj) * L + (t / g.sh) * g.bw + u / g.sw];
    }
  }
  return sum;
}

}  // namespace kiln::detail

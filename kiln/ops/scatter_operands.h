#pragma once
// What every backend's scatter kernels share: scatter's operands as the kernels of scatter,
// scatter_add and scatter_reduce walk them (the meta functions have checked them:
// meta::check_scatter_args), and select_scatter and slice_scatter whole, over the backend's copy
// kernel. Internal to kiln/ops and the backends.
#include "kiln/ops/meta.h"

namespace kiln::meta {

// d: dim wrapped. self_sizes, index_sizes: 0-d as [1]. bound: self_sizes[d], the range
// [0, bound) of the index values. src: src sliced down to the index's shape (every backend reads
// src at the index's coordinates).
struct ScatterOperands {
  int64_t d = 0;
  Shape self_sizes, index_sizes;
  int64_t bound = 1;
  Tensor src;
};

ScatterOperands scatter_operands(const char* op, const Tensor& self, int64_t dim,
                                 const Tensor& index, const Tensor& src);

// A backend's copy kernel: dst (a view, maybe strided) = src, cast to dst's dtype.
using CopyKernel = void (*)(const Tensor& dst, const Tensor& src);

// select_scatter and slice_scatter (checked by their meta functions): out = self, then src into
// out's select(dim, index) or slice(dim, start, end, step), both by `copy`.
void select_scatter_by(CopyKernel copy, const Tensor& out, const Tensor& self, const Tensor& src,
                       int64_t dim, int64_t index);
void slice_scatter_by(CopyKernel copy, const Tensor& out, const Tensor& self, const Tensor& src,
                      int64_t dim, const OptInt& start, const OptInt& end, int64_t step);

}  // namespace kiln::meta

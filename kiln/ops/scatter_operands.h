#pragma once
// scatter's operands as the kernels of scatter, scatter_add and scatter_reduce walk them, shared
// by every backend (the meta functions have checked them: meta::check_scatter_args). Internal to
// kiln/ops and the backends.
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

}  // namespace kiln::meta

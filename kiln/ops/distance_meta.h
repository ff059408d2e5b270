#pragma once
// cdist and pdist (Note [cdist and pdist] in kiln/ops/distance_meta.cpp): meta functions and the
// geometry the CPU and CUDA kernels share. Internal.
#include "kiln/ops/meta.h"

namespace kiln::meta {

// x1 [*, P, M] and x2 [*, R, M] (batch dims broadcast) of one floating dtype and device, p >= 0,
// compute_mode none or 0-2: the [*, P, R] result.
TensorSpec cdist_forward(const Tensor& x1, const Tensor& x2, double p, const OptInt& compute_mode);
// grad and cdist [*, P, R] as cdist_forward gives them: x1's gradient, [*, P, M] (batch dims
// broadcast, as ATen's).
TensorSpec cdist_backward(const Tensor& grad, const Tensor& x1, const Tensor& x2, double p,
                          const Tensor& cdist);
// self [N, M] floating, p >= 0: the [N (N - 1) / 2] distances of the pairs i < j, row-major.
TensorSpec pdist_forward(const Tensor& self, double p);
// grad and pdist [N (N - 1) / 2] as pdist_forward gives them: self's gradient [N, M].
TensorSpec pdist_backward(const Tensor& grad, const Tensor& self, double p, const Tensor& pdist);

}  // namespace kiln::meta

namespace kiln::detail {

// Which formula a p takes: 0 (a count), 1, 2, infinity, other p below 2, other p above 2.
enum class NormKind : int { Zero, One, Two, Inf, Below2, Above2 };
NormKind norm_kind(double p);

// cdist's operands as [B, P, M] and [B, R, M] (B the broadcast batch dims' product).
struct CdistGeom {
  Shape batch;  // the broadcast batch dims
  int64_t B = 1, P = 0, R = 0, M = 0;
};
CdistGeom cdist_geom(const Tensor& x1, const Tensor& x2);
// t [*, rows, M] expanded to [*batch, rows, M] (a view; contiguous, it is [B, rows, M]).
Tensor expanded(const Tensor& t, const CdistGeom& g);

}  // namespace kiln::detail

// CPU kernels of cdist and pdist and their backward ops (Note [cdist and pdist] in
// kiln/ops/distance_meta.cpp): operands contiguous in the accumulating type (float for the
// 16-bit floats), one OpenMP loop over the results, the result cast once.
#include "kiln/backend/cpu/loops.h"
#include "kiln/ops/distance_math.h"
#include "kiln/ops/distance_meta.h"

namespace kiln::cpu {
namespace {

namespace dist = detail::dist;

DType acc_of(DType t) { return t == kFloat64 ? kFloat64 : kFloat32; }
template <class A>
const A* ptr(const Tensor& t) {
  return static_cast<const A*>(t.impl()->data());
}
template <class A>
A* mptr(const Tensor& t) {
  return static_cast<A*>(t.impl()->data());
}
// Runs f.template operator()<A>() with A the accumulating type of `t`.
template <class F>
void with_acc(DType t, F f) {
  if (t == kFloat64)
    f(double{});
  else
    f(float{});
}

Tensor cdist_forward_kernel(const Tensor& x1_, const Tensor& x2_, double p, const OptInt& mode) {
  TensorSpec s = meta::cdist_forward(x1_, x2_, p, mode);
  detail::CdistGeom g = detail::cdist_geom(x1_, x2_);
  const DType acc = acc_of(s.dtype);
  Tensor x1 = contiguous_as(detail::expanded(x1_, g), acc);
  Tensor x2 = contiguous_as(detail::expanded(x2_, g), acc);
  Tensor out = empty_cpu(s.sizes, acc);
  const int kind = static_cast<int>(detail::norm_kind(p));
  with_acc(acc, [&](auto zero) {
    using A = decltype(zero);
    const A* a = ptr<A>(x1);
    const A* b = ptr<A>(x2);
    A* o = mptr<A>(out);
    const int64_t P = g.P, R = g.R, M = g.M, total = g.B * P * R;
    const A pa = static_cast<A>(p);
#pragma omp parallel for if (total * M > kGrainSize)
    for (int64_t e = 0; e < total; ++e) {
      const int64_t bi = e / R, j = e % R, bb = bi / P;
      const A* u = a + bi * M;
      const A* v = b + (bb * R + j) * M;
      A sum = 0;
      for (int64_t k = 0; k < M; ++k) sum = dist::step(kind, sum, u[k] - v[k], pa);
      o[e] = dist::finish(kind, sum, pa);
    }
  });
  return s.dtype == acc ? out : contiguous_as(out, s.dtype);
}

// grad_x1[b, i, k] = sum_j grad[b, i, j] * d'(x1[b, i, k] - x2[b, j, k], cdist[b, i, j]).
Tensor cdist_backward_kernel(const Tensor& grad_, const Tensor& x1_, const Tensor& x2_, double p,
                             const Tensor& cdist_) {
  TensorSpec s = meta::cdist_backward(grad_, x1_, x2_, p, cdist_);
  detail::CdistGeom g = detail::cdist_geom(x1_, x2_);
  const DType acc = acc_of(s.dtype);
  Tensor x1 = contiguous_as(detail::expanded(x1_, g), acc);
  Tensor x2 = contiguous_as(detail::expanded(x2_, g), acc);
  Tensor gr = contiguous_as(grad_, acc), d = contiguous_as(cdist_, acc);
  Tensor out = empty_cpu(s.sizes, acc);
  const int kind = static_cast<int>(detail::norm_kind(p));
  with_acc(acc, [&](auto zero) {
    using A = decltype(zero);
    const A *a = ptr<A>(x1), *b = ptr<A>(x2), *gp = ptr<A>(gr), *dp = ptr<A>(d);
    A* o = mptr<A>(out);
    const int64_t P = g.P, R = g.R, M = g.M, rows = g.B * P;
    const A pa = static_cast<A>(p);
#pragma omp parallel for if (rows * R * M > kGrainSize)
    for (int64_t bi = 0; bi < rows; ++bi) {
      const int64_t bb = bi / P;
      for (int64_t k = 0; k < M; ++k) {
        A sum = 0;
        for (int64_t j = 0; j < R; ++j) {
          const A t = a[bi * M + k] - b[(bb * R + j) * M + k];
          sum += gp[bi * R + j] * dist::grad(kind, t, dp[bi * R + j], pa);
        }
        o[bi * M + k] = sum;
      }
    }
  });
  return s.dtype == acc ? out : contiguous_as(out, s.dtype);
}

Tensor pdist_forward_kernel(const Tensor& self, double p) {
  TensorSpec s = meta::pdist_forward(self, p);
  const DType acc = acc_of(s.dtype);
  Tensor x = contiguous_as(self, acc);
  Tensor out = empty_cpu(s.sizes, acc);
  const int kind = static_cast<int>(detail::norm_kind(p));
  const int64_t N = self.size(0), M = self.size(1);
  with_acc(acc, [&](auto zero) {
    using A = decltype(zero);
    const A* a = ptr<A>(x);
    A* o = mptr<A>(out);
    const A pa = static_cast<A>(p);
#pragma omp parallel for schedule(dynamic, 16) if (N * N * M > 2 * kGrainSize)
    for (int64_t i = 0; i < N; ++i)
      for (int64_t j = i + 1; j < N; ++j) {
        A sum = 0;
        for (int64_t k = 0; k < M; ++k)
          sum = dist::step(kind, sum, a[i * M + k] - a[j * M + k], pa);
        o[dist::pair_index(i, j, N)] = dist::finish(kind, sum, pa);
      }
  });
  return s.dtype == acc ? out : contiguous_as(out, s.dtype);
}

// grad_self[i, k] = sum_{j != i} grad[pair(i, j)] * d'(x[i, k] - x[j, k], pdist[pair(i, j)]):
// the derivative is odd in the difference, so row j of a pair (i, j) gets the negated term.
Tensor pdist_backward_kernel(const Tensor& grad_, const Tensor& self, double p,
                             const Tensor& pdist_) {
  TensorSpec s = meta::pdist_backward(grad_, self, p, pdist_);
  const DType acc = acc_of(s.dtype);
  Tensor x = contiguous_as(self, acc), gr = contiguous_as(grad_, acc);
  Tensor d = contiguous_as(pdist_, acc);
  Tensor out = empty_cpu(s.sizes, acc);
  const int kind = static_cast<int>(detail::norm_kind(p));
  const int64_t N = self.size(0), M = self.size(1);
  with_acc(acc, [&](auto zero) {
    using A = decltype(zero);
    const A *a = ptr<A>(x), *gp = ptr<A>(gr), *dp = ptr<A>(d);
    A* o = mptr<A>(out);
    const A pa = static_cast<A>(p);
#pragma omp parallel for if (N * N * M > 2 * kGrainSize)
    for (int64_t i = 0; i < N; ++i)
      for (int64_t k = 0; k < M; ++k) {
        A sum = 0;
        for (int64_t j = 0; j < N; ++j) {
          if (j == i) continue;
          const int64_t q = i < j ? dist::pair_index(i, j, N) : dist::pair_index(j, i, N);
          sum += gp[q] * dist::grad(kind, a[i * M + k] - a[j * M + k], dp[q], pa);
        }
        o[i * M + k] = sum;
      }
  });
  return s.dtype == acc ? out : contiguous_as(out, s.dtype);
}

const bool registered = [] {
  constexpr auto K = DispatchKey::CPU;
  ops::op_cdist_forward.set_kernel(K, &cdist_forward_kernel);
  ops::op_cdist_backward.set_kernel(K, &cdist_backward_kernel);
  ops::op_pdist_forward.set_kernel(K, &pdist_forward_kernel);
  ops::op_pdist_backward.set_kernel(K, &pdist_backward_kernel);
  return true;
}();

}  // namespace
}  // namespace kiln::cpu

// CPU kernels of sort, topk, cumsum and prod. Each works on its input made contiguous with the
// dim of interest innermost (sort, topk) or viewed as [outer, n, inner] (cumsum, prod), one
// slice per task, parallel over slices.
#include <algorithm>
#include <cmath>
#include <numeric>
#include <type_traits>
#include <vector>

#include "kiln/backend/cpu/loops.h"
#include "kiln/ops/other_meta.h"
#include "kiln/ops/structured.h"

namespace kiln::cpu {
namespace {

// The permutation that moves dim d last (the identity for a 0-d tensor).
Shape dim_last(int64_t ndim, int64_t d) {
  Shape perm;
  for (int64_t i = 0; i < ndim; ++i)
    if (i != d) perm.push_back(i);
  if (ndim > 0) perm.push_back(d);
  return perm;
}

template <class F>
bool is_nan(F v) {
  if constexpr (std::is_floating_point_v<F>) return std::isnan(v);
  return false;
}

// The first k of each row of x ([rows, n], contiguous) in a stable sort's order (NaN largest;
// ties by index, so std::sort and std::partial_sort give the stable order: Note [topk order]).
template <class T>
void sort_rows(const T* x, T* vals, int64_t* idx, int64_t rows, int64_t n, int64_t k,
               bool descending) {
  using F = acc_t<T>;
#pragma omp parallel for if (rows * n > kGrainSize && rows > 1)
  for (int64_t r = 0; r < rows; ++r) {
    const T* row = x + r * n;
    std::vector<int64_t> order(static_cast<size_t>(n));
    std::iota(order.begin(), order.end(), int64_t{0});
    auto before = [&](int64_t a, int64_t b) {
      F va = static_cast<F>(row[a]), vb = static_cast<F>(row[b]);
      bool na = is_nan(va), nb = is_nan(vb);
      if (na != nb) return descending ? na : nb;
      if (!na && va != vb) return descending ? va > vb : va < vb;
      return a < b;
    };
    if (k < n) {
      std::partial_sort(order.begin(), order.begin() + k, order.end(), before);
    } else {
      std::sort(order.begin(), order.end(), before);
    }
    for (int64_t j = 0; j < k; ++j) {
      vals[r * k + j] = row[order[static_cast<size_t>(j)]];
      idx[r * k + j] = order[static_cast<size_t>(j)];
    }
  }
}

TensorPair sort_topk(const Tensor& self, const TensorSpec& s, int64_t d, int64_t k,
                     bool descending) {
  Tensor values = empty_cpu(s.sizes, s.dtype), indices = empty_cpu(s.sizes, kInt64);
  if (values.numel() == 0) return {values, indices};
  const int64_t nd = self.dim(), n = nd == 0 ? 1 : self.sizes()[d];
  Shape perm = dim_last(nd, d);
  Tensor x = contiguous_as(ops::op_permute(self, perm), self.dtype());
  const bool last = nd == 0 || d == nd - 1;
  Shape moved;
  for (int64_t p : perm) moved.push_back(s.sizes[p]);
  Tensor v = last ? values : empty_cpu(moved, s.dtype);
  Tensor ix = last ? indices : empty_cpu(moved, kInt64);
  KILN_DISPATCH_TYPES(self.dtype(), "sort", [&] {
    sort_rows(static_cast<const scalar_t*>(x.impl()->data()),
              static_cast<scalar_t*>(v.impl()->data()), static_cast<int64_t*>(ix.impl()->data()),
              self.numel() / n, n, k, descending);
  });
  if (!last) {
    copy_kernel(ops::op_permute(values, perm), v);
    copy_kernel(ops::op_permute(indices, perm), ix);
  }
  return {values, indices};
}

TensorPair sort_kernel(const Tensor& self, int64_t dim, bool descending) {
  TensorSpec s = meta::sort(self, dim, descending);
  int64_t d = wrap_dim(dim, self.dim(), "sort");
  return sort_topk(self, s, d, self.dim() == 0 ? 1 : self.sizes()[d], descending);
}
TensorPair topk_kernel(const Tensor& self, int64_t k, int64_t dim, bool largest, bool sorted) {
  TensorSpec s = meta::topk(self, k, dim, largest, sorted);
  return sort_topk(self, s, wrap_dim(dim, self.dim(), "topk"), k, largest);
}

// [outer, n, inner] around dim d (n = 1 for a 0-d tensor).
struct Lines {
  int64_t outer = 1, n = 1, inner = 1;
};
Lines lines_around(const Tensor& self, int64_t d) {
  Lines l;
  for (int64_t i = 0; i < self.dim(); ++i) {
    if (i < d) l.outer *= self.sizes()[i];
    if (i == d) l.n = self.sizes()[i];
    if (i > d) l.inner *= self.sizes()[i];
  }
  return l;
}

// Integers wrap around (as ATen's do in practice) instead of overflowing into undefined
// behaviour.
template <class A>
A add_acc(A a, A b) {
  if constexpr (std::is_integral_v<A>)
    return static_cast<A>(static_cast<uint64_t>(a) + static_cast<uint64_t>(b));
  return a + b;
}
template <class A>
A mul_acc(A a, A b) {
  if constexpr (std::is_integral_v<A>)
    return static_cast<A>(static_cast<uint64_t>(a) * static_cast<uint64_t>(b));
  return a * b;
}

// cumsum and prod accumulate in double (floating results) or int64, after casting the input
// to the result's dtype (as ATen: the cast comes first, so a float input summed in int64 is
// truncated element by element).
DType accumulator(DType out) { return is_floating(out) ? kFloat64 : kInt64; }
Tensor accumulator_input(const Tensor& self, DType out) {
  return contiguous_as(contiguous_as(self, out), accumulator(out));
}

template <class A>
void cumsum_lines(const A* x, A* y, const Lines& l) {
  const int64_t n = l.n, inner = l.inner;
#pragma omp parallel for if (l.outer * n * inner > kGrainSize && l.outer > 1)
  for (int64_t o = 0; o < l.outer; ++o) {
    const A* xs = x + o * n * inner;
    A* ys = y + o * n * inner;
    for (int64_t j = 0; j < inner; ++j) ys[j] = xs[j];
    for (int64_t i = 1; i < n; ++i)
      for (int64_t j = 0; j < inner; ++j)
        ys[i * inner + j] = add_acc(ys[(i - 1) * inner + j], xs[i * inner + j]);
  }
}
void cumsum_impl(const Tensor& out, const Tensor& self, int64_t dim, const OptDType&) {
  int64_t d = wrap_dim(dim, self.dim(), "cumsum");
  if (self.numel() == 0) return;
  DType acc = accumulator(out.dtype());
  Tensor x = accumulator_input(self, out.dtype());
  Tensor y = empty_cpu(self.sizes(), acc);
  Lines l = lines_around(self, d);
  if (acc == kFloat64) {
    cumsum_lines(static_cast<const double*>(x.impl()->data()),
                 static_cast<double*>(y.impl()->data()), l);
  } else {
    cumsum_lines(static_cast<const int64_t*>(x.impl()->data()),
                 static_cast<int64_t*>(y.impl()->data()), l);
  }
  copy_kernel(out, y);
}

template <class A>
void prod_lines(const A* x, A* y, const Lines& l) {
  const int64_t n = l.n, inner = l.inner;
#pragma omp parallel for if (l.outer * n * inner > kGrainSize && l.outer > 1)
  for (int64_t o = 0; o < l.outer; ++o) {
    const A* xs = x + o * n * inner;
    A* ys = y + o * inner;
    for (int64_t j = 0; j < inner; ++j) ys[j] = A(1);
    for (int64_t i = 0; i < n; ++i)
      for (int64_t j = 0; j < inner; ++j) ys[j] = mul_acc(ys[j], xs[i * inner + j]);
  }
}
void prod_impl(const Tensor& out, const Tensor& self, const OptInt& dim, bool, const OptDType&) {
  if (out.numel() == 0) return;
  DType acc = accumulator(out.dtype());
  Tensor x = accumulator_input(self, out.dtype());
  Lines l;
  if (dim) {
    l = lines_around(self, wrap_dim(*dim, self.dim(), "prod"));
  } else {
    l.n = self.numel();
  }
  Tensor y = empty_cpu(out.sizes(), acc);
  if (acc == kFloat64) {
    prod_lines(static_cast<const double*>(x.impl()->data()), static_cast<double*>(y.impl()->data()),
               l);
  } else {
    prod_lines(static_cast<const int64_t*>(x.impl()->data()),
               static_cast<int64_t*>(y.impl()->data()), l);
  }
  copy_kernel(out, y);
}

constexpr auto K = DispatchKey::CPU;
KILN_REGISTER_STRUCTURED(cumsum, K, &cumsum_impl);
KILN_REGISTER_STRUCTURED(prod, K, &prod_impl);
const bool registered = [] {
  ops::op_sort.set_kernel(K, &sort_kernel);
  ops::op_topk.set_kernel(K, &topk_kernel);
  return true;
}();

}  // namespace
}  // namespace kiln::cpu

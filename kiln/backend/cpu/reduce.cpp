// CPU kernels of reductions (sum, mean, var, amax/amin, all/any, argmax/argmin, max/min with
// indices) and of softmax / log_softmax.
#include <cmath>
#include <limits>

#include "kiln/backend/cpu/loops.h"
#include "kiln/backend/cpu/vec_math.h"
#include "kiln/ops/other_meta.h"
#include "kiln/ops/structured.h"

namespace kiln::cpu {
namespace {

// The input rearranged as a contiguous [rows, len] matrix: rows run over the kept dims in order,
// each row holds the reduced elements. Row r is output element r.
struct Rows {
  Tensor data;
  int64_t rows;
  int64_t len;
};
// See Note [Debug asserts] in kiln/core/error.h: each kernel writes one output per row.
Rows to_rows(const char* op, const Tensor& self, IntArrayRef dims, DType dtype) {
  auto mask = meta::reduce_mask(op, self, dims);
  Shape perm, kept_sizes;
  int64_t rows = 1, len = 1;
  for (int64_t i = 0; i < self.dim(); ++i)
    if (!mask[i]) {
      perm.push_back(i);
      rows *= self.sizes()[i];
    }
  for (int64_t i = 0; i < self.dim(); ++i)
    if (mask[i]) {
      perm.push_back(i);
      len *= self.sizes()[i];
    }
  Tensor p = ops::op_permute(self, perm);
  return {contiguous_as(p, dtype), rows, len};
}

// Accumulator type: double for floats, int64 for integers and bool.
template <class T>
using Acc = std::conditional_t<std::is_floating_point_v<acc_t<T>>, double, int64_t>;

template <class F>
void for_rows(int64_t rows, int64_t len, F f) {
#pragma omp parallel for if (rows * len > kGrainSize && rows > 1)
  for (int64_t r = 0; r < rows; ++r) f(r);
}

// A reduction over the leading dims of a contiguous tensor ([R, K] -> [K]: bias gradients,
// broadcast gradients summed back) adds whole rows into per-column accumulators, in row order,
// instead of transposing the input first.
bool reduces_leading_dims(const char* op, const Tensor& self, IntArrayRef dims, int64_t* rows,
                          int64_t* cols) {
  if (!self.is_contiguous() || self.dim() < 2) return false;
  auto mask = meta::reduce_mask(op, self, dims);
  int64_t k = 0;
  while (k < self.dim() && mask[k]) ++k;
  for (int64_t i = k; i < self.dim(); ++i)
    if (mask[i]) return false;
  if (k == 0 || k == self.dim()) return false;
  *rows = 1;
  *cols = 1;
  for (int64_t i = 0; i < self.dim(); ++i) (i < k ? *rows : *cols) *= self.sizes()[i];
  return true;
}
// y[c] = sum over r of x[r, c] (divided by rows for the mean), accumulated in double.
template <class T>
void column_sums(const T* x, T* y, int64_t rows, int64_t cols, bool mean) {
  constexpr int64_t kBlock = 1024;  // columns per block: the accumulators stay in L1
#pragma omp parallel for if (rows * cols > kGrainSize && cols > kBlock)
  for (int64_t c0 = 0; c0 < cols; c0 += kBlock) {
    int64_t n = std::min(kBlock, cols - c0);
    double acc[kBlock] = {};
    for (int64_t r = 0; r < rows; ++r) {
      const T* row = x + r * cols + c0;
      for (int64_t j = 0; j < n; ++j) acc[j] += static_cast<double>(row[j]);
    }
    for (int64_t j = 0; j < n; ++j)
      y[c0 + j] =
          static_cast<T>(static_cast<acc_t<T>>(mean ? acc[j] / static_cast<double>(rows) : acc[j]));
  }
}
// Runs column_sums when it applies (float types, same dtype in and out); false otherwise.
bool try_column_sums(const char* op, const Tensor& out, const Tensor& self, IntArrayRef dims,
                     bool mean) {
  int64_t rows, cols;
  if (out.dtype() != self.dtype() || !is_floating(self.dtype()) ||
      !reduces_leading_dims(op, self, dims, &rows, &cols))
    return false;
  with_contiguous_result(out, out.dtype(), [&](const Tensor& o) {
    KILN_DISPATCH_FLOAT_TYPES(self.dtype(), op, [&] {
      column_sums(static_cast<const scalar_t*>(self.impl()->data()),
                  static_cast<scalar_t*>(o.impl()->data()), rows, cols, mean);
    });
  });
  return true;
}

void sum_impl(const Tensor& out, const Tensor& self, IntArrayRef dims, bool, const OptDType& dt) {
  // With out=, PyTorch reduces in out's dtype (a float32 out of a float16 input sums in float32).
  DType t = out.dtype();
  (void)dt;
  if (try_column_sums("sum", out, self, dims, false)) return;
  Rows R = to_rows("sum", self, dims, t);
  KILN_DEBUG_ASSERT(out.numel() == R.rows, "[{}] {} rows into {} outputs", "sum", R.rows,
                    out.numel());
  with_contiguous_result(out, t, [&](const Tensor& o) {
    KILN_DISPATCH_TYPES(t, "sum", [&] {
      const scalar_t* x = static_cast<const scalar_t*>(R.data.impl()->data());
      scalar_t* y = static_cast<scalar_t*>(o.impl()->data());
      for_rows(R.rows, R.len, [&](int64_t r) {
        Acc<scalar_t> s = 0;
        const scalar_t* row = x + r * R.len;
        for (int64_t i = 0; i < R.len; ++i) s += static_cast<Acc<scalar_t>>(row[i]);
        y[r] = static_cast<scalar_t>(static_cast<acc_t<scalar_t>>(s));
      });
    });
  });
}

void mean_impl(const Tensor& out, const Tensor& self, IntArrayRef dims, bool, const OptDType& dt) {
  DType t = out.dtype();  // as for sum
  (void)dt;
  if (try_column_sums("mean", out, self, dims, true)) return;
  Rows R = to_rows("mean", self, dims, t);
  KILN_DEBUG_ASSERT(out.numel() == R.rows, "[{}] {} rows into {} outputs", "mean", R.rows,
                    out.numel());
  with_contiguous_result(out, t, [&](const Tensor& o) {
    KILN_DISPATCH_FLOAT_TYPES(t, "mean", [&] {
      const scalar_t* x = static_cast<const scalar_t*>(R.data.impl()->data());
      scalar_t* y = static_cast<scalar_t*>(o.impl()->data());
      for_rows(R.rows, R.len, [&](int64_t r) {
        double s = 0;
        const scalar_t* row = x + r * R.len;
        for (int64_t i = 0; i < R.len; ++i) s += static_cast<double>(row[i]);
        y[r] = static_cast<scalar_t>(static_cast<acc_t<scalar_t>>(s / static_cast<double>(R.len)));
      });
    });
  });
}

void var_impl(const Tensor& out, const Tensor& self, IntArrayRef dims, int64_t correction, bool) {
  DType t = self.dtype();
  Rows R = to_rows("var", self, dims, t);
  KILN_DEBUG_ASSERT(out.numel() == R.rows, "[{}] {} rows into {} outputs", "var", R.rows,
                    out.numel());
  double denom = std::max<double>(0.0, static_cast<double>(R.len - correction));
  with_contiguous_result(out, t, [&](const Tensor& o) {
    KILN_DISPATCH_FLOAT_TYPES(t, "var", [&] {
      const scalar_t* x = static_cast<const scalar_t*>(R.data.impl()->data());
      scalar_t* y = static_cast<scalar_t*>(o.impl()->data());
      for_rows(R.rows, R.len, [&](int64_t r) {
        const scalar_t* row = x + r * R.len;
        double m = 0;
        for (int64_t i = 0; i < R.len; ++i) m += static_cast<double>(row[i]);
        m /= static_cast<double>(R.len);
        double ss = 0;
        for (int64_t i = 0; i < R.len; ++i) {
          double d = static_cast<double>(row[i]) - m;
          ss += d * d;
        }
        y[r] = static_cast<scalar_t>(static_cast<acc_t<scalar_t>>(ss / denom));
      });
    });
  });
}

// max (is_max) or min of a row; NaN wins, as in PyTorch. Returns the first index of the result.
template <class T>
std::pair<acc_t<T>, int64_t> extreme(const T* row, int64_t len, bool is_max) {
  KILN_DEBUG_ASSERT(len > 0, "[{}] an empty row has no extreme", is_max ? "max" : "min");
  using V = acc_t<T>;
  V best = row[0];
  int64_t at = 0;
  if constexpr (!std::is_integral_v<V>)
    if (best != best) return {best, 0};
  for (int64_t i = 1; i < len; ++i) {
    V v = row[i];
    if constexpr (!std::is_integral_v<V>)
      if (v != v) return {v, i};
    if (is_max ? v > best : v < best) {
      best = v;
      at = i;
    }
  }
  return {best, at};
}

void amax_amin(const char* op, const Tensor& out, const Tensor& self, IntArrayRef dims,
               bool is_max) {
  Rows R = to_rows(op, self, dims, self.dtype());
  KILN_DEBUG_ASSERT(out.numel() == R.rows, "[{}] {} rows into {} outputs", op, R.rows, out.numel());
  with_contiguous_result(out, self.dtype(), [&](const Tensor& o) {
    KILN_DISPATCH_TYPES(self.dtype(), op, [&] {
      const scalar_t* x = static_cast<const scalar_t*>(R.data.impl()->data());
      scalar_t* y = static_cast<scalar_t*>(o.impl()->data());
      for_rows(R.rows, R.len, [&](int64_t r) {
        y[r] = static_cast<scalar_t>(extreme(x + r * R.len, R.len, is_max).first);
      });
    });
  });
}
void amax_impl(const Tensor& out, const Tensor& self, IntArrayRef dims, bool) {
  amax_amin("amax", out, self, dims, true);
}
void amin_impl(const Tensor& out, const Tensor& self, IntArrayRef dims, bool) {
  amax_amin("amin", out, self, dims, false);
}

void all_any(const char* op, const Tensor& out, const Tensor& self, IntArrayRef dims, bool is_all) {
  Rows R = to_rows(op, self, dims, kBool);
  KILN_DEBUG_ASSERT(out.numel() == R.rows, "[{}] {} rows into {} outputs", op, R.rows, out.numel());
  with_contiguous_result(out, kBool, [&](const Tensor& o) {
    const bool* x = static_cast<const bool*>(R.data.impl()->data());
    bool* y = static_cast<bool*>(o.impl()->data());
    for_rows(R.rows, R.len, [&](int64_t r) {
      bool acc = is_all;
      const bool* row = x + r * R.len;
      for (int64_t i = 0; i < R.len; ++i) {
        if (row[i] != is_all) {
          acc = !is_all;
          break;
        }
      }
      y[r] = acc;
    });
  });
}
void all_impl(const Tensor& out, const Tensor& self, IntArrayRef dims, bool) {
  all_any("all", out, self, dims, true);
}
void any_impl(const Tensor& out, const Tensor& self, IntArrayRef dims, bool) {
  all_any("any", out, self, dims, false);
}

// Writes values (if `values` is defined) and indices of the max/min over `dims`.
void arg_extreme(const char* op, const Tensor& values, const Tensor& indices, const Tensor& self,
                 IntArrayRef dims, bool is_max) {
  Rows R = to_rows(op, self, dims, self.dtype());
  auto run = [&](const Tensor& vo, const Tensor& io) {
    KILN_DISPATCH_TYPES(self.dtype(), op, [&] {
      const scalar_t* x = static_cast<const scalar_t*>(R.data.impl()->data());
      scalar_t* v = vo.defined() ? static_cast<scalar_t*>(vo.impl()->data()) : nullptr;
      int64_t* ix = static_cast<int64_t*>(io.impl()->data());
      for_rows(R.rows, R.len, [&](int64_t r) {
        auto [best, at] = extreme(x + r * R.len, R.len, is_max);
        if (v) v[r] = static_cast<scalar_t>(best);
        ix[r] = at;
      });
    });
  };
  with_contiguous_result(indices, kInt64, [&](const Tensor& io) {
    if (!values.defined()) return run(Tensor(), io);
    with_contiguous_result(values, self.dtype(), [&](const Tensor& vo) { run(vo, io); });
  });
}
Shape flat_dims(const Tensor& self) {
  Shape all;
  for (int64_t i = 0; i < self.dim(); ++i) all.push_back(i);
  return all;
}
void argmax_impl(const Tensor& out, const Tensor& self, const OptInt& dim, bool) {
  int64_t d = dim.value_or(0);
  arg_extreme("argmax", Tensor(), out, self,
              dim ? IntArrayRef(&d, 1) : IntArrayRef(flat_dims(self)), true);
}
void argmin_impl(const Tensor& out, const Tensor& self, const OptInt& dim, bool) {
  int64_t d = dim.value_or(0);
  arg_extreme("argmin", Tensor(), out, self,
              dim ? IntArrayRef(&d, 1) : IntArrayRef(flat_dims(self)), false);
}

TensorPair minmax_dim(const char* op, const Tensor& self, int64_t dim, bool keepdim, bool is_max) {
  TensorSpec s = is_max ? meta::max_dim(self, dim, keepdim) : meta::min_dim(self, dim, keepdim);
  Tensor values = empty_cpu(s.sizes, s.dtype), indices = empty_cpu(s.sizes, kInt64);
  if (self.numel() > 0) arg_extreme(op, values, indices, self, IntArrayRef(&dim, 1), is_max);
  return {values, indices};
}
TensorPair max_dim_kernel(const Tensor& self, int64_t dim, bool keepdim) {
  return minmax_dim("max", self, dim, keepdim, true);
}
TensorPair min_dim_kernel(const Tensor& self, int64_t dim, bool keepdim) {
  return minmax_dim("min", self, dim, keepdim, false);
}

// softmax over the middle dim of x viewed as [outer, n, inner]; y has the same layout.
template <class T>
void softmax_rows(const T* px, T* py, int64_t outer, int64_t n, int64_t inner, bool log) {
  using F = acc_t<T>;
#pragma omp parallel for if (outer * n * inner > kGrainSize && outer * inner > 1)
  for (int64_t oi = 0; oi < outer * inner; ++oi) {
    int64_t a = oi / inner, b = oi % inner;
    const T* row = px + a * n * inner + b;
    T* dst = py + a * n * inner + b;
    F m = -std::numeric_limits<F>::infinity();
    for (int64_t i = 0; i < n; ++i) m = std::max<F>(m, static_cast<F>(row[i * inner]));
    if (std::isinf(m) && m < 0) m = 0;  // an all -inf row: exp(-inf - 0) = 0
    F s = 0;
    if (!log && std::is_same_v<T, F> && inner == 1 && px != py) {
      // Softmax over contiguous rows (the usual last dim): store the exponentials in one
      // vectorisable loop, sum them, scale (T == F: nothing is lost in the store).
      for (int64_t i = 0; i < n; ++i) dst[i] = static_cast<T>(exp_any(static_cast<F>(row[i]) - m));
      for (int64_t i = 0; i < n; ++i) s += static_cast<F>(dst[i]);
      F inv = F(1) / s;
      for (int64_t i = 0; i < n; ++i) dst[i] = static_cast<T>(static_cast<F>(dst[i]) * inv);
      continue;
    }
    for (int64_t i = 0; i < n; ++i) s += exp_any(static_cast<F>(row[i * inner]) - m);
    if (log) {
      F ls = std::log(s);
      for (int64_t i = 0; i < n; ++i)
        dst[i * inner] = static_cast<T>(static_cast<F>(row[i * inner]) - m - ls);
    } else {
      for (int64_t i = 0; i < n; ++i)
        dst[i * inner] = static_cast<T>(exp_any(static_cast<F>(row[i * inner]) - m) / s);
    }
  }
}

void softmax_common(const Tensor& out, const Tensor& self, int64_t dim, bool log) {
  int64_t d = wrap_dim(dim, self.dim(), log ? "log_softmax" : "softmax");
  Tensor x = contiguous_as(self, self.dtype());
  int64_t n = self.dim() == 0 ? 1 : self.sizes()[d];
  int64_t inner = 1, outer = 1;
  for (int64_t i = 0; i < self.dim(); ++i) {
    if (i < d) outer *= self.sizes()[i];
    if (i > d) inner *= self.sizes()[i];
  }
  if (self.numel() == 0) return;
  with_contiguous_result(out, self.dtype(), [&](const Tensor& o) {
    KILN_DISPATCH_FLOAT_TYPES(self.dtype(), "softmax", [&] {
      softmax_rows(static_cast<const scalar_t*>(x.impl()->data()),
                   static_cast<scalar_t*>(o.impl()->data()), outer, n, inner, log);
    });
  });
}
void softmax_impl(const Tensor& out, const Tensor& self, int64_t dim) {
  softmax_common(out, self, dim, false);
}
void log_softmax_impl(const Tensor& out, const Tensor& self, int64_t dim) {
  softmax_common(out, self, dim, true);
}

constexpr auto K = DispatchKey::CPU;
KILN_REGISTER_STRUCTURED(sum, K, &sum_impl);
KILN_REGISTER_STRUCTURED(mean, K, &mean_impl);
KILN_REGISTER_STRUCTURED(var, K, &var_impl);
KILN_REGISTER_STRUCTURED(amax, K, &amax_impl);
KILN_REGISTER_STRUCTURED(amin, K, &amin_impl);
KILN_REGISTER_STRUCTURED(all, K, &all_impl);
KILN_REGISTER_STRUCTURED(any, K, &any_impl);
KILN_REGISTER_STRUCTURED(argmax, K, &argmax_impl);
KILN_REGISTER_STRUCTURED(argmin, K, &argmin_impl);
KILN_REGISTER_STRUCTURED(softmax, K, &softmax_impl);
KILN_REGISTER_STRUCTURED(log_softmax, K, &log_softmax_impl);
const bool registered = [] {
  ops::op_max_dim.set_kernel(K, &max_dim_kernel);
  ops::op_min_dim.set_kernel(K, &min_dim_kernel);
  return true;
}();

}  // namespace
}  // namespace kiln::cpu

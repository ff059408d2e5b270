// CPU kernels of layer_norm (and its backward ops), rms_norm, embedding, nll_loss and dropout.
#include <algorithm>
#include <cmath>
#include <utility>
#include <vector>

#include "kiln/backend/cpu/loops.h"
#include "kiln/ops/norm_meta.h"
#include "kiln/ops/other_meta.h"
#include "kiln/ops/structured.h"

namespace kiln::cpu {

void philox_uniform(const Tensor& out, Generator* gen);  // common.cpp

namespace {

// The mean (0 for rms) and 1 / sqrt(variance + eps) of a row of n elements, summed in double.
template <class F, class T>
std::pair<F, F> row_stats(const T* xr, int64_t n, double eps, bool rms) {
  double mean = 0, sq = 0;
  if (!rms) {
    for (int64_t i = 0; i < n; ++i) mean += static_cast<double>(xr[i]);
    mean /= static_cast<double>(n);
  }
  for (int64_t i = 0; i < n; ++i) {
    double d = static_cast<double>(xr[i]) - mean;
    sq += d * d;
  }
  return {static_cast<F>(mean), static_cast<F>(1.0 / std::sqrt(sq / static_cast<double>(n) + eps))};
}

// x is [rows, n] (normalised over the last n elements); w and b are [n] or null.
template <class T>
void norm_rows(const T* x, const T* w, const T* b, T* y, int64_t rows, int64_t n, double eps,
               bool rms) {
  using F = acc_t<T>;
#pragma omp parallel for if (rows * n > kGrainSize && rows > 1)
  for (int64_t r = 0; r < rows; ++r) {
    const T* xr = x + r * n;
    T* yr = y + r * n;
    auto [m, rstd] = row_stats<F>(xr, n, eps, rms);
    for (int64_t i = 0; i < n; ++i) {
      F v = (static_cast<F>(xr[i]) - m) * rstd;
      if (w) v *= static_cast<F>(w[i]);
      if (b) v += static_cast<F>(b[i]);
      yr[i] = static_cast<T>(v);
    }
  }
}

void norm_common(const Tensor& out, const Tensor& x, IntArrayRef shape, const Tensor& w,
                 const Tensor& b, double eps, bool rms) {
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  int64_t rows = n == 0 ? 0 : x.numel() / n;
  if (x.numel() == 0) return;
  Tensor cx = contiguous_as(x, x.dtype());
  Tensor cw = w.defined() ? contiguous_as(w, x.dtype()) : Tensor();
  Tensor cb = b.defined() ? contiguous_as(b, x.dtype()) : Tensor();
  with_contiguous_result(out, x.dtype(), [&](const Tensor& y) {
    KILN_DISPATCH_FLOAT_TYPES(x.dtype(), rms ? "rms_norm" : "layer_norm", [&] {
      using T = scalar_t;
      norm_rows<T>(static_cast<const T*>(cx.impl()->data()),
                   cw.defined() ? static_cast<const T*>(cw.impl()->data()) : nullptr,
                   cb.defined() ? static_cast<const T*>(cb.impl()->data()) : nullptr,
                   static_cast<T*>(y.impl()->data()), rows, n, eps, rms);
    });
  });
}
void layer_norm_impl(const Tensor& out, const Tensor& x, IntArrayRef shape, const Tensor& w,
                     const Tensor& b, double eps) {
  norm_common(out, x, shape, w, b, eps, false);
}
void rms_norm_impl(const Tensor& out, const Tensor& x, IntArrayRef shape, const Tensor& w,
                   double eps) {
  norm_common(out, x, shape, w, Tensor(), eps, true);
}

// dx = rstd * (gx - mean(gx) - xhat * mean(gx * xhat)) with gx = g * w for one row of n
// elements whose statistics are m and rstd; w is [n] or null. Sums in double, elements in F.
template <class T, class F>
void layer_norm_backward_row(const T* gr, const T* xr, const T* w, T* dxr, int64_t n, F m, F rstd) {
  double sum_g = 0, sum_gx = 0;
  for (int64_t i = 0; i < n; ++i) {
    F gx = static_cast<F>(gr[i]) * (w ? static_cast<F>(w[i]) : F(1));
    sum_g += gx;
    sum_gx += gx * ((static_cast<F>(xr[i]) - m) * rstd);
  }
  F a = static_cast<F>(sum_g / static_cast<double>(n));
  F b = static_cast<F>(sum_gx / static_cast<double>(n));
  for (int64_t i = 0; i < n; ++i) {
    F gx = static_cast<F>(gr[i]) * (w ? static_cast<F>(w[i]) : F(1));
    F xhat = (static_cast<F>(xr[i]) - m) * rstd;
    dxr[i] = static_cast<T>(rstd * (gx - a - xhat * b));
  }
}

// g, x and dx are [rows, n], w is [n] or null.
template <class T>
void layer_norm_backward_rows(const T* g, const T* x, const T* w, T* dx, int64_t rows, int64_t n,
                              double eps) {
  using F = acc_t<T>;
#pragma omp parallel for if (rows * n > kGrainSize && rows > 1)
  for (int64_t r = 0; r < rows; ++r) {
    auto [m, rstd] = row_stats<F>(x + r * n, n, eps, false);
    layer_norm_backward_row(g + r * n, x + r * n, w, dx + r * n, n, m, rstd);
  }
}

// layer_norm_fused_backward: dx (when dx is given) as layer_norm_backward_rows, and dw = sum of g *
// xhat, db = sum of g over the rows (each when given). The rows go in blocks of kRowsPerPartial
// whose sums (in double) are added in block order, so the result does not depend on the thread
// count.
template <class T>
void layer_norm_fused_backward_rows(const T* g, const T* x, const T* w, T* dx, T* dw, T* db,
                                    int64_t rows, int64_t n, double eps) {
  using F = acc_t<T>;
  constexpr int64_t kRowsPerPartial = 32;
  const int64_t blocks = (rows + kRowsPerPartial - 1) / kRowsPerPartial;
  const bool params = dw || db;
  std::vector<double> partial(params ? static_cast<size_t>(blocks * 2 * n) : 0, 0.0);
#pragma omp parallel for if (rows * n > kGrainSize && blocks > 1)
  for (int64_t blk = 0; blk < blocks; ++blk) {
    double* pw = params ? partial.data() + blk * 2 * n : nullptr;
    for (int64_t r = blk * kRowsPerPartial; r < std::min(rows, (blk + 1) * kRowsPerPartial); ++r) {
      const T *xr = x + r * n, *gr = g + r * n;
      auto [m, rstd] = row_stats<F>(xr, n, eps, false);
      if (params)
        for (int64_t i = 0; i < n; ++i) {
          const double gi = static_cast<double>(gr[i]);
          pw[i] += gi * static_cast<double>((static_cast<F>(xr[i]) - m) * rstd);
          pw[n + i] += gi;
        }
      if (dx) layer_norm_backward_row(gr, xr, w, dx + r * n, n, m, rstd);
    }
  }
  if (!params) return;
  std::vector<double> sum(static_cast<size_t>(2 * n), 0.0);
  for (int64_t blk = 0; blk < blocks; ++blk)
    for (int64_t i = 0; i < 2 * n; ++i) sum[i] += partial[blk * 2 * n + i];
  for (int64_t i = 0; i < n; ++i) {
    if (dw) dw[i] = static_cast<T>(sum[i]);
    if (db) db[i] = static_cast<T>(sum[n + i]);
  }
}

void layer_norm_backward_impl(const Tensor& out, const Tensor& g, const Tensor& x,
                              IntArrayRef shape, const Tensor& w, double eps) {
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  int64_t rows = n == 0 ? 0 : x.numel() / n;
  Tensor cg = contiguous_as(g, x.dtype()), cx = contiguous_as(x, x.dtype());
  Tensor cw = w.defined() ? contiguous_as(w, x.dtype()) : Tensor();
  with_contiguous_result(out, x.dtype(), [&](const Tensor& y) {
    KILN_DISPATCH_FLOAT_TYPES(x.dtype(), "layer_norm_backward", [&] {
      using T = scalar_t;
      layer_norm_backward_rows<T>(static_cast<const T*>(cg.impl()->data()),
                                  static_cast<const T*>(cx.impl()->data()),
                                  cw.defined() ? static_cast<const T*>(cw.impl()->data()) : nullptr,
                                  static_cast<T*>(y.impl()->data()), rows, n, eps);
    });
  });
}

TensorTriple layer_norm_fused_backward_kernel(const Tensor& g, const Tensor& x, IntArrayRef shape,
                                              const Tensor& w, double eps, IntArrayRef mask) {
  // A named result, not a structured binding: lambdas capture it (clang before 16 cannot capture
  // bindings, and the fuzz build uses clang).
  const detail::LayerNormGrads r =
      detail::layer_norm_fused_backward_outputs(g, x, shape, w, eps, mask);
  if (r.rows == 0) return {r.dx, r.dw, r.db};
  Tensor cg = contiguous_as(g, x.dtype()), cx = contiguous_as(x, x.dtype());
  Tensor cw = w.defined() ? contiguous_as(w, x.dtype()) : Tensor();
  KILN_DISPATCH_FLOAT_TYPES(x.dtype(), "layer_norm_fused_backward", [&] {
    using T = scalar_t;
    auto data = [](const Tensor& t) {
      return t.defined() ? static_cast<T*>(t.impl()->data()) : nullptr;
    };
    layer_norm_fused_backward_rows<T>(data(cg), data(cx), data(cw), data(r.dx), data(r.dw),
                                      data(r.db), r.rows, r.n, eps);
  });
  return {r.dx, r.dw, r.db};
}

// padding_idx and scale_grad_by_freq change only the gradient (Note [Embedding gradients]).
void embedding_impl(const Tensor& out, const Tensor& weight, const Tensor& indices, int64_t, bool,
                    bool) {
  int64_t V = weight.sizes()[0], D = weight.sizes()[1];
  std::vector<int64_t> idx = checked_indices("embedding", indices, V, "an embedding table");
  Tensor cw = contiguous_as(weight, weight.dtype());
  with_contiguous_result(out, weight.dtype(), [&](const Tensor& y) {
    const char* src = static_cast<const char*>(cw.impl()->data());
    char* dst = static_cast<char*>(y.impl()->data());
    size_t row = static_cast<size_t>(D) * weight.itemsize();
    for (size_t i = 0; i < idx.size(); ++i)
      if (row) std::memcpy(dst + i * row, src + static_cast<size_t>(idx[i]) * row, row);
  });
}

void nll_loss_impl(const Tensor& out, const Tensor& self, const Tensor& target,
                   int64_t ignore_index) {
  int64_t C = self.sizes()[self.dim() - 1];
  Tensor x = contiguous_as(self, self.dtype());
  std::vector<int64_t> t = target.to_vector<int64_t>();
  for (int64_t v : t)
    KILN_CHECK_INDEX(v == ignore_index || (v >= 0 && v < C),
                     "[nll_loss] target {} is out of bounds for {} classes", v, C);
  with_contiguous_result(out, self.dtype(), [&](const Tensor& y) {
    KILN_DISPATCH_FLOAT_TYPES(self.dtype(), "nll_loss", [&] {
      const scalar_t* px = static_cast<const scalar_t*>(x.impl()->data());
      double s = 0;
      int64_t count = 0;
      for (size_t i = 0; i < t.size(); ++i) {
        if (t[i] == ignore_index) continue;
        s -= static_cast<double>(px[static_cast<int64_t>(i) * C + t[i]]);
        ++count;
      }
      // Mean over the counted targets; 0/0 = NaN when every target is ignored, as in PyTorch.
      *static_cast<scalar_t*>(y.impl()->data()) =
          static_cast<scalar_t>(static_cast<acc_t<scalar_t>>(s / static_cast<double>(count)));
    });
  });
}

TensorPair dropout_kernel(const Tensor& x, double p, Generator* gen) {
  TensorSpec s = meta::native_dropout(x, p, gen);
  Tensor mask = empty_cpu(s.sizes, kBool);
  Tensor out = empty_cpu(s.sizes, s.dtype);
  Tensor u = empty_cpu(s.sizes, kFloat32);
  philox_uniform(u, gen);
  Tensor cx = contiguous_as(x, x.dtype());
  KILN_DISPATCH_FLOAT_TYPES(x.dtype(), "dropout", [&] {
    using F = acc_t<scalar_t>;
    const float* pu = static_cast<const float*>(u.impl()->data());
    const scalar_t* px = static_cast<const scalar_t*>(cx.impl()->data());
    bool* pm = static_cast<bool*>(mask.impl()->data());
    scalar_t* py = static_cast<scalar_t*>(out.impl()->data());
    F scale = p >= 1 ? F(0) : static_cast<F>(1.0 / (1.0 - p));
    for (int64_t i = 0; i < out.numel(); ++i) {
      bool keep = static_cast<double>(pu[i]) >= p;
      pm[i] = keep;
      py[i] = static_cast<scalar_t>(keep ? static_cast<F>(px[i]) * scale : F(0));
    }
  });
  return {out, mask};
}

constexpr auto K = DispatchKey::CPU;
KILN_REGISTER_STRUCTURED(layer_norm, K, &layer_norm_impl);
KILN_REGISTER_STRUCTURED(layer_norm_backward, K, &layer_norm_backward_impl);
KILN_REGISTER_STRUCTURED(rms_norm, K, &rms_norm_impl);
KILN_REGISTER_STRUCTURED(embedding, K, &embedding_impl);
KILN_REGISTER_STRUCTURED(nll_loss, K, &nll_loss_impl);
const bool registered = [] {
  ops::op_native_dropout.set_kernel(K, &dropout_kernel);
  ops::op_layer_norm_fused_backward.set_kernel(K, &layer_norm_fused_backward_kernel);
  return true;
}();

}  // namespace

std::vector<int64_t> checked_indices(const char* op, const Tensor& index, int64_t bound,
                                     const char* what) {
  std::vector<int64_t> idx = index.to_vector<int64_t>();
  for (int64_t v : idx)
    KILN_CHECK_INDEX(v >= 0 && v < bound, "[{}] index {} is out of range for {} of size {}", op, v,
                     what, bound);
  return idx;
}

}  // namespace kiln::cpu

// CPU kernels of batch, group and layer norm (Note [Batch, group and layer norm] in
// kiln/ops/norm_meta.cpp): the three NormKernels, OpenMP loops over the groups.
#include <algorithm>

#include "kiln/backend/cpu/loops.h"
#include "kiln/ops/norm_meta.h"

namespace kiln::cpu {
namespace {

template <class T>
const T* cptr(const Tensor& t) {
  return t.defined() ? static_cast<const T*>(t.impl()->data()) : nullptr;
}
template <class T>
T* mptr(const Tensor& t) {
  return static_cast<T*>(t.impl()->data());
}

// Two passes per channel (the mean, then the squared deviations from it): no cancellation,
// whatever the data's offset. Blocks of kBlock elements are summed in acc_t lanes (`omp simd`
// reductions: float for float32 and the 16-bit floats, 8 lanes of at most kBlock / 8 terms)
// and the blocks' sums in double, so the error stays that of a short float sum.
constexpr int64_t kBlock = 1024;

template <class T>
void moments_loop(const T* px, int64_t n, int64_t c, int64_t hw, acc_t<T>* pm, acc_t<T>* pv) {
  using S = acc_t<T>;
  const double count = static_cast<double>(n * hw);
#pragma omp parallel for if (n * c * hw > kGrainSize && c > 1)
  for (int64_t j = 0; j < c; ++j) {
    double s = 0;
    for (int64_t i = 0; i < n; ++i) {
      const T* row = px + (i * c + j) * hw;
      for (int64_t k0 = 0; k0 < hw; k0 += kBlock) {
        const int64_t k1 = std::min(hw, k0 + kBlock);
        S b = 0;
#pragma omp simd reduction(+ : b)
        for (int64_t k = k0; k < k1; ++k) b += static_cast<S>(row[k]);
        s += static_cast<double>(b);
      }
    }
    const double m = s / count;
    const S ms = static_cast<S>(m);
    double sq = 0;
    for (int64_t i = 0; i < n; ++i) {
      const T* row = px + (i * c + j) * hw;
      for (int64_t k0 = 0; k0 < hw; k0 += kBlock) {
        const int64_t k1 = std::min(hw, k0 + kBlock);
        S b = 0;
#pragma omp simd reduction(+ : b)
        for (int64_t k = k0; k < k1; ++k) {
          const S d = static_cast<S>(row[k]) - ms;
          b += d * d;
        }
        sq += static_cast<double>(b);
      }
    }
    pm[j] = static_cast<S>(m);
    pv[j] = static_cast<S>(sq / count);
  }
}

template <class T>
void dot_loop(const T* pg, const T* px, const acc_t<T>* pm, int64_t n, int64_t c, int64_t hw,
              acc_t<T>* ps, acc_t<T>* pd) {
  using S = acc_t<T>;
#pragma omp parallel for if (n * c * hw > kGrainSize && c > 1)
  for (int64_t j = 0; j < c; ++j) {
    const S m = pm ? pm[j] : S(0);
    double s = 0, d = 0;
    for (int64_t i = 0; i < n; ++i) {
      const int64_t off = (i * c + j) * hw;
      for (int64_t k0 = 0; k0 < hw; k0 += kBlock) {
        const int64_t k1 = std::min(hw, k0 + kBlock);
        S bs = 0, bd = 0;
#pragma omp simd reduction(+ : bs, bd)
        for (int64_t k = off + k0; k < off + k1; ++k) {
          const S g = static_cast<S>(pg[k]);
          bs += g;
          bd += g * (static_cast<S>(px[k]) - m);
        }
        s += static_cast<double>(bs);
        d += static_cast<double>(bd);
      }
    }
    ps[j] = static_cast<S>(s);
    pd[j] = static_cast<S>(d);
  }
}

template <class T>
void apply_loop(T* po, const T* pa, const acc_t<T>* pp, const T* pb, const acc_t<T>* pr,
                const acc_t<T>* ps, const acc_t<T>* pw, const acc_t<T>* pbias, int64_t n, int64_t c,
                int64_t hw, int64_t qi, int64_t qj) {
  using S = acc_t<T>;
#pragma omp parallel for if (n * c * hw > kGrainSize && n * c > 1)
  for (int64_t ij = 0; ij < n * c; ++ij) {
    const int64_t i = ij / c, j = ij % c, q = i * qi + j * qj, off = ij * hw;
    const S vp = pp[q], vr = pr ? pr[q] : S(0), vs = ps ? ps[q] : S(0);
    if (!pb && !pw && !pbias) {
#pragma omp simd
      for (int64_t k = 0; k < hw; ++k)
        po[off + k] = static_cast<T>(static_cast<S>(pa[off + k]) * vp + vs);
      continue;
    }
    if (pb && !pw && !pbias) {
#pragma omp simd
      for (int64_t k = 0; k < hw; ++k)
        po[off + k] = static_cast<T>(static_cast<S>(pa[off + k]) * vp + vs +
                                     static_cast<S>(pb[off + k]) * vr);
      continue;
    }
    for (int64_t k = 0; k < hw; ++k) {
      S v = static_cast<S>(pa[off + k]) * vp + vs;
      if (pb) v += static_cast<S>(pb[off + k]) * vr;
      if (pw) v *= pw[k];
      if (pbias) v += pbias[k];
      po[off + k] = static_cast<T>(v);
    }
  }
}

void moments(const Tensor& x, int64_t n, int64_t c, int64_t hw, const Tensor& mean,
             const Tensor& var) {
  KILN_DISPATCH_FLOAT_TYPES(x.dtype(), "batch_norm", [&] {
    using T = scalar_t;
    moments_loop<T>(cptr<T>(x), n, c, hw, mptr<acc_t<T>>(mean), mptr<acc_t<T>>(var));
  });
}

void dot(const Tensor& dy, const Tensor& x, const Tensor& mean, int64_t n, int64_t c, int64_t hw,
         const Tensor& sum_dy, const Tensor& sum_dy_xmu) {
  KILN_DISPATCH_FLOAT_TYPES(x.dtype(), "batch_norm_backward", [&] {
    using T = scalar_t;
    using S = acc_t<T>;
    dot_loop<T>(cptr<T>(dy), cptr<T>(x), cptr<S>(mean), n, c, hw, mptr<S>(sum_dy),
                mptr<S>(sum_dy_xmu));
  });
}

void apply(const Tensor& out, const Tensor& a, const Tensor& p, const Tensor& b, const Tensor& r,
           const Tensor& s, const Tensor& w, const Tensor& bias, int64_t n, int64_t c, int64_t hw,
           int64_t qi, int64_t qj) {
  KILN_DISPATCH_FLOAT_TYPES(out.dtype(), "batch_norm", [&] {
    using T = scalar_t;
    using S = acc_t<T>;
    apply_loop<T>(mptr<T>(out), cptr<T>(a), cptr<S>(p), cptr<T>(b), cptr<S>(r), cptr<S>(s),
                  cptr<S>(w), cptr<S>(bias), n, c, hw, qi, qj);
  });
}

const detail::NormKernels kCpuNorm{&moments, &dot, &apply};
using Ops = detail::NormOps<kCpuNorm>;

constexpr auto K = DispatchKey::CPU;
const bool registered = [] {
  ops::op_native_batch_norm_legit.set_kernel(K, &Ops::batch_norm_legit);
  ops::op_native_batch_norm_legit_no_stats.set_kernel(K, &Ops::batch_norm_no_stats);
  ops::op_native_batch_norm_legit_no_training.set_kernel(K, &Ops::batch_norm_no_training);
  ops::op_native_batch_norm_backward.set_kernel(K, &Ops::batch_norm_backward);
  ops::op_native_group_norm.set_kernel(K, &Ops::group_norm);
  ops::op_native_group_norm_backward.set_kernel(K, &Ops::group_norm_backward);
  ops::op_native_layer_norm.set_kernel(K, &Ops::layer_norm);
  ops::op_native_layer_norm_backward.set_kernel(K, &Ops::layer_norm_backward);
  return true;
}();

}  // namespace
}  // namespace kiln::cpu

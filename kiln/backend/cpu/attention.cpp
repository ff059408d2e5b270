// CPU kernels of flash_attention and flash_attention_backward (Note [Fused attention] in
// kiln/ops/ops.h): the reference the device kernels are tested against (sim runs them too).
// Row by row, summed in double. scaled_dot_product_attention on the CPU takes the math path,
// whose BLAS products are faster than these loops.
#include <cmath>
#include <limits>
#include <vector>

#include "kiln/backend/cpu/loops.h"
#include "kiln/ops/other_meta.h"

namespace kiln::cpu {
namespace {

// The shapes of one call: n = product of the leading dims, l queries, s keys, e features.
struct Dims {
  int64_t n, l, s, e;
};
// See Note [Debug asserts] in kiln/core/error.h: the meta function made q [..., l, e] and k and
// v [..., s, e] with the same leading dims, which the loops index as flat [n, l or s, e].
Dims dims_of(const Tensor& q, const Tensor& k, const Tensor& v) {
  int64_t n = 1;
  for (int64_t d = 0; d < q.dim() - 2; ++d) n *= q.size(d);
  Dims r{n, q.size(-2), k.size(-2), q.size(-1)};
  KILN_DEBUG_ASSERT(q.dim() >= 2 && k.numel() == r.n * r.s * r.e && v.numel() == k.numel(),
                    "[flash_attention] q {}, k {}, v {}", q.sizes(), k.sizes(), v.sizes());
  return r;
}
// Keys a query sees: all, or (causal) those at or before its own position.
int64_t keys_seen(bool causal, int64_t row, int64_t s) { return causal ? std::min(row + 1, s) : s; }
template <class T>
double dot(const T* a, const T* b, int64_t e) {
  double acc = 0;
  for (int64_t i = 0; i < e; ++i) acc += static_cast<double>(a[i]) * static_cast<double>(b[i]);
  return acc;
}
template <class T>
const T* data_of(const Tensor& t) {
  return static_cast<const T*>(t.impl()->data());
}
template <class T>
T* data_of_mut(const Tensor& t) {
  return static_cast<T*>(t.impl()->data());
}

TensorPair flash_attention_kernel(const Tensor& q, const Tensor& k, const Tensor& v, bool causal,
                                  double scale) {
  TensorSpec spec = meta::flash_attention(q, k, v, causal, scale);
  DType st = meta::attention_stats_dtype(spec.dtype);
  Tensor out = empty_cpu(spec.sizes, spec.dtype);
  Tensor lse = empty_cpu(meta::attention_stats_sizes(q), st);
  Tensor cq = contiguous_as(q, q.dtype()), ck = contiguous_as(k, q.dtype()),
         cv = contiguous_as(v, q.dtype());
  Dims d = dims_of(q, k, v);
  KILN_DISPATCH_FLOAT_TYPES(q.dtype(), "flash_attention", [&] {
    using T = scalar_t;
    const T *pq = data_of<T>(cq), *pk = data_of<T>(ck), *pv = data_of<T>(cv);
    T* po = data_of_mut<T>(out);
    parallel_range(d.n * d.l, [&](int64_t begin, int64_t end) {
      std::vector<double> p(static_cast<size_t>(d.s)), acc(static_cast<size_t>(d.e));
      for (int64_t row = begin; row < end; ++row) {
        int64_t b = row / d.l, i = row % d.l, seen = keys_seen(causal, i, d.s);
        const T* qi = pq + row * d.e;
        const T* kb = pk + b * d.s * d.e;
        const T* vb = pv + b * d.s * d.e;
        double m = -std::numeric_limits<double>::infinity();
        for (int64_t j = 0; j < seen; ++j) {
          p[j] = scale * dot(qi, kb + j * d.e, d.e);
          m = std::max(m, p[j]);
        }
        double sum = 0;
        for (int64_t j = 0; j < seen; ++j) sum += std::exp(p[j] - m);
        double ls = m + std::log(sum);
        std::fill(acc.begin(), acc.end(), 0.0);
        for (int64_t j = 0; j < seen; ++j) {
          double pj = std::exp(p[j] - ls);
          const T* vj = vb + j * d.e;
          for (int64_t c = 0; c < d.e; ++c) acc[c] += pj * static_cast<double>(vj[c]);
        }
        for (int64_t c = 0; c < d.e; ++c) po[row * d.e + c] = static_cast<T>(acc[c]);
        if (st == kFloat64)
          data_of_mut<double>(lse)[row] = ls;
        else
          data_of_mut<float>(lse)[row] = static_cast<float>(ls);
      }
    });
  });
  return {out, lse};
}

// dv_j = sum_i p_ij do_i; dp_ij = do_i . v_j; ds_ij = p_ij (dp_ij - do_i . o_i);
// dq_i = scale sum_j ds_ij k_j; dk_j = scale sum_i ds_ij q_i (p recomputed from the lse).
TensorTriple flash_attention_backward_kernel(const Tensor& g, const Tensor& q, const Tensor& k,
                                             const Tensor& v, const Tensor& out, const Tensor& lse,
                                             bool causal, double scale) {
  TensorSpec spec = meta::flash_attention_backward(g, q, k, v, out, lse, causal, scale);
  DType t = spec.dtype;
  Tensor dq = empty_cpu(q.sizes(), t), dk = empty_cpu(k.sizes(), t), dv = empty_cpu(v.sizes(), t);
  Tensor cg = contiguous_as(g, t), cq = contiguous_as(q, t), ck = contiguous_as(k, t),
         cv = contiguous_as(v, t), co = contiguous_as(out, t);
  Tensor cl = contiguous_as(lse, kFloat64);
  Dims d = dims_of(q, k, v);
  KILN_DISPATCH_FLOAT_TYPES(t, "flash_attention_backward", [&] {
    using T = scalar_t;
    const T *pg = data_of<T>(cg), *pq = data_of<T>(cq), *pk = data_of<T>(ck), *pv = data_of<T>(cv),
            *po = data_of<T>(co);
    const double* pl = data_of<double>(cl);
    parallel_range(d.n, [&](int64_t begin, int64_t end) {
      size_t le = static_cast<size_t>(d.l * d.e), se = static_cast<size_t>(d.s * d.e);
      std::vector<double> gq(le), gk(se), gv(se);
      for (int64_t b = begin; b < end; ++b) {
        std::fill(gq.begin(), gq.end(), 0.0);
        std::fill(gk.begin(), gk.end(), 0.0);
        std::fill(gv.begin(), gv.end(), 0.0);
        const T *qb = pq + b * d.l * d.e, *gb = pg + b * d.l * d.e, *ob = po + b * d.l * d.e;
        const T *kb = pk + b * d.s * d.e, *vb = pv + b * d.s * d.e;
        for (int64_t i = 0; i < d.l; ++i) {
          const T *qi = qb + i * d.e, *gi = gb + i * d.e;
          double di = dot(gi, ob + i * d.e, d.e), li = pl[b * d.l + i];
          for (int64_t j = 0, seen = keys_seen(causal, i, d.s); j < seen; ++j) {
            const T *kj = kb + j * d.e, *vj = vb + j * d.e;
            double p = std::exp(scale * dot(qi, kj, d.e) - li);
            double ds = p * (dot(gi, vj, d.e) - di) * scale;
            for (int64_t c = 0; c < d.e; ++c) {
              gv[j * d.e + c] += p * static_cast<double>(gi[c]);
              gq[i * d.e + c] += ds * static_cast<double>(kj[c]);
              gk[j * d.e + c] += ds * static_cast<double>(qi[c]);
            }
          }
        }
        T* oq = data_of_mut<T>(dq) + b * d.l * d.e;
        T *ok = data_of_mut<T>(dk) + b * d.s * d.e, *ov = data_of_mut<T>(dv) + b * d.s * d.e;
        for (size_t x = 0; x < le; ++x) oq[x] = static_cast<T>(gq[x]);
        for (size_t x = 0; x < se; ++x) {
          ok[x] = static_cast<T>(gk[x]);
          ov[x] = static_cast<T>(gv[x]);
        }
      }
    });
  });
  return {dq, dk, dv};
}

const bool registered = [] {
  ops::op_flash_attention.set_kernel(DispatchKey::CPU, &flash_attention_kernel);
  ops::op_flash_attention_backward.set_kernel(DispatchKey::CPU, &flash_attention_backward_kernel);
  return true;
}();

}  // namespace
}  // namespace kiln::cpu

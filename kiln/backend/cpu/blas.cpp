// CPU matrix products: OpenBLAS for float32/float64 (float16/bfloat16 through float32), plain
// loops for integers.
#include <cblas.h>
#include <omp.h>

#include "kiln/backend/cpu/loops.h"
#include "kiln/ops/other_meta.h"
#include "kiln/ops/structured.h"

namespace kiln::cpu {
namespace {

// A matrix operand as BLAS sees it: row-major data, leading dim, and whether to transpose.
struct BlasMat {
  Tensor keep;  // owns a contiguous copy when one was needed
  const void* data;
  int64_t ld;
  bool trans;
};
BlasMat blas_operand(const Tensor& m, DType dtype) {
  int64_t r = m.sizes()[0], c = m.sizes()[1];
  int64_t s0 = m.strides()[0], s1 = m.strides()[1];
  if (m.dtype() == dtype) {
    if ((s1 == 1 || c == 1) && s0 >= std::max<int64_t>(1, c))
      return {m, m.impl()->data(), s0, false};
    if ((s0 == 1 || r == 1) && s1 >= std::max<int64_t>(1, r))
      return {m, m.impl()->data(), s1, true};
  }
  Tensor cm = contiguous_as(m, dtype);
  return {cm, cm.impl()->data(), std::max<int64_t>(1, c), false};
}

// OpenBLAS keeps its own thread pool; two pools on the same cores spin against each other
// (sched_yield dominated profiles). Keep OpenBLAS at the thread count Kiln's loops use.
void sync_blas_threads() {
  static thread_local int current = 0;
  int want = omp_get_max_threads();
  if (want != current) {
    openblas_set_num_threads(want);
    current = want;
  }
}

// y[n, p] = alpha * a[n, m] @ b[m, p] + beta * y (y contiguous; beta 0 ignores y's contents).
void gemm(const Tensor& y, const Tensor& a, const Tensor& b, double alpha, double beta) {
  // See Note [Debug asserts] in kiln/core/error.h: mm's meta function checked the shapes.
  KILN_DEBUG_ASSERT(a.dim() == 2 && b.dim() == 2 && y.dim() == 2,
                    "[mm] gemm takes matrices, got {}, {} -> {}", a.sizes(), b.sizes(), y.sizes());
  KILN_DEBUG_ASSERT(
      a.sizes()[1] == b.sizes()[0] && y.sizes()[0] == a.sizes()[0] && y.sizes()[1] == b.sizes()[1],
      "[mm] gemm of {} and {} into {}", a.sizes(), b.sizes(), y.sizes());
  KILN_DEBUG_ASSERT(y.is_contiguous(), "[mm] gemm writes a contiguous y, got strides {}",
                    y.strides());
  int64_t n = a.sizes()[0], m = a.sizes()[1], p = b.sizes()[1];
  if (n == 0 || p == 0) return;
  sync_blas_threads();
  DType t = y.dtype();
  if (m == 0) {  // an empty sum: y = beta * y
    Tensor scaled = empty_cpu(y.sizes(), t);
    KILN_DISPATCH_TYPES(t, "mm", [&] {
      using V = acc_t<scalar_t>;
      V bv = static_cast<V>(beta);
      elementwise<scalar_t, scalar_t>(scaled, {&y}, [bv](scalar_t v) -> scalar_t {
        return bv == V(0) ? V(0) : static_cast<V>(v) * bv;
      });
    });
    copy_kernel(y, scaled);
    return;
  }
  if (t == kFloat32 || t == kFloat64) {
    BlasMat A = blas_operand(a, t), B = blas_operand(b, t);
    auto ta = A.trans ? CblasTrans : CblasNoTrans, tb = B.trans ? CblasTrans : CblasNoTrans;
    if (t == kFloat32)
      cblas_sgemm(CblasRowMajor, ta, tb, n, p, m, static_cast<float>(alpha),
                  static_cast<const float*>(A.data), A.ld, static_cast<const float*>(B.data), B.ld,
                  static_cast<float>(beta), static_cast<float*>(y.impl()->data()), p);
    else
      cblas_dgemm(CblasRowMajor, ta, tb, n, p, m, alpha, static_cast<const double*>(A.data), A.ld,
                  static_cast<const double*>(B.data), B.ld, beta,
                  static_cast<double*>(y.impl()->data()), p);
    return;
  }
  if (t == kFloat16 || t == kBFloat16) {
    Tensor y32 = beta != 0 ? contiguous_as(y, kFloat32) : empty_cpu(y.sizes(), kFloat32);
    gemm(y32, contiguous_as(a, kFloat32), contiguous_as(b, kFloat32), alpha, beta);
    copy_kernel(y, y32);
    return;
  }
  KILN_DISPATCH_TYPES(t, "mm", [&] {
    Tensor ca = contiguous_as(a, t), cb = contiguous_as(b, t);
    const scalar_t* pa = static_cast<const scalar_t*>(ca.impl()->data());
    const scalar_t* pb = static_cast<const scalar_t*>(cb.impl()->data());
    scalar_t* py = static_cast<scalar_t*>(y.impl()->data());
    int64_t ia = static_cast<int64_t>(alpha), ib = static_cast<int64_t>(beta);
    for (int64_t i = 0; i < n; ++i)
      for (int64_t j = 0; j < p; ++j) {
        int64_t s = 0;
        for (int64_t k = 0; k < m; ++k)
          s += static_cast<int64_t>(pa[i * m + k]) * static_cast<int64_t>(pb[k * p + j]);
        int64_t prev = ib != 0 ? static_cast<int64_t>(py[i * p + j]) * ib : 0;
        py[i * p + j] = static_cast<scalar_t>(ia * s + prev);
      }
  });
}

void mm_impl(const Tensor& out, const Tensor& a, const Tensor& b) {
  with_contiguous_result(out, a.dtype(), [&](const Tensor& y) { gemm(y, a, b, 1.0, 0.0); });
}

void addmm_impl(const Tensor& out, const Tensor& self, const Tensor& a, const Tensor& b,
                const Scalar& beta, const Scalar& alpha) {
  double be = beta.to_double();
  with_contiguous_result(out, a.dtype(), [&](const Tensor& y) {
    if (be != 0) copy_kernel(y, self);  // self broadcast into y, then y = alpha*ab + beta*y
    gemm(y, a, b, alpha.to_double(), be);
  });
}

void bmm_impl(const Tensor& out, const Tensor& a, const Tensor& b) {
  with_contiguous_result(out, a.dtype(), [&](const Tensor& y) {
    for (int64_t i = 0; i < a.sizes()[0]; ++i)
      gemm(ops::op_select(y, 0, i), ops::op_select(a, 0, i), ops::op_select(b, 0, i), 1.0, 0.0);
  });
}

constexpr auto K = DispatchKey::CPU;
KILN_REGISTER_STRUCTURED(mm, K, &mm_impl);
KILN_REGISTER_STRUCTURED(addmm, K, &addmm_impl);
KILN_REGISTER_STRUCTURED(bmm, K, &bmm_impl);
const bool registered = [] {
  ops::op_addmm_gelu.set_kernel(K, &detail::addmm_gelu_unfused);
  return true;
}();

}  // namespace
}  // namespace kiln::cpu

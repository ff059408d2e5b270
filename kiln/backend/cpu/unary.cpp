// CPU kernels of the unary pointwise ops, clamp, hardtanh, leaky_relu and gelu.
#include <cmath>
#include <numbers>

#include "kiln/backend/cpu/loops.h"
#include "kiln/backend/cpu/vec_math.h"
#include "kiln/ops/structured.h"

namespace kiln::cpu {
namespace {

template <class T>
using A = acc_t<T>;

// out = f(a) computed in `compute` (a cast to it first), cast into out's dtype if it differs.
template <class Make>
void unary(const Tensor& out, const Tensor& a, DType compute, const char* op, Make make) {
  Tensor ta;
  const Tensor& ca = a.dtype() == compute ? a : (ta = as_dtype(a, compute));
  with_result_dtype(out, compute, [&](const Tensor& r) {
    KILN_DISPATCH_TYPES(compute, op, [&] {
      using T = scalar_t;
      elementwise<T, T>(r, {&ca}, make(static_cast<T*>(nullptr)));
    });
  });
}

// For ops defined on floats only: the Make functor sees only floating types.
#define KILN_FLOAT_UNARY(name, expr)                                            \
  void name##_impl(const Tensor& out, const Tensor& a) {                        \
    unary(out, a, meta::float_result(a.dtype()), #name, [](auto* tag) {         \
      using T = std::remove_pointer_t<decltype(tag)>;                           \
      return [](T v) -> T {                                                     \
        if constexpr (std::is_floating_point_v<A<T>>) {                         \
          A<T> x = v;                                                           \
          return expr;                                                          \
        } else {                                                                \
          return v; /* unreachable: float_result never picks an integer type */ \
        }                                                                       \
      };                                                                        \
    });                                                                         \
  }
KILN_FLOAT_UNARY(exp, exp_any(x))
KILN_FLOAT_UNARY(log, std::log(x))
KILN_FLOAT_UNARY(sqrt, std::sqrt(x))
KILN_FLOAT_UNARY(rsqrt, A<T>(1) / std::sqrt(x))
KILN_FLOAT_UNARY(tanh, tanh_any(x))
KILN_FLOAT_UNARY(sigmoid, A<T>(1) / (A<T>(1) + exp_any(-x)))
KILN_FLOAT_UNARY(silu, x / (A<T>(1) + exp_any(-x)))
KILN_FLOAT_UNARY(sin, std::sin(x))
KILN_FLOAT_UNARY(cos, std::cos(x))
KILN_FLOAT_UNARY(erf, std::erf(x))
KILN_FLOAT_UNARY(acos, std::acos(x))
KILN_FLOAT_UNARY(acosh, std::acosh(x))
KILN_FLOAT_UNARY(asin, std::asin(x))
KILN_FLOAT_UNARY(asinh, std::asinh(x))
KILN_FLOAT_UNARY(atan, std::atan(x))
KILN_FLOAT_UNARY(atanh, std::atanh(x))
KILN_FLOAT_UNARY(cosh, std::cosh(x))
KILN_FLOAT_UNARY(sinh, std::sinh(x))
KILN_FLOAT_UNARY(tan, std::tan(x))
KILN_FLOAT_UNARY(expm1, std::expm1(x))
KILN_FLOAT_UNARY(log1p, std::log1p(x))
KILN_FLOAT_UNARY(log2, std::log2(x))
KILN_FLOAT_UNARY(log10, std::log10(x))
KILN_FLOAT_UNARY(reciprocal, A<T>(1) / x)
#undef KILN_FLOAT_UNARY

void neg_impl(const Tensor& out, const Tensor& a) {
  unary(out, a, a.dtype(), "neg", [](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    return [](T v) -> T { return -static_cast<A<T>>(v); };
  });
}
void abs_impl(const Tensor& out, const Tensor& a) {
  unary(out, a, a.dtype(), "abs", [](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    return [](T v) -> T {
      A<T> x = v;
      if constexpr (std::is_unsigned_v<A<T>>)
        return x;
      else
        return x < A<T>(0) ? -x : x;
    };
  });
}
void relu_impl(const Tensor& out, const Tensor& a) {
  unary(out, a, a.dtype(), "relu", [](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    return [](T v) -> T {
      A<T> x = v;
      return x > A<T>(0) ? x : (x != x ? x : A<T>(0));  // NaN stays NaN
    };
  });
}
void logical_not_impl(const Tensor& out, const Tensor& a) {
  with_result_dtype(out, kBool, [&](const Tensor& r) {
    KILN_DISPATCH_TYPES(a.dtype(), "logical_not", [&] {
      elementwise<bool, scalar_t>(
          r, {&a}, [](scalar_t v) { return !(static_cast<A<scalar_t>>(v) != A<scalar_t>(0)); });
    });
  });
}

// ceil, floor, round and trunc: integer tensors are kept as they are (See Note [Rounding
// integers] in kiln/ops/meta_pointwise.cpp). round is half to even (nearbyint in the default
// rounding mode), as ATen's.
#define KILN_ROUNDING_UNARY(name, expr)                  \
  void name##_impl(const Tensor& out, const Tensor& a) { \
    unary(out, a, a.dtype(), #name, [](auto* tag) {      \
      using T = std::remove_pointer_t<decltype(tag)>;    \
      return [](T v) -> T {                              \
        if constexpr (std::is_floating_point_v<A<T>>) {  \
          A<T> x = v;                                    \
          return expr;                                   \
        } else {                                         \
          return v;                                      \
        }                                                \
      };                                                 \
    });                                                  \
  }
KILN_ROUNDING_UNARY(ceil, std::ceil(x))
KILN_ROUNDING_UNARY(floor, std::floor(x))
KILN_ROUNDING_UNARY(round, std::nearbyint(x))
KILN_ROUNDING_UNARY(trunc, std::trunc(x))
#undef KILN_ROUNDING_UNARY

// -1, 0 or 1 in self's dtype; NaN and -0.0 give 0, as ATen's (0 < x) - (x < 0).
void sign_impl(const Tensor& out, const Tensor& a) {
  unary(out, a, a.dtype(), "sign", [](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    return [](T v) -> T {
      A<T> x = v;
      if constexpr (std::is_same_v<A<T>, bool>)
        return x;
      else
        return static_cast<A<T>>(static_cast<int>(A<T>(0) < x) - static_cast<int>(x < A<T>(0)));
    };
  });
}

// isnan and isinf: bool results, false for integer and bool tensors.
template <class Pred>
void float_predicate(const Tensor& out, const Tensor& a, const char* op, Pred pred) {
  with_result_dtype(out, kBool, [&](const Tensor& r) {
    KILN_DISPATCH_TYPES(a.dtype(), op, [&] {
      elementwise<bool, scalar_t>(r, {&a}, [pred](scalar_t v) -> bool {
        if constexpr (std::is_floating_point_v<A<scalar_t>>)
          return pred(static_cast<A<scalar_t>>(v));
        else
          return false;
      });
    });
  });
}
void isnan_impl(const Tensor& out, const Tensor& a) {
  float_predicate(out, a, "isnan", [](auto x) { return x != x; });
}
void isinf_impl(const Tensor& out, const Tensor& a) {
  float_predicate(out, a, "isinf", [](auto x) { return std::isinf(x); });
}

void bitwise_not_impl(const Tensor& out, const Tensor& a) {
  unary(out, a, a.dtype(), "bitwise_not", [](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    return [](T v) -> T {
      if constexpr (std::is_same_v<T, bool>)
        return !v;
      else if constexpr (std::is_integral_v<T>)
        return static_cast<T>(~v);
      else
        return v;  // meta rejects floating dtypes
    };
  });
}

// hardtanh is clamp with both bounds, in self's dtype.
void hardtanh_impl(const Tensor& out, const Tensor& a, const Scalar& lo, const Scalar& hi) {
  unary(out, a, a.dtype(), "hardtanh", [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    A<T> l = lo.to<A<T>>(), h = hi.to<A<T>>();
    return [=](T v) -> T {
      A<T> x = v;
      if constexpr (!std::is_integral_v<A<T>>)
        if (x != x) return x;
      if (x < l) x = l;
      if (x > h) x = h;  // min_val wins when min_val > max_val, as clamp
      return x;
    };
  });
}
void leaky_relu_impl(const Tensor& out, const Tensor& a, const Scalar& negative_slope) {
  unary(out, a, a.dtype(), "leaky_relu", [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    A<T> s = negative_slope.to<A<T>>();
    return [=](T v) -> T {
      A<T> x = v;
      return x > A<T>(0) ? x : x * s;
    };
  });
}

// Two loops rather than a branch per element, so that each one vectorises.
void gelu_impl(const Tensor& out, const Tensor& a, bool approximate_tanh) {
  if (approximate_tanh) {
    unary(out, a, a.dtype(), "gelu", [](auto* tag) {
      using T = std::remove_pointer_t<decltype(tag)>;
      return [](T v) -> T {
        using F = A<T>;
        if constexpr (std::is_floating_point_v<F>) {
          constexpr F kBeta = F(std::numbers::sqrt2 * std::numbers::inv_sqrtpi);  // sqrt(2/pi)
          F x = v;
          F inner = kBeta * (x + F(0.044715) * x * x * x);
          return F(0.5) * x * (F(1) + tanh_any(inner));
        } else {
          return v;
        }
      };
    });
    return;
  }
  unary(out, a, a.dtype(), "gelu", [](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    return [](T v) -> T {
      using F = A<T>;
      if constexpr (std::is_floating_point_v<F>) {
        F x = v;
        return x * F(0.5) * (F(1) + erf_any(x * F(std::numbers::sqrt2 / 2)));
      } else {
        return v;
      }
    };
  });
}

// d/dx gelu(x) * grad in one pass (autograd's formula for gelu).
void gelu_backward_impl(const Tensor& out, const Tensor& grad, const Tensor& x,
                        bool approximate_tanh) {
  with_result_dtype(out, x.dtype(), [&](const Tensor& r) {
    KILN_DISPATCH_FLOAT_TYPES(x.dtype(), "gelu_backward", [&] {
      using T = scalar_t;
      using F = A<T>;
      if (approximate_tanh) {
        constexpr F kBeta = F(std::numbers::sqrt2 * std::numbers::inv_sqrtpi), kKappa = 0.044715;
        elementwise<T, T, T>(r, {&grad, &x}, [](T gv, T xv) -> T {
          F x = xv, x2 = x * x;
          F t = tanh_any(kBeta * (x + kKappa * x2 * x));
          F left = F(0.5) * (F(1) + t);
          F right = F(0.5) * x * (F(1) - t * t) * kBeta * (F(1) + F(3) * kKappa * x2);
          return static_cast<F>(gv) * (left + right);
        });
      } else {
        constexpr F kInvSqrt2 = F(std::numbers::sqrt2 / 2),
                    kInvSqrt2Pi = F(std::numbers::inv_sqrtpi * std::numbers::sqrt2 / 2);
        elementwise<T, T, T>(r, {&grad, &x}, [](T gv, T xv) -> T {
          F x = xv;
          F cdf = F(0.5) * (F(1) + erf_any(x * kInvSqrt2));
          F pdf = exp_any(F(-0.5) * x * x) * kInvSqrt2Pi;
          return static_cast<F>(gv) * (cdf + x * pdf);
        });
      }
    });
  });
}

// grad where x > threshold, else 0, in one pass (relu's backward formula). x and the threshold
// compare in acc_t (float for the 16-bit floats), the threshold unrounded, as ATen's CPU kernel
// compares them; a NaN x compares false and lets grad through.
void threshold_backward_impl(const Tensor& out, const Tensor& grad, const Tensor& x,
                             const Scalar& threshold) {
  with_result_dtype(out, x.dtype(), [&](const Tensor& r) {
    KILN_DISPATCH_FLOAT_TYPES(x.dtype(), "threshold_backward", [&] {
      using T = scalar_t;
      const A<T> th = threshold.to<A<T>>();
      elementwise<T, T, T>(r, {&grad, &x},
                           [th](T gv, T xv) -> T { return A<T>(xv) <= th ? T(0) : gv; });
    });
  });
}

void clamp_impl(const Tensor& out, const Tensor& a, const OptScalar& lo, const OptScalar& hi) {
  DType ct = meta::clamp(a, lo, hi).dtype;
  unary(out, a, ct, "clamp", [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    bool has_lo = lo.has_value(), has_hi = hi.has_value();
    A<T> l = has_lo ? lo->to<A<T>>() : A<T>(0), h = has_hi ? hi->to<A<T>>() : A<T>(0);
    return [=](T v) -> T {
      A<T> x = v;
      if constexpr (!std::is_integral_v<A<T>>)
        if (x != x) return x;
      if (has_lo && x < l) x = l;
      if (has_hi && x > h) x = h;  // min wins when min > max, as in PyTorch
      return x;
    };
  });
}

constexpr auto K = DispatchKey::CPU;
KILN_REGISTER_POINTWISE(exp, K, &exp_impl);
KILN_REGISTER_POINTWISE(log, K, &log_impl);
KILN_REGISTER_POINTWISE(sqrt, K, &sqrt_impl);
KILN_REGISTER_POINTWISE(rsqrt, K, &rsqrt_impl);
KILN_REGISTER_POINTWISE(tanh, K, &tanh_impl);
KILN_REGISTER_POINTWISE(sigmoid, K, &sigmoid_impl);
KILN_REGISTER_POINTWISE(silu, K, &silu_impl);
KILN_REGISTER_POINTWISE(sin, K, &sin_impl);
KILN_REGISTER_POINTWISE(cos, K, &cos_impl);
KILN_REGISTER_POINTWISE(erf, K, &erf_impl);
KILN_REGISTER_POINTWISE(acos, K, &acos_impl);
KILN_REGISTER_POINTWISE(acosh, K, &acosh_impl);
KILN_REGISTER_POINTWISE(asin, K, &asin_impl);
KILN_REGISTER_POINTWISE(asinh, K, &asinh_impl);
KILN_REGISTER_POINTWISE(atan, K, &atan_impl);
KILN_REGISTER_POINTWISE(atanh, K, &atanh_impl);
KILN_REGISTER_POINTWISE(cosh, K, &cosh_impl);
KILN_REGISTER_POINTWISE(sinh, K, &sinh_impl);
KILN_REGISTER_POINTWISE(tan, K, &tan_impl);
KILN_REGISTER_POINTWISE(expm1, K, &expm1_impl);
KILN_REGISTER_POINTWISE(log1p, K, &log1p_impl);
KILN_REGISTER_POINTWISE(log2, K, &log2_impl);
KILN_REGISTER_POINTWISE(log10, K, &log10_impl);
KILN_REGISTER_POINTWISE(reciprocal, K, &reciprocal_impl);
KILN_REGISTER_POINTWISE(ceil, K, &ceil_impl);
KILN_REGISTER_POINTWISE(floor, K, &floor_impl);
KILN_REGISTER_POINTWISE(round, K, &round_impl);
KILN_REGISTER_POINTWISE(trunc, K, &trunc_impl);
KILN_REGISTER_POINTWISE(sign, K, &sign_impl);
KILN_REGISTER_POINTWISE(isnan, K, &isnan_impl);
KILN_REGISTER_POINTWISE(isinf, K, &isinf_impl);
KILN_REGISTER_POINTWISE(hardtanh, K, &hardtanh_impl);
KILN_REGISTER_POINTWISE(leaky_relu, K, &leaky_relu_impl);
KILN_REGISTER_POINTWISE(bitwise_not, K, &bitwise_not_impl);
KILN_REGISTER_POINTWISE(neg, K, &neg_impl);
KILN_REGISTER_POINTWISE(abs, K, &abs_impl);
KILN_REGISTER_POINTWISE(relu, K, &relu_impl);
KILN_REGISTER_POINTWISE(logical_not, K, &logical_not_impl);
KILN_REGISTER_POINTWISE(gelu, K, &gelu_impl);
KILN_REGISTER_POINTWISE(clamp, K, &clamp_impl);
KILN_REGISTER_STRUCTURED(gelu_backward, K, &gelu_backward_impl);
KILN_REGISTER_STRUCTURED(threshold_backward, K, &threshold_backward_impl);

}  // namespace
}  // namespace kiln::cpu

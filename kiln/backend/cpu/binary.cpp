// CPU kernels of the binary pointwise ops: arithmetic, comparisons, logical ops and where.
#include <cmath>

#include "kiln/backend/cpu/loops.h"
#include "kiln/ops/structured.h"

namespace kiln::cpu {
namespace {

// Runs out = f(a, b) computing in `compute` (inputs cast to it first) and producing values of
// `result`, which are cast into out's dtype if it differs. `make(tag)` returns the functor
// for element type T.
template <class T>
struct Tag {
  using type = T;
};

template <class Make>
void binary_same(const Tensor& out, const Tensor& a, const Tensor& b, DType compute, const char* op,
                 Make make) {
  Tensor ta, tb;  // casts, only when needed
  const Tensor& ca = a.dtype() == compute ? a : (ta = operand_as(a, compute));
  const Tensor& cb = b.dtype() == compute ? b : (tb = operand_as(b, compute));
  with_result_dtype(out, compute, [&](const Tensor& r) {
    KILN_DISPATCH_TYPES(compute, op, [&] {
      elementwise<scalar_t, scalar_t, scalar_t>(r, {&ca, &cb}, make(Tag<scalar_t>{}));
    });
  });
}

template <class Make>
void binary_bool(const Tensor& out, const Tensor& a, const Tensor& b, DType compute, const char* op,
                 Make make) {
  Tensor ta, tb;
  const Tensor& ca = a.dtype() == compute ? a : (ta = operand_as(a, compute));
  const Tensor& cb = b.dtype() == compute ? b : (tb = operand_as(b, compute));
  with_result_dtype(out, kBool, [&](const Tensor& r) {
    KILN_DISPATCH_TYPES(compute, op, [&] {
      elementwise<bool, scalar_t, scalar_t>(r, {&ca, &cb}, make(Tag<scalar_t>{}));
    });
  });
}

template <class T>
using A = acc_t<T>;

void add_impl(const Tensor& out, const Tensor& a, const Tensor& b, const Scalar& alpha) {
  DType ct = meta::result_type(a, b);
  binary_same(out, a, b, ct, "add", [&](auto tag) {
    using T = typename decltype(tag)::type;
    if constexpr (std::is_same_v<T, bool>) {
      bool al = alpha.to_bool();
      return [al](T x, T y) -> T { return x || (al && y); };
    } else {
      A<T> al = alpha.to<A<T>>();
      return [al](T x, T y) -> T { return static_cast<A<T>>(x) + al * static_cast<A<T>>(y); };
    }
  });
}
void sub_impl(const Tensor& out, const Tensor& a, const Tensor& b, const Scalar& alpha) {
  DType ct = meta::result_type(a, b);
  binary_same(out, a, b, ct, "sub", [&](auto tag) {
    using T = typename decltype(tag)::type;
    A<T> al = alpha.to<A<T>>();
    return [al](T x, T y) -> T { return static_cast<A<T>>(x) - al * static_cast<A<T>>(y); };
  });
}
void mul_impl(const Tensor& out, const Tensor& a, const Tensor& b) {
  binary_same(out, a, b, meta::result_type(a, b), "mul", [](auto tag) {
    using T = typename decltype(tag)::type;
    if constexpr (std::is_same_v<T, bool>)
      return [](T x, T y) -> T { return x && y; };
    else
      return [](T x, T y) -> T { return static_cast<A<T>>(x) * static_cast<A<T>>(y); };
  });
}
void div_impl(const Tensor& out, const Tensor& a, const Tensor& b) {
  binary_same(out, a, b, meta::float_result(meta::result_type(a, b)), "div", [](auto tag) {
    using T = typename decltype(tag)::type;
    return [](T x, T y) -> T { return static_cast<A<T>>(x) / static_cast<A<T>>(y); };
  });
}
template <class T>
T int_pow(T base, T exp) {
  if (exp < 0) {  // ATen's rule: only +-1 survive a negative integer power
    if (base == 1) return 1;
    if (base == -1) return (exp % 2 == 0) ? 1 : -1;
    return 0;
  }
  T result = 1;
  while (exp) {
    if (exp & 1) result = static_cast<T>(result * base);
    exp >>= 1;
    base = static_cast<T>(base * base);
  }
  return result;
}
void pow_impl(const Tensor& out, const Tensor& a, const Tensor& b) {
  binary_same(out, a, b, meta::result_type(a, b), "pow", [](auto tag) {
    using T = typename decltype(tag)::type;
    if constexpr (std::is_same_v<T, bool>)
      return [](T x, T) -> T { return x; };  // meta rejects bool
    else if constexpr (std::is_integral_v<T>)
      return [](T x, T y) -> T { return int_pow<T>(x, y); };
    else
      return [](T x, T y) -> T { return std::pow(static_cast<A<T>>(x), static_cast<A<T>>(y)); };
  });
}
// maximum/minimum propagate NaN, as in PyTorch.
void maximum_impl(const Tensor& out, const Tensor& a, const Tensor& b) {
  binary_same(out, a, b, meta::result_type(a, b), "maximum", [](auto tag) {
    using T = typename decltype(tag)::type;
    return [](T x, T y) -> T {
      A<T> p = x, q = y;
      if constexpr (!std::is_integral_v<A<T>>)
        if (p != p || q != q) return std::numeric_limits<A<T>>::quiet_NaN();
      return p > q ? p : q;
    };
  });
}
void minimum_impl(const Tensor& out, const Tensor& a, const Tensor& b) {
  binary_same(out, a, b, meta::result_type(a, b), "minimum", [](auto tag) {
    using T = typename decltype(tag)::type;
    return [](T x, T y) -> T {
      A<T> p = x, q = y;
      if constexpr (!std::is_integral_v<A<T>>)
        if (p != p || q != q) return std::numeric_limits<A<T>>::quiet_NaN();
      return p < q ? p : q;
    };
  });
}

void atan2_impl(const Tensor& out, const Tensor& a, const Tensor& b) {
  binary_same(out, a, b, meta::float_result(meta::result_type(a, b)), "atan2", [](auto tag) {
    using T = typename decltype(tag)::type;
    return [](T x, T y) -> T {
      if constexpr (std::is_floating_point_v<A<T>>)
        return std::atan2(static_cast<A<T>>(x), static_cast<A<T>>(y));
      else
        return x;  // float_result never picks an integer type
    };
  });
}

// Note [Integer division by zero]
// fmod, remainder and div's trunc and floor modes throw for an integer zero divisor on the CPU,
// as ATen's CPU kernels do (ATen says "ZeroDivisionError"). The divisor is scanned before
// anything is written; the kernels then never see a zero (nor INT_MIN / -1, which they compute
// without overflow: -1 divides everything). CUDA, as ATen's, does not check.
template <class T>
bool has_zero(const Tensor& t) {
  const T* p = static_cast<const T*>(t.impl()->data());
  const int64_t nd = t.dim();
  std::vector<int64_t> idx(static_cast<size_t>(nd), 0);
  int64_t off = 0;
  for (int64_t i = 0; i < t.numel(); ++i) {
    if (p[off] == T(0)) return true;
    for (int64_t d = nd - 1; d >= 0; --d) {
      if (++idx[d] < t.sizes()[d]) {
        off += t.strides()[d];
        break;
      }
      off -= (t.sizes()[d] - 1) * t.strides()[d];
      idx[d] = 0;
    }
  }
  return false;
}
void check_divisor(const char* op, DType compute, const Tensor& b) {
  if (is_floating(compute)) return;
  bool zero = KILN_DISPATCH_TYPES(b.dtype(), op, [&] {
    if constexpr (std::is_floating_point_v<A<scalar_t>>)
      return false;  // an integer compute dtype has integer operands
    else
      return has_zero<scalar_t>(b);
  });
  KILN_CHECK(!zero, "[{}] ZeroDivisionError: integer division by zero ({} divisor)", op, b.dtype());
}

// The integer kernels: truncated quotient and remainder, exact for a divisor of -1.
template <class T>
T int_div(T x, T y) {
  if constexpr (std::is_signed_v<T>)
    if (y == T(-1)) return static_cast<T>(T(0) - static_cast<std::make_unsigned_t<T>>(x));
  return static_cast<T>(x / y);
}
template <class T>
T int_mod(T x, T y) {
  if constexpr (std::is_signed_v<T>)
    if (y == T(-1)) return T(0);
  return static_cast<T>(x % y);
}
// ATen's c10::div_floor_floating: the quotient of a - fmod(a, b) rounded to the nearest whole
// number (not floor(a / b), which can be one off).
template <class F>
F div_floor_float(F a, F b) {
  if (b == F(0)) return a / b;
  F mod = std::fmod(a, b);
  F div = (a - mod) / b;
  if (mod != F(0) && (b < F(0)) != (mod < F(0))) div -= F(1);
  if (div == F(0)) return std::copysign(F(0), a / b);
  F floordiv = std::floor(div);
  if (div - floordiv > F(0.5)) floordiv += F(1);
  return floordiv;
}

// The division family: `int_f` on integers, `float_f` on A<T> for the floating types.
template <class IntF, class FloatF>
void division(const Tensor& out, const Tensor& a, const Tensor& b, const char* op, IntF int_f,
              FloatF float_f) {
  DType ct = meta::result_type(a, b);
  check_divisor(op, ct, b);
  binary_same(out, a, b, ct, op, [&](auto tag) {
    using T = typename decltype(tag)::type;
    return [=](T x, T y) -> T {
      if constexpr (std::is_same_v<T, bool>)
        return x;  // meta rejects bool
      else if constexpr (std::is_integral_v<T>)
        return int_f(x, y);
      else
        return float_f(static_cast<A<T>>(x), static_cast<A<T>>(y));
    };
  });
}
void fmod_impl(const Tensor& out, const Tensor& a, const Tensor& b) {
  division(
      out, a, b, "fmod", [](auto x, auto y) { return int_mod(x, y); },
      [](auto x, auto y) { return std::fmod(x, y); });
}
// The sign of the divisor, as Python's %.
void remainder_impl(const Tensor& out, const Tensor& a, const Tensor& b) {
  division(
      out, a, b, "remainder",
      [](auto x, auto y) {
        auto r = int_mod(x, y);
        using T = decltype(r);
        if constexpr (std::is_signed_v<T>)
          if (r != 0 && ((r < 0) != (y < 0))) r = static_cast<T>(r + y);
        return r;
      },
      [](auto x, auto y) {
        auto m = std::fmod(x, y);
        if (m != 0 && ((y < 0) != (m < 0))) m += y;
        return m;
      });
}
void div_trunc_impl(const Tensor& out, const Tensor& a, const Tensor& b) {
  division(
      out, a, b, "div_trunc", [](auto x, auto y) { return int_div(x, y); },
      [](auto x, auto y) { return std::trunc(x / y); });
}
void div_floor_impl(const Tensor& out, const Tensor& a, const Tensor& b) {
  division(
      out, a, b, "div_floor",
      [](auto x, auto y) {
        auto q = int_div(x, y);
        using T = decltype(q);
        if constexpr (std::is_signed_v<T>)
          if ((x < 0) != (y < 0) && int_mod(x, y) != 0) q = static_cast<T>(q - 1);
        return q;
      },
      [](auto x, auto y) { return div_floor_float(x, y); });
}

// Bool and integer dtypes only (meta rejects floats); on bool they are logical.
#define KILN_BITWISE(name, op)                                            \
  void name##_impl(const Tensor& out, const Tensor& a, const Tensor& b) { \
    binary_same(out, a, b, meta::result_type(a, b), #name, [](auto tag) { \
      using T = typename decltype(tag)::type;                             \
      return [](T x, T y) -> T {                                          \
        if constexpr (std::is_integral_v<T>)                              \
          return static_cast<T>(x op y);                                  \
        else                                                              \
          return x;                                                       \
      };                                                                  \
    });                                                                   \
  }
KILN_BITWISE(bitwise_and, &)
KILN_BITWISE(bitwise_or, |)
KILN_BITWISE(bitwise_xor, ^)
#undef KILN_BITWISE

#define KILN_COMPARISON(name, expr)                                       \
  void name##_impl(const Tensor& out, const Tensor& a, const Tensor& b) { \
    binary_bool(out, a, b, meta::result_type(a, b), #name, [](auto tag) { \
      using T = typename decltype(tag)::type;                             \
      return [](T x_, T y_) -> bool {                                     \
        A<T> x = x_, y = y_;                                              \
        return expr;                                                      \
      };                                                                  \
    });                                                                   \
  }
KILN_COMPARISON(eq, x == y)
KILN_COMPARISON(ne, x != y)
KILN_COMPARISON(lt, x < y)
KILN_COMPARISON(le, x <= y)
KILN_COMPARISON(gt, x > y)
KILN_COMPARISON(ge, x >= y)
KILN_COMPARISON(logical_and, x != A<T>(0) && y != A<T>(0))
KILN_COMPARISON(logical_or, x != A<T>(0) || y != A<T>(0))
KILN_COMPARISON(logical_xor, (x != A<T>(0)) != (y != A<T>(0)))
#undef KILN_COMPARISON

void where_impl(const Tensor& out, const Tensor& cond, const Tensor& a, const Tensor& b) {
  DType ct = meta::result_type(a, b);
  Tensor ca = as_dtype(a, ct), cb = as_dtype(b, ct);
  with_result_dtype(out, ct, [&](const Tensor& r) {
    KILN_DISPATCH_TYPES(ct, "where", [&] {
      elementwise<scalar_t, bool, scalar_t, scalar_t>(
          r, {&cond, &ca, &cb}, [](bool c, scalar_t x, scalar_t y) { return c ? x : y; });
    });
  });
}

constexpr auto K = DispatchKey::CPU;
KILN_REGISTER_POINTWISE(add, K, &add_impl);
KILN_REGISTER_POINTWISE(sub, K, &sub_impl);
KILN_REGISTER_POINTWISE(mul, K, &mul_impl);
KILN_REGISTER_POINTWISE(div, K, &div_impl);
KILN_REGISTER_POINTWISE(pow, K, &pow_impl);
KILN_REGISTER_POINTWISE(maximum, K, &maximum_impl);
KILN_REGISTER_POINTWISE(minimum, K, &minimum_impl);
KILN_REGISTER_POINTWISE(eq, K, &eq_impl);
KILN_REGISTER_POINTWISE(ne, K, &ne_impl);
KILN_REGISTER_POINTWISE(lt, K, &lt_impl);
KILN_REGISTER_POINTWISE(le, K, &le_impl);
KILN_REGISTER_POINTWISE(gt, K, &gt_impl);
KILN_REGISTER_POINTWISE(ge, K, &ge_impl);
KILN_REGISTER_POINTWISE(logical_and, K, &logical_and_impl);
KILN_REGISTER_POINTWISE(logical_or, K, &logical_or_impl);
KILN_REGISTER_POINTWISE(logical_xor, K, &logical_xor_impl);
KILN_REGISTER_POINTWISE(where, K, &where_impl);
KILN_REGISTER_POINTWISE(atan2, K, &atan2_impl);
KILN_REGISTER_POINTWISE(fmod, K, &fmod_impl);
KILN_REGISTER_POINTWISE(remainder, K, &remainder_impl);
KILN_REGISTER_POINTWISE(div_trunc, K, &div_trunc_impl);
KILN_REGISTER_POINTWISE(div_floor, K, &div_floor_impl);
KILN_REGISTER_POINTWISE(bitwise_and, K, &bitwise_and_impl);
KILN_REGISTER_POINTWISE(bitwise_or, K, &bitwise_or_impl);
KILN_REGISTER_POINTWISE(bitwise_xor, K, &bitwise_xor_impl);

}  // namespace
}  // namespace kiln::cpu

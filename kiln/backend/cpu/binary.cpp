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

}  // namespace
}  // namespace kiln::cpu

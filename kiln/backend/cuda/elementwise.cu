// Elementwise kernels: one functor per op, run by the engine of loops.cuh for every dtype the
// op supports. Arithmetic happens in acc_t (float for the 16-bit floats), rounding once into
// the result, as the CPU kernels do.
#include <cmath>

#include "kiln/backend/cuda/elementwise.h"
#include "kiln/backend/cuda/loops.cuh"

namespace kiln::cuda {
namespace {

template <class T>
__device__ __forceinline__ bool is_nan(T x) {
  if constexpr (std::is_integral_v<T>)
    return false;
  else
    return x != x;
}

// Integer power with ATen's rule for negative exponents (only +-1 survive).
template <class T>
__device__ T int_pow(T base, T exp) {
  if constexpr (std::is_signed_v<T>) {
    if (exp < 0) {
      if (base == 1) return 1;
      if (base == -1) return (exp % 2 == 0) ? 1 : -1;
      return 0;
    }
  }
  T result = 1;
  while (exp) {
    if (exp & 1) result = static_cast<T>(result * base);
    exp >>= 1;
    base = static_cast<T>(base * base);
  }
  return result;
}

// Each op is its own kernel (a template argument, not a switch at run time): a tiny kernel's
// time is mostly its start, which grows with its code.
template <class T, UnaryOp Op>
struct Unary {
  __device__ T operator()(T v) const {
    using A = acc_t<T>;
    if constexpr (std::is_same_v<T, bool>) {
      if constexpr (Op == UnaryOp::BitwiseNot)
        return !v;
      else
        return v;  // bool reaches abs, relu and sign, which keep it (meta rejects the others)
    } else {
      A x = cvt<A>(v);
      if constexpr (Op == UnaryOp::Neg) {
        return cvt<T>(-x);
      } else if constexpr (Op == UnaryOp::Abs) {
        if constexpr (std::is_unsigned_v<A>)
          return v;
        else
          return cvt<T>(x < A(0) ? -x : x);
      } else if constexpr (Op == UnaryOp::Relu) {
        return cvt<T>(x > A(0) ? x : (is_nan(x) ? x : A(0)));
      } else if constexpr (Op == UnaryOp::Gelu) {
        return cvt<T>(x * A(0.5) * (A(1) + erf(x * A(0.70710678118654752440))));
      } else if constexpr (Op == UnaryOp::GeluTanh) {
        const A beta = A(0.79788456080286535588);  // sqrt(2/pi)
        return cvt<T>(A(0.5) * x * (A(1) + tanh(beta * (x + A(0.044715) * x * x * x))));
      } else if constexpr (Op == UnaryOp::Ceil || Op == UnaryOp::Floor || Op == UnaryOp::Round ||
                           Op == UnaryOp::Trunc) {
        if constexpr (std::is_integral_v<A>) {
          return v;  // See Note [Rounding integers] in kiln/ops/meta_pointwise.cpp
        } else if constexpr (Op == UnaryOp::Ceil) {
          return cvt<T>(ceil(x));
        } else if constexpr (Op == UnaryOp::Floor) {
          return cvt<T>(floor(x));
        } else if constexpr (Op == UnaryOp::Round) {
          return cvt<T>(rint(x));  // half to even
        } else {
          return cvt<T>(trunc(x));
        }
      } else if constexpr (Op == UnaryOp::BitwiseNot) {
        if constexpr (std::is_integral_v<A>)
          return static_cast<T>(~x);
        else
          return v;  // meta rejects floating dtypes
      } else if constexpr (Op == UnaryOp::Sign) {
        return cvt<T>(static_cast<A>(static_cast<int>(A(0) < x) - static_cast<int>(x < A(0))));
      }
#define KILN_CUDA_UNARY_CASE(name, Enumerator, expression) \
  else if constexpr (Op == UnaryOp::Enumerator) return cvt<T>(expression);
      KILN_CUDA_FLOAT_UNARY_OPS(KILN_CUDA_UNARY_CASE)
#undef KILN_CUDA_UNARY_CASE
      else static_assert(Op != Op, "a UnaryOp without device code");
    }
  }
};
constexpr bool float_only(UnaryOp op) {
  return op != UnaryOp::Neg && op != UnaryOp::Abs && op != UnaryOp::Relu && op != UnaryOp::Ceil &&
         op != UnaryOp::Floor && op != UnaryOp::Round && op != UnaryOp::Trunc &&
         op != UnaryOp::Sign && op != UnaryOp::BitwiseNot;
}

// The integer kernels: truncated quotient and remainder, exact for a divisor of -1; a zero
// divisor gives 0 (not checked on CUDA; See Note [Integer division by zero] in
// backend/cpu/binary.cpp).
template <class T>
__device__ T int_div(T x, T y) {
  if (y == T(0)) return T(0);
  if constexpr (std::is_signed_v<T>)
    if (y == T(-1)) return static_cast<T>(T(0) - static_cast<std::make_unsigned_t<T>>(x));
  return static_cast<T>(x / y);
}
template <class T>
__device__ T int_mod(T x, T y) {
  if (y == T(0)) return T(0);
  if constexpr (std::is_signed_v<T>)
    if (y == T(-1)) return T(0);
  return static_cast<T>(x % y);
}
// ATen's c10::div_floor_floating.
template <class F>
__device__ F div_floor_float(F a, F b) {
  if (b == F(0)) return a / b;
  F mod = fmod(a, b);
  F div = (a - mod) / b;
  if (mod != F(0) && (b < F(0)) != (mod < F(0))) div -= F(1);
  if (div == F(0)) return copysign(F(0), a / b);
  F floordiv = floor(div);
  if (div - floordiv > F(0.5)) floordiv += F(1);
  return floordiv;
}

template <class T, BinaryOp Op>
struct Binary {
  acc_t<T> alpha;
  __device__ T operator()(T a, T b) const {
    using A = acc_t<T>;
    if constexpr (std::is_same_v<T, bool>) {
      if constexpr (Op == BinaryOp::Add)
        return a || (alpha && b);
      else if constexpr (Op == BinaryOp::Mul || Op == BinaryOp::Minimum)
        return a && b;
      else if constexpr (Op == BinaryOp::Maximum || Op == BinaryOp::BitwiseOr)
        return a || b;
      else if constexpr (Op == BinaryOp::BitwiseAnd)
        return a && b;
      else if constexpr (Op == BinaryOp::BitwiseXor)
        return a != b;
      else
        return a;  // sub, div, pow and the divisions of bools never get here (meta promotes or
                   // rejects)
    } else {
      A x = cvt<A>(a), y = cvt<A>(b);
      if constexpr (Op == BinaryOp::Add) {
        return cvt<T>(x + alpha * y);
      } else if constexpr (Op == BinaryOp::Sub) {
        return cvt<T>(x - alpha * y);
      } else if constexpr (Op == BinaryOp::Mul) {
        return cvt<T>(x * y);
      } else if constexpr (Op == BinaryOp::Div) {
        return cvt<T>(x / y);
      } else if constexpr (Op == BinaryOp::Pow) {
        if constexpr (std::is_integral_v<A>)
          return int_pow<A>(x, y);
        else
          return cvt<T>(pow(x, y));
      } else if constexpr (Op == BinaryOp::Maximum) {
        if (is_nan(x) || is_nan(y)) return cvt<T>(is_nan(x) ? x : y);
        return cvt<T>(x > y ? x : y);
      } else if constexpr (Op == BinaryOp::Atan2) {
        if constexpr (std::is_integral_v<A>)
          return a;  // float_result never picks an integer type
        else
          return cvt<T>(atan2(x, y));
      } else if constexpr (Op == BinaryOp::Fmod) {
        if constexpr (std::is_integral_v<A>)
          return int_mod<A>(x, y);
        else
          return cvt<T>(fmod(x, y));
      } else if constexpr (Op == BinaryOp::Remainder) {
        A m;
        if constexpr (std::is_integral_v<A>)
          m = int_mod<A>(x, y);
        else
          m = fmod(x, y);
        if constexpr (std::is_signed_v<A> || !std::is_integral_v<A>)
          if (m != A(0) && ((y < A(0)) != (m < A(0)))) m += y;
        return cvt<T>(m);
      } else if constexpr (Op == BinaryOp::DivTrunc) {
        if constexpr (std::is_integral_v<A>)
          return int_div<A>(x, y);
        else
          return cvt<T>(trunc(x / y));
      } else if constexpr (Op == BinaryOp::DivFloor) {
        if constexpr (std::is_integral_v<A>) {
          A q = int_div<A>(x, y);
          if constexpr (std::is_signed_v<A>)
            if ((x < A(0)) != (y < A(0)) && int_mod<A>(x, y) != A(0)) q -= A(1);
          return q;
        } else {
          return cvt<T>(div_floor_float(x, y));
        }
      } else if constexpr (Op == BinaryOp::BitwiseAnd || Op == BinaryOp::BitwiseOr ||
                           Op == BinaryOp::BitwiseXor) {
        if constexpr (!std::is_integral_v<A>)
          return a;  // meta rejects floating dtypes
        else if constexpr (Op == BinaryOp::BitwiseAnd)
          return static_cast<T>(x & y);
        else if constexpr (Op == BinaryOp::BitwiseOr)
          return static_cast<T>(x | y);
        else
          return static_cast<T>(x ^ y);
      } else {
        if (is_nan(x) || is_nan(y)) return cvt<T>(is_nan(x) ? x : y);
        return cvt<T>(x < y ? x : y);
      }
    }
  }
};

template <class T, CompareOp Op>
struct Compare {
  __device__ bool operator()(T a, T b) const {
    using A = acc_t<T>;
    A x = cvt<A>(a), y = cvt<A>(b);
    if constexpr (Op == CompareOp::Eq) return x == y;
    if constexpr (Op == CompareOp::Ne) return x != y;
    if constexpr (Op == CompareOp::Lt) return x < y;
    if constexpr (Op == CompareOp::Le) return x <= y;
    if constexpr (Op == CompareOp::Gt) return x > y;
    if constexpr (Op == CompareOp::Ge) return x >= y;
    if constexpr (Op == CompareOp::LogicalAnd) return x != A(0) && y != A(0);
    if constexpr (Op == CompareOp::LogicalOr) return x != A(0) || y != A(0);
    if constexpr (Op == CompareOp::LogicalXor) return (x != A(0)) != (y != A(0));
    return false;
  }
};

static_assert(static_cast<int>(CompareOp::LogicalXor) == 8,
              "with_op<> below is given the number of enumerators of each op enum");

// Calls f(std::integral_constant<E, e>) for the enumerator `e` of 0..N-1 equal to `v`.
template <class E, int N, class F, int I = 0>
void with_op(E v, F&& f) {
  if constexpr (I < N) {
    if (static_cast<int>(v) == I) {
      f(std::integral_constant<E, static_cast<E>(I)>{});
      return;
    }
    with_op<E, N, F, I + 1>(v, std::forward<F>(f));
  }
}

template <class T>
struct Clamp {
  bool has_lo, has_hi;
  acc_t<T> lo, hi;
  __device__ T operator()(T v) const {
    using A = acc_t<T>;
    A x = cvt<A>(v);
    if (is_nan(x)) return v;
    if (has_lo && x < lo) x = lo;
    if (has_hi && x > hi) x = hi;  // min wins when min > max, as in PyTorch
    return cvt<T>(x);
  }
};

template <class T>
struct LogicalNot {
  __device__ bool operator()(T v) const { return !(cvt<acc_t<T>>(v) != acc_t<T>(0)); }
};

template <class T, FloatPredicate Op>
struct IsFloat {
  __device__ bool operator()(T v) const {
    if constexpr (is_floating_v<T>) {
      acc_t<T> x = cvt<acc_t<T>>(v);
      if constexpr (Op == FloatPredicate::IsNan)
        return x != x;
      else
        return isinf(x);
    } else {
      return false;
    }
  }
};

template <class T>
struct LeakyRelu {
  acc_t<T> slope;
  __device__ T operator()(T v) const {
    acc_t<T> x = cvt<acc_t<T>>(v);
    return cvt<T>(x > acc_t<T>(0) ? x : x * slope);
  }
};

template <class T>
struct Where {
  __device__ T operator()(bool c, T a, T b) const { return c ? a : b; }
};

template <class To, class From>
struct Cast {
  __device__ To operator()(From v) const { return cvt<To>(v); }
};

// A host number in the compute type's arithmetic type.
template <class T>
acc_t<T> value_of(const Operand& o) {
  if constexpr (is_floating_v<T>)
    return static_cast<acc_t<T>>(o.f);
  else if constexpr (std::is_same_v<T, bool>)
    return o.i != 0;
  else
    return static_cast<acc_t<T>>(o.i);
}

}  // namespace

void launch_unary(UnaryOp op, Dt dtype, const Indexer<2>& ix, void* out, const Operand& a,
                  cudaStream_t stream) {
  with_op<UnaryOp, static_cast<int>(UnaryOp::NumOps)>(op, [&](auto o) {
    constexpr UnaryOp O = decltype(o)::value;
    if constexpr (float_only(O)) {
      KILN_CUDA_DISPATCH_FLOAT(dtype, [&] {
        launch_elementwise<scalar_t>(ix, out, Unary<scalar_t, O>{}, stream, in_of<scalar_t>(a));
      });
    } else {
      KILN_CUDA_DISPATCH_ALL(dtype, [&] {
        launch_elementwise<scalar_t>(ix, out, Unary<scalar_t, O>{}, stream, in_of<scalar_t>(a));
      });
    }
  });
}

void launch_logical_not(Dt in, const Indexer<2>& ix, void* out, const Operand& a,
                        cudaStream_t stream) {
  KILN_CUDA_DISPATCH_ALL(in, [&] {
    launch_elementwise<bool>(ix, out, LogicalNot<scalar_t>{}, stream, in_of<scalar_t>(a));
  });
}

void launch_float_predicate(FloatPredicate op, Dt in, const Indexer<2>& ix, void* out,
                            const Operand& a, cudaStream_t stream) {
  with_op<FloatPredicate, 2>(op, [&](auto o) {
    constexpr FloatPredicate O = decltype(o)::value;
    KILN_CUDA_DISPATCH_ALL(in, [&] {
      launch_elementwise<bool>(ix, out, IsFloat<scalar_t, O>{}, stream, in_of<scalar_t>(a));
    });
  });
}

void launch_leaky_relu(Dt dtype, const Indexer<2>& ix, void* out, const Operand& a,
                       const Operand& slope, cudaStream_t stream) {
  KILN_CUDA_DISPATCH_FLOAT(dtype, [&] {
    LeakyRelu<scalar_t> f{value_of<scalar_t>(slope)};
    launch_elementwise<scalar_t>(ix, out, f, stream, in_of<scalar_t>(a));
  });
}

void launch_clamp(Dt dtype, const Indexer<2>& ix, void* out, const Operand& a, bool has_lo,
                  const Operand& lo, bool has_hi, const Operand& hi, cudaStream_t stream) {
  KILN_CUDA_DISPATCH_ALL(dtype, [&] {
    Clamp<scalar_t> f{has_lo, has_hi, value_of<scalar_t>(lo), value_of<scalar_t>(hi)};
    launch_elementwise<scalar_t>(ix, out, f, stream, in_of<scalar_t>(a));
  });
}

void launch_binary(BinaryOp op, Dt dtype, const Indexer<3>& ix, void* out, const Operand& a,
                   const Operand& b, const Operand& alpha, cudaStream_t stream) {
  with_op<BinaryOp, static_cast<int>(BinaryOp::NumOps)>(op, [&](auto o) {
    constexpr BinaryOp O = decltype(o)::value;
    KILN_CUDA_DISPATCH_ALL(dtype, [&] {
      Binary<scalar_t, O> f{value_of<scalar_t>(alpha)};
      launch_elementwise<scalar_t>(ix, out, f, stream, in_of<scalar_t>(a), in_of<scalar_t>(b));
    });
  });
}

void launch_compare(CompareOp op, Dt dtype, const Indexer<3>& ix, void* out, const Operand& a,
                    const Operand& b, cudaStream_t stream) {
  with_op<CompareOp, 9>(op, [&](auto o) {
    constexpr CompareOp O = decltype(o)::value;
    KILN_CUDA_DISPATCH_ALL(dtype, [&] {
      launch_elementwise<bool>(ix, out, Compare<scalar_t, O>{}, stream, in_of<scalar_t>(a),
                               in_of<scalar_t>(b));
    });
  });
}

void launch_where(Dt dtype, const Indexer<4>& ix, void* out, const Operand& cond, const Operand& a,
                  const Operand& b, cudaStream_t stream) {
  KILN_CUDA_DISPATCH_ALL(dtype, [&] {
    launch_elementwise<scalar_t>(ix, out, Where<scalar_t>{}, stream, in_of<bool>(cond),
                                 in_of<scalar_t>(a), in_of<scalar_t>(b));
  });
}

void launch_copy(Dt out_dtype, Dt in_dtype, const Indexer<2>& ix, void* out, const Operand& a,
                 cudaStream_t stream) {
  KILN_CUDA_DISPATCH_ALL(out_dtype, [&] {
    using To = scalar_t;
    KILN_CUDA_DISPATCH_ALL(in_dtype, [&] {
      launch_elementwise<To>(ix, out, Cast<To, scalar_t>{}, stream, in_of<scalar_t>(a));
    });
  });
}

}  // namespace kiln::cuda

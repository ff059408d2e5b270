#pragma once
// The per-element arithmetic of cdist and pdist (Note [cdist and pdist] in
// kiln/ops/distance_meta.cpp), shared by the CPU and CUDA kernels. `kind` is a
// detail::NormKind as an int; A is float or double. No CUDA header: nvcc defines __CUDACC__.
#include <cstdint>

#include "kiln/ops/hd_math.h"

namespace kiln::detail::dist {

enum : int { kZero, kOne, kTwo, kInf, kBelow2, kAbove2 };

using hd::ab;
using hd::pw;
using hd::sgn;
using hd::sq;

// The running sum (or max) after one more difference t.
template <class A>
KILN_HD inline A step(int kind, A acc, A t, A p) {
  A a = ab(t);
  switch (kind) {
    case kZero:
      return acc + (a != A(0) ? A(1) : A(0));
    case kOne:
      return acc + a;
    case kTwo:
      return acc + a * a;
    case kInf:
      return a > acc || a != a ? a : acc;
    default:
      return acc + pw(a, p);
  }
}
// The distance from the finished sum.
template <class A>
KILN_HD inline A finish(int kind, A acc, A p) {
  if (kind == kTwo) return sq(acc);
  if (kind == kBelow2 || kind == kAbove2) return pw(acc, A(1) / p);
  return acc;
}
// d(distance d)/d(difference t), 0 where the table of the Note says so.
template <class A>
KILN_HD inline A grad(int kind, A t, A d, A p) {
  switch (kind) {
    case kZero:
      return A(0);
    case kOne:
      return sgn(t);
    case kTwo:
      return d == A(0) ? A(0) : t / d;
    case kInf:
      return ab(t) == d ? sgn(t) : A(0);
    case kBelow2:
      return d == A(0) || (t == A(0) && p < A(1)) ? A(0)
                                                  : sgn(t) * pw(ab(t), p - A(1)) / pw(d, p - A(1));
    default:
      return d == A(0) ? A(0) : t * pw(ab(t), p - A(2)) / pw(d, p - A(1));
  }
}

// Row i < j of pair k of pdist over n rows: k = i n - i (i + 1) / 2 + j - i - 1.
KILN_HD inline int64_t pair_index(int64_t i, int64_t j, int64_t n) {
  return i * n - i * (i + 1) / 2 + j - i - 1;
}

}  // namespace kiln::detail::dist

#pragma once
// What the kernel-arithmetic headers (distance_math.h, grid_sample_math.h) share between the CPU
// and CUDA kernels: KILN_HD, which makes a function callable on both sides, and libm's float or
// double function picked by the type A (float or double), as ATen's kernels call them. No CUDA
// header: nvcc defines __CUDACC__.
#include <cmath>
#include <type_traits>

#ifdef __CUDACC__
#define KILN_HD __host__ __device__
#else
#define KILN_HD
#endif

namespace kiln::detail::hd {

template <class A>
KILN_HD inline A pw(A x, A y) {
  if constexpr (std::is_same_v<A, float>)
    return powf(x, y);
  else
    return pow(x, y);
}
template <class A>
KILN_HD inline A sq(A x) {
  if constexpr (std::is_same_v<A, float>)
    return sqrtf(x);
  else
    return sqrt(x);
}
template <class A>
KILN_HD inline A flo(A x) {
  if constexpr (std::is_same_v<A, float>)
    return floorf(x);
  else
    return floor(x);
}
template <class A>
KILN_HD inline A fm(A x, A y) {
  if constexpr (std::is_same_v<A, float>)
    return fmodf(x, y);
  else
    return fmod(x, y);
}
// Rounds half to even (the default rounding mode), as ATen's nearest mode.
template <class A>
KILN_HD inline A rint_even(A x) {
  if constexpr (std::is_same_v<A, float>)
    return nearbyintf(x);
  else
    return nearbyint(x);
}
template <class A>
KILN_HD inline A ab(A x) {
  return x < A(0) ? -x : x;
}
template <class A>
KILN_HD inline A sgn(A x) {
  return A((A(0) < x) - (x < A(0)));
}
template <class A>
KILN_HD inline A mn(A a, A b) {
  return b < a ? b : a;
}
template <class A>
KILN_HD inline A mx(A a, A b) {
  return a < b ? b : a;
}

}  // namespace kiln::detail::hd

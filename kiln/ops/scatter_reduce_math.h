#pragma once
// The reductions of scatter_reduce (Note [scatter_reduce] in kiln/ops/scatter_meta.cpp), shared
// by the CPU and CUDA kernels. A is the computing type: float, double or int64_t. No CUDA
// header: nvcc defines __CUDACC__.
#include <cstdint>
#include <limits>
#include <type_traits>

#ifdef __CUDACC__
#define KILN_SR_HD __host__ __device__
#else
#define KILN_SR_HD
#endif

namespace kiln::detail::scatter_reduce {

// The op's `reduce` argument (ATen's names, in ATen's order of its ReductionType).
enum Reduce : int64_t { kSum = 0, kProd = 1, kMean = 2, kAmax = 3, kAmin = 4 };

template <class A>
KILN_SR_HD inline bool is_nan(A x) {
  if constexpr (std::is_floating_point_v<A>)
    return x != x;
  else
    return false;
}

// The value a position starts from when include_self is false (the reduction's identity).
template <class A>
KILN_SR_HD inline A identity(int64_t reduce) {
  if (reduce == kProd) return A(1);
  if (reduce == kAmax) {
    if constexpr (std::is_floating_point_v<A>)
      return -std::numeric_limits<A>::infinity();
    else
      return std::numeric_limits<A>::lowest();
  }
  if (reduce == kAmin) {
    if constexpr (std::is_floating_point_v<A>)
      return std::numeric_limits<A>::infinity();
    else
      return std::numeric_limits<A>::max();
  }
  return A(0);
}

// old combined with v (mean sums; the division comes at the end). NaN wins amax and amin.
// Integer sums and products wrap (computed unsigned).
template <class A>
KILN_SR_HD inline A combine(int64_t reduce, A old, A v) {
  if (reduce == kSum || reduce == kMean) {
    if constexpr (std::is_floating_point_v<A>)
      return old + v;
    else
      return static_cast<A>(static_cast<uint64_t>(old) + static_cast<uint64_t>(v));
  }
  if (reduce == kProd) {
    if constexpr (std::is_floating_point_v<A>)
      return old * v;
    else
      return static_cast<A>(static_cast<uint64_t>(old) * static_cast<uint64_t>(v));
  }
  if (is_nan(old)) return old;
  if (is_nan(v)) return v;
  if (reduce == kAmax) return v > old ? v : old;
  return v < old ? v : old;
}

// mean's result: the sum over `count` values (count 0: the position kept its value). Integers
// divide rounding down, as ATen's (div with rounding_mode "floor").
template <class A>
KILN_SR_HD inline A mean_of(A sum, int64_t count) {
  if (count == 0) return sum;
  if constexpr (std::is_floating_point_v<A>) {
    return sum / static_cast<A>(count);
  } else {
    A q = sum / count;
    if ((sum % count != 0) && ((sum < 0) != (count < 0))) --q;
    return q;
  }
}

}  // namespace kiln::detail::scatter_reduce

#undef KILN_SR_HD

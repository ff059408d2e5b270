#pragma once
// The CUDA elementwise engine (device side): out[i] = f(in0[i], in1[i], ...) over an Indexer
// (kernel_args.h), with a flat fast path when every operand is contiguous. Inputs are Operands:
// device data or a host number passed by value. Internal to kiln/backend/cuda.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "kiln/backend/cuda/kernel_args.h"

namespace kiln::cuda {

// The type arithmetic happens in: float for the 16-bit floats, the type itself otherwise.
template <class T>
struct AccT {
  using type = T;
};
template <>
struct AccT<__half> {
  using type = float;
};
template <>
struct AccT<__nv_bfloat16> {
  using type = float;
};
template <class T>
using acc_t = typename AccT<T>::type;

// Conversions that go through float for the 16-bit types (and read bool as 0/1).
template <class To, class From>
__host__ __device__ __forceinline__ To cvt(From v) {
  if constexpr (std::is_same_v<To, From>) {
    return v;
  } else if constexpr (std::is_same_v<From, __half> || std::is_same_v<From, __nv_bfloat16>) {
    return cvt<To>(static_cast<float>(v));
  } else if constexpr (std::is_same_v<To, __half>) {
    return __float2half_rn(static_cast<float>(v));
  } else if constexpr (std::is_same_v<To, __nv_bfloat16>) {
    return __float2bfloat16_rn(static_cast<float>(v));
  } else if constexpr (std::is_same_v<To, bool>) {
    return v != From(0);
  } else {
    return static_cast<To>(v);
  }
}

// An input as the kernel sees it: a pointer, or a value given at launch.
template <class T>
struct In {
  const T* p;
  T s;
  bool scalar;
  __device__ __forceinline__ T at(int64_t off) const { return scalar ? s : p[off]; }
};
template <class T>
inline constexpr bool is_floating_v =
    std::is_floating_point_v<T> || std::is_same_v<T, __half> || std::is_same_v<T, __nv_bfloat16>;
template <class T>
In<T> in_of(const Operand& o) {
  In<T> r{static_cast<const T*>(o.data), T{}, o.scalar};
  if (o.scalar) r.s = is_floating_v<T> ? cvt<T>(o.f) : cvt<T>(o.i);
  return r;
}

// kBlock, the threads per block, is in kernel_args.h (the host glue checks grids with it).
inline constexpr int kUnroll = 4;  // elements per thread in the flat kernel

template <class Out, class F, class... T>
__global__ void __launch_bounds__(kBlock) flat_kernel(int64_t n, Out* out, F f, In<T>... in) {
  int64_t base = (static_cast<int64_t>(blockIdx.x) * kBlock * kUnroll) + threadIdx.x;
#pragma unroll
  for (int k = 0; k < kUnroll; ++k) {
    int64_t i = base + static_cast<int64_t>(k) * kBlock;
    if (i < n) out[i] = f(in.at(i)...);
  }
}

// V elements per thread through one aligned vector load per operand (16 bytes for the widest
// type): fewer instructions per element, which is most of what a small kernel costs.
template <class T, int V>
struct alignas(sizeof(T) * V) Vec {
  T v[V];
};
template <int V, class T>
__device__ __forceinline__ Vec<T, V> load_vec(const In<T>& x, int64_t i) {
  Vec<T, V> r;
  if (x.scalar) {
#pragma unroll
    for (int k = 0; k < V; ++k) r.v[k] = x.s;
  } else {
    r = *reinterpret_cast<const Vec<T, V>*>(x.p + i);
  }
  return r;
}
template <int V, class Out, class F, class... T>
__device__ __forceinline__ void apply_vec(Vec<Out, V>& o, const F& f, const Vec<T, V>&... vs) {
#pragma unroll
  for (int k = 0; k < V; ++k) o.v[k] = f(vs.v[k]...);
}
template <int V, class Out, class F, class... T>
__global__ void __launch_bounds__(kBlock) vec_kernel(int64_t n, Out* out, F f, In<T>... in) {
  int64_t i = (static_cast<int64_t>(blockIdx.x) * kBlock + threadIdx.x) * V;
  if (i + V <= n) {
    Vec<Out, V> o;
    apply_vec<V>(o, f, load_vec<V>(in, i)...);
    *reinterpret_cast<Vec<Out, V>*>(out + i) = o;
  } else {
    for (; i < n; ++i) out[i] = f(in.at(i)...);
  }
}
template <class T>
constexpr int max_size() {
  return static_cast<int>(sizeof(T));
}
template <class T, class U, class... R>
constexpr int max_size() {
  return sizeof(T) > sizeof(U) ? max_size<T, R...>() : max_size<U, R...>();
}
template <int V, class T>
bool aligned(const T* p) {
  return reinterpret_cast<uintptr_t>(p) % (sizeof(T) * V) == 0;
}

// Index is uint32_t when every offset fits: 64-bit division, one per dim and element, is most
// of a strided kernel's time.
template <int N, class Index, class Out, class F, class... T>
__global__ void __launch_bounds__(kBlock)
    strided_kernel(Indexer<N> ix, Out* out, F f, In<T>... in) {
  Index i = static_cast<Index>(blockIdx.x) * kBlock + threadIdx.x;
  if (i >= static_cast<Index>(ix.numel)) return;
  Index off[N] = {};
  Index rem = i;
  for (int d = 0; d < ix.ndim; ++d) {
    Index size = static_cast<Index>(ix.sizes[d]);
    Index c = rem % size;
    rem /= size;
#pragma unroll
    for (int k = 0; k < N; ++k) off[k] += c * static_cast<Index>(ix.strides[k][d]);
  }
  int k = 0;
  auto next = [&] { return static_cast<int64_t>(off[++k]); };
  out[off[0]] = f(in.at(next())...);
}

// Whether every element count and offset of `ix` fits in 32 bits (strides are non-negative).
template <int N>
bool fits_32(const Indexer<N>& ix) {
  if (ix.numel >= (int64_t{1} << 31)) return false;
  for (int k = 0; k < N; ++k) {
    int64_t last = 0;
    for (int d = 0; d < ix.ndim; ++d) {
      if (ix.strides[k][d] < 0) return false;
      last += (ix.sizes[d] - 1) * ix.strides[k][d];
    }
    if (last >= (int64_t{1} << 31)) return false;
  }
  return true;
}

// Launches out = f(in...) over `ix` on `stream`; Out and T... are the element types.
template <class Out, class... T, class F>
void launch_elementwise(const Indexer<sizeof...(T) + 1>& ix, void* out, F f, cudaStream_t stream,
                        In<T>... in) {
  if (ix.numel == 0) return;
  Out* o = static_cast<Out*>(out);
  constexpr int V = 16 / max_size<Out, T...>() > 0 ? 16 / max_size<Out, T...>() : 1;
  if constexpr (V > 1) {
    if (ix.contiguous && aligned<V>(o) && ((in.scalar || aligned<V>(in.p)) && ...)) {
      int64_t threads = (ix.numel + V - 1) / V;
      int64_t blocks = (threads + kBlock - 1) / kBlock;
      vec_kernel<V, Out, F, T...>
          <<<static_cast<unsigned>(blocks), kBlock, 0, stream>>>(ix.numel, o, f, in...);
      return;
    }
  }
  if (ix.contiguous) {
    int64_t blocks = (ix.numel + kBlock * kUnroll - 1) / (kBlock * kUnroll);
    flat_kernel<Out, F, T...>
        <<<static_cast<unsigned>(blocks), kBlock, 0, stream>>>(ix.numel, o, f, in...);
  } else {
    int64_t blocks = (ix.numel + kBlock - 1) / kBlock;
    if (fits_32(ix))
      strided_kernel<sizeof...(T) + 1, uint32_t, Out, F, T...>
          <<<static_cast<unsigned>(blocks), kBlock, 0, stream>>>(ix, o, f, in...);
    else
      strided_kernel<sizeof...(T) + 1, int64_t, Out, F, T...>
          <<<static_cast<unsigned>(blocks), kBlock, 0, stream>>>(ix, o, f, in...);
  }
}

// Calls f(T{}) with T the element type of `d` (kiln::DType order; bool, integers, floats).
#define KILN_CUDA_CASE(D, T, ...) \
  case Dt::D: {                   \
    using scalar_t = T;           \
    __VA_ARGS__();                \
    break;                        \
  }
#define KILN_CUDA_DISPATCH_ALL(d, ...)                   \
  switch (d) {                                           \
    KILN_CUDA_CASE(Bool, bool, __VA_ARGS__)              \
    KILN_CUDA_CASE(UInt8, uint8_t, __VA_ARGS__)          \
    KILN_CUDA_CASE(Int32, int32_t, __VA_ARGS__)          \
    KILN_CUDA_CASE(Int64, int64_t, __VA_ARGS__)          \
    KILN_CUDA_CASE(Float16, __half, __VA_ARGS__)         \
    KILN_CUDA_CASE(BFloat16, __nv_bfloat16, __VA_ARGS__) \
    KILN_CUDA_CASE(Float32, float, __VA_ARGS__)          \
    KILN_CUDA_CASE(Float64, double, __VA_ARGS__)         \
  }
#define KILN_CUDA_DISPATCH_FLOAT(d, ...)                 \
  switch (d) {                                           \
    KILN_CUDA_CASE(Float16, __half, __VA_ARGS__)         \
    KILN_CUDA_CASE(BFloat16, __nv_bfloat16, __VA_ARGS__) \
    KILN_CUDA_CASE(Float32, float, __VA_ARGS__)          \
    KILN_CUDA_CASE(Float64, double, __VA_ARGS__)         \
    default:                                             \
      break;                                             \
  }

}  // namespace kiln::cuda

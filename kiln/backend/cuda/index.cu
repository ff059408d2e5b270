// CUDA kernels of index_select (and embedding), gather, scatter_add, scatter_reduce, index_add,
// index, index_put, one_hot and triu/tril. One thread per output (or source) element, kBlock
// threads a block.
#include <type_traits>

#include "kiln/backend/cuda/index.h"
#include "kiln/backend/cuda/loops.cuh"
#include "kiln/backend/cuda/thread_per_element.cuh"
#include "kiln/ops/scatter_reduce_math.h"

namespace kiln::cuda {
namespace {

// Calls f(U{}) with U an unsigned type of dt's width: for kernels that only move elements.
template <class F>
void dispatch_width(Dt dt, F f) {
  switch (dt) {
    case Dt::Bool:
    case Dt::UInt8:
      f(uint8_t{});
      break;
    case Dt::Float16:
    case Dt::BFloat16:
      f(uint16_t{});
      break;
    case Dt::Int32:
    case Dt::Float32:
      f(uint32_t{});
      break;
    case Dt::Int64:
    case Dt::Float64:
      f(uint64_t{});
      break;
  }
}

// Runs f(I{}) with I the index element type (int32 or int64).
template <class F>
void dispatch_index(Dt index_dt, F f) {
  if (index_dt == Dt::Int32)
    f(int32_t{});
  else
    f(int64_t{});
}

// self is (outer, dim_size, inner), index is (k), out is (outer, k, inner) with n elements.
template <class U, class I>
__global__ void __launch_bounds__(kBlock)
    index_select_kernel(const U* self, const I* index, U* out, int64_t dim_size, int64_t k,
                        int64_t inner, int64_t n, int* err, int code) {
  int64_t i = thread_index();
  if (i >= n) return;
  int64_t j = i % inner, t = i / inner;
  int64_t v = static_cast<int64_t>(index[t % k]);
  if (v < 0 || v >= dim_size) {
    report(err, code);
    return;
  }
  out[i] = self[((t / k) * dim_size + v) * inner + j];
}

// The offset in self of walk position p of `g`, the coordinate of dim g.d being v.
__device__ __forceinline__ int64_t walk_offset(const IndexGeom& g, int64_t p, int64_t v) {
  int64_t off = 0;
  for (int k = 0; k < g.ndim; ++k) {
    int64_t c = p % g.sizes[k];
    p /= g.sizes[k];
    off += (k == g.d ? v : c) * g.strides[k];
  }
  return off;
}

// index and out have g.numel elements; self is read at walk_offset.
template <class U>
__global__ void __launch_bounds__(kBlock)
    gather_kernel(const U* self, const int64_t* index, U* out, IndexGeom g, int* err, int code) {
  int64_t p = thread_index();
  if (p >= g.numel) return;
  int64_t v = index[p];
  if (v < 0 || v >= g.bound) {
    report(err, code);
    return;
  }
  out[p] = self[walk_offset(g, p, v)];
}

// index and src have g.numel elements; acc is written at walk_offset.
template <class U>
__global__ void __launch_bounds__(kBlock)
    scatter_kernel(U* acc, const int64_t* index, const U* src, IndexGeom g, int* err, int code) {
  int64_t p = thread_index();
  if (p >= g.numel) return;
  int64_t v = index[p];
  if (v < 0 || v >= g.bound) {
    report(err, code);
    return;
  }
  acc[walk_offset(g, p, v)] = src[p];
}

// Atomically rewrites the byte at p as f(old byte), through a CAS on its aligned 32-bit word.
template <class F>
__device__ void atomic_update_byte(void* p, F f) {
  uintptr_t a = reinterpret_cast<uintptr_t>(p);
  unsigned* w = reinterpret_cast<unsigned*>(a & ~uintptr_t{3});
  unsigned shift = static_cast<unsigned>(a & 3) * 8;
  unsigned old = *w, assumed;
  do {
    assumed = old;
    unsigned b = f((assumed >> shift) & 0xffu) & 0xffu;
    old = atomicCAS(w, assumed, (assumed & ~(0xffu << shift)) | (b << shift));
  } while (old != assumed);
}

template <class T>
inline constexpr bool is_16bit_float_v =
    std::is_same_v<T, __half> || std::is_same_v<T, __nv_bfloat16>;

__device__ __forceinline__ unsigned short bits_of(__half v) { return __half_as_ushort(v); }
__device__ __forceinline__ unsigned short bits_of(__nv_bfloat16 v) {
  return __bfloat16_as_ushort(v);
}
template <class T>
__device__ __forceinline__ T from_bits(unsigned short b) {
  if constexpr (std::is_same_v<T, __half>)
    return __ushort_as_half(b);
  else
    return __ushort_as_bfloat16(b);
}

// *p = *p + alpha * v, atomically, rounded to T once per update as the CPU's add rounds each
// element (alpha is alpha_f for floating T, alpha_i otherwise); integers wrap, bools OR.
template <class T>
__device__ __forceinline__ void atomic_axpy(T* p, T v, double alpha_f, int64_t alpha_i) {
  if constexpr (std::is_same_v<T, bool>) {
    if (v && alpha_i != 0) {
      uintptr_t a = reinterpret_cast<uintptr_t>(p);
      atomicOr(reinterpret_cast<unsigned*>(a & ~uintptr_t{3}), 1u << ((a & 3) * 8));
    }
  } else if constexpr (is_16bit_float_v<T>) {
    if (alpha_f == 1.0) {
      atomicAdd(p, v);
      return;
    }
    float add = static_cast<float>(alpha_f) * cvt<float>(v);
    unsigned short* w = reinterpret_cast<unsigned short*>(p);
    unsigned short old = *w, assumed;
    do {
      assumed = old;
      T next = cvt<T>(cvt<float>(from_bits<T>(assumed)) + add);
      old = atomicCAS(w, assumed, bits_of(next));
    } while (old != assumed);
  } else if constexpr (std::is_floating_point_v<T>) {
    atomicAdd(p, static_cast<T>(alpha_f) * v);
  } else {
    // Unsigned arithmetic: the product wraps (as in T's width) without signed overflow.
    uint64_t add = static_cast<uint64_t>(alpha_i) * static_cast<uint64_t>(v);
    if constexpr (std::is_same_v<T, uint8_t>) {
      atomic_update_byte(p, [add](unsigned old) { return old + static_cast<unsigned>(add); });
    } else if constexpr (std::is_same_v<T, int32_t>) {
      atomicAdd(reinterpret_cast<unsigned*>(p), static_cast<unsigned>(add));
    } else {
      atomicAdd(reinterpret_cast<unsigned long long*>(p), static_cast<unsigned long long>(add));
    }
  }
}

// index and src have g.numel elements; acc is updated at walk_offset.
template <class T>
__global__ void __launch_bounds__(kBlock)
    scatter_add_kernel(T* acc, const int64_t* index, const T* src, IndexGeom g, int* err,
                       int code) {
  int64_t p = thread_index();
  if (p >= g.numel) return;
  int64_t v = index[p];
  if (v < 0 || v >= g.bound) {
    report(err, code);
    return;
  }
  atomic_axpy(acc + walk_offset(g, p, v), src[p], 1.0, 1);
}

namespace sr = detail::scatter_reduce;

__device__ __forceinline__ unsigned to_bits(float v) { return __float_as_uint(v); }
__device__ __forceinline__ unsigned long long to_bits(double v) {
  return static_cast<unsigned long long>(__double_as_longlong(v));
}
__device__ __forceinline__ unsigned long long to_bits(int64_t v) {
  return static_cast<unsigned long long>(v);
}
template <class A, class B>
__device__ __forceinline__ A of_bits(B b) {
  if constexpr (std::is_same_v<A, float>)
    return __uint_as_float(b);
  else if constexpr (std::is_same_v<A, double>)
    return __longlong_as_double(static_cast<long long>(b));
  else
    return static_cast<int64_t>(b);
}

// *p = combine(reduce, *p, v) atomically: atomicAdd for sums, else a CAS loop on p's bits.
template <class A>
__device__ void atomic_combine(A* p, A v, int64_t reduce) {
  if (reduce == sr::kSum || reduce == sr::kMean) {
    if constexpr (std::is_floating_point_v<A>)
      atomicAdd(p, v);
    else
      atomicAdd(reinterpret_cast<unsigned long long*>(p), static_cast<unsigned long long>(v));
    return;
  }
  using B = decltype(to_bits(v));
  B* w = reinterpret_cast<B*>(p);
  B old = *w, assumed;
  do {
    assumed = old;
    old = atomicCAS(w, assumed, to_bits(sr::combine<A>(reduce, of_bits<A>(assumed), v)));
  } while (old != assumed);
}

// index and src have g.numel elements; the identity goes to every position some index writes.
template <class A>
__global__ void __launch_bounds__(kBlock)
    scatter_identity_kernel(A* acc, const int64_t* index, IndexGeom g, int64_t reduce) {
  int64_t p = thread_index();
  if (p >= g.numel) return;
  int64_t v = index[p];
  if (v < 0 || v >= g.bound) return;  // reported by scatter_reduce_kernel
  acc[walk_offset(g, p, v)] = sr::identity<A>(reduce);
}
template <class A>
__global__ void __launch_bounds__(kBlock)
    scatter_reduce_kernel(A* acc, const int64_t* index, const A* src, int* count, IndexGeom g,
                          int64_t reduce, int* err, int code) {
  int64_t p = thread_index();
  if (p >= g.numel) return;
  int64_t v = index[p];
  if (v < 0 || v >= g.bound) {
    report(err, code);
    return;
  }
  const int64_t off = walk_offset(g, p, v);
  atomic_combine(acc + off, src[p], reduce);
  if (count) atomicAdd(count + off, 1);
}
template <class A>
__global__ void __launch_bounds__(kBlock)
    scatter_mean_kernel(A* acc, const int* count, int64_t n, bool include_self) {
  int64_t i = thread_index();
  if (i >= n) return;
  acc[i] = sr::mean_of<A>(acc[i], count[i] + (include_self ? 1 : 0));
}

// acc is (outer, dim_size, inner), index is (k), source is (outer, k, inner) with n elements.
template <class T, class I>
__global__ void __launch_bounds__(kBlock)
    index_add_kernel(T* acc, const I* index, const T* source, int64_t dim_size, int64_t k,
                     int64_t inner, int64_t n, double alpha_f, int64_t alpha_i, int* err,
                     int code) {
  int64_t i = thread_index();
  if (i >= n) return;
  int64_t j = i % inner, t = i / inner;
  int64_t v = static_cast<int64_t>(index[t % k]);
  if (v < 0 || v >= dim_size) {
    report(err, code);
    return;
  }
  atomic_axpy(acc + ((t / k) * dim_size + v) * inner + j, source[i], alpha_f, alpha_i);
}

// self is (rows), out is (rows, classes) with n elements; a bad row is reported, not written.
__global__ void __launch_bounds__(kBlock)
    one_hot_kernel(const int64_t* self, int64_t* out, int64_t classes, int64_t n, int* err,
                   int code) {
  int64_t i = thread_index();
  if (i >= n) return;
  int64_t c = i % classes;
  int64_t v = self[i / classes];
  if (v < 0 || v >= classes) {
    if (c == 0) report(err, code);
    return;
  }
  out[i] = v == c ? 1 : 0;
}

// x and y are (batch, rows, cols) with n elements.
template <class U>
__global__ void __launch_bounds__(kBlock) tri_kernel(const U* x, U* y, int64_t rows, int64_t cols,
                                                     int64_t diagonal, bool upper, int64_t n) {
  int64_t i = thread_index();
  if (i >= n) return;
  int64_t off = i % cols - (i / cols) % rows;
  bool keep = upper ? off >= diagonal : off <= diagonal;
  y[i] = keep ? x[i] : U(0);
}

// The element offset position p of `g` reaches, or -1 when one of its index values is out of
// bounds (reported through err).
__device__ __forceinline__ int64_t adv_offset(const AdvIndexGeom& g, int64_t p, int* err,
                                              int code) {
  int64_t off = 0, b = 0;
  for (int r = 0; r < g.ndim; ++r) {
    int64_t c = p % g.sizes[r];
    p /= g.sizes[r];
    off += c * g.strides[r];
    b += c * g.bstrides[r];
  }
  for (int k = 0; k < g.nidx; ++k) {
    int64_t v = g.idx[k][b];
    if (v < 0) v += g.bound[k];
    if (v < 0 || v >= g.bound[k]) {
      report(err, code);
      return -1;
    }
    off += v * g.istride[k];
  }
  return off;
}

template <class U>
__global__ void __launch_bounds__(kBlock)
    index_kernel(const U* self, U* out, AdvIndexGeom g, int* err, int code) {
  int64_t p = thread_index();
  if (p >= g.numel) return;
  int64_t off = adv_offset(g, p, err, code);
  if (off >= 0) out[p] = self[off];
}

// Note [index_put on CUDA]
// index_put with accumulate adds each value with an atomicAdd (atomic_axpy: a CAS loop for the
// 16-bit floats with alpha != 1, bytes and bools), so duplicates all land but, for floating
// dtypes, in an order that may change between runs (the last bits may differ; ATen's CUDA
// kernel sorts the indices to be deterministic when asked to). Without accumulate one of the
// duplicate values wins, unspecified, as in ATen.
template <class T>
__global__ void __launch_bounds__(kBlock)
    index_put_kernel(T* dst, const T* values, AdvIndexGeom g, bool accumulate, int* err, int code) {
  int64_t p = thread_index();
  if (p >= g.numel) return;
  int64_t off = adv_offset(g, p, err, code);
  if (off < 0) return;
  if (accumulate)
    atomic_axpy(dst + off, values[p], 1.0, 1);
  else
    dst[off] = values[p];
}

}  // namespace

void launch_index_select(Dt dt, const void* self, Dt index_dt, const void* index, void* out,
                         int64_t outer, int64_t dim_size, int64_t k, int64_t inner, int* err,
                         int code, cudaStream_t stream) {
  int64_t n = outer * k * inner;
  if (n == 0) return;
  dispatch_width(dt, [&](auto u) {
    using U = decltype(u);
    dispatch_index(index_dt, [&](auto ix) {
      using I = decltype(ix);
      index_select_kernel<U, I><<<blocks_for(n), kBlock, 0, stream>>>(
          static_cast<const U*>(self), static_cast<const I*>(index), static_cast<U*>(out), dim_size,
          k, inner, n, err, code);
    });
  });
}

void launch_gather(Dt dt, const void* self, const int64_t* index, void* out, const IndexGeom& g,
                   int* err, int code, cudaStream_t stream) {
  if (g.numel == 0) return;
  dispatch_width(dt, [&](auto u) {
    using U = decltype(u);
    gather_kernel<U><<<blocks_for(g.numel), kBlock, 0, stream>>>(
        static_cast<const U*>(self), index, static_cast<U*>(out), g, err, code);
  });
}

void launch_scatter(Dt dt, void* acc, const int64_t* index, const void* src, const IndexGeom& g,
                    int* err, int code, cudaStream_t stream) {
  if (g.numel == 0) return;
  dispatch_width(dt, [&](auto u) {
    using U = decltype(u);
    scatter_kernel<U><<<blocks_for(g.numel), kBlock, 0, stream>>>(
        static_cast<U*>(acc), index, static_cast<const U*>(src), g, err, code);
  });
}

void launch_scatter_add(Dt dt, void* acc, const int64_t* index, const void* src, const IndexGeom& g,
                        int* err, int code, cudaStream_t stream) {
  if (g.numel == 0) return;
  KILN_CUDA_DISPATCH_ALL(dt, [&] {
    scatter_add_kernel<scalar_t><<<blocks_for(g.numel), kBlock, 0, stream>>>(
        static_cast<scalar_t*>(acc), index, static_cast<const scalar_t*>(src), g, err, code);
  });
}

void launch_scatter_reduce(Dt a_dt, void* acc, const int64_t* index, const void* src, int* count,
                           int64_t acc_numel, const IndexGeom& g, int64_t reduce, bool include_self,
                           int* err, int code, cudaStream_t stream) {
  if (g.numel == 0) return;
  auto run = [&](auto a) {
    using A = decltype(a);
    A* pa = static_cast<A*>(acc);
    if (!include_self)
      scatter_identity_kernel<A><<<blocks_for(g.numel), kBlock, 0, stream>>>(pa, index, g, reduce);
    scatter_reduce_kernel<A><<<blocks_for(g.numel), kBlock, 0, stream>>>(
        pa, index, static_cast<const A*>(src), reduce == sr::kMean ? count : nullptr, g, reduce,
        err, code);
    if (reduce == sr::kMean && acc_numel > 0)
      scatter_mean_kernel<A>
          <<<blocks_for(acc_numel), kBlock, 0, stream>>>(pa, count, acc_numel, include_self);
  };
  if (a_dt == Dt::Float32)
    run(float{});
  else if (a_dt == Dt::Float64)
    run(double{});
  else
    run(int64_t{});
}

void launch_index_add(Dt dt, void* acc, Dt index_dt, const void* index, const void* source,
                      int64_t outer, int64_t dim_size, int64_t k, int64_t inner, double alpha_f,
                      int64_t alpha_i, int* err, int code, cudaStream_t stream) {
  int64_t n = outer * k * inner;
  if (n == 0) return;
  KILN_CUDA_DISPATCH_ALL(dt, [&] {
    dispatch_index(index_dt, [&](auto ix) {
      using I = decltype(ix);
      index_add_kernel<scalar_t, I><<<blocks_for(n), kBlock, 0, stream>>>(
          static_cast<scalar_t*>(acc), static_cast<const I*>(index),
          static_cast<const scalar_t*>(source), dim_size, k, inner, n, alpha_f, alpha_i, err, code);
    });
  });
}

void launch_index(Dt dt, const void* self, void* out, const AdvIndexGeom& g, int* err, int code,
                  cudaStream_t stream) {
  if (g.numel == 0) return;
  dispatch_width(dt, [&](auto u) {
    using U = decltype(u);
    index_kernel<U><<<blocks_for(g.numel), kBlock, 0, stream>>>(static_cast<const U*>(self),
                                                                static_cast<U*>(out), g, err, code);
  });
}

void launch_index_put(Dt dt, void* dst, const void* values, const AdvIndexGeom& g, bool accumulate,
                      int* err, int code, cudaStream_t stream) {
  if (g.numel == 0) return;
  KILN_CUDA_DISPATCH_ALL(dt, [&] {
    index_put_kernel<scalar_t><<<blocks_for(g.numel), kBlock, 0, stream>>>(
        static_cast<scalar_t*>(dst), static_cast<const scalar_t*>(values), g, accumulate, err,
        code);
  });
}

void launch_one_hot(const int64_t* self, int64_t* out, int64_t n, int64_t classes, int* err,
                    int code, cudaStream_t stream) {
  int64_t total = n * classes;
  if (total == 0) return;
  one_hot_kernel<<<blocks_for(total), kBlock, 0, stream>>>(self, out, classes, total, err, code);
}

void launch_tri(Dt dt, const void* x, void* y, int64_t batch, int64_t rows, int64_t cols,
                int64_t diagonal, bool upper, cudaStream_t stream) {
  int64_t n = batch * rows * cols;
  if (n == 0) return;
  dispatch_width(dt, [&](auto u) {
    using U = decltype(u);
    tri_kernel<U><<<blocks_for(n), kBlock, 0, stream>>>(
        static_cast<const U*>(x), static_cast<U*>(y), rows, cols, diagonal, upper, n);
  });
}

}  // namespace kiln::cuda

// CUDA kernels of layer_norm, rms_norm, gelu_backward and nll_loss. Arithmetic in acc_t
// (float for the 16-bit floats, double for float64); nll_loss sums in double as the CPU does.
// The norms take a warp to a block per row (rows of up to 4096 held in registers); nll_loss
// is one block; gelu_backward runs on the elementwise engine (loops.cuh).
#include <algorithm>

#include "kiln/backend/cuda/loops.cuh"
#include "kiln/backend/cuda/nn.h"

namespace kiln::cuda {
namespace {

__device__ __forceinline__ float sqrt_of(float x) { return sqrtf(x); }
__device__ __forceinline__ double sqrt_of(double x) { return sqrt(x); }
__device__ __forceinline__ float tanh_of(float x) { return tanhf(x); }
__device__ __forceinline__ double tanh_of(double x) { return tanh(x); }
__device__ __forceinline__ float erf_of(float x) { return erff(x); }
__device__ __forceinline__ double erf_of(double x) { return erf(x); }
__device__ __forceinline__ float exp_of(float x) { return expf(x); }
__device__ __forceinline__ double exp_of(double x) { return exp(x); }

// The sum over a warp, as lane 0 has it, given to every lane (so all agree to the bit).
template <class A>
__device__ __forceinline__ A warp_sum(A v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_down_sync(0xffffffffu, v, o);
  return __shfl_sync(0xffffffffu, v, 0);
}

inline constexpr int kNormThreads = 512;  // most threads of a norm block

// The sum of v over the threads of this row (threadIdx.y), given to each of them; every
// thread of the block calls it. shm holds one value per warp of the block.
template <class A>
__device__ A row_sum(A v, A* shm) {
  v = warp_sum(v);
  int warps = static_cast<int>(blockDim.x) / 32;
  if (warps == 1) return v;
  int base = static_cast<int>(threadIdx.y) * warps;
  if (threadIdx.x % 32 == 0) shm[base + static_cast<int>(threadIdx.x) / 32] = v;
  __syncthreads();
  A t = 0;
  for (int i = 0; i < warps; ++i) t += shm[base + i];
  __syncthreads();  // shm is reused by the next call
  return t;
}

// The output element of value v at column i: (v - mean) * rstd, then * w[i] and + b[i].
template <class T, class A>
__device__ __forceinline__ T norm_out(A v, A mean, A rstd, const T* w, const T* b, int64_t i) {
  A r = (v - mean) * rstd;
  if (w) r *= cvt<A>(w[i]);
  if (b) r += cvt<A>(b[i]);
  return cvt<T>(r);
}

inline constexpr int kNormItems = 8;  // elements a thread keeps in registers

// kVec elements moved by one access (16 bytes where the row allows it).
template <class T, int kVec>
struct alignas(sizeof(T) * kVec) Pack {
  T v[kVec];
};

// x and y are (rows, n) with n <= kNormItems * blockDim.x and n % kVec == 0, w and b are (n)
// or null; all 16-byte aligned when kVec > 1. Block (threads per row, rows per block): row
// blockIdx.x * blockDim.y + threadIdx.y. The row is read once into registers; the variance
// sums squared deviations from the mean (two passes over the registers), which keeps it
// accurate.
template <class T, int kVec>
__global__ void __launch_bounds__(kNormThreads)
    norm_cached_kernel(const T* x, const T* w, const T* b, T* y, int64_t rows, int64_t n,
                       double eps, bool rms) {
  using A = acc_t<T>;
  using P = Pack<T, kVec>;
  constexpr int kChunks = kNormItems / kVec;
  __shared__ A shm[kNormThreads / 32];
  int64_t row = static_cast<int64_t>(blockIdx.x) * blockDim.y + threadIdx.y;
  bool live = row < rows;  // dead rows still take part in the block's reductions
  const T* xr = x + (live ? row : 0) * n;
  A v[kNormItems];
  A s = 0;
#pragma unroll
  for (int k = 0; k < kChunks; ++k) {
    int64_t i = (threadIdx.x + static_cast<int64_t>(k) * blockDim.x) * kVec;
    P p{};
    if (live && i < n) p = *reinterpret_cast<const P*>(xr + i);
#pragma unroll
    for (int j = 0; j < kVec; ++j) {
      v[k * kVec + j] = cvt<A>(p.v[j]);
      s += v[k * kVec + j];
    }
  }
  A mean = rms ? A(0) : row_sum(s, shm) / static_cast<A>(n);
  A sq = 0;
#pragma unroll
  for (int k = 0; k < kChunks; ++k) {
    int64_t i = (threadIdx.x + static_cast<int64_t>(k) * blockDim.x) * kVec;
#pragma unroll
    for (int j = 0; j < kVec; ++j) {
      A d = i < n ? v[k * kVec + j] - mean : A(0);
      sq += d * d;
    }
  }
  sq = row_sum(sq, shm);
  if (!live) return;
  A rstd = A(1) / sqrt_of(sq / static_cast<A>(n) + static_cast<A>(eps));
  T* yr = y + row * n;
#pragma unroll
  for (int k = 0; k < kChunks; ++k) {
    int64_t i = (threadIdx.x + static_cast<int64_t>(k) * blockDim.x) * kVec;
    if (i >= n) break;
    P pw{}, pb{}, o;
    if (w) pw = *reinterpret_cast<const P*>(w + i);
    if (b) pb = *reinterpret_cast<const P*>(b + i);
#pragma unroll
    for (int j = 0; j < kVec; ++j) {
      A r = (v[k * kVec + j] - mean) * rstd;
      if (w) r *= cvt<A>(pw.v[j]);
      if (b) r += cvt<A>(pb.v[j]);
      o.v[j] = cvt<T>(r);
    }
    *reinterpret_cast<P*>(yr + i) = o;
  }
}

// As norm_cached_kernel for rows of any length, reading the row three times (mean, squared
// deviations, output); one row a block.
template <class T>
__global__ void __launch_bounds__(kNormThreads)
    norm_kernel(const T* x, const T* w, const T* b, T* y, int64_t n, double eps, bool rms) {
  using A = acc_t<T>;
  __shared__ A shm[kNormThreads / 32];
  const T* xr = x + static_cast<int64_t>(blockIdx.x) * n;
  A mean = 0;
  if (!rms) {
    A s = 0;
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) s += cvt<A>(xr[i]);
    mean = row_sum(s, shm) / static_cast<A>(n);
  }
  A sq = 0;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
    A d = cvt<A>(xr[i]) - mean;
    sq += d * d;
  }
  sq = row_sum(sq, shm);
  A rstd = A(1) / sqrt_of(sq / static_cast<A>(n) + static_cast<A>(eps));
  T* yr = y + static_cast<int64_t>(blockIdx.x) * n;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x)
    yr[i] = norm_out(cvt<A>(xr[i]), mean, rstd, w, b, i);
}

// grad where x > threshold, else 0, compared in acc_t with the threshold unrounded, as on the
// CPU; a NaN x lets grad through.
template <class T>
struct ThresholdBackward {
  acc_t<T> threshold;
  __device__ T operator()(T g, T x) const {
    return cvt<acc_t<T>>(x) <= threshold ? cvt<T>(0.0f) : g;
  }
};

// grad * d/dx gelu(x), as the CPU kernel computes it.
template <class T>
struct GeluBackward {
  bool approximate_tanh;
  __device__ T operator()(T g, T xv) const {
    using A = acc_t<T>;
    A x = cvt<A>(xv);
    A r;
    if (approximate_tanh) {
      const A beta = A(0.7978845608028654), kappa = A(0.044715);  // beta = sqrt(2 / pi)
      A x2 = x * x;
      A t = tanh_of(beta * (x + kappa * x2 * x));
      A left = A(0.5) * (A(1) + t);
      A right = A(0.5) * x * (A(1) - t * t) * beta * (A(1) + A(3) * kappa * x2);
      r = left + right;
    } else {
      const A inv_sqrt2 = A(0.7071067811865476), inv_sqrt_2pi = A(0.3989422804014327);
      A cdf = A(0.5) * (A(1) + erf_of(x * inv_sqrt2));
      A pdf = exp_of(A(-0.5) * x * x) * inv_sqrt_2pi;
      r = cdf + x * pdf;
    }
    return cvt<T>(cvt<A>(g) * r);
  }
};

inline constexpr int kLossThreads = 1024;
inline constexpr int kLossUnroll = 4;  // targets a thread has in flight

// self is (n, classes), target is (n), out one element. One block of kLossThreads threads.
template <class T>
__global__ void __launch_bounds__(kLossThreads)
    nll_loss_kernel(const T* self, const int64_t* target, T* out, int64_t n, int64_t classes,
                    int64_t ignore_index, int* err, int code) {
  __shared__ double shm_sum[kLossThreads / 32], shm_count[kLossThreads / 32];
  double s = 0, count = 0;
  for (int64_t base = threadIdx.x; base < n; base += kLossThreads * kLossUnroll) {
    // All loads first, then the sums: the gathers of one thread overlap.
    int64_t t[kLossUnroll];
#pragma unroll
    for (int k = 0; k < kLossUnroll; ++k) {
      int64_t i = base + k * kLossThreads;
      t[k] = i < n ? target[i] : ignore_index;
    }
    double v[kLossUnroll];
#pragma unroll
    for (int k = 0; k < kLossUnroll; ++k) {
      int64_t i = base + k * kLossThreads;
      bool bad = t[k] != ignore_index && (t[k] < 0 || t[k] >= classes);
      if (bad) {
        atomicCAS(err, 0, code);
        t[k] = ignore_index;  // left out of the mean
      }
      v[k] = t[k] != ignore_index ? cvt<double>(self[i * classes + t[k]]) : 0.0;
    }
#pragma unroll
    for (int k = 0; k < kLossUnroll; ++k) {
      s -= v[k];
      count += t[k] != ignore_index ? 1.0 : 0.0;
    }
  }
  s = warp_sum(s);
  count = warp_sum(count);
  int warp = static_cast<int>(threadIdx.x) / 32;
  if (threadIdx.x % 32 == 0) {
    shm_sum[warp] = s;
    shm_count[warp] = count;
  }
  __syncthreads();
  if (threadIdx.x != 0) return;
  s = 0;
  count = 0;
  for (int i = 0; i < kLossThreads / 32; ++i) {
    s += shm_sum[i];
    count += shm_count[i];
  }
  // 0/0 = NaN when every target is ignored, as in PyTorch.
  *out = cvt<T>(static_cast<acc_t<T>>(s / count));
}

// layer_norm_backward_kernel for rows that fit in registers, laid out as norm_cached_kernel
// (same block shape, kVec-wide accesses, n % kVec == 0, all 16-byte aligned when kVec > 1):
// x and g are read once, dx written once, and nothing is read again from memory. For
// gpt_large's [8192, 768] float32 rows on the H200 this is what makes the backward of layer
// norm cost about a forward's time instead of three.
// Blocks step over the row groups (blockDim.y rows each) from blockIdx.x by gridDim.x. With
// kSums (layer_norm_fused_backward) each thread also sums g * xhat and g over its live rows for
// its columns (which w and the layout fix for every row); the block adds its rows' sums in
// shared memory (dynamic, blockDim.x * blockDim.y * kNormItems * 2 accumulators when
// blockDim.y > 1) and writes row blockIdx.x of partial (gridDim.x, 2n): the dw sums, then the db
// sums. dx may then be null (only the sums). Dead rows (past `rows`) add nothing: their rstd is
// 1 / sqrt(eps), infinite for eps 0.
template <class T, int kVec, bool kSums>
__global__ void __launch_bounds__(kNormThreads)
    layer_norm_backward_cached_kernel(const T* g, const T* x, const T* w, T* dx, acc_t<T>* partial,
                                      int64_t rows, int64_t n, double eps) {
  using A = acc_t<T>;
  using P = Pack<T, kVec>;
  constexpr int kChunks = kNormItems / kVec;
  __shared__ A shm[kNormThreads / 32];
  A wv[kNormItems], dw[kSums ? kNormItems : 1], db[kSums ? kNormItems : 1];
#pragma unroll
  for (int k = 0; k < kChunks; ++k) {
    int64_t i = (threadIdx.x + static_cast<int64_t>(k) * blockDim.x) * kVec;
    P pw{};
    if (w && i < n) pw = *reinterpret_cast<const P*>(w + i);
#pragma unroll
    for (int j = 0; j < kVec; ++j) wv[k * kVec + j] = w ? cvt<A>(pw.v[j]) : A(1);
  }
  if constexpr (kSums) {
#pragma unroll
    for (int k = 0; k < kNormItems; ++k) dw[k] = db[k] = A(0);
  }
  const int64_t groups = (rows + blockDim.y - 1) / blockDim.y;
  for (int64_t group = blockIdx.x; group < groups; group += gridDim.x) {
    const int64_t row = group * blockDim.y + threadIdx.y;
    const bool live = row < rows;  // dead rows still take part in the block's reductions
    const int64_t off = (live ? row : 0) * n;
    A xv[kNormItems], gv[kNormItems];
    A s = 0;
#pragma unroll
    for (int k = 0; k < kChunks; ++k) {
      int64_t i = (threadIdx.x + static_cast<int64_t>(k) * blockDim.x) * kVec;
      P px{}, pg{};
      if (live && i < n) {
        px = *reinterpret_cast<const P*>(x + off + i);
        pg = *reinterpret_cast<const P*>(g + off + i);
      }
#pragma unroll
      for (int j = 0; j < kVec; ++j) {
        xv[k * kVec + j] = cvt<A>(px.v[j]);
        gv[k * kVec + j] = cvt<A>(pg.v[j]);
        s += xv[k * kVec + j];
      }
    }
    const A mean = row_sum(s, shm) / static_cast<A>(n);
    A sq = 0;
#pragma unroll
    for (int k = 0; k < kChunks; ++k) {
      int64_t i = (threadIdx.x + static_cast<int64_t>(k) * blockDim.x) * kVec;
#pragma unroll
      for (int j = 0; j < kVec; ++j) {
        A d = i < n ? xv[k * kVec + j] - mean : A(0);
        sq += d * d;
      }
    }
    const A rstd = A(1) / sqrt_of(row_sum(sq, shm) / static_cast<A>(n) + static_cast<A>(eps));
    A sg = 0, sgx = 0;
#pragma unroll
    for (int k = 0; k < kNormItems; ++k) {
      xv[k] = (xv[k] - mean) * rstd;  // xhat from here on (g is 0 past the row's end)
      if constexpr (kSums) {
        if (live) {
          dw[k] += gv[k] * xv[k];
          db[k] += gv[k];
        }
      }
      gv[k] *= wv[k];
      sg += gv[k];
      sgx += gv[k] * xv[k];
    }
    if (!dx) continue;
    const A a = row_sum(sg, shm) / static_cast<A>(n);
    const A b = row_sum(sgx, shm) / static_cast<A>(n);
    if (!live) continue;
#pragma unroll
    for (int k = 0; k < kChunks; ++k) {
      int64_t i = (threadIdx.x + static_cast<int64_t>(k) * blockDim.x) * kVec;
      if (i >= n) break;
      P o;
#pragma unroll
      for (int j = 0; j < kVec; ++j) {
        int e = k * kVec + j;
        o.v[j] = cvt<T>(rstd * (gv[e] - a - xv[e] * b));
      }
      *reinterpret_cast<P*>(dx + off + i) = o;
    }
  }
  if constexpr (kSums) {
    if (blockDim.y > 1) {  // add the block's rows: row 0's threads sum the others' accumulators
      extern __shared__ __align__(16) unsigned char raw[];
      A* red = reinterpret_cast<A*>(raw);
      const int lanes = static_cast<int>(blockDim.x * blockDim.y);
      const int t = static_cast<int>(threadIdx.y * blockDim.x + threadIdx.x);
#pragma unroll
      for (int k = 0; k < kNormItems; ++k) {
        red[k * lanes + t] = dw[k];
        red[(kNormItems + k) * lanes + t] = db[k];
      }
      __syncthreads();
      if (threadIdx.y != 0) return;
      for (unsigned y = 1; y < blockDim.y; ++y) {
        const int u = static_cast<int>(y * blockDim.x + threadIdx.x);
#pragma unroll
        for (int k = 0; k < kNormItems; ++k) {
          dw[k] += red[k * lanes + u];
          db[k] += red[(kNormItems + k) * lanes + u];
        }
      }
    }
    A* out = partial + static_cast<int64_t>(blockIdx.x) * 2 * n;
#pragma unroll
    for (int k = 0; k < kChunks; ++k) {
      int64_t i = (threadIdx.x + static_cast<int64_t>(k) * blockDim.x) * kVec;
      if (i >= n) break;
#pragma unroll
      for (int j = 0; j < kVec; ++j) {
        out[i + j] = dw[k * kVec + j];
        out[n + i + j] = db[k * kVec + j];
      }
    }
  }
}

// dw[c] and db[c] (each when not null) = the sums of the `parts` rows of partial (parts, 2n).
// A block of (32, kSumRows) threads per 32 columns: row y of threads adds parts y, y + kSumRows,
// ... (coalesced loads), then row 0 adds the rows' sums in order. One thread a column looping
// over all the parts was latency-bound: 64 us a call at gpt_large's 528 parts (run Q12).
inline constexpr int kSumRows = 32;
template <class T>
__global__ void __launch_bounds__(32 * kSumRows)
    layer_norm_param_sums_kernel(const acc_t<T>* partial, int64_t parts, int64_t n, T* dw, T* db) {
  using A = acc_t<T>;
  __shared__ A rows[kSumRows][33];
  const int64_t c = static_cast<int64_t>(blockIdx.x) * 32 + threadIdx.x;
  A s = 0;
  if (c < 2 * n)
    for (int64_t p = threadIdx.y; p < parts; p += kSumRows) s += partial[p * 2 * n + c];
  rows[threadIdx.y][threadIdx.x] = s;
  __syncthreads();
  if (threadIdx.y != 0 || c >= 2 * n) return;
  for (int y = 1; y < kSumRows; ++y) s += rows[y][threadIdx.x];
  T* out = c < n ? dw : db;
  if (out) out[c < n ? c : c - n] = cvt<T>(s);
}

// g, x and dx are (rows, n), w is (n) or null; one row a block. Mean and rstd as the forward
// computes them, then the two row sums of the backward, then dx: four passes over a row that
// stays in L1.
template <class T>
__global__ void __launch_bounds__(kNormThreads)
    layer_norm_backward_kernel(const T* g, const T* x, const T* w, T* dx, int64_t n, double eps) {
  using A = acc_t<T>;
  __shared__ A shm[kNormThreads / 32];
  const int64_t off = static_cast<int64_t>(blockIdx.x) * n;
  const T *xr = x + off, *gr = g + off;
  A s = 0;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) s += cvt<A>(xr[i]);
  const A mean = row_sum(s, shm) / static_cast<A>(n);
  A sq = 0;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
    A d = cvt<A>(xr[i]) - mean;
    sq += d * d;
  }
  const A rstd = A(1) / sqrt_of(row_sum(sq, shm) / static_cast<A>(n) + static_cast<A>(eps));
  A sg = 0, sgx = 0;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
    A gx = cvt<A>(gr[i]) * (w ? cvt<A>(w[i]) : A(1));
    sg += gx;
    sgx += gx * ((cvt<A>(xr[i]) - mean) * rstd);
  }
  const A a = row_sum(sg, shm) / static_cast<A>(n);
  const A b = row_sum(sgx, shm) / static_cast<A>(n);
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
    A gx = cvt<A>(gr[i]) * (w ? cvt<A>(w[i]) : A(1));
    A xhat = (cvt<A>(xr[i]) - mean) * rstd;
    dx[off + i] = cvt<T>(rstd * (gx - a - xhat * b));
  }
}

// Rows of n elements held in registers (kNormItems a thread): launch_norm's geometry, a warp to
// kNormThreads a row, short rows sharing a block of 256 threads.
struct RowLayout {
  int per_row = 32, rows_per_block = 1;
  bool fits = false;  // whether a row fits in its threads' registers
  int64_t groups(int64_t rows) const { return (rows + rows_per_block - 1) / rows_per_block; }
  int threads() const { return per_row * rows_per_block; }
};
RowLayout row_layout(int64_t n) {
  RowLayout l;
  while (l.per_row < kNormThreads && l.per_row * kNormItems < n) l.per_row *= 2;
  l.fits = l.per_row * kNormItems >= n;
  l.rows_per_block = l.per_row >= 256 ? 1 : 256 / l.per_row;
  return l;
}

}  // namespace

void launch_norm(Dt dt, const void* x, const void* w, const void* b, void* y, int64_t rows,
                 int64_t n, double eps, bool rms, cudaStream_t stream) {
  if (rows == 0 || n == 0) return;
  const RowLayout l = row_layout(n);
  if (!l.fits) {
    KILN_CUDA_DISPATCH_FLOAT(dt, [&] {
      norm_kernel<scalar_t><<<static_cast<unsigned>(rows), kNormThreads, 0, stream>>>(
          static_cast<const scalar_t*>(x), static_cast<const scalar_t*>(w),
          static_cast<const scalar_t*>(b), static_cast<scalar_t*>(y), n, eps, rms);
    });
    return;
  }
  dim3 block(static_cast<unsigned>(l.per_row), static_cast<unsigned>(l.rows_per_block));
  unsigned grid = static_cast<unsigned>(l.groups(rows));
  KILN_CUDA_DISPATCH_FLOAT(dt, [&] {
    using T = scalar_t;
    constexpr int kVec = 16 / sizeof(T);
    auto aligned = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
    bool vec = n % kVec == 0 && aligned(x) && aligned(y) && aligned(w) && aligned(b);
    auto kernel = vec ? &norm_cached_kernel<T, kVec> : &norm_cached_kernel<T, 1>;
    kernel<<<grid, block, 0, stream>>>(static_cast<const T*>(x), static_cast<const T*>(w),
                                       static_cast<const T*>(b), static_cast<T*>(y), rows, n, eps,
                                       rms);
  });
}

void launch_gelu_backward(Dt dt, const Indexer<3>& ix, void* out, const Operand& grad,
                          const Operand& x, bool approximate_tanh, cudaStream_t stream) {
  KILN_CUDA_DISPATCH_FLOAT(dt, [&] {
    launch_elementwise<scalar_t, scalar_t, scalar_t>(
        ix, out, GeluBackward<scalar_t>{approximate_tanh}, stream, in_of<scalar_t>(grad),
        in_of<scalar_t>(x));
  });
}

void launch_threshold_backward(Dt dt, const Indexer<3>& ix, void* out, const Operand& grad,
                               const Operand& x, double threshold, cudaStream_t stream) {
  KILN_CUDA_DISPATCH_FLOAT(dt, [&] {
    launch_elementwise<scalar_t, scalar_t, scalar_t>(
        ix, out, ThresholdBackward<scalar_t>{static_cast<acc_t<scalar_t>>(threshold)}, stream,
        in_of<scalar_t>(grad), in_of<scalar_t>(x));
  });
}

void launch_nll_loss(Dt dt, const void* self, const int64_t* target, void* out, int64_t n,
                     int64_t classes, int64_t ignore_index, int* err, int code,
                     cudaStream_t stream) {
  KILN_CUDA_DISPATCH_FLOAT(dt, [&] {
    nll_loss_kernel<scalar_t><<<1, kLossThreads, 0, stream>>>(static_cast<const scalar_t*>(self),
                                                              target, static_cast<scalar_t*>(out),
                                                              n, classes, ignore_index, err, code);
  });
}

namespace {

// layer_norm_backward_cached_kernel over `grid` blocks (rows that fit, partial as it says).
void launch_backward_cached(Dt dt, const void* g, const void* x, const void* w, void* dx,
                            void* partial, int64_t rows, int64_t n, double eps, int64_t grid,
                            cudaStream_t stream) {
  const RowLayout l = row_layout(n);
  dim3 block(static_cast<unsigned>(l.per_row), static_cast<unsigned>(l.rows_per_block));
  KILN_CUDA_DISPATCH_FLOAT(dt, [&] {
    using T = scalar_t;
    using A = acc_t<T>;
    constexpr int kVec = 16 / sizeof(T) <= kNormItems ? 16 / sizeof(T) : 1;
    auto aligned = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
    bool vec = n % kVec == 0 && aligned(g) && aligned(x) && aligned(w) && aligned(dx);
    auto kernel = partial ? (vec ? &layer_norm_backward_cached_kernel<T, kVec, true>
                                 : &layer_norm_backward_cached_kernel<T, 1, true>)
                          : (vec ? &layer_norm_backward_cached_kernel<T, kVec, false>
                                 : &layer_norm_backward_cached_kernel<T, 1, false>);
    size_t shm = partial && l.rows_per_block > 1
                     ? static_cast<size_t>(l.threads()) * kNormItems * 2 * sizeof(A)
                     : 0;
    kernel<<<static_cast<unsigned>(grid), block, shm, stream>>>(
        static_cast<const T*>(g), static_cast<const T*>(x), static_cast<const T*>(w),
        static_cast<T*>(dx), static_cast<A*>(partial), rows, n, eps);
  });
}

}  // namespace

void launch_layer_norm_backward(Dt dt, const void* g, const void* x, const void* w, void* dx,
                                int64_t rows, int64_t n, double eps, cudaStream_t stream) {
  if (rows == 0 || n == 0) return;
  const RowLayout l = row_layout(n);
  if (l.fits) {
    launch_backward_cached(dt, g, x, w, dx, nullptr, rows, n, eps, l.groups(rows), stream);
    return;
  }
  // About four elements a thread, in whole warps.
  int threads = static_cast<int>(std::min<int64_t>(kNormThreads, ((n + 3) / 4 + 31) / 32 * 32));
  KILN_CUDA_DISPATCH_FLOAT(dt, [&] {
    using T = scalar_t;
    layer_norm_backward_kernel<T><<<static_cast<unsigned>(rows), threads, 0, stream>>>(
        static_cast<const T*>(g), static_cast<const T*>(x), static_cast<const T*>(w),
        static_cast<T*>(dx), n, eps);
  });
}

bool layer_norm_fused_backward_fit(int64_t n) { return row_layout(n).fits; }

int64_t layer_norm_fused_backward_parts(int64_t rows, int64_t n) {
  const RowLayout l = row_layout(n);
  // About 1024 threads resident a multiprocessor: one wave of blocks, each taking its share of
  // the row groups.
  const int64_t wave = static_cast<int64_t>(sm_count()) * std::max(1, 1024 / l.threads());
  return std::max<int64_t>(1, std::min(l.groups(rows), wave));
}

void launch_layer_norm_fused_backward(Dt dt, const void* g, const void* x, const void* w, void* dx,
                                      void* dw, void* db, void* partial, int64_t parts,
                                      int64_t rows, int64_t n, double eps, cudaStream_t stream) {
  if (rows == 0 || n == 0) return;
  launch_backward_cached(dt, g, x, w, dx, partial, rows, n, eps, parts, stream);
  KILN_CUDA_DISPATCH_FLOAT(dt, [&] {
    using T = scalar_t;
    const unsigned blocks = static_cast<unsigned>((2 * n + 31) / 32);
    layer_norm_param_sums_kernel<T><<<blocks, dim3(32, kSumRows), 0, stream>>>(
        static_cast<const acc_t<T>*>(partial), parts, n, static_cast<T*>(dw), static_cast<T*>(db));
  });
}

}  // namespace kiln::cuda

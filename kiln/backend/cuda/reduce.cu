// CUDA reductions and softmax. A reduction is a functor (SumOp, VarOp, ExtremeOp, AllAnyOp)
// giving an accumulator, how an element folds into it, how two merge (in any order: the
// merges are order-independent up to rounding) and how the result is written; the kernels
// below run any functor over rows (a thread, a warp or a block per row) or over columns.
// Long rows and few outputs split each reduction over several blocks whose partial
// accumulators a second kernel merges.
#include <algorithm>
#include <cstring>
#include <limits>
#include <type_traits>

#include "kiln/backend/cuda/loops.cuh"
#include "kiln/backend/cuda/reduce.h"

namespace kiln::cuda {
namespace {

constexpr int kThreads = 256;  // every kernel's block
constexpr int kWarps = kThreads / 32;
constexpr int64_t kMaxSplits = 1024;  // slices of one reduction, merged by merge_kernel
constexpr int64_t kMaxGrid = int64_t{1} << 30;

__host__ __device__ int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Blocks for `items` work items, `per_block` per block (the kernels loop over the rest).
unsigned grid_for(int64_t items, int64_t per_block) {
  return static_cast<unsigned>(std::clamp<int64_t>(ceil_div(items, per_block), 1, kMaxGrid));
}

}  // namespace

int sm_count() {
  int dev = 0, n = 0;
  if (cudaGetDevice(&dev) != cudaSuccess ||
      cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess || n <= 0)
    return 132;  // an H100; the count only sizes the split of long reductions
  return n;
}

namespace {

// ---------------------------------------------------------------------------------------------
// Merging accumulators across threads

// Accumulators are trivially copyable structs shuffled as 32-bit words.
template <class A>
__device__ __forceinline__ A shfl_xor(A a, int mask) {
  static_assert(sizeof(A) % 4 == 0, "accumulators shuffle as 32-bit words");
  int w[sizeof(A) / 4];
  memcpy(w, &a, sizeof(A));
#pragma unroll
  for (int k = 0; k < static_cast<int>(sizeof(A) / 4); ++k)
    w[k] = __shfl_xor_sync(0xffffffffu, w[k], mask);
  memcpy(&a, w, sizeof(A));
  return a;
}

// Every lane of the warp gets the merge of the warp's 32 values.
template <class Op, class A>
__device__ __forceinline__ A warp_merge(const Op& op, A a) {
#pragma unroll
  for (int d = 16; d > 0; d /= 2) a = op.merge(a, shfl_xor(a, d));
  return a;
}

// Every thread of the block (kThreads threads, one dim) gets the merge of the block's values.
template <class Op, class A>
__device__ A block_merge(const Op& op, A a) {
  __shared__ __align__(16) unsigned char raw[kWarps * sizeof(A)];
  A* part = reinterpret_cast<A*>(raw);
  a = warp_merge(op, a);
  if (threadIdx.x % 32 == 0) part[threadIdx.x / 32] = a;
  __syncthreads();
  a = part[0];
  for (int w = 1; w < kWarps; ++w) a = op.merge(a, part[w]);
  __syncthreads();  // part may be written again by the caller's next iteration
  return a;
}

// ---------------------------------------------------------------------------------------------
// Reduction functors: In (element type), Acc, init(), step(acc, x, position), merge(a, b),
// write(output index, acc).

template <class T>
using sum_acc_t = std::conditional_t<is_floating_v<T>, acc_t<T>, int64_t>;

// Sum (or mean) in float (double for float64), in int64 for integers and bool.
template <class T, bool kMean>
struct SumOp {
  using In = T;
  using Acc = sum_acc_t<T>;
  T* y;
  Acc len;  // the mean's divisor
  __device__ Acc init() const { return Acc(0); }
  __device__ Acc step(Acc a, T x, int64_t) const { return a + cvt<Acc>(x); }
  __device__ Acc merge(Acc a, Acc b) const { return a + b; }
  __device__ void write(int64_t o, Acc a) const {
    if constexpr (kMean)
      y[o] = cvt<T>(a / len);
    else
      y[o] = cvt<T>(a);
  }
};

template <class A>
struct Welford {
  int64_t n;
  A mean;
  A m2;  // sum of squared deviations from mean
};
// Variance by Welford's method (Chan et al. to merge), divided by max(0, n - correction).
template <class T>
struct VarOp {
  using In = T;
  using F = acc_t<T>;
  using Acc = Welford<F>;
  T* y;
  int64_t correction;
  __device__ Acc init() const { return {0, F(0), F(0)}; }
  __device__ Acc step(Acc a, T x, int64_t) const {
    F v = cvt<F>(x);
    a.n += 1;
    F d = v - a.mean;
    a.mean += d / static_cast<F>(a.n);
    a.m2 += d * (v - a.mean);
    return a;
  }
  __device__ Acc merge(Acc a, Acc b) const {
    if (a.n == 0) return b;
    if (b.n == 0) return a;
    int64_t n = a.n + b.n;
    F d = b.mean - a.mean, fb = static_cast<F>(b.n) / static_cast<F>(n);
    return {n, a.mean + d * fb, a.m2 + b.m2 + d * d * static_cast<F>(a.n) * fb};
  }
  __device__ void write(int64_t o, Acc a) const {
    F denom = static_cast<F>(a.n - correction);
    y[o] = cvt<T>(a.m2 / (denom > F(0) ? denom : F(0)));
  }
};

template <class V>
struct ValueIndex {
  V v;
  int64_t i;
};
// max (kMax) or min and its position; values and indices are each optional.
template <class T, bool kMax>
struct ExtremeOp {
  using In = T;
  using V = acc_t<T>;
  using Acc = ValueIndex<V>;
  T* y;
  int64_t* idx;
  __device__ Acc init() const {
    constexpr int64_t kNone = std::numeric_limits<int64_t>::max();  // loses every tie
    if constexpr (is_floating_v<T>) {
      V inf = std::numeric_limits<V>::infinity();
      return {kMax ? -inf : inf, kNone};
    } else {
      return {kMax ? std::numeric_limits<V>::lowest() : std::numeric_limits<V>::max(), kNone};
    }
  }
  // As the CPU's first-to-last scan: a NaN wins (the first NaN), then the larger (smaller)
  // value, then the first position.
  __device__ Acc merge(Acc a, Acc b) const {
    if constexpr (is_floating_v<T>) {
      bool an = a.v != a.v, bn = b.v != b.v;
      if (an && bn) return b.i < a.i ? b : a;
      if (an || bn) return an ? a : b;
    }
    if (kMax ? b.v > a.v : b.v < a.v) return b;
    return b.v == a.v && b.i < a.i ? b : a;
  }
  __device__ Acc step(Acc a, T x, int64_t i) const { return merge(a, Acc{cvt<V>(x), i}); }
  __device__ void write(int64_t o, Acc a) const {
    if (y) y[o] = cvt<T>(a.v);
    if (idx) idx[o] = a.i;
  }
};

template <bool kAll>
struct AllAnyOp {
  using In = bool;
  using Acc = int;
  bool* y;
  __device__ Acc init() const { return kAll ? 1 : 0; }
  __device__ Acc step(Acc a, bool x, int64_t) const { return merge(a, x ? 1 : 0); }
  __device__ Acc merge(Acc a, Acc b) const { return kAll ? (a & b) : (a | b); }
  __device__ void write(int64_t o, Acc a) const { y[o] = a != 0; }
};

// ---------------------------------------------------------------------------------------------
// Reduction kernels

// Loads in flight per thread in the loops over a row: 16-bit and smaller elements need more to
// keep as many bytes in flight.
template <class T>
inline constexpr int kBatch = sizeof(T) <= 2 ? 8 : 4;

// Folds p[i * ld] into a for i = first, first + step, ... < end.
template <class Op>
__device__ __forceinline__ typename Op::Acc fold(const Op& op, typename Op::Acc a,
                                                 const typename Op::In* p, int64_t ld, int64_t i,
                                                 int64_t end, int64_t step) {
  using T = typename Op::In;
  constexpr int kB = kBatch<T>;
  for (; i + (kB - 1) * step < end; i += kB * step) {
    T v[kB];
#pragma unroll
    for (int k = 0; k < kB; ++k) v[k] = p[(i + k * step) * ld];
#pragma unroll
    for (int k = 0; k < kB; ++k) a = op.step(a, v[k], i + k * step);
  }
  for (; i < end; i += step) a = op.step(a, p[i * ld], i);
  return a;
}

// x is (rows, len), short rows: one thread per row.
template <class Op>
__global__ void __launch_bounds__(kThreads)
    thread_rows_kernel(const typename Op::In* x, int64_t rows, int64_t len, Op op) {
  for (int64_t r = blockIdx.x * int64_t{kThreads} + threadIdx.x; r < rows;
       r += int64_t{gridDim.x} * kThreads)
    op.write(r, fold(op, op.init(), x + r * len, 1, 0, len, 1));
}

// x is (rows, len): one warp per row.
template <class Op>
__global__ void __launch_bounds__(kThreads)
    warp_rows_kernel(const typename Op::In* x, int64_t rows, int64_t len, Op op) {
  int lane = static_cast<int>(threadIdx.x % 32);
  for (int64_t r = (blockIdx.x * int64_t{kThreads} + threadIdx.x) / 32; r < rows;
       r += int64_t{gridDim.x} * kWarps) {
    auto a = warp_merge(op, fold(op, op.init(), x + r * len, 1, lane, len, 32));
    if (lane == 0) op.write(r, a);
  }
}

// x is (rows, len): block b reduces slice s = b % splits, elements [s * chunk, (s + 1) * chunk),
// of row b / splits, into the output, or into partials (rows, splits) when splits > 1.
template <class Op>
__global__ void __launch_bounds__(kThreads)
    block_rows_kernel(const typename Op::In* x, int64_t rows, int64_t len, int64_t splits,
                      int64_t chunk, Op op, typename Op::Acc* partials) {
  for (int64_t b = blockIdx.x; b < rows * splits; b += gridDim.x) {
    int64_t r = b / splits, lo = b % splits * chunk, hi = min(len, lo + chunk);
    auto a = block_merge(op, fold(op, op.init(), x + r * len, 1, lo + threadIdx.x, hi, kThreads));
    if (threadIdx.x != 0) continue;
    if (partials)
      partials[b] = a;
    else
      op.write(r, a);
  }
}

// x is (batch, len, cols), reduced over len. A block (32, kWarps) takes a tile of `width`
// columns (a power of two, at most 32) of one batch and rows [y * chunk, (y + 1) * chunk) of
// len, y = blockIdx.y; a warp reads 32 / width whole rows of the tile at a time, so loads are
// coalesced even for few columns. Writes the output (batch, cols), or partials (batch * cols,
// gridDim.y) when gridDim.y > 1.
template <class Op>
__global__ void __launch_bounds__(kThreads)
    columns_kernel(const typename Op::In* x, int64_t batch, int64_t len, int64_t cols, int width,
                   int64_t chunk, Op op, typename Op::Acc* partials) {
  using A = typename Op::Acc;
  __shared__ __align__(16) unsigned char raw[kThreads * sizeof(A)];
  A* part = reinterpret_cast<A*>(raw);
  int lane = static_cast<int>(threadIdx.x), per_warp = 32 / width;
  int64_t tiles = ceil_div(cols, width);
  int64_t lo = blockIdx.y * chunk, hi = min(len, lo + chunk);
  for (int64_t t = blockIdx.x; t < batch * tiles; t += gridDim.x) {
    int64_t b = t / tiles, c = t % tiles * width + lane % width;
    A a = op.init();
    if (c < cols)
      a = fold(op, a, x + b * len * cols + c, cols, lo + threadIdx.y * per_warp + lane / width, hi,
               int64_t{kWarps} * per_warp);
    part[threadIdx.y * 32 + lane] = a;
    __syncthreads();
    if (threadIdx.y == 0 && lane < width && c < cols) {
      // Entries j with j % width == lane hold this column's other rows.
      for (int j = lane + width; j < kThreads; j += width) a = op.merge(a, part[j]);
      int64_t o = b * cols + c;
      if (partials)
        partials[o * gridDim.y + blockIdx.y] = a;
      else
        op.write(o, a);
    }
    __syncthreads();
  }
}

// columns_kernel with kV adjacent columns a lane, read by one 16-byte load: a tile is 32 * kV
// columns, and warp y reads rows lo + y, lo + y + kWarps, ... of it. Needs cols % kV == 0 and x
// 16-byte aligned. The block's warps merge each column's accumulators in shared memory, one of
// the kV columns at a time.
template <class Op, int kV>
__global__ void __launch_bounds__(kThreads)
    columns_vec_kernel(const typename Op::In* x, int64_t batch, int64_t len, int64_t cols,
                       int64_t chunk, Op op, typename Op::Acc* partials) {
  using A = typename Op::Acc;
  using T = typename Op::In;
  struct alignas(sizeof(T) * kV) Pack {
    T v[kV];
  };
  constexpr int kUnroll = 4;  // loads in flight a thread
  __shared__ __align__(16) unsigned char raw[kThreads * sizeof(A)];
  A* part = reinterpret_cast<A*>(raw);
  const int lane = static_cast<int>(threadIdx.x), y = static_cast<int>(threadIdx.y);
  const int64_t width = 32 * kV, tiles = ceil_div(cols, width);
  const int64_t lo = blockIdx.y * chunk, hi = min(len, lo + chunk);
  for (int64_t t = blockIdx.x; t < batch * tiles; t += gridDim.x) {
    const int64_t b = t / tiles, c = t % tiles * width + int64_t{lane} * kV;
    A a[kV];
#pragma unroll
    for (int j = 0; j < kV; ++j) a[j] = op.init();
    if (c < cols) {
      const T* p = x + b * len * cols + c;
      int64_t i = lo + y;
      for (; i + (kUnroll - 1) * kWarps < hi; i += kUnroll * kWarps) {
        Pack v[kUnroll];
#pragma unroll
        for (int u = 0; u < kUnroll; ++u)
          v[u] = *reinterpret_cast<const Pack*>(p + (i + u * kWarps) * cols);
#pragma unroll
        for (int u = 0; u < kUnroll; ++u)
#pragma unroll
          for (int j = 0; j < kV; ++j) a[j] = op.step(a[j], v[u].v[j], i + u * kWarps);
      }
      for (; i < hi; i += kWarps) {
        Pack v = *reinterpret_cast<const Pack*>(p + i * cols);
#pragma unroll
        for (int j = 0; j < kV; ++j) a[j] = op.step(a[j], v.v[j], i);
      }
    }
#pragma unroll
    for (int j = 0; j < kV; ++j) {
      part[y * 32 + lane] = a[j];
      __syncthreads();
      if (y == 0 && c < cols) {
        A m = a[j];
        for (int w = 1; w < kWarps; ++w) m = op.merge(m, part[w * 32 + lane]);
        const int64_t o = b * cols + c + j;
        if (partials)
          partials[o * gridDim.y + blockIdx.y] = m;
        else
          op.write(o, m);
      }
      __syncthreads();
    }
  }
}

// partials is (outputs, splits): one warp merges the slices of each output and writes it.
template <class Op>
__global__ void __launch_bounds__(kThreads)
    merge_kernel(const typename Op::Acc* partials, int64_t outputs, int64_t splits, Op op) {
  int lane = static_cast<int>(threadIdx.x % 32);
  for (int64_t o = (blockIdx.x * int64_t{kThreads} + threadIdx.x) / 32; o < outputs;
       o += int64_t{gridDim.x} * kWarps) {
    auto a = op.init();
    for (int64_t s = lane; s < splits; s += 32) a = op.merge(a, partials[o * splits + s]);
    a = warp_merge(op, a);
    if (lane == 0) op.write(o, a);
  }
}

// ---------------------------------------------------------------------------------------------
// Choosing and launching the kernels

struct Plan {
  enum Kind { kThreadRows, kWarpRows, kBlockRows, kColumns } kind = kThreadRows;
  int64_t splits = 1;  // slices of len per output (partials and merge_kernel when > 1)
  int64_t chunk = 0;   // elements of len per slice
  int width = 32;      // kColumns: columns per tile
  bool vec = false;    // kColumns: columns_vec_kernel (width 32 * 16 / element size)
};

template <class Op>
Plan plan_for(const ReduceArgs& a) {
  constexpr int kV = 16 / sizeof(typename Op::In);
  Plan p;
  p.chunk = a.len;
  // Slices len (each at least min_chunk long) until about 8 blocks per SM run, when `blocks`
  // blocks alone would leave the device idle.
  auto split = [&](int64_t blocks, int64_t min_chunk) {
    int64_t target = 8 * static_cast<int64_t>(sm_count());
    int64_t s = std::min({ceil_div(target, blocks), ceil_div(a.len, min_chunk), kMaxSplits});
    p.chunk = ceil_div(a.len, std::max<int64_t>(s, 1));
    p.splits = p.chunk > 0 ? ceil_div(a.len, p.chunk) : 1;
  };
  // 16-byte loads where a row has a tile of them (bias gradients, sums over a batch).
  p.vec =
      kV > 1 && a.cols >= 32 * kV && a.cols % kV == 0 && reinterpret_cast<uintptr_t>(a.x) % 16 == 0;
  if (p.vec) {
    p.kind = Plan::kColumns;
    p.width = 32 * kV;
    split(a.batch * ceil_div(a.cols, p.width), 4 * kWarps);  // each warp 4 rows or more
  } else if (a.cols > 1) {
    p.kind = Plan::kColumns;
    while (p.width / 2 >= a.cols) p.width /= 2;
    split(a.batch * ceil_div(a.cols, p.width), 8 * kThreads / p.width);
  } else if (a.len <= 16) {
    p.kind = Plan::kThreadRows;
  } else if (a.len <= 1024) {
    p.kind = Plan::kWarpRows;
  } else {
    p.kind = Plan::kBlockRows;
    split(a.batch, 16 * kThreads);
  }
  return p;
}

// Calls f(op) with the functor of a.op for a.dtype.
template <class F>
void with_op(const ReduceArgs& a, F f) {
  switch (a.op) {
    case Reduce::Sum:
      KILN_CUDA_DISPATCH_ALL(a.dtype, [&] {
        f(SumOp<scalar_t, false>{static_cast<scalar_t*>(a.values), 0});
      });
      break;
    case Reduce::Mean:
      KILN_CUDA_DISPATCH_FLOAT(a.dtype, [&] {
        f(SumOp<scalar_t, true>{static_cast<scalar_t*>(a.values),
                                static_cast<sum_acc_t<scalar_t>>(a.len)});
      });
      break;
    case Reduce::Var:
      KILN_CUDA_DISPATCH_FLOAT(a.dtype, [&] {
        f(VarOp<scalar_t>{static_cast<scalar_t*>(a.values), a.correction});
      });
      break;
    case Reduce::Max:
      KILN_CUDA_DISPATCH_ALL(a.dtype, [&] {
        f(ExtremeOp<scalar_t, true>{static_cast<scalar_t*>(a.values), a.indices});
      });
      break;
    case Reduce::Min:
      KILN_CUDA_DISPATCH_ALL(a.dtype, [&] {
        f(ExtremeOp<scalar_t, false>{static_cast<scalar_t*>(a.values), a.indices});
      });
      break;
    case Reduce::All:
      f(AllAnyOp<true>{static_cast<bool*>(a.values)});
      break;
    case Reduce::Any:
      f(AllAnyOp<false>{static_cast<bool*>(a.values)});
      break;
  }
}

template <class Op>
void run(const Op& op, const ReduceArgs& a, void* workspace, cudaStream_t stream) {
  using A = typename Op::Acc;
  const auto* x = static_cast<const typename Op::In*>(a.x);
  Plan p = plan_for<Op>(a);
  int64_t outputs = a.batch * a.cols;
  A* partials = p.splits > 1 ? static_cast<A*>(workspace) : nullptr;
  switch (p.kind) {
    case Plan::kThreadRows:
      thread_rows_kernel<<<grid_for(outputs, kThreads), kThreads, 0, stream>>>(x, outputs, a.len,
                                                                               op);
      break;
    case Plan::kWarpRows:
      warp_rows_kernel<<<grid_for(outputs, kWarps), kThreads, 0, stream>>>(x, outputs, a.len, op);
      break;
    case Plan::kBlockRows:
      block_rows_kernel<<<grid_for(outputs * p.splits, 1), kThreads, 0, stream>>>(
          x, outputs, a.len, p.splits, p.chunk, op, partials);
      break;
    case Plan::kColumns: {
      dim3 grid(grid_for(a.batch * ceil_div(a.cols, p.width), 1), static_cast<unsigned>(p.splits));
      if (p.vec)
        columns_vec_kernel<Op, 16 / sizeof(typename Op::In)><<<grid, dim3(32, kWarps), 0, stream>>>(
            x, a.batch, a.len, a.cols, p.chunk, op, partials);
      else
        columns_kernel<<<grid, dim3(32, kWarps), 0, stream>>>(x, a.batch, a.len, a.cols, p.width,
                                                              p.chunk, op, partials);
      break;
    }
  }
  if (partials)
    merge_kernel<<<grid_for(outputs, kWarps), kThreads, 0, stream>>>(partials, outputs, p.splits,
                                                                     op);
}

// ---------------------------------------------------------------------------------------------
// Softmax

__device__ __forceinline__ float exp_of(float v) { return expf(v); }
__device__ __forceinline__ double exp_of(double v) { return exp(v); }
__device__ __forceinline__ float log_of(float v) { return logf(v); }
__device__ __forceinline__ double log_of(double v) { return log(v); }

// The results match the CPU's three passes (max ignoring NaN, then s = sum of exp(x - max),
// with max = 0 for a row without a number above -inf, then the outputs): a NaN anywhere makes
// s NaN, and so does a +inf (exp(inf - inf)).
template <class F>
struct MaxMerge {
  __device__ F merge(F a, F b) const { return b > a ? b : a; }
};
template <class F>
struct AddMerge {
  __device__ F merge(F a, F b) const { return a + b; }
};
// The running max and sum of exp(x - m) of part of a row, merged online (one read pass).
template <class F>
struct MaxSum {
  F m;
  F s;
};
template <class F>
struct MaxSumMerge {
  __device__ MaxSum<F> merge(MaxSum<F> a, MaxSum<F> b) const {
    F m = b.m > a.m ? b.m : a.m;
    if (m == -std::numeric_limits<F>::infinity()) return {m, a.s + b.s};  // 0, or NaN
    return {m, a.s * exp_of(a.m - m) + b.s * exp_of(b.m - m)};
  }
};
// The MaxSum of K values.
template <class F, int K>
__device__ __forceinline__ MaxSum<F> max_sum_of(const F (&v)[K]) {
  constexpr F kInf = std::numeric_limits<F>::infinity();
  F m = -kInf, s = 0;
#pragma unroll
  for (int k = 0; k < K; ++k) m = MaxMerge<F>{}.merge(m, v[k]);
#pragma unroll
  for (int k = 0; k < K; ++k) s += v[k] == -kInf ? F(0) : exp_of(v[k] - m);  // not exp(NaN)
  return {m, s};
}

template <class T, class F>
__device__ __forceinline__ T softmax_out(F v, F m, F s_or_log_s, bool log) {
  return cvt<T>(log ? v - m - s_or_log_s : exp_of(v - m) * s_or_log_s);
}

// x, y are (rows, n), n <= 32 * kPer: one warp per row, held in registers (one read).
template <class T, int kPer>
__global__ void __launch_bounds__(kThreads)
    softmax_warp_kernel(const T* x, T* y, int64_t rows, int n, bool log) {
  using F = acc_t<T>;
  constexpr F kInf = std::numeric_limits<F>::infinity();
  int lane = static_cast<int>(threadIdx.x % 32);
  for (int64_t r = (blockIdx.x * int64_t{kThreads} + threadIdx.x) / 32; r < rows;
       r += int64_t{gridDim.x} * kWarps) {
    const T* p = x + r * n;
    F v[kPer];
    F m = -kInf;
#pragma unroll
    for (int k = 0; k < kPer; ++k) {
      int i = lane + 32 * k;
      v[k] = i < n ? cvt<F>(p[i]) : -kInf;  // padding adds exp(-inf) = 0 below
      m = MaxMerge<F>{}.merge(m, v[k]);
    }
    m = warp_merge(MaxMerge<F>{}, m);
    if (m == -kInf) m = 0;
    F s = 0;
#pragma unroll
    for (int k = 0; k < kPer; ++k) s += exp_of(v[k] - m);
    s = warp_merge(AddMerge<F>{}, s);
    F t = log ? log_of(s) : F(1) / s;
    T* q = y + r * n;
#pragma unroll
    for (int k = 0; k < kPer; ++k)
      if (lane + 32 * k < n) q[lane + 32 * k] = softmax_out<T>(v[k], m, t, log);
  }
}

// Softmax of the n elements p[i * ld] into q[i * ld], shared by the threads that call it:
// each takes i = first, first + step, ...; `all` merges a MaxSum over them.
template <class T, class AllMerge>
__device__ void softmax_line(const T* p, T* q, int64_t n, int64_t ld, int64_t first, int64_t step,
                             bool log, AllMerge all) {
  using F = acc_t<T>;
  constexpr int kB = kBatch<T>;
  MaxSumMerge<F> merge;
  MaxSum<F> a{-std::numeric_limits<F>::infinity(), F(0)};
  int64_t i = first;
  for (; i + (kB - 1) * step < n; i += kB * step) {
    F v[kB];
#pragma unroll
    for (int k = 0; k < kB; ++k) v[k] = cvt<F>(p[(i + k * step) * ld]);
    a = merge.merge(a, max_sum_of(v));
  }
  for (; i < n; i += step) {
    F v[1] = {cvt<F>(p[i * ld])};
    a = merge.merge(a, max_sum_of(v));
  }
  a = all(a);
  F m = a.m == -std::numeric_limits<F>::infinity() ? F(0) : a.m;
  F t = log ? log_of(a.s) : F(1) / a.s;
  for (i = first; i + (kB - 1) * step < n; i += kB * step) {
    F v[kB];
#pragma unroll
    for (int k = 0; k < kB; ++k) v[k] = cvt<F>(p[(i + k * step) * ld]);
#pragma unroll
    for (int k = 0; k < kB; ++k) q[(i + k * step) * ld] = softmax_out<T>(v[k], m, t, log);
  }
  for (; i < n; i += step) q[i * ld] = softmax_out<T>(cvt<F>(p[i * ld]), m, t, log);
}

// x, y are (rows, n): one block per row.
template <class T>
__global__ void __launch_bounds__(kThreads)
    softmax_block_kernel(const T* x, T* y, int64_t rows, int64_t n, bool log) {
  using F = acc_t<T>;
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x)
    softmax_line(x + r * n, y + r * n, n, 1, threadIdx.x, kThreads, log,
                 [](MaxSum<F> a) { return block_merge(MaxSumMerge<F>{}, a); });
}

// x, y are (outer, n, inner): one thread per (outer, inner) line; neighbouring threads read
// neighbouring elements.
template <class T>
__global__ void __launch_bounds__(kThreads)
    softmax_lines_kernel(const T* x, T* y, int64_t outer, int64_t n, int64_t inner, bool log) {
  using F = acc_t<T>;
  for (int64_t l = blockIdx.x * int64_t{kThreads} + threadIdx.x; l < outer * inner;
       l += int64_t{gridDim.x} * kThreads) {
    int64_t off = l / inner * n * inner + l % inner;
    softmax_line(x + off, y + off, n, inner, 0, 1, log, [](MaxSum<F> a) { return a; });
  }
}

template <class T, int kPer>
void launch_softmax_warp(const T* x, T* y, int64_t rows, int64_t n, bool log, cudaStream_t stream) {
  if constexpr (kPer < 32) {
    if (n > 32 * kPer) return launch_softmax_warp<T, kPer * 2>(x, y, rows, n, log, stream);
  }
  softmax_warp_kernel<T, kPer>
      <<<grid_for(rows, kWarps), kThreads, 0, stream>>>(x, y, rows, static_cast<int>(n), log);
}

}  // namespace

size_t reduce_workspace_bytes(const ReduceArgs& a) {
  if (a.batch * a.cols == 0) return 0;
  size_t bytes = 0;
  with_op(a, [&](auto op) {
    using Op = decltype(op);
    Plan p = plan_for<Op>(a);
    if (p.splits > 1)
      bytes = sizeof(typename Op::Acc) * static_cast<size_t>(a.batch * a.cols * p.splits);
  });
  return bytes;
}

void launch_reduce(const ReduceArgs& a, void* workspace, cudaStream_t stream) {
  if (a.batch * a.cols == 0) return;
  with_op(a, [&](auto op) { run(op, a, workspace, stream); });
}

void launch_softmax(Dt dtype, const void* x, void* y, int64_t outer, int64_t n, int64_t inner,
                    bool log, cudaStream_t stream) {
  if (outer * n * inner == 0) return;
  KILN_CUDA_DISPATCH_FLOAT(dtype, [&] {
    const auto* px = static_cast<const scalar_t*>(x);
    auto* py = static_cast<scalar_t*>(y);
    if (inner > 1)
      softmax_lines_kernel<<<grid_for(outer * inner, kThreads), kThreads, 0, stream>>>(
          px, py, outer, n, inner, log);
    else if (n <= 1024)
      launch_softmax_warp<scalar_t, 1>(px, py, outer, n, log, stream);
    else
      softmax_block_kernel<<<grid_for(outer, 1), kThreads, 0, stream>>>(px, py, outer, n, log);
  });
}

}  // namespace kiln::cuda

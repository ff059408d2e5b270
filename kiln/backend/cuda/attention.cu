// Fused attention kernels for float32 (FlashAttention-2 style; Note [Fused attention] in
// kiln/ops/ops.h; float16 and bfloat16 run attention16.cu's, Note [16-bit fused attention]).
// A block of 4 warps owns a tile of 64 queries (forward, dq) or 64 keys (dk, dv) and walks the
// tiles of the other side, 64 at a time: the scores of one 64 x 64 tile live in shared memory,
// never the whole L x S matrix. Tiles are zero-padded to HD (64 or 128) columns. The products
// run either on TF32 tensor cores (wmma m16n16k8, float accumulation) or as exact float32 FMAs
// (TC = false), each warp computing 16 rows of a tile. The softmax is online: a running max and
// sum per query, the output rescaled as the max grows; the forward saves each query's
// logsumexp, from which the backward recomputes the probabilities.
#include <mma.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <type_traits>

#include "kiln/backend/cuda/attention.h"
#include "kiln/backend/cuda/attention_common.cuh"
#include "kiln/backend/cuda/loops.cuh"

namespace kiln::cuda {
namespace {

using namespace nvcuda;

constexpr int kTile = 64;      // queries per block (forward, dq) and keys per step
constexpr int kThreads = 128;  // 4 warps of 16 rows
using attn::kLn2;
using attn::kLog2e;
using attn::visible;
constexpr int kLdS = kTile + 4;  // leading dim of the 64 x 64 score tiles (wmma: multiple of 4)

template <int HD>
constexpr int ld_of() {
  return HD + 4;  // leading dim of 64 x HD tiles
}

using FragA = wmma::fragment<wmma::matrix_a, 16, 16, 8, wmma::precision::tf32, wmma::row_major>;
using FragACol = wmma::fragment<wmma::matrix_a, 16, 16, 8, wmma::precision::tf32, wmma::col_major>;
using FragBCol = wmma::fragment<wmma::matrix_b, 16, 16, 8, wmma::precision::tf32, wmma::col_major>;
using FragBRow = wmma::fragment<wmma::matrix_b, 16, 16, 8, wmma::precision::tf32, wmma::row_major>;
using FragC = wmma::fragment<wmma::accumulator, 16, 16, 8, float>;

template <class Frag>
__device__ __forceinline__ void to_tf32(Frag& f) {
#pragma unroll
  for (int i = 0; i < f.num_elements; ++i) f.x[i] = wmma::__float_to_tf32(f.x[i]);
}

// Rows [r0, r0 + 64) of `op`'s batch entry b into `tile` (64 x HD, ld HD + 4) as float; rows
// >= rows and columns >= e are zero. 16 bytes a load where the layout allows.
template <class T, int HD>
__device__ void load_tile(float* tile, const AttnOperand& op, int64_t b, int64_t inner, int64_t r0,
                          int64_t rows, int e) {
  constexpr int LD = ld_of<HD>();
  const T* base = static_cast<const T*>(op.data) + (b / inner) * op.outer_stride +
                  (b % inner) * op.inner_stride;
  constexpr int kVec = 16 / static_cast<int>(sizeof(T));
  struct alignas(16) Vec {
    T v[kVec];
  };
  if (e % kVec == 0 && op.row_stride % kVec == 0 && reinterpret_cast<uintptr_t>(base) % 16 == 0) {
    constexpr int kPerRow = HD / kVec;
    for (int idx = static_cast<int>(threadIdx.x); idx < kTile * kPerRow; idx += kThreads) {
      const int r = idx / kPerRow, c = (idx % kPerRow) * kVec;
      const int64_t row = r0 + r;
      float f[kVec];
      if (row < rows && c < e) {
        const Vec p = *reinterpret_cast<const Vec*>(base + row * op.row_stride + c);
#pragma unroll
        for (int x = 0; x < kVec; ++x) f[x] = cvt<float>(p.v[x]);
      } else {
#pragma unroll
        for (int x = 0; x < kVec; ++x) f[x] = 0.f;
      }
#pragma unroll
      for (int x = 0; x < kVec; x += 4)
        *reinterpret_cast<float4*>(tile + r * LD + c + x) =
            make_float4(f[x], f[x + 1], f[x + 2], f[x + 3]);
    }
    return;
  }
  for (int idx = static_cast<int>(threadIdx.x); idx < kTile * HD; idx += kThreads) {
    const int r = idx / HD, c = idx % HD;
    const int64_t row = r0 + r;
    float v = 0.f;
    if (row < rows && c < e) v = cvt<float>(base[row * op.row_stride + c]);
    tile[r * LD + c] = v;
  }
}

// C (64 x 64, ld kLdS) = A (64 x HD) . B (64 x HD)^T, both ld HD + 4. Warp w writes rows
// 16w .. 16w + 15.
template <bool TC, int HD>
__device__ void mm_abt(const float* A, const float* B, float* C) {
  constexpr int LD = ld_of<HD>();
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  if constexpr (TC) {
    FragC acc[4];
#pragma unroll
    for (int j = 0; j < 4; ++j) wmma::fill_fragment(acc[j], 0.f);
#pragma unroll 2
    for (int kk = 0; kk < HD; kk += 8) {
      FragA a;
      wmma::load_matrix_sync(a, A + warp * 16 * LD + kk, LD);
      to_tf32(a);
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        FragBCol b;  // B^T (k, col) = B[col * LD + k]: column-major
        wmma::load_matrix_sync(b, B + j * 16 * LD + kk, LD);
        to_tf32(b);
        wmma::mma_sync(acc[j], a, b, acc[j]);
      }
    }
#pragma unroll
    for (int j = 0; j < 4; ++j)
      wmma::store_matrix_sync(C + warp * 16 * kLdS + j * 16, acc[j], kLdS, wmma::mem_row_major);
  } else {
    // Lane: rows 16w + rg + 4i (i < 4), columns cg + 8j (j < 8); rows and columns that differ
    // by one sit 4 banks apart, so the loads are conflict-free or broadcasts.
    const int rg = lane >> 3, cg = lane & 7;
    float acc[4][8] = {};
    const float* a0 = A + (warp * 16 + rg) * LD;
    const float* b0 = B + cg * LD;
#pragma unroll 4
    for (int k = 0; k < HD; ++k) {
      float a[4], b[8];
#pragma unroll
      for (int i = 0; i < 4; ++i) a[i] = a0[4 * i * LD + k];
#pragma unroll
      for (int j = 0; j < 8; ++j) b[j] = b0[8 * j * LD + k];
#pragma unroll
      for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 8; ++j) acc[i][j] = fmaf(a[i], b[j], acc[i][j]);
    }
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
      for (int j = 0; j < 8; ++j) C[(warp * 16 + rg + 4 * i) * kLdS + cg + 8 * j] = acc[i][j];
  }
}

// A warp's 16 rows x HD accumulator: += P (its 16 rows of 64 x 64, ld ldp) . V (64 x HD, ld
// HD + 4), or with TransA += P^T . V; store() writes them into a 64 x HD tile (ld HD + 4).
template <bool TC, int HD>
struct RowAcc;

template <int HD>
struct RowAcc<true, HD> {
  FragC f[HD / 16];
  __device__ void zero() {
#pragma unroll
    for (int j = 0; j < HD / 16; ++j) wmma::fill_fragment(f[j], 0.f);
  }
  template <bool TransA = false>
  __device__ void mma(const float* P, int ldp, const float* V) {
    constexpr int LD = ld_of<HD>();
    const int warp = static_cast<int>(threadIdx.x) / 32;
#pragma unroll 2
    for (int kk = 0; kk < kTile; kk += 8) {
      // P^T (row, k) = P[k * ldp + row]: column-major
      std::conditional_t<TransA, FragACol, FragA> a;
      if constexpr (TransA)
        wmma::load_matrix_sync(a, P + kk * ldp + warp * 16, ldp);
      else
        wmma::load_matrix_sync(a, P + warp * 16 * ldp + kk, ldp);
      to_tf32(a);
#pragma unroll
      for (int j = 0; j < HD / 16; ++j) {
        FragBRow b;
        wmma::load_matrix_sync(b, V + kk * LD + j * 16, LD);
        to_tf32(b);
        wmma::mma_sync(f[j], a, b, f[j]);
      }
    }
  }
  __device__ void store(float* C) const {
    constexpr int LD = ld_of<HD>();
    const int warp = static_cast<int>(threadIdx.x) / 32;
#pragma unroll
    for (int j = 0; j < HD / 16; ++j)
      wmma::store_matrix_sync(C + warp * 16 * LD + j * 16, f[j], LD, wmma::mem_row_major);
  }
};

template <int HD>
struct RowAcc<false, HD> {
  float a[4][HD / 8];
  __device__ void zero() {
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
      for (int j = 0; j < HD / 8; ++j) a[i][j] = 0.f;
  }
  template <bool TransA = false>
  __device__ void mma(const float* P, int ldp, const float* V) {
    constexpr int LD = ld_of<HD>();
    const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
    const int rg = lane >> 3, cg = lane & 7;
    const float* p0 = P + (warp * 16 + rg) * ldp;
    const float* pt = P + warp * 16 + rg;  // TransA: P^T (row, k) = P[k * ldp + row]
#pragma unroll 2
    for (int k = 0; k < kTile; ++k) {
      float p[4], v[HD / 8];
#pragma unroll
      for (int i = 0; i < 4; ++i) p[i] = TransA ? pt[k * ldp + 4 * i] : p0[4 * i * ldp + k];
#pragma unroll
      for (int j = 0; j < HD / 8; ++j) v[j] = V[k * LD + cg + 8 * j];
#pragma unroll
      for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < HD / 8; ++j) a[i][j] = fmaf(p[i], v[j], a[i][j]);
    }
  }
  __device__ void store(float* C) const {
    constexpr int LD = ld_of<HD>();
    const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
    const int rg = lane >> 3, cg = lane & 7;
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
      for (int j = 0; j < HD / 8; ++j) C[(warp * 16 + rg + 4 * i) * LD + cg + 8 * j] = a[i][j];
  }
};

// Shared memory of each kernel, in floats.
template <int HD>
constexpr int forward_smem() {
  return 3 * kTile * ld_of<HD>() + kTile * kLdS + 3 * kTile;
}
template <int HD>
constexpr int backward_smem() {
  return 4 * kTile * ld_of<HD>() + 2 * kTile * kLdS + 2 * kTile;
}
// How the backward kernels lay out those floats: four 64 x HD tiles, two 64 x 64 score tiles
// (probabilities and their gradients) and two rows of query statistics.
template <int HD>
struct BackwardSmem {
  float* tile[4];
  float *p, *d, *lse, *del;
  __device__ explicit BackwardSmem(float* s) {
    for (int i = 0; i < 4; ++i) tile[i] = s + i * kTile * ld_of<HD>();
    p = s + 4 * kTile * ld_of<HD>();
    d = p + kTile * kLdS;
    lse = d + kTile * kLdS;
    del = lse + kTile;
  }
};

// Grid: one block per (batch entry, query tile), the causal tiles with the most keys first.
template <class T, bool TC, int HD>
__global__ void __launch_bounds__(kThreads)
    flash_forward_kernel(AttnShape sh, AttnOperand q, AttnOperand k, AttnOperand v, T* out,
                         float* lse) {
  constexpr int LD = ld_of<HD>();
  constexpr int kPer = kTile * HD / kThreads;  // output elements a thread keeps
  extern __shared__ __align__(128) float smem[];
  float* Qs = smem;
  float* Ks = Qs + kTile * LD;  // then P . V of the step
  float* Vs = Ks + kTile * LD;
  float* Ss = Vs + kTile * LD;
  float* row_max = Ss + kTile * kLdS;
  float* row_sum = row_max + kTile;
  float* row_scale = row_sum + kTile;
  const int tid = static_cast<int>(threadIdx.x);
  const int64_t tiles = (sh.l + kTile - 1) / kTile;
  const int64_t b = blockIdx.x / tiles;
  const int64_t q0 = (tiles - 1 - static_cast<int64_t>(blockIdx.x) % tiles) * kTile;
  load_tile<T, HD>(Qs, q, b, sh.inner, q0, sh.l, sh.e);
  if (tid < kTile) {
    row_max[tid] = -INFINITY;
    row_sum[tid] = 0.f;
  }
  float o[kPer];
#pragma unroll
  for (int t = 0; t < kPer; ++t) o[t] = 0.f;
  RowAcc<TC, HD> pv;
  const float scale2 = sh.scale * kLog2e;  // scores in base 2
  const int64_t kend = sh.causal && q0 + kTile < sh.s ? q0 + kTile : sh.s;
  for (int64_t k0 = 0; k0 < kend; k0 += kTile) {
    __syncthreads();  // the last step is done with Ks and Vs
    load_tile<T, HD>(Ks, k, b, sh.inner, k0, sh.s, sh.e);
    load_tile<T, HD>(Vs, v, b, sh.inner, k0, sh.s, sh.e);
    __syncthreads();
    mm_abt<TC, HD>(Qs, Ks, Ss);
    __syncthreads();
    {  // online softmax in base 2: two neighbouring lanes per row, alternate columns each
      const int r = tid >> 1, half = tid & 1;
      const int64_t i = q0 + r;
      float* srow = Ss + r * kLdS + half;
      float mx = -INFINITY;
#pragma unroll 8
      for (int c = 0; c < 64; c += 2) {
        float x = visible(sh, i, k0 + half + c) ? srow[c] * scale2 : -INFINITY;
        srow[c] = x;
        mx = fmaxf(mx, x);
      }
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
      const float m_old = row_max[r];
      const float m_new = fmaxf(m_old, mx);
      const float base = m_new == -INFINITY ? 0.f : m_new;  // a padding row (i >= l)
      float sum = 0.f;
#pragma unroll 8
      for (int c = 0; c < 64; c += 2) {
        float p = exp2f(srow[c] - base);
        srow[c] = p;
        sum += p;
      }
      sum += __shfl_xor_sync(0xffffffffu, sum, 1);
      __syncwarp();
      if (half == 0) {
        const float alpha = exp2f(m_old - base);
        row_scale[r] = alpha;
        row_sum[r] = row_sum[r] * alpha + sum;
        row_max[r] = m_new;
      }
    }
    __syncthreads();
    pv.zero();
    pv.mma(Ss, kLdS, Vs);
    pv.store(Ks);  // every warp finished reading Ks before the softmax
    __syncthreads();
#pragma unroll
    for (int t = 0; t < kPer; ++t) {
      const int idx = tid + t * kThreads, r = idx / HD, c = idx % HD;
      o[t] = o[t] * row_scale[r] + Ks[r * LD + c];
    }
  }
  __syncthreads();
#pragma unroll
  for (int t = 0; t < kPer; ++t) {
    const int idx = tid + t * kThreads, r = idx / HD, c = idx % HD;
    const int64_t i = q0 + r;
    if (i < sh.l && c < sh.e) out[(b * sh.l + i) * sh.e + c] = cvt<T>(o[t] / row_sum[r]);
  }
  if (tid < kTile && q0 + tid < sh.l)
    lse[b * sh.l + q0 + tid] = (row_max[tid] + log2f(row_sum[tid])) * kLn2;
}

// delta[b, i] = grad_out[b, i] . out[b, i]: a warp per row.
template <class T>
__global__ void __launch_bounds__(kThreads)
    attention_delta_kernel(AttnShape sh, AttnOperand o, AttnOperand g, float* delta) {
  const int64_t row = static_cast<int64_t>(blockIdx.x) * (kThreads / 32) + threadIdx.x / 32;
  const int lane = static_cast<int>(threadIdx.x) % 32;
  if (row >= sh.n * sh.l) return;
  const int64_t b = row / sh.l, i = row % sh.l;
  const T* po = static_cast<const T*>(o.data) + (b / sh.inner) * o.outer_stride +
                (b % sh.inner) * o.inner_stride + i * o.row_stride;
  const T* pg = static_cast<const T*>(g.data) + (b / sh.inner) * g.outer_stride +
                (b % sh.inner) * g.inner_stride + i * g.row_stride;
  float s = 0.f;
  for (int c = lane; c < sh.e; c += 32) s += cvt<float>(po[c]) * cvt<float>(pg[c]);
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) s += __shfl_down_sync(0xffffffffu, s, off);
  if (lane == 0) delta[row] = s;
}

// Loads lse (in base 2: times log2 e) and delta of queries [i0, i0 + 64) (0 past the end).
__device__ __forceinline__ void load_row_stats(float* lse_s, float* del_s, const float* lse,
                                               const float* delta, const AttnShape& sh, int64_t b,
                                               int64_t i0) {
  const int tid = static_cast<int>(threadIdx.x);
  if (tid < kTile) {
    const int64_t i = i0 + tid;
    lse_s[tid] = i < sh.l ? lse[b * sh.l + i] * kLog2e : 0.f;  // base 2
    del_s[tid] = i < sh.l ? delta[b * sh.l + i] : 0.f;
  }
}

// dk and dv of one key tile, over the query tiles that see it: with S^T = K Q^T (keys as
// rows), P^T = exp(S^T scale - lse), dP^T = V dO^T, dS^T = P^T (dP^T - delta) scale:
// dv += P^T dO, dk += dS^T Q. kAtomicDq: also dq += dS K for each query tile, added into the
// float32 dq_acc ([n, l, e], zeroed) with atomics.
template <class T, bool TC, int HD, bool kAtomicDq>
__global__ void __launch_bounds__(kThreads)
    flash_backward_kv_kernel(AttnShape sh, AttnOperand q, AttnOperand k, AttnOperand v,
                             AttnOperand g, const float* lse, const float* delta, T* dk, T* dv,
                             float* dq_acc) {
  constexpr int LD = ld_of<HD>();
  extern __shared__ __align__(128) float smem[];
  const BackwardSmem<HD> m(smem);
  float *Ks = m.tile[0], *Vs = m.tile[1], *Qs = m.tile[2], *Gs = m.tile[3];
  float *Ps = m.p, *Ds = m.d, *lse_s = m.lse, *del_s = m.del;
  const int tid = static_cast<int>(threadIdx.x);
  const int64_t tiles = (sh.s + kTile - 1) / kTile;
  const int64_t b = blockIdx.x / tiles;
  const int64_t j0 = (static_cast<int64_t>(blockIdx.x) % tiles) * kTile;
  load_tile<T, HD>(Ks, k, b, sh.inner, j0, sh.s, sh.e);
  load_tile<T, HD>(Vs, v, b, sh.inner, j0, sh.s, sh.e);
  const float scale2 = sh.scale * kLog2e;
  RowAcc<TC, HD> acc_dk, acc_dv;
  acc_dk.zero();
  acc_dv.zero();
  for (int64_t i0 = sh.causal ? j0 : 0; i0 < sh.l; i0 += kTile) {
    __syncthreads();  // the last step is done with Qs, Gs and the stats
    load_tile<T, HD>(Qs, q, b, sh.inner, i0, sh.l, sh.e);
    load_tile<T, HD>(Gs, g, b, sh.inner, i0, sh.l, sh.e);
    load_row_stats(lse_s, del_s, lse, delta, sh, b, i0);
    __syncthreads();
    mm_abt<TC, HD>(Ks, Qs, Ps);
    mm_abt<TC, HD>(Vs, Gs, Ds);
    __syncthreads();
    for (int idx = tid; idx < kTile * kTile; idx += kThreads) {
      const int c = idx / kTile, r = idx % kTile;  // key c, query r
      float* ps = Ps + c * kLdS + r;
      float* ds = Ds + c * kLdS + r;
      const float p = visible(sh, i0 + r, j0 + c) ? exp2f(*ps * scale2 - lse_s[r]) : 0.f;
      *ps = p;
      *ds = p * (*ds - del_s[r]) * sh.scale;
    }
    __syncthreads();
    acc_dv.mma(Ps, kLdS, Gs);
    acc_dk.mma(Ds, kLdS, Qs);
    if constexpr (kAtomicDq) {
      RowAcc<TC, HD> dq;  // rows: this warp's 16 queries
      dq.zero();
      dq.template mma<true>(Ds, kLdS, Ks);
      __syncthreads();  // every warp is done reading Qs
      dq.store(Qs);
      __syncthreads();
      for (int idx = tid; idx < kTile * HD; idx += kThreads) {
        const int r = idx / HD, c = idx % HD;
        const int64_t i = i0 + r;
        if (i < sh.l && c < sh.e) atomicAdd(dq_acc + (b * sh.l + i) * sh.e + c, Qs[r * LD + c]);
      }
    }
  }
  __syncthreads();
  acc_dk.store(Qs);
  acc_dv.store(Gs);
  __syncthreads();
  for (int idx = tid; idx < kTile * HD; idx += kThreads) {
    const int r = idx / HD, c = idx % HD;
    const int64_t j = j0 + r;
    if (j < sh.s && c < sh.e) {
      dk[(b * sh.s + j) * sh.e + c] = cvt<T>(Qs[r * LD + c]);
      dv[(b * sh.s + j) * sh.e + c] = cvt<T>(Gs[r * LD + c]);
    }
  }
}

// dq of one query tile, over the key tiles it sees: dS = P (dO V^T - delta) scale, dq += dS K.
template <class T, bool TC, int HD>
__global__ void __launch_bounds__(kThreads)
    flash_backward_q_kernel(AttnShape sh, AttnOperand q, AttnOperand k, AttnOperand v,
                            AttnOperand g, const float* lse, const float* delta, T* dq) {
  constexpr int LD = ld_of<HD>();
  extern __shared__ __align__(128) float smem[];
  const BackwardSmem<HD> m(smem);
  float *Qs = m.tile[0], *Gs = m.tile[1], *Ks = m.tile[2], *Vs = m.tile[3];
  float *Ps = m.p, *Ds = m.d, *lse_s = m.lse, *del_s = m.del;
  const int tid = static_cast<int>(threadIdx.x);
  const int64_t tiles = (sh.l + kTile - 1) / kTile;
  const int64_t b = blockIdx.x / tiles;
  const int64_t i0 = (tiles - 1 - static_cast<int64_t>(blockIdx.x) % tiles) * kTile;
  load_tile<T, HD>(Qs, q, b, sh.inner, i0, sh.l, sh.e);
  load_tile<T, HD>(Gs, g, b, sh.inner, i0, sh.l, sh.e);
  load_row_stats(lse_s, del_s, lse, delta, sh, b, i0);
  const float scale2 = sh.scale * kLog2e;
  RowAcc<TC, HD> acc_dq;
  acc_dq.zero();
  const int64_t kend = sh.causal && i0 + kTile < sh.s ? i0 + kTile : sh.s;
  for (int64_t j0 = 0; j0 < kend; j0 += kTile) {
    __syncthreads();  // the last step is done with Ks
    load_tile<T, HD>(Ks, k, b, sh.inner, j0, sh.s, sh.e);
    load_tile<T, HD>(Vs, v, b, sh.inner, j0, sh.s, sh.e);
    __syncthreads();
    mm_abt<TC, HD>(Qs, Ks, Ps);
    mm_abt<TC, HD>(Gs, Vs, Ds);
    __syncthreads();
    for (int idx = tid; idx < kTile * kTile; idx += kThreads) {
      const int r = idx / kTile, c = idx % kTile;  // query r, key c
      const float p =
          visible(sh, i0 + r, j0 + c) ? exp2f(Ps[r * kLdS + c] * scale2 - lse_s[r]) : 0.f;
      Ds[r * kLdS + c] = p * (Ds[r * kLdS + c] - del_s[r]) * sh.scale;
    }
    __syncthreads();
    acc_dq.mma(Ds, kLdS, Ks);
  }
  __syncthreads();
  acc_dq.store(Qs);
  __syncthreads();
  for (int idx = tid; idx < kTile * HD; idx += kThreads) {
    const int r = idx / HD, c = idx % HD;
    const int64_t i = i0 + r;
    if (i < sh.l && c < sh.e) dq[(b * sh.l + i) * sh.e + c] = cvt<T>(Qs[r * LD + c]);
  }
}

unsigned blocks_of(int64_t batch, int64_t rows) { return attn::blocks_of(batch, rows, kTile); }

template <class K>
void allow_smem(K kernel, int floats, std::atomic<bool>* done) {
  attn::allow_smem(kernel, static_cast<size_t>(floats) * sizeof(float), done);
}
using attn::kMaxDevices;

template <class T, bool TC, int HD>
void forward(const AttnShape& sh, const AttnOperand& q, const AttnOperand& k, const AttnOperand& v,
             void* out, float* lse, cudaStream_t st) {
  static std::atomic<bool> done[kMaxDevices];
  auto kernel = flash_forward_kernel<T, TC, HD>;
  allow_smem(kernel, forward_smem<HD>(), done);
  kernel<<<blocks_of(sh.n, sh.l), kThreads, forward_smem<HD>() * sizeof(float), st>>>(
      sh, q, k, v, static_cast<T*>(out), lse);
}

template <class T, bool TC, int HD>
void backward(const AttnShape& sh, const AttnOperand& q, const AttnOperand& k, const AttnOperand& v,
              const AttnOperand& g, const float* lse, const float* delta, bool deterministic,
              void* dq, void* dk, void* dv, cudaStream_t st) {
  const size_t bytes = backward_smem<HD>() * sizeof(float);
  if (deterministic) {
    auto kv = flash_backward_kv_kernel<T, TC, HD, false>;
    auto qk = flash_backward_q_kernel<T, TC, HD>;
    static std::atomic<bool> done_kv[kMaxDevices], done_q[kMaxDevices];
    allow_smem(kv, backward_smem<HD>(), done_kv);
    allow_smem(qk, backward_smem<HD>(), done_q);
    kv<<<blocks_of(sh.n, sh.s), kThreads, bytes, st>>>(
        sh, q, k, v, g, lse, delta, static_cast<T*>(dk), static_cast<T*>(dv), nullptr);
    qk<<<blocks_of(sh.n, sh.l), kThreads, bytes, st>>>(sh, q, k, v, g, lse, delta,
                                                       static_cast<T*>(dq));
    return;
  }
  // dq accumulates in place with atomics.
  cudaMemsetAsync(dq, 0, static_cast<size_t>(sh.n * sh.l * sh.e) * sizeof(float), st);
  auto kv = flash_backward_kv_kernel<T, TC, HD, true>;
  static std::atomic<bool> done_kv[kMaxDevices];
  allow_smem(kv, backward_smem<HD>(), done_kv);
  kv<<<blocks_of(sh.n, sh.s), kThreads, bytes, st>>>(sh, q, k, v, g, lse, delta,
                                                     static_cast<T*>(dk), static_cast<T*>(dv),
                                                     static_cast<float*>(dq));
}

// delta = rowwise (grad_out . out), the backward's first kernel in every dtype.
template <class T>
void launch_delta(const AttnShape& sh, const AttnOperand& o, const AttnOperand& g, float* delta,
                  cudaStream_t st) {
  constexpr int kRowsPerBlock = kThreads / 32;
  unsigned rows = static_cast<unsigned>((sh.n * sh.l + kRowsPerBlock - 1) / kRowsPerBlock);
  if (rows > 0) attention_delta_kernel<T><<<rows, kThreads, 0, st>>>(sh, o, g, delta);
}

bool is_16bit(Dt dt) { return dt == Dt::Float16 || dt == Dt::BFloat16; }

// Calls f.template operator()<float, TC, HD>() for the product kind and the head dim (the
// 16-bit dtypes run attention16.cu's kernels).
template <class F>
void dispatch(bool tensor_cores, int e, F&& f) {
  auto by_hd = [&]<bool TC>() {
    if (e <= 64)
      f.template operator()<float, TC, 64>();
    else
      f.template operator()<float, TC, 128>();
  };
  if (tensor_cores)
    by_hd.template operator()<true>();
  else
    by_hd.template operator()<false>();
}

}  // namespace

void launch_flash_forward(Dt dt, bool tensor_cores, const AttnShape& sh, const AttnOperand& q,
                          const AttnOperand& k, const AttnOperand& v, void* out, float* lse,
                          cudaStream_t stream) {
  if (is_16bit(dt)) return launch_flash16_forward(dt, sh, q, k, v, out, lse, stream);
  dispatch(tensor_cores, sh.e,
           [&]<class T, bool TC, int HD>() { forward<T, TC, HD>(sh, q, k, v, out, lse, stream); });
}

void launch_flash_backward(Dt dt, bool tensor_cores, const AttnShape& sh, const AttnOperand& q,
                           const AttnOperand& k, const AttnOperand& v, const AttnOperand& out,
                           const AttnOperand& grad_out, const float* lse, float* delta,
                           bool deterministic, void* dq, void* dk, void* dv, cudaStream_t stream) {
  if (is_16bit(dt)) {
    if (dt == Dt::BFloat16)
      launch_delta<__nv_bfloat16>(sh, out, grad_out, delta, stream);
    else
      launch_delta<__half>(sh, out, grad_out, delta, stream);
    return launch_flash16_backward(dt, sh, q, k, v, grad_out, lse, delta, dq, dk, dv, stream);
  }
  launch_delta<float>(sh, out, grad_out, delta, stream);
  dispatch(tensor_cores, sh.e, [&]<class T, bool TC, int HD>() {
    backward<T, TC, HD>(sh, q, k, v, grad_out, lse, delta, deterministic, dq, dk, dv, stream);
  });
}

}  // namespace kiln::cuda

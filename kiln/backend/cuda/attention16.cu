// Fused attention kernels for float16 and bfloat16 (Note [16-bit fused attention]).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <cstring>
#include <type_traits>

#include "kiln/backend/cuda/attention.h"
#include "kiln/backend/cuda/attention_common.cuh"
#include "kiln/backend/cuda/loops.cuh"

namespace kiln::cuda {
namespace {

using attn::kLn2;
using attn::kLog2e;
using attn::visible;

// Note [16-bit fused attention]
// The float32 kernels (attention.cu) hold their tiles as float and multiply on TF32 tensor
// cores through wmma, whose fragment layout is opaque: the scores must pass through shared
// memory between the two products, and the 16-bit inputs gain nothing from being 16 bit. These
// kernels keep the tiles in the input's dtype and multiply with mma.sync m16n8k16 (16-bit
// inputs, float accumulation), whose register layout is specified by PTX, so that, as in
// FlashAttention-2:
//  - each warp owns 16 rows of the block's 64 and computes its 16 x 64 scores in registers;
//  - the softmax runs on those registers (a row is spread over the 4 lanes of a quad);
//  - an accumulator of two neighbouring 8-column tiles is, once rounded to the dtype, exactly
//    the A operand of the next product over those 16 columns (pack_a), so the probabilities
//    never leave the registers.
// Two warp-level products cover every pass: scores_abt (16 x 64 += A[16 rows] B^T, both
// row-major tiles of HD columns) and accumulate_pv (16 x HD += P B, P from registers, B a
// row-major 64 x HD tile, read transposed by ldmatrix.trans). Tiles are loaded with cp.async
// (16 bytes at a time, zero-filled past the ends) into double buffers, so the next step's tile
// arrives while this one multiplies; a row pitch of HD + 8 elements keeps ldmatrix free of bank
// conflicts. Rows whose layout cannot take 16-byte copies (head dims not a multiple of 8,
// unaligned views) are loaded element by element.
// The backward runs two kernels, as the float32 one under set_deterministic_algorithms: one
// per key tile for dk and dv (S^T = K Q^T, dP^T = V dO^T: keys are the rows), one per query
// tile for dq. dq then needs no atomics and no float32 scratch, and every run gives the same
// bits; the scores are computed twice, which costs less than the atomics did.
// The probabilities are rounded to the dtype before the product with V (as FlashAttention
// does); the row sums add the unrounded ones.

constexpr int kRows = 64;      // the rows a block owns: queries (forward, dq) or keys (dk, dv)
constexpr int kCols = 64;      // the columns one step walks: keys, or queries for dk and dv
constexpr int kThreads = 128;  // 4 warps of 16 rows

// Blocks an SM the backward kernels are compiled for (a register cap of 64K / (128 x blocks)):
// left alone, nvcc gave the head-dim-64 dk/dv kernel 172 registers, two blocks an SM instead
// of three.
template <int HD>
constexpr int backward_min_blocks() {
  return HD <= 64 ? 3 : 2;
}

template <int HD>
constexpr int pitch() {
  return HD + 8;  // elements per shared-memory row
}
template <int HD>
constexpr int tile_elems() {
  return kRows * pitch<HD>();
}

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ void cp_async16(uint32_t dst, const void* src, int src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src),
               "r"(src_bytes));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

// Rows [r0, r0 + 64) of `op`'s batch entry b into `tile` (64 x HD, pitch HD + 8); rows >= rows
// and columns >= e are zero. The 16-byte copies are asynchronous (cp_async_commit/wait).
template <class T, int HD>
__device__ void load_tile(T* tile, const AttnOperand& op, int64_t b, int64_t inner, int64_t r0,
                          int64_t rows, int e) {
  constexpr int P = pitch<HD>();
  const T* base = static_cast<const T*>(op.data) + (b / inner) * op.outer_stride +
                  (b % inner) * op.inner_stride;
  const int tid = static_cast<int>(threadIdx.x);
  if (e % 8 == 0 && op.row_stride % 8 == 0 && reinterpret_cast<uintptr_t>(base) % 16 == 0) {
    // Thread tid copies chunk tid % kPerRow of rows tid / kPerRow + i kRowStep: the
    // addresses of one step are an increment apart, computed once.
    constexpr int kPerRow = HD / 8, kRowStep = kThreads / kPerRow;
    static_assert(kRows % kRowStep == 0);
    const int r = tid / kPerRow, c = (tid % kPerRow) * 8;
    const T* src = base + (r0 + r) * op.row_stride + c;
    const int64_t src_step = kRowStep * op.row_stride;
    const uint32_t dst = smem_u32(tile + r * P + c);
    const int64_t left = rows - r0 - r;  // rows of this thread's first row on
#pragma unroll
    for (int i = 0; i < kRows / kRowStep; ++i) {
      const bool in = i * kRowStep < left && c < e;
      cp_async16(dst + i * kRowStep * P * 2, in ? src + i * src_step : base, in ? 16 : 0);
    }
    return;
  }
  for (int idx = tid; idx < kRows * HD; idx += kThreads) {
    const int r = idx / HD, c = idx % HD;
    const int64_t row = r0 + r;
    tile[r * P + c] = row < rows && c < e ? base[row * op.row_stride + c] : cvt<T>(0.f);
  }
}

// Starts the copies of the next step's tiles (load(), when there is a next step), waits for
// this step's, and then for every thread of the block: the double buffer's turn.
template <class Load>
__device__ __forceinline__ void next_step(bool has_next, Load&& load) {
  if (has_next) {
    load();
    cp_async_commit();
    cp_async_wait<1>();
  } else {
    cp_async_wait<0>();
  }
  __syncthreads();
}

__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

// c (16 x 8, float) += a (16 x 16) b (16 x 8).
template <class T>
__device__ __forceinline__ void mma16816(float (&c)[4], const uint32_t (&a)[4], uint32_t b0,
                                         uint32_t b1) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
        "{%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  } else {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
        "{%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
}

// Two floats as a register of two T, `lo` in the low half (the lower column).
static_assert(sizeof(__half) == 2 && sizeof(__nv_bfloat16) == 2);  // the 2-byte strides below

template <class T>
__device__ __forceinline__ uint32_t pack(float lo, float hi) {
  uint32_t r;
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    memcpy(&r, &v, sizeof r);
  } else {
    __half2 v = __floats2half2_rn(lo, hi);
    memcpy(&r, &v, sizeof r);
  }
  return r;
}

// Accumulator fragments: a warp's 16 x (8 N) floats as N tiles of 16 x 8. Lane (g = lane / 4,
// t = lane % 4) holds x[0], x[1] at row g, columns 2t, 2t + 1, and x[2], x[3] at row g + 8.
template <int N>
using Acc = float[N][4];

// s (16 x 64) += A[a_row .. a_row + 16) . B[0 .. 64)^T over HD columns; A and B are row-major
// tiles of pitch HD + 8.
template <class T, int HD>
__device__ __forceinline__ void scores_abt(Acc<8>& s, const T* A, int a_row, const T* B) {
  constexpr int P = pitch<HD>();
  const int lane = static_cast<int>(threadIdx.x) % 32;
  // ldmatrix: lanes 0-7 address the rows of matrix 0, 8-15 of matrix 1, and so on. Addresses
  // are shared-window bytes from one base a lane, the loops adding constants (which ptxas folds
  // into the instructions: per-load pointer arithmetic was most of the kernels' instructions).
  const uint32_t a_at =
      smem_u32(A) + ((a_row + (lane & 7) + ((lane >> 3) & 1) * 8) * P + (lane >> 4) * 8) * 2;
  const uint32_t b_at =
      smem_u32(B) + (((lane & 7) + (lane >> 4) * 8) * P + ((lane >> 3) & 1) * 8) * 2;
#pragma unroll
  for (int k = 0; k < HD; k += 16) {
    uint32_t a[4];
    ldmatrix_x4(a, a_at + k * 2);
#pragma unroll
    for (int n = 0; n < 4; ++n) {  // B rows 16n .. 16n + 15: two 8-column tiles of s
      uint32_t b[4];
      ldmatrix_x4(b, b_at + (n * 16 * P + k) * 2);
      mma16816<T>(s[2 * n], a, b[0], b[1]);
      mma16816<T>(s[2 * n + 1], a, b[2], b[3]);
    }
  }
}

// o (16 x HD) += p (16 x 64, registers, rounded to T) . B (64 x HD, row-major, pitch HD + 8).
template <class T, int HD>
__device__ __forceinline__ void accumulate_pv(Acc<HD / 8>& o, const Acc<8>& p, const T* B) {
  constexpr int P = pitch<HD>();
  const int lane = static_cast<int>(threadIdx.x) % 32;
  const uint32_t b_at =
      smem_u32(B) + (((lane & 7) + ((lane >> 3) & 1) * 8) * P + (lane >> 4) * 8) * 2;
#pragma unroll
  for (int k = 0; k < 4; ++k) {  // columns 16k .. 16k + 15 of p: its tiles 2k and 2k + 1
    const uint32_t a[4] = {pack<T>(p[2 * k][0], p[2 * k][1]), pack<T>(p[2 * k][2], p[2 * k][3]),
                           pack<T>(p[2 * k + 1][0], p[2 * k + 1][1]),
                           pack<T>(p[2 * k + 1][2], p[2 * k + 1][3])};
#pragma unroll
    for (int n = 0; n < HD / 16; ++n) {
      uint32_t b[4];
      ldmatrix_x4_trans(b, b_at + (k * 16 * P + n * 16) * 2);
      mma16816<T>(o[2 * n], a, b[0], b[1]);
      mma16816<T>(o[2 * n + 1], a, b[2], b[3]);
    }
  }
}

template <int N>
__device__ __forceinline__ void zero(Acc<N>& a) {
#pragma unroll
  for (int i = 0; i < N; ++i)
#pragma unroll
    for (int x = 0; x < 4; ++x) a[i][x] = 0.f;
}

// Writes a warp's 16 x HD accumulator, times row_scale[h] (h = 0: row g, 1: row g + 8), as rows
// [row0, row0 + 16) of dst ([rows, e] contiguous), skipping rows >= rows and columns >= e.
template <class T, int HD>
__device__ __forceinline__ void store_rows(T* dst, const Acc<HD / 8>& o, int64_t row0, int64_t rows,
                                           int e, const float (&row_scale)[2]) {
  const int lane = static_cast<int>(threadIdx.x) % 32, g = lane >> 2, t = lane & 3;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int64_t row = row0 + g + 8 * h;
    if (row >= rows) continue;
#pragma unroll
    for (int n = 0; n < HD / 8; ++n) {
      const int c = n * 8 + 2 * t;
      if (c < e) dst[row * e + c] = cvt<T>(o[n][2 * h] * row_scale[h]);
      if (c + 1 < e) dst[row * e + c + 1] = cvt<T>(o[n][2 * h + 1] * row_scale[h]);
    }
  }
}

// 2^x by the SFU's single instruction (ex2.approx.ftz: relative error about 2^-22, subnormal
// results flushed to 0, 2^-inf = 0). exp2f without fast math adds a range fix-up around it for
// subnormal results, several instructions on each of the 64 probabilities a lane computes per
// step; probabilities below 2^-126 are 0 for a 16-bit product anyway.
__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

__device__ __forceinline__ float quad_max(float x) {
  x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
  return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
}
__device__ __forceinline__ float quad_sum(float x) {
  x += __shfl_xor_sync(0xffffffffu, x, 1);
  return x + __shfl_xor_sync(0xffffffffu, x, 2);
}

// Grid: one block per (batch entry, query tile), the causal tiles with the most keys first.
// Shared memory: Q, then K and V twice (the step's and the next one's).
template <class T, int HD>
__global__ void __launch_bounds__(kThreads)
    flash16_forward_kernel(AttnShape sh, AttnOperand q, AttnOperand k, AttnOperand v, T* out,
                           float* lse) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  T* Qs = reinterpret_cast<T*>(smem_raw);
  // K and V of step st: buffer st % 2 (pointers computed, not indexed: no local memory).
  auto Ks = [&](int buf) { return Qs + (1 + buf) * tile_elems<HD>(); };
  auto Vs = [&](int buf) { return Qs + (3 + buf) * tile_elems<HD>(); };
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  const int g = lane >> 2, t = lane & 3;
  const int64_t tiles = (sh.l + kRows - 1) / kRows;
  const int64_t b = blockIdx.x / tiles;
  const int64_t q0 = (tiles - 1 - static_cast<int64_t>(blockIdx.x) % tiles) * kRows;
  const int64_t row0 = q0 + warp * 16;  // this warp's first query
  const int64_t kend = sh.causal && q0 + kRows < sh.s ? q0 + kRows : sh.s;
  const int64_t steps = (kend + kCols - 1) / kCols;
  load_tile<T, HD>(Qs, q, b, sh.inner, q0, sh.l, sh.e);
  load_tile<T, HD>(Ks(0), k, b, sh.inner, 0, sh.s, sh.e);
  load_tile<T, HD>(Vs(0), v, b, sh.inner, 0, sh.s, sh.e);
  cp_async_commit();
  const float scale2 = sh.scale * kLog2e;  // scores in base 2
  Acc<HD / 8> o;
  zero<HD / 8>(o);
  float m[2] = {-INFINITY, -INFINITY}, sum[2] = {0.f, 0.f};  // sum: this lane's columns only
  for (int64_t st = 0; st < steps; ++st) {
    const int cur = static_cast<int>(st & 1);
    next_step(st + 1 < steps, [&] {
      load_tile<T, HD>(Ks(cur ^ 1), k, b, sh.inner, (st + 1) * kCols, sh.s, sh.e);
      load_tile<T, HD>(Vs(cur ^ 1), v, b, sh.inner, (st + 1) * kCols, sh.s, sh.e);
    });
    const int64_t k0 = st * kCols;
    Acc<8> s;
    zero<8>(s);
    scores_abt<T, HD>(s, Qs, warp * 16, Ks(cur));
    const bool edge = k0 + kCols > sh.s || row0 + 16 > sh.l || (sh.causal && k0 + kCols > row0);
#pragma unroll
    for (int h = 0; h < 2; ++h) {  // online softmax in base 2 of row g + 8h
      const int64_t i = row0 + g + 8 * h;
      float mx = -INFINITY;
#pragma unroll
      for (int n = 0; n < 8; ++n)
#pragma unroll
        for (int x = 0; x < 2; ++x) {
          float& y = s[n][2 * h + x];
          y = edge && !visible(sh, i, k0 + n * 8 + 2 * t + x) ? -INFINITY : y * scale2;
          mx = fmaxf(mx, y);
        }
      const float m_new = fmaxf(m[h], quad_max(mx));
      const float base = m_new == -INFINITY ? 0.f : m_new;  // a padding row (i >= l)
      const float alpha = fast_exp2(m[h] - base);
      m[h] = m_new;
      float rs = 0.f;
#pragma unroll
      for (int n = 0; n < 8; ++n)
#pragma unroll
        for (int x = 0; x < 2; ++x) {
          float& y = s[n][2 * h + x];
          y = fast_exp2(y - base);
          rs += y;
        }
      sum[h] = sum[h] * alpha + rs;
#pragma unroll
      for (int n = 0; n < HD / 8; ++n) {
        o[n][2 * h] *= alpha;
        o[n][2 * h + 1] *= alpha;
      }
    }
    accumulate_pv<T, HD>(o, s, Vs(cur));
    __syncthreads();  // every warp is done with this step's K and V before they are refilled
  }
  float inv[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    sum[h] = quad_sum(sum[h]);
    inv[h] = sum[h] > 0.f ? 1.f / sum[h] : 0.f;
  }
  store_rows<T, HD>(out + b * sh.l * sh.e, o, row0, sh.l, sh.e, inv);
  if (t == 0) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int64_t i = row0 + g + 8 * h;
      if (i < sh.l) lse[b * sh.l + i] = (m[h] + log2f(sum[h])) * kLn2;
    }
  }
}

// Query statistics of queries [i0, i0 + 64) into shared memory: lse in base 2, and delta (0
// past the end).
__device__ __forceinline__ void load_stats(float* lse_s, float* del_s, const float* lse,
                                           const float* delta, const AttnShape& sh, int64_t b,
                                           int64_t i0) {
  const int tid = static_cast<int>(threadIdx.x);
  if (tid < kCols) {
    const int64_t i = i0 + tid;
    lse_s[tid] = i < sh.l ? lse[b * sh.l + i] * kLog2e : 0.f;
    del_s[tid] = i < sh.l ? delta[b * sh.l + i] : 0.f;
  }
}

// dk and dv of one key tile (a warp: 16 keys), over the query tiles that see it. With keys as
// rows: S^T = K Q^T, P^T = exp(S^T scale - lse), dP^T = V dO^T, dS^T = P^T (dP^T - delta)
// scale; dv += P^T dO, dk += dS^T Q. Shared memory: K, V, then Q, dO and the query statistics
// twice (this step's and the next one's).
template <class T, int HD>
__global__ void __launch_bounds__(kThreads, backward_min_blocks<HD>())
    flash16_backward_kv_kernel(AttnShape sh, AttnOperand q, AttnOperand k, AttnOperand v,
                               AttnOperand g, const float* lse, const float* delta, T* dk, T* dv) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  T* Ks = reinterpret_cast<T*>(smem_raw);
  T* Vs = Ks + tile_elems<HD>();
  auto Qs = [&](int buf) { return Ks + (2 + buf) * tile_elems<HD>(); };
  auto Gs = [&](int buf) { return Ks + (4 + buf) * tile_elems<HD>(); };
  float* stats = reinterpret_cast<float*>(Ks + 6 * tile_elems<HD>());
  auto lse_s = [&](int buf) { return stats + buf * 2 * kCols; };
  auto del_s = [&](int buf) { return stats + buf * 2 * kCols + kCols; };
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  const int gr = lane >> 2, t = lane & 3;
  const int64_t tiles = (sh.s + kRows - 1) / kRows;
  const int64_t b = blockIdx.x / tiles;
  const int64_t j0 = (static_cast<int64_t>(blockIdx.x) % tiles) * kRows;
  const int64_t row0 = j0 + warp * 16;  // this warp's first key
  const int64_t istart = sh.causal ? j0 : 0;
  const int64_t steps = istart < sh.l ? (sh.l - istart + kCols - 1) / kCols : 0;
  load_tile<T, HD>(Ks, k, b, sh.inner, j0, sh.s, sh.e);
  load_tile<T, HD>(Vs, v, b, sh.inner, j0, sh.s, sh.e);
  if (steps > 0) {
    load_tile<T, HD>(Qs(0), q, b, sh.inner, istart, sh.l, sh.e);
    load_tile<T, HD>(Gs(0), g, b, sh.inner, istart, sh.l, sh.e);
    load_stats(lse_s(0), del_s(0), lse, delta, sh, b, istart);
  }
  cp_async_commit();
  const float scale2 = sh.scale * kLog2e;
  Acc<HD / 8> acc_dk, acc_dv;
  zero<HD / 8>(acc_dk);
  zero<HD / 8>(acc_dv);
  for (int64_t st = 0; st < steps; ++st) {
    const int cur = static_cast<int>(st & 1);
    const int64_t i0 = istart + st * kCols;
    next_step(st + 1 < steps, [&] {
      load_tile<T, HD>(Qs(cur ^ 1), q, b, sh.inner, i0 + kCols, sh.l, sh.e);
      load_tile<T, HD>(Gs(cur ^ 1), g, b, sh.inner, i0 + kCols, sh.l, sh.e);
      load_stats(lse_s(cur ^ 1), del_s(cur ^ 1), lse, delta, sh, b, i0 + kCols);
    });
    Acc<8> p, ds;
    zero<8>(p);
    zero<8>(ds);
    scores_abt<T, HD>(p, Ks, warp * 16, Qs(cur));
    scores_abt<T, HD>(ds, Vs, warp * 16, Gs(cur));
#pragma unroll
    for (int n = 0; n < 8; ++n)
#pragma unroll
      for (int x = 0; x < 4; ++x) {
        const int col = n * 8 + 2 * t + (x & 1);  // the query
        const int64_t j = row0 + gr + 8 * (x >> 1);
        const float pr =
            visible(sh, i0 + col, j) ? fast_exp2(p[n][x] * scale2 - lse_s(cur)[col]) : 0.f;
        p[n][x] = pr;
        ds[n][x] = pr * (ds[n][x] - del_s(cur)[col]) * sh.scale;
      }
    accumulate_pv<T, HD>(acc_dv, p, Gs(cur));
    accumulate_pv<T, HD>(acc_dk, ds, Qs(cur));
    __syncthreads();  // every warp is done with this step's tiles before they are refilled
  }
  cp_async_wait<0>();  // no step: K and V were loaded and never waited for
  const float one[2] = {1.f, 1.f};
  store_rows<T, HD>(dk + b * sh.s * sh.e, acc_dk, row0, sh.s, sh.e, one);
  store_rows<T, HD>(dv + b * sh.s * sh.e, acc_dv, row0, sh.s, sh.e, one);
}

// dq of one query tile (a warp: 16 queries), over the key tiles it sees: S = Q K^T,
// dS = P (dO V^T - delta) scale, dq += dS K. Shared memory: Q, dO, then K and V twice.
template <class T, int HD>
__global__ void __launch_bounds__(kThreads, backward_min_blocks<HD>())
    flash16_backward_q_kernel(AttnShape sh, AttnOperand q, AttnOperand k, AttnOperand v,
                              AttnOperand g, const float* lse, const float* delta, T* dq) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  T* Qs = reinterpret_cast<T*>(smem_raw);
  T* Gs = Qs + tile_elems<HD>();
  auto Ks = [&](int buf) { return Qs + (2 + buf) * tile_elems<HD>(); };
  auto Vs = [&](int buf) { return Qs + (4 + buf) * tile_elems<HD>(); };
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  const int gr = lane >> 2, t = lane & 3;
  const int64_t tiles = (sh.l + kRows - 1) / kRows;
  const int64_t b = blockIdx.x / tiles;
  const int64_t i0 = (tiles - 1 - static_cast<int64_t>(blockIdx.x) % tiles) * kRows;
  const int64_t row0 = i0 + warp * 16;  // this warp's first query
  const int64_t kend = sh.causal && i0 + kRows < sh.s ? i0 + kRows : sh.s;
  const int64_t steps = (kend + kCols - 1) / kCols;
  load_tile<T, HD>(Qs, q, b, sh.inner, i0, sh.l, sh.e);
  load_tile<T, HD>(Gs, g, b, sh.inner, i0, sh.l, sh.e);
  load_tile<T, HD>(Ks(0), k, b, sh.inner, 0, sh.s, sh.e);
  load_tile<T, HD>(Vs(0), v, b, sh.inner, 0, sh.s, sh.e);
  cp_async_commit();
  float lse2[2], del[2];  // of rows g and g + 8
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int64_t i = row0 + gr + 8 * h;
    lse2[h] = i < sh.l ? lse[b * sh.l + i] * kLog2e : 0.f;
    del[h] = i < sh.l ? delta[b * sh.l + i] : 0.f;
  }
  const float scale2 = sh.scale * kLog2e;
  Acc<HD / 8> acc_dq;
  zero<HD / 8>(acc_dq);
  for (int64_t st = 0; st < steps; ++st) {
    const int cur = static_cast<int>(st & 1);
    const int64_t k0 = st * kCols;
    next_step(st + 1 < steps, [&] {
      load_tile<T, HD>(Ks(cur ^ 1), k, b, sh.inner, k0 + kCols, sh.s, sh.e);
      load_tile<T, HD>(Vs(cur ^ 1), v, b, sh.inner, k0 + kCols, sh.s, sh.e);
    });
    Acc<8> s, ds;
    zero<8>(s);
    zero<8>(ds);
    scores_abt<T, HD>(s, Qs, warp * 16, Ks(cur));
    scores_abt<T, HD>(ds, Gs, warp * 16, Vs(cur));
#pragma unroll
    for (int n = 0; n < 8; ++n)
#pragma unroll
      for (int x = 0; x < 4; ++x) {
        const int h = x >> 1;
        const int64_t i = row0 + gr + 8 * h, j = k0 + n * 8 + 2 * t + (x & 1);
        const float pr = visible(sh, i, j) ? fast_exp2(s[n][x] * scale2 - lse2[h]) : 0.f;
        ds[n][x] = pr * (ds[n][x] - del[h]) * sh.scale;
      }
    accumulate_pv<T, HD>(acc_dq, ds, Ks(cur));
    __syncthreads();
  }
  const float one[2] = {1.f, 1.f};
  store_rows<T, HD>(dq + b * sh.l * sh.e, acc_dq, row0, sh.l, sh.e, one);
}

template <int HD>
constexpr size_t forward_bytes() {
  return 5 * tile_elems<HD>() * 2;
}
template <int HD>
constexpr size_t backward_bytes() {
  return 6 * tile_elems<HD>() * 2 + 4 * kCols * sizeof(float);
}

template <class T, int HD>
void forward(const AttnShape& sh, const AttnOperand& q, const AttnOperand& k, const AttnOperand& v,
             void* out, float* lse, cudaStream_t st) {
  static std::atomic<bool> done[attn::kMaxDevices];
  auto kernel = flash16_forward_kernel<T, HD>;
  attn::allow_smem(kernel, forward_bytes<HD>(), done);
  kernel<<<attn::blocks_of(sh.n, sh.l, kRows), kThreads, forward_bytes<HD>(), st>>>(
      sh, q, k, v, static_cast<T*>(out), lse);
}

template <class T, int HD>
void backward(const AttnShape& sh, const AttnOperand& q, const AttnOperand& k, const AttnOperand& v,
              const AttnOperand& g, const float* lse, const float* delta, void* dq, void* dk,
              void* dv, cudaStream_t st) {
  static std::atomic<bool> done_kv[attn::kMaxDevices], done_q[attn::kMaxDevices];
  auto kv = flash16_backward_kv_kernel<T, HD>;
  auto qk = flash16_backward_q_kernel<T, HD>;
  attn::allow_smem(kv, backward_bytes<HD>(), done_kv);
  attn::allow_smem(qk, backward_bytes<HD>(), done_q);
  if (const unsigned blocks = attn::blocks_of(sh.n, sh.s, kRows); blocks > 0)
    kv<<<blocks, kThreads, backward_bytes<HD>(), st>>>(sh, q, k, v, g, lse, delta,
                                                       static_cast<T*>(dk), static_cast<T*>(dv));
  if (const unsigned blocks = attn::blocks_of(sh.n, sh.l, kRows); blocks > 0)
    qk<<<blocks, kThreads, backward_bytes<HD>(), st>>>(sh, q, k, v, g, lse, delta,
                                                       static_cast<T*>(dq));
}

// Calls f.template operator()<T, HD>() for the 16-bit dtype and the head dim.
template <class F>
void dispatch16(Dt dt, int e, F&& f) {
  auto by_hd = [&]<class T>() {
    if (e <= 64)
      f.template operator()<T, 64>();
    else
      f.template operator()<T, 128>();
  };
  if (dt == Dt::BFloat16)
    by_hd.template operator()<__nv_bfloat16>();
  else
    by_hd.template operator()<__half>();
}

}  // namespace

void launch_flash16_forward(Dt dt, const AttnShape& sh, const AttnOperand& q, const AttnOperand& k,
                            const AttnOperand& v, void* out, float* lse, cudaStream_t stream) {
  if (sh.l == 0) return;
  dispatch16(dt, sh.e, [&]<class T, int HD>() { forward<T, HD>(sh, q, k, v, out, lse, stream); });
}

void launch_flash16_backward(Dt dt, const AttnShape& sh, const AttnOperand& q, const AttnOperand& k,
                             const AttnOperand& v, const AttnOperand& grad_out, const float* lse,
                             const float* delta, void* dq, void* dk, void* dv,
                             cudaStream_t stream) {
  dispatch16(dt, sh.e, [&]<class T, int HD>() {
    backward<T, HD>(sh, q, k, v, grad_out, lse, delta, dq, dk, dv, stream);
  });
}

}  // namespace kiln::cuda

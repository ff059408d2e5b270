#pragma once
// Launchers of the CUDA indexing kernels: index_select (and embedding), gather, scatter_add,
// scatter_reduce, index_add, one_hot, triu/tril. Data pointers are device memory of contiguous
// tensors. A bad index value (seen only on the device) skips its write and sets *err to `code`
// (see error_word() in common.h). Internal to kiln/backend/cuda.
#include <cuda_runtime.h>

#include <cstdint>

#include "kiln/backend/cuda/kernel_args.h"

namespace kiln::cuda {

// Dims gather and scatter_add walk: the index's dims (innermost first, size-1 dims other than
// `d` dropped, neighbours merged where self's strides allow), self's strides over them, and
// `d`, whose coordinate is replaced by the index value (checked against `bound`).
inline constexpr int kMaxIndexDims = 16;
struct IndexGeom {
  int ndim = 0;
  int d = 0;
  int64_t numel = 0;
  int64_t bound = 0;
  int64_t sizes[kMaxIndexDims] = {};
  int64_t strides[kMaxIndexDims] = {};
};

// out (outer, k, inner) = self (outer, dim_size, inner) at the k indices `index` (int32/int64
// per `index_dt`) along the middle dim; any element dtype.
void launch_index_select(Dt dt, const void* self, Dt index_dt, const void* index, void* out,
                         int64_t outer, int64_t dim_size, int64_t k, int64_t inner, int* err,
                         int code, cudaStream_t stream);
// out[p] = self[coords of p with dim g.d replaced by index[p]]; out and index have g.numel
// elements.
void launch_gather(Dt dt, const void* self, const int64_t* index, void* out, const IndexGeom& g,
                   int* err, int code, cudaStream_t stream);
// acc[coords of p with dim g.d replaced by index[p]] = src[p] (a repeated position keeps one
// of its values, unspecified, as in ATen).
void launch_scatter(Dt dt, void* acc, const int64_t* index, const void* src, const IndexGeom& g,
                    int* err, int code, cudaStream_t stream);
// acc[coords of p with dim g.d replaced by index[p]] += src[p], atomically.
void launch_scatter_add(Dt dt, void* acc, const int64_t* index, const void* src, const IndexGeom& g,
                        int* err, int code, cudaStream_t stream);
// scatter_reduce (Note [scatter_reduce] in kiln/ops/scatter_meta.cpp) on acc, contiguous in the
// computing type `a_dt` (Float32, Float64 or Int64): where include_self is false, every written
// position first takes the reduction's identity; then acc[walk position of p] = reduce(acc, src[p])
// atomically (CAS loops for prod, amax and amin); for mean, `count` (int32, acc's numel, zeroed)
// counts the values and a last pass divides.
void launch_scatter_reduce(Dt a_dt, void* acc, const int64_t* index, const void* src, int* count,
                           int64_t acc_numel, const IndexGeom& g, int64_t reduce, bool include_self,
                           int* err, int code, cudaStream_t stream);
// acc (outer, dim_size, inner) at index[j] along the middle dim += alpha * source (outer, k,
// inner) at j, atomically; alpha is `alpha_f` for floating dtypes, `alpha_i` otherwise.
void launch_index_add(Dt dt, void* acc, Dt index_dt, const void* index, const void* source,
                      int64_t outer, int64_t dim_size, int64_t k, int64_t inner, double alpha_f,
                      int64_t alpha_i, int* err, int code, cudaStream_t stream);
// out (n, classes) int64 = 1 where the column is self[row] (self is n int64 values), else 0.
void launch_one_hot(const int64_t* self, int64_t* out, int64_t n, int64_t classes, int* err,
                    int code, cudaStream_t stream);
// The walk of index/index_put over the indexed shape (see Note [Advanced indexing] in
// kiln/ops/index_meta.cpp), innermost dim first: position p has coordinates c_r over `sizes`
// and reads (or writes) base[sum_r c_r * strides[r] + sum_k v_k * istride[k]], v_k =
// idx[k][sum_r c_r * bstrides[r]] wrapped when negative and checked against bound[k].
struct AdvIndexGeom {
  int ndim = 0;
  int nidx = 0;
  int64_t numel = 0;
  int64_t sizes[kMaxIndexDims] = {};
  int64_t strides[kMaxIndexDims] = {};
  int64_t bstrides[kMaxIndexDims] = {};
  const int64_t* idx[kMaxIndexDims] = {};
  int64_t bound[kMaxIndexDims] = {};
  int64_t istride[kMaxIndexDims] = {};
};
// out (g.numel elements, contiguous) = self at the walk.
void launch_index(Dt dt, const void* self, void* out, const AdvIndexGeom& g, int* err, int code,
                  cudaStream_t stream);
// dst at the walk = values[p] (accumulate: += atomically; see Note [index_put on CUDA]).
void launch_index_put(Dt dt, void* dst, const void* values, const AdvIndexGeom& g, bool accumulate,
                      int* err, int code, cudaStream_t stream);
// y = x (batch, rows, cols) with the elements outside the band zeroed: kept where
// col - row >= diagonal (upper) or col - row <= diagonal (lower).
void launch_tri(Dt dt, const void* x, void* y, int64_t batch, int64_t rows, int64_t cols,
                int64_t diagonal, bool upper, cudaStream_t stream);

}  // namespace kiln::cuda

#pragma once
// Launchers of the CUDA kernels of embedding_dense_backward (Note [Embedding gradients]) and
// embedding_bag (Note [embedding_bag]), both in kiln/ops/embedding_meta.cpp. Floating data is in
// the computing type (float, or double where `dbl`), indices and offsets int64, all contiguous
// device memory. A bad index or offset (seen only on the device) sets *err to its code.
// Internal to kiln/backend/cuda.
#include <cuda_runtime.h>

#include <cstdint>

namespace kiln::cuda {

// count[v] (int32, zeroed, num_weights entries) += 1 for each of the n indices in range.
void launch_embedding_counts(const int64_t* idx, int64_t n, int64_t num_weights, int* count,
                             cudaStream_t stream);
// acc [num_weights, D] (zeroed) row idx[i] += grad row i (n rows of D), times 1 / count[idx[i]]
// when count is given, for every idx[i] other than padding_idx; atomicAdd.
void launch_embedding_dense_backward(bool dbl, const void* grad, const int64_t* idx,
                                     const int* count, void* acc, int64_t n, int64_t D,
                                     int64_t num_weights, int64_t padding_idx, int* err, int code,
                                     cudaStream_t stream);

struct EmbeddingBagArgs {
  int64_t n = 0;        // indices
  int64_t bags = 0;     // B
  int64_t noffs = 0;    // offsets' length (B, or B + 1 with include_last_offset)
  int64_t weights = 0;  // V
  int64_t dim = 0;      // D
  int64_t mode = 0;     // 0 sum, 1 mean, 2 max
  int64_t padding_idx = -1;
  bool include_last = false;
};
// One thread per output element walks its bag in index order (no atomics). out [B, D];
// offset2bag [n], bag_size [B] and max_indices ([B, D] for max, else untouched) int64;
// psw null or n values.
void launch_embedding_bag(bool dbl, const void* weight, const int64_t* idx, const int64_t* offs,
                          const void* psw, void* out, int64_t* offset2bag, int64_t* bag_size,
                          int64_t* max_indices, const EmbeddingBagArgs& a, int* err, int bad_index,
                          int bad_offsets, cudaStream_t stream);

}  // namespace kiln::cuda

#pragma once
// embedding_bag's checks (Note [embedding_bag] in kiln/ops/embedding_meta.cpp), shared by its
// meta kernel and every backend's kernel. Internal to kiln/ops and the backends. (embedding's and
// embedding_dense_backward's meta functions are meta.h's, from the op list.)
#include "kiln/ops/meta.h"

namespace kiln::meta {

// What a valid embedding_bag call computes: `bags` rows of `dim` values, on `device`.
struct EmbeddingBagGeom {
  int64_t bags = 0;
  int64_t dim = 0;
  Device device;
};

// weight [V, D] floating; indices [N] and offsets [B] (B + 1 with include_last_offset, then at
// least 1) 1-D int64 or int32 of one dtype; mode 0 sum, 1 mean, 2 max; per_sample_weights
// undefined or [N] of weight's dtype, only with mode sum; sparse false; scale_grad_by_freq not
// with max. The offsets' values are checked by the kernels (they may live on the device).
EmbeddingBagGeom embedding_bag(const Tensor& weight, const Tensor& indices, const Tensor& offsets,
                               bool scale_grad_by_freq, int64_t mode, bool sparse,
                               const Tensor& per_sample_weights, bool include_last_offset,
                               int64_t padding_idx);

}  // namespace kiln::meta

// Meta functions of embedding, embedding_dense_backward and embedding_bag: ATen's checks, with
// the values, before any kernel writes; embedding_bag's meta kernel.
#include "kiln/ops/embedding_meta.h"

#include "kiln/ops/structured.h"

namespace kiln::meta {
namespace {

void check_index_dtype(const char* op, const Tensor& t, const char* arg) {
  KILN_CHECK_TYPE(t.dtype() == kInt64 || t.dtype() == kInt32,
                  "[{}] {} must be an int64 or int32 tensor, got {}", op, arg, t.dtype());
}
void check_not_sparse(const char* op, bool sparse) {
  KILN_CHECK(!sparse,
             "[{}] sparse=true asks for a sparse gradient of weight, and Kiln has no sparse "
             "tensors; pass sparse=false (the gradient is dense)",
             op);
}

}  // namespace

// Note [Embedding gradients]
// embedding(weight, indices, padding_idx, scale_grad_by_freq, sparse) reads rows of weight;
// padding_idx and scale_grad_by_freq only change its gradient, which is
// embedding_dense_backward(grad_output, indices, num_weights, padding_idx, scale_grad_by_freq):
// grad_output's row for each index is added into that index's row of a [num_weights, D] zero
// tensor, except where the index is padding_idx (a negative padding_idx matches none, as in
// ATen, which takes -1 for "none"), each times 1 / (how often its index occurs in indices) when
// scale_grad_by_freq. The sums are computed in float (double for float64) and rounded once.
// The CPU kernel adds the rows in index order (deterministic); the CUDA kernel adds them with
// atomicAdd, so the order, and the last bits of a row several indices share, vary from run to
// run (ATen's CUDA kernel sorts the indices instead). sparse=true would ask for a sparse
// gradient, which Kiln cannot represent: it is refused with that reason.
TensorSpec embedding(const Tensor& weight, const Tensor& indices, int64_t, bool, bool sparse) {
  check_defined("embedding", weight, "weight");
  check_defined("embedding", indices, "indices");
  KILN_CHECK(weight.dim() == 2, "[embedding] weight must be 2-D, got shape [{}]",
             fmt::join(weight.sizes(), ", "));
  check_index_dtype("embedding", indices, "indices");
  check_not_sparse("embedding", sparse);
  Shape out(indices.sizes());
  out.push_back(weight.size(1));
  return {out, weight.dtype(), common_device("embedding", {&weight, &indices})};
}

TensorSpec embedding_dense_backward(const Tensor& grad_output, const Tensor& indices,
                                    int64_t num_weights, int64_t, bool) {
  const char* op = "embedding_dense_backward";
  check_defined(op, grad_output, "grad_output");
  check_defined(op, indices, "indices");
  check_index_dtype(op, indices, "indices");
  KILN_CHECK_TYPE(is_floating(grad_output.dtype()),
                  "[{}] grad_output must be a floating-point tensor, got {}", op,
                  grad_output.dtype());
  KILN_CHECK(num_weights >= 0, "[{}] num_weights must be non-negative, got {}", op, num_weights);
  bool ok = grad_output.dim() == indices.dim() + 1;
  for (int64_t i = 0; ok && i < indices.dim(); ++i) ok = grad_output.size(i) == indices.size(i);
  KILN_CHECK(ok, "[{}] grad_output must have indices' shape [{}] and one more dim, got shape [{}]",
             op, fmt::join(indices.sizes(), ", "), fmt::join(grad_output.sizes(), ", "));
  return {Shape{num_weights, grad_output.size(-1)}, grad_output.dtype(),
          common_device(op, {&grad_output, &indices})};
}

// Note [embedding_bag]
// embedding_bag(weight [V, D], indices [N], offsets, scale_grad_by_freq, mode, sparse,
// per_sample_weights, include_last_offset, padding_idx) is ATen's _embedding_bag: bag b holds
// indices[offsets[b] .. offsets[b + 1]) (the last bag runs to N; with include_last_offset
// offsets has one more entry, which must be N). Its outputs, as ATen's:
//   - output [B, D]: per bag the sum (each row times per_sample_weights[i] when given), the mean
//     or the elementwise max of the rows at its indices; indices equal to padding_idx (negative:
//     none) are left out, and an empty bag gives zeros;
//   - offset2bag [N]: the bag of each index;
//   - bag_size [B]: the indices of each bag, padding_idx left out (the mean's divisor);
//   - max_indices: mode max [B, D], the index each max came from (the first of ties; 0 for an
//     empty bag); other modes zeros of bag_size's shape.
// The last three have indices' dtype. In mode sum ATen's CPU kernel leaves offset2bag empty and
// bag_size zero on its fast path, and max_indices of the other modes uninitialised: only what
// its backward reads is defined, so the op table compares those where ATen defines them.
// Offsets must start at 0, never decrease and stay within N (ATen checks the first and the
// last on the CPU; it does not check the order). Rows are summed in float (double for
// float64) in index order and rounded once, on every backend: the CUDA kernel runs one thread
// per output element over its bag, so no atomics and the same bits every run. The gradient
// (kiln/autograd/formulas.cpp) goes through embedding_dense_backward for sum and mean and a
// scatter_add at max_indices for max; per_sample_weights' is each row's dot with its bag's
// gradient. sparse=true is refused (Note [Embedding gradients]); so is scale_grad_by_freq with
// mode max, which torch.nn.functional.embedding_bag refuses too.
EmbeddingBagGeom embedding_bag(const Tensor& weight, const Tensor& indices, const Tensor& offsets,
                               bool scale_grad_by_freq, int64_t mode, bool sparse,
                               const Tensor& per_sample_weights, bool include_last_offset,
                               int64_t) {
  const char* op = "embedding_bag";
  check_defined(op, weight, "weight");
  check_defined(op, indices, "indices");
  check_defined(op, offsets, "offsets");
  KILN_CHECK(weight.dim() == 2, "[{}] weight must be 2-D, got shape [{}]", op,
             fmt::join(weight.sizes(), ", "));
  KILN_CHECK_TYPE(is_floating(weight.dtype()),
                  "[{}] weight must be a floating-point tensor, got {}", op, weight.dtype());
  KILN_CHECK(indices.dim() == 1, "[{}] indices must be 1-D, got shape [{}]", op,
             fmt::join(indices.sizes(), ", "));
  KILN_CHECK(offsets.dim() == 1, "[{}] offsets must be 1-D, got shape [{}]", op,
             fmt::join(offsets.sizes(), ", "));
  check_index_dtype(op, indices, "indices");
  check_index_dtype(op, offsets, "offsets");
  KILN_CHECK_TYPE(indices.dtype() == offsets.dtype(),
                  "[{}] indices and offsets must have one dtype, got {} and {}", op,
                  indices.dtype(), offsets.dtype());
  KILN_CHECK(mode >= 0 && mode <= 2, "[{}] mode must be 0 (sum), 1 (mean) or 2 (max), got {}", op,
             mode);
  check_not_sparse(op, sparse);
  KILN_CHECK(!(scale_grad_by_freq && mode == 2),
             "[{}] scale_grad_by_freq is not supported with mode 2 (max)", op);
  KILN_CHECK(!include_last_offset || offsets.size(0) >= 1,
             "[{}] with include_last_offset, offsets needs at least 1 entry, got 0", op);
  if (per_sample_weights.defined()) {
    KILN_CHECK(mode == 0,
               "[{}] per_sample_weights is only supported with mode 0 (sum), got mode {}", op,
               mode);
    KILN_CHECK_TYPE(per_sample_weights.dtype() == weight.dtype(),
                    "[{}] per_sample_weights dtype {} differs from weight {}", op,
                    per_sample_weights.dtype(), weight.dtype());
    KILN_CHECK(per_sample_weights.dim() == 1 && per_sample_weights.size(0) == indices.size(0),
               "[{}] per_sample_weights must have indices' shape [{}], got [{}]", op,
               indices.size(0), fmt::join(per_sample_weights.sizes(), ", "));
  }
  EmbeddingBagGeom g;
  g.bags = offsets.size(0) - (include_last_offset ? 1 : 0);
  g.dim = weight.size(1);
  g.device = per_sample_weights.defined()
                 ? common_device(op, {&weight, &indices, &offsets, &per_sample_weights})
                 : common_device(op, {&weight, &indices, &offsets});
  return g;
}

}  // namespace kiln::meta

namespace kiln {
namespace {

TensorQuad meta_embedding_bag(const Tensor& weight, const Tensor& indices, const Tensor& offsets,
                              bool scale, int64_t mode, bool sparse, const Tensor& psw,
                              bool include_last, int64_t padding_idx) {
  const meta::EmbeddingBagGeom g = meta::embedding_bag(weight, indices, offsets, scale, mode,
                                                       sparse, psw, include_last, padding_idx);
  const Device m(kMeta);
  Shape max_shape = mode == 2 ? Shape{g.bags, g.dim} : Shape{g.bags};
  const DType it = indices.dtype();
  return {detail::empty_tensor({g.bags, g.dim}, weight.dtype(), m),
          detail::empty_tensor({indices.size(0)}, it, m), detail::empty_tensor({g.bags}, it, m),
          detail::empty_tensor(max_shape, it, m)};
}

const bool registered = [] {
  using Sig = decltype(meta_embedding_bag);
  ops::op_embedding_bag.def.set_meta_raw(reinterpret_cast<void*>(&meta_embedding_bag));
  ops::op_embedding_bag.set_kernel(DispatchKey::Meta, static_cast<Sig*>(&meta_embedding_bag));
  return true;
}();

}  // namespace
}  // namespace kiln

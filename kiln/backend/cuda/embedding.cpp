// CUDA kernels of embedding_dense_backward and embedding_bag: host glue (Note [Embedding
// gradients] and Note [embedding_bag] in kiln/ops/embedding_meta.cpp). Operands are made
// contiguous in the computing type (float, double for float64) and the results cast once.
#include "kiln/backend/cuda/embedding.h"

#include "kiln/backend/cuda/common.h"
#include "kiln/ops/embedding_meta.h"
#include "kiln/ops/structured.h"

namespace kiln::cuda {
namespace {

DType acc_of(DType t) { return t == kFloat64 ? kFloat64 : kFloat32; }
Tensor on_device(const Tensor& t, DType dtype, Device device) {
  return contiguous_as(t.device() == device ? t : t.to(device), dtype);
}
void zero(const Tensor& t, cudaStream_t stream) {
  KILN_CUDA_CHECK(cudaMemsetAsync(t.impl()->data(), 0,
                                  static_cast<size_t>(t.numel()) * itemsize(t.dtype()), stream));
}

void embedding_dense_backward_impl(const Tensor& out, const Tensor& grad, const Tensor& indices,
                                   int64_t num_weights, int64_t padding_idx, bool scale) {
  static const int kBadIndex = error_code(
      "[embedding_dense_backward] an index is out of range [0, num_weights) (found on the "
      "device)");
  const DType a = acc_of(grad.dtype());
  const Device d = out.device();
  const int64_t n = indices.numel(), D = out.size(1);
  Tensor g = on_device(grad, a, d), idx = on_device(indices, kInt64, d);
  Tensor acc = empty_cuda(out.sizes(), a, d);
  cudaStream_t stream = stream_for(out);
  zero(acc, stream);
  Tensor count;
  if (scale) {
    count = empty_cuda({num_weights}, kInt32, d);
    zero(count, stream);
    launch_embedding_counts(static_cast<const int64_t*>(idx.impl()->data()), n, num_weights,
                            static_cast<int*>(count.impl()->data()), stream);
  }
  launch_embedding_dense_backward(
      a == kFloat64, g.impl()->data(), static_cast<const int64_t*>(idx.impl()->data()),
      scale ? static_cast<const int*>(count.impl()->data()) : nullptr, acc.impl()->data(), n, D,
      num_weights, padding_idx, error_word(d.index()), kBadIndex, stream);
  check_launch("embedding_dense_backward");
  copy_kernel(out, acc);
}

TensorQuad embedding_bag_kernel(const Tensor& weight, const Tensor& indices, const Tensor& offsets,
                                bool scale, int64_t mode, bool sparse, const Tensor& psw,
                                bool include_last, int64_t padding_idx) {
  static const int kBadIndex = error_code(
      "[embedding_bag] an index is out of range [0, num_embeddings) (found on the device)");
  static const int kBadOffsets = error_code(
      "[embedding_bag] offsets must start at 0, not decrease and stay within the number of "
      "indices (with include_last_offset, end at it) (found on the device)");
  const meta::EmbeddingBagGeom geo = meta::embedding_bag(weight, indices, offsets, scale, mode,
                                                         sparse, psw, include_last, padding_idx);
  const DType a = acc_of(weight.dtype());
  const Device d = geo.device;
  Tensor w = on_device(weight, a, d);
  Tensor idx = on_device(indices, kInt64, d), offs = on_device(offsets, kInt64, d);
  Tensor ps = psw.defined() ? on_device(psw, a, d) : Tensor();
  const int64_t n = indices.size(0);
  Tensor out = empty_cuda({geo.bags, geo.dim}, a, d);
  Tensor offset2bag = empty_cuda({n}, kInt64, d), bag_size = empty_cuda({geo.bags}, kInt64, d);
  Tensor max_indices =
      empty_cuda(mode == 2 ? Shape{geo.bags, geo.dim} : Shape{geo.bags}, kInt64, d);
  cudaStream_t stream = stream_for(out);
  zero(offset2bag, stream);
  zero(max_indices, stream);
  EmbeddingBagArgs args;
  args.n = n;
  args.bags = geo.bags;
  args.noffs = offsets.size(0);
  args.weights = weight.size(0);
  args.dim = geo.dim;
  args.mode = mode;
  args.padding_idx = padding_idx;
  args.include_last = include_last;
  launch_embedding_bag(
      a == kFloat64, w.impl()->data(), static_cast<const int64_t*>(idx.impl()->data()),
      static_cast<const int64_t*>(offs.impl()->data()), ps.defined() ? ps.impl()->data() : nullptr,
      out.impl()->data(), static_cast<int64_t*>(offset2bag.impl()->data()),
      static_cast<int64_t*>(bag_size.impl()->data()),
      static_cast<int64_t*>(max_indices.impl()->data()), args, error_word(d.index()), kBadIndex,
      kBadOffsets, stream);
  check_launch("embedding_bag");
  Tensor result = a == weight.dtype() ? out : contiguous_as(out, weight.dtype());
  // The auxiliary outputs in indices' dtype, as ATen's.
  const DType it = indices.dtype();
  return {result, contiguous_as(offset2bag, it), contiguous_as(bag_size, it),
          contiguous_as(max_indices, it)};
}

}  // namespace

KILN_CUDA_STRUCTURED(embedding_dense_backward, &embedding_dense_backward_impl);
KILN_CUDA_KERNELS(backend_kernel(ops::op_embedding_bag, &embedding_bag_kernel));

}  // namespace kiln::cuda

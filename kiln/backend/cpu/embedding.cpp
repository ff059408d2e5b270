// CPU kernels of embedding_dense_backward (Note [Embedding gradients]) and embedding_bag (Note
// [embedding_bag]), both in kiln/ops/embedding_meta.cpp: every index checked before anything is
// written, rows summed in float (double for float64) in index order, results cast once.
#include "kiln/backend/cpu/loops.h"
#include "kiln/ops/embedding_meta.h"
#include "kiln/ops/structured.h"

namespace kiln::cpu {
namespace {

DType acc_of(DType t) { return t == kFloat64 ? kFloat64 : kFloat32; }

template <class A>
void dense_backward(const Tensor& r, const Tensor& g, const std::vector<int64_t>& idx,
                    int64_t num_weights, int64_t padding_idx, bool scale) {
  const int64_t D = r.size(1);
  A* pr = static_cast<A*>(r.impl()->data());
  const A* pg = static_cast<const A*>(g.impl()->data());
  std::fill(pr, pr + num_weights * D, A(0));
  std::vector<int64_t> count(scale ? static_cast<size_t>(num_weights) : 0, 0);
  if (scale)
    for (int64_t v : idx) ++count[static_cast<size_t>(v)];
  for (size_t i = 0; i < idx.size(); ++i) {
    const int64_t v = idx[i];
    if (v == padding_idx) continue;
    const A s = scale ? A(1) / static_cast<A>(count[static_cast<size_t>(v)]) : A(1);
    A* row = pr + v * D;
    const A* gi = pg + static_cast<int64_t>(i) * D;
    for (int64_t j = 0; j < D; ++j) row[j] += scale ? gi[j] * s : gi[j];
  }
}

void embedding_dense_backward_impl(const Tensor& out, const Tensor& grad, const Tensor& indices,
                                   int64_t num_weights, int64_t padding_idx, bool scale) {
  std::vector<int64_t> idx =
      checked_indices("embedding_dense_backward", indices, num_weights, "an embedding table");
  const DType a = acc_of(grad.dtype());
  Tensor g = contiguous_as(grad, a);
  Tensor r = empty_cpu(out.sizes(), a);
  if (a == kFloat64)
    dense_backward<double>(r, g, idx, num_weights, padding_idx, scale);
  else
    dense_backward<float>(r, g, idx, num_weights, padding_idx, scale);
  copy_kernel(out, r);
}

// Bag b's indices are [start(b), end(b)): see Note [embedding_bag].
std::vector<int64_t> checked_offsets(const Tensor& offsets, int64_t n, bool include_last) {
  std::vector<int64_t> offs = offsets.to_vector<int64_t>();
  if (offs.empty()) return offs;
  KILN_CHECK(offs[0] == 0, "[embedding_bag] offsets[0] must be 0, got {}", offs[0]);
  for (size_t b = 1; b < offs.size(); ++b)
    KILN_CHECK(offs[b] >= offs[b - 1],
               "[embedding_bag] offsets must not decrease, got offsets[{}] = {} after {}", b,
               offs[b], offs[b - 1]);
  KILN_CHECK(offs.back() <= n,
             "[embedding_bag] offsets[-1] = {} is larger than the number of indices {}",
             offs.back(), n);
  KILN_CHECK(!include_last || offs.back() == n,
             "[embedding_bag] with include_last_offset, offsets[-1] must be the number of "
             "indices {}, got {}",
             n, offs.back());
  return offs;
}

template <class A>
void bag_run(const Tensor& out, const Tensor& w, const Tensor& psw, const std::vector<int64_t>& idx,
             const std::vector<int64_t>& offs, int64_t bags, int64_t mode, int64_t padding_idx,
             int64_t* offset2bag, int64_t* bag_size, int64_t* max_indices) {
  const int64_t D = w.size(1), N = static_cast<int64_t>(idx.size());
  const A* pw = static_cast<const A*>(w.impl()->data());
  const A* ps = psw.defined() ? static_cast<const A*>(psw.impl()->data()) : nullptr;
  A* po = static_cast<A*>(out.impl()->data());
  std::fill(po, po + bags * D, A(0));
  for (int64_t b = 0; b < bags; ++b) {
    const int64_t start = offs[static_cast<size_t>(b)];
    const int64_t end = b + 1 < static_cast<int64_t>(offs.size()) ? offs[b + 1] : N;
    A* row = po + b * D;
    int64_t count = 0;
    for (int64_t i = start; i < end; ++i) {
      offset2bag[i] = b;
      const int64_t v = idx[static_cast<size_t>(i)];
      if (v == padding_idx) continue;
      const A* wr = pw + v * D;
      if (mode == 2) {
        for (int64_t j = 0; j < D; ++j)
          if (count == 0 || wr[j] > row[j]) {
            row[j] = wr[j];
            max_indices[b * D + j] = v;
          }
      } else {
        const A s = ps ? ps[i] : A(1);
        for (int64_t j = 0; j < D; ++j) row[j] += ps ? wr[j] * s : wr[j];
      }
      ++count;
    }
    bag_size[b] = count;
    if (mode == 1 && count > 0)
      for (int64_t j = 0; j < D; ++j) row[j] /= static_cast<A>(count);
  }
}

TensorQuad embedding_bag_kernel(const Tensor& weight, const Tensor& indices, const Tensor& offsets,
                                bool scale, int64_t mode, bool sparse, const Tensor& psw,
                                bool include_last, int64_t padding_idx) {
  const meta::EmbeddingBagGeom g = meta::embedding_bag(weight, indices, offsets, scale, mode,
                                                       sparse, psw, include_last, padding_idx);
  const int64_t N = indices.size(0);
  std::vector<int64_t> idx =
      checked_indices("embedding_bag", indices, weight.size(0), "an embedding table");
  std::vector<int64_t> offs = checked_offsets(offsets, N, include_last);
  const DType a = acc_of(weight.dtype());
  Tensor w = contiguous_as(weight, a);
  Tensor ps = psw.defined() ? contiguous_as(psw, a) : Tensor();
  Tensor out = empty_cpu({g.bags, g.dim}, a);
  Tensor offset2bag = empty_cpu({N}, kInt64), bag_size = empty_cpu({g.bags}, kInt64);
  Tensor max_indices = empty_cpu(mode == 2 ? Shape{g.bags, g.dim} : Shape{g.bags}, kInt64);
  int64_t* pm = static_cast<int64_t*>(max_indices.impl()->data());
  std::fill(pm, pm + max_indices.numel(), int64_t{0});
  int64_t* po2b = static_cast<int64_t*>(offset2bag.impl()->data());
  std::fill(po2b, po2b + N, int64_t{0});
  int64_t* pbs = static_cast<int64_t*>(bag_size.impl()->data());
  if (a == kFloat64)
    bag_run<double>(out, w, ps, idx, offs, g.bags, mode, padding_idx, po2b, pbs, pm);
  else
    bag_run<float>(out, w, ps, idx, offs, g.bags, mode, padding_idx, po2b, pbs, pm);
  Tensor result = out;
  if (a != weight.dtype()) {
    result = empty_cpu(out.sizes(), weight.dtype());
    copy_kernel(result, out);
  }
  // The auxiliary outputs in indices' dtype, as ATen's.
  auto in_index_dtype = [&](const Tensor& t) {
    if (indices.dtype() == kInt64) return t;
    Tensor r = empty_cpu(t.sizes(), indices.dtype());
    copy_kernel(r, t);
    return r;
  };
  return {result, in_index_dtype(offset2bag), in_index_dtype(bag_size),
          in_index_dtype(max_indices)};
}

const bool registered = [] {
  constexpr auto K = DispatchKey::CPU;
  ops::op_embedding_bag.set_kernel(K, &embedding_bag_kernel);
  return true;
}();

KILN_REGISTER_STRUCTURED(embedding_dense_backward, DispatchKey::CPU,
                         &embedding_dense_backward_impl);

}  // namespace
}  // namespace kiln::cpu

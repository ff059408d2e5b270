// CPU kernels of cat, index_select, gather, scatter_add, index_add, triu/tril and one_hot.
#include "kiln/backend/cpu/loops.h"
#include "kiln/ops/ops.h"
#include "kiln/ops/scatter_operands.h"
#include "kiln/ops/structured.h"

namespace kiln::cpu {
namespace {

void cat_impl(const Tensor& out, const TensorList& ts, int64_t dim) {
  if (out.numel() == 0) return;
  int64_t d = wrap_dim(dim, out.dim(), "cat");
  int64_t offset = 0;
  for (const Tensor& t : ts) {
    if (t.dim() == 1 && t.numel() == 0) continue;
    int64_t n = t.sizes()[d];
    copy_kernel(ops::op_slice(out, d, offset, offset + n, 1), t);
    offset += n;
  }
  KILN_DEBUG_ASSERT(offset == out.sizes()[d], "[cat] the inputs fill {} of out's {} along dim {}",
                    offset, out.sizes()[d], d);
}

void index_select_impl(const Tensor& out, const Tensor& self, int64_t dim, const Tensor& index) {
  if (self.dim() == 0) {
    checked_indices("index_select", index, 1, "a 0-d tensor");
    copy_kernel(out, self);
    return;
  }
  int64_t d = wrap_dim(dim, self.dim(), "index_select");
  std::vector<int64_t> idx = checked_indices("index_select", index, self.sizes()[d], "dimension");
  for (size_t i = 0; i < idx.size(); ++i)
    copy_kernel(ops::op_select(out, d, static_cast<int64_t>(i)), ops::op_select(self, d, idx[i]));
}

// Visits every element of a contiguous tensor of `sizes`, giving its flat position and the
// offset of the same coordinates under `strides`, with dim `d`'s coordinate replaced by the
// index value at that position.
template <class F>
void for_each_indexed(IntArrayRef sizes, IntArrayRef strides, int64_t d,
                      const std::vector<int64_t>& idx, F f) {
  int64_t nd = static_cast<int64_t>(sizes.size());
  // See Note [Debug asserts] in kiln/core/error.h: one index value per position.
  KILN_DEBUG_ASSERT(static_cast<int64_t>(idx.size()) == checked_numel(sizes, "index"),
                    "[index] {} index values for sizes {}", idx.size(), sizes);
  Shape coord(static_cast<size_t>(nd), 0);
  for (size_t p = 0; p < idx.size(); ++p) {
    int64_t off = 0;
    for (int64_t k = 0; k < nd; ++k) off += (k == d ? idx[p] : coord[k]) * strides[k];
    f(static_cast<int64_t>(p), off);
    for (int64_t k = nd - 1; k >= 0; --k) {
      if (++coord[k] < sizes[k]) break;
      coord[k] = 0;
    }
  }
}

void gather_impl(const Tensor& out, const Tensor& self_in, int64_t dim, const Tensor& index_in) {
  // 0-d operands act as 1-d of size 1, as in PyTorch.
  Tensor self = self_in.dim() == 0 ? ops::op_view(self_in, {1}) : self_in;
  Tensor index = index_in.dim() == 0 ? ops::op_view(index_in, {1}) : index_in;
  int64_t d = wrap_dim(dim, self.dim(), "gather");
  std::vector<int64_t> idx = checked_indices("gather", index, self.sizes()[d], "dimension");
  KILN_DEBUG_ASSERT(out.numel() == index.numel() && index.dim() == self.dim(),
                    "[gather] out {} for index {} of self {}", out.sizes(), index.sizes(),
                    self.sizes());
  Tensor src = contiguous_as(self, self.dtype());
  Shape st = contiguous_strides(self.sizes());
  with_contiguous_result(out, self.dtype(), [&](const Tensor& y) {
    KILN_DISPATCH_TYPES(self.dtype(), "gather", [&] {
      const scalar_t* ps = static_cast<const scalar_t*>(src.impl()->data());
      scalar_t* py = static_cast<scalar_t*>(y.impl()->data());
      for_each_indexed(index.sizes(), st, d, idx, [&](int64_t p, int64_t off) { py[p] = ps[off]; });
    });
  });
}

void scatter_add_impl(const Tensor& out, const Tensor& self, int64_t dim, const Tensor& index,
                      const Tensor& src) {
  const meta::ScatterOperands o = meta::scatter_operands("scatter_add", self, dim, index, src);
  std::vector<int64_t> idx = checked_indices("scatter_add", index, o.bound, "dimension");
  Tensor acc = empty_cpu(self.sizes(), self.dtype());
  copy_kernel(acc, self);
  Tensor cs = contiguous_as(o.src, self.dtype());
  Shape st = contiguous_strides(o.self_sizes);
  KILN_DISPATCH_TYPES(self.dtype(), "scatter_add", [&] {
    using V = acc_t<scalar_t>;
    const scalar_t* ps = static_cast<const scalar_t*>(cs.impl()->data());
    scalar_t* pa = static_cast<scalar_t*>(acc.impl()->data());
    for_each_indexed(o.index_sizes, st, o.d, idx, [&](int64_t p, int64_t off) {
      pa[off] = static_cast<scalar_t>(static_cast<V>(pa[off]) + static_cast<V>(ps[p]));
    });
  });
  copy_kernel(out, acc);
}

void index_add_impl(const Tensor& out, const Tensor& self, int64_t dim, const Tensor& index,
                    const Tensor& source, const Scalar& alpha) {
  Tensor acc = empty_cpu(self.sizes(), self.dtype());
  copy_kernel(acc, self);
  if (self.dim() == 0) {
    std::vector<int64_t> idx = checked_indices("index_add", index, 1, "a 0-d tensor");
    Tensor flat = reshape(source, {-1});
    for (size_t i = 0; i < idx.size(); ++i) {
      Tensor sum = empty_cpu({}, self.dtype());
      ops::op_add_out(sum, acc, ops::op_select(flat, 0, static_cast<int64_t>(i)), alpha);
      copy_kernel(acc, sum);
    }
    copy_kernel(out, acc);
    return;
  }
  int64_t d = wrap_dim(dim, self.dim(), "index_add");
  std::vector<int64_t> idx = checked_indices("index_add", index, self.sizes()[d], "dimension");
  for (size_t i = 0; i < idx.size(); ++i) {
    Tensor dst = ops::op_select(acc, d, idx[i]);
    // dst += alpha * source[i]; a temporary keeps the update free of aliasing.
    Tensor upd = empty_cpu(dst.sizes(), self.dtype());
    ops::op_add_out(upd, dst, ops::op_select(source, d, static_cast<int64_t>(i)), alpha);
    copy_kernel(dst, upd);
  }
  copy_kernel(out, acc);
}

void tri_common(const Tensor& out, const Tensor& self, int64_t k, bool upper) {
  KILN_DEBUG_ASSERT(self.dim() >= 2, "[{}] self is {}-d", upper ? "triu" : "tril", self.dim());
  Tensor y = empty_cpu(self.sizes(), self.dtype());
  copy_kernel(y, self);
  int64_t R = self.sizes()[self.dim() - 2], C = self.sizes()[self.dim() - 1];
  int64_t batch = R * C == 0 ? 0 : self.numel() / (R * C);
  char* base = static_cast<char*>(y.impl()->data());
  size_t isz = self.itemsize();
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t i = 0; i < R; ++i)
      for (int64_t j = 0; j < C; ++j) {
        bool keep = upper ? (j - i >= k) : (j - i <= k);
        if (!keep) std::memset(base + ((b * R + i) * C + j) * isz, 0, isz);
      }
  copy_kernel(out, y);
}
void triu_impl(const Tensor& out, const Tensor& self, int64_t k) { tri_common(out, self, k, true); }
void tril_impl(const Tensor& out, const Tensor& self, int64_t k) {
  tri_common(out, self, k, false);
}

void one_hot_impl(const Tensor& out, const Tensor& self, int64_t num_classes) {
  std::vector<int64_t> idx = checked_indices("one_hot", self, num_classes, "num_classes");
  KILN_DEBUG_ASSERT(out.numel() == static_cast<int64_t>(idx.size()) * num_classes,
                    "[one_hot] out {} for {} indices of {} classes", out.sizes(), idx.size(),
                    num_classes);
  Tensor y = empty_cpu(out.sizes(), kInt64);
  int64_t* p = static_cast<int64_t*>(y.impl()->data());
  std::fill(p, p + y.numel(), 0);
  for (size_t i = 0; i < idx.size(); ++i) p[static_cast<int64_t>(i) * num_classes + idx[i]] = 1;
  copy_kernel(out, y);
}

constexpr auto K = DispatchKey::CPU;
KILN_REGISTER_STRUCTURED(cat, K, &cat_impl);
KILN_REGISTER_STRUCTURED(index_select, K, &index_select_impl);
KILN_REGISTER_STRUCTURED(gather, K, &gather_impl);
KILN_REGISTER_STRUCTURED(scatter_add, K, &scatter_add_impl);
KILN_REGISTER_STRUCTURED(index_add, K, &index_add_impl);
KILN_REGISTER_STRUCTURED(triu, K, &triu_impl);
KILN_REGISTER_STRUCTURED(tril, K, &tril_impl);
KILN_REGISTER_STRUCTURED(one_hot, K, &one_hot_impl);

}  // namespace
}  // namespace kiln::cpu

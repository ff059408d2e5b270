// CUDA kernels of cat, index_select, gather, scatter, scatter_add, scatter_reduce, index_add,
// select_scatter, slice_scatter, triu/tril and one_hot: host glue. Index values live on the
// device, so the kernels check them (see index.h).
#include <vector>

#include "kiln/backend/cuda/common.h"
#include "kiln/backend/cuda/index.h"
#include "kiln/ops/index_meta.h"
#include "kiln/ops/scatter_operands.h"

namespace kiln::cuda {
namespace {

int* err_word_of(const Tensor& out) { return error_word(out.device().index()); }

// `t` on `device` (a 0-d cpu operand is copied over), contiguous in `dtype`.
Tensor device_contiguous(const Tensor& t, DType dtype, Device device) {
  return contiguous_as(t.device() == device ? t : t.to(device), dtype);
}

// A contiguous shape seen as (outer, size, inner) around dim d.
struct Split {
  int64_t outer = 1, size = 1, inner = 1;
};
Split split_at(IntArrayRef sizes, int64_t d) {
  Split s;
  for (int64_t k = 0; k < static_cast<int64_t>(sizes.size()); ++k) {
    if (k < d) s.outer *= sizes[k];
    if (k > d) s.inner *= sizes[k];
  }
  s.size = sizes[d];
  return s;
}

// The walk of gather/scatter_add over the index's dims, reading self at its contiguous
// strides; dims other than d of size 1 drop out and neighbours merge where the strides allow.
IndexGeom make_geom(const char* op, IntArrayRef index_sizes, IntArrayRef self_sizes, int64_t d,
                    int64_t bound) {
  int64_t nd = static_cast<int64_t>(self_sizes.size());
  std::vector<int64_t> self_strides(static_cast<size_t>(nd));
  int64_t st = 1;
  for (int64_t k = nd - 1; k >= 0; --k) {
    self_strides[k] = st;
    st *= self_sizes[k];
  }
  std::vector<int64_t> sizes, strides;  // outermost first
  int64_t dpos = -1, numel = 1;
  for (int64_t k = 0; k < nd; ++k) {
    int64_t s = index_sizes[k];
    numel *= s;
    if (k != d && s == 1) continue;
    bool merge = k != d && !sizes.empty() && static_cast<int64_t>(sizes.size()) - 1 != dpos &&
                 strides.back() == self_strides[k] * s;
    if (merge) {
      sizes.back() *= s;
      strides.back() = self_strides[k];
      continue;
    }
    if (k == d) dpos = static_cast<int64_t>(sizes.size());
    sizes.push_back(s);
    strides.push_back(self_strides[k]);
  }
  int n = static_cast<int>(sizes.size());
  KILN_CHECK(n <= kMaxIndexDims,
             "[{}] index of shape [{}] walks {} dims that cannot be merged (at most {} on cuda)",
             op, fmt::join(index_sizes, ", "), n, kMaxIndexDims);
  IndexGeom g;
  g.ndim = n;
  g.d = n - 1 - static_cast<int>(dpos);
  g.numel = numel;
  g.bound = bound;
  for (int i = 0; i < n; ++i) {
    g.sizes[i] = sizes[static_cast<size_t>(n - 1 - i)];
    g.strides[i] = strides[static_cast<size_t>(n - 1 - i)];
  }
  return g;
}

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
}

void index_select_impl(const Tensor& out, const Tensor& self, int64_t dim, const Tensor& index) {
  static const int kBadIndex =
      error_code("[index_select] an index is out of range [0, size of dim) (found on the device)");
  // A 0-d self acts as (1, 1, 1), taking its one index (which must be 0).
  Split s =
      self.dim() == 0 ? Split{} : split_at(self.sizes(), wrap_dim(dim, self.dim(), "index_select"));
  Tensor cs = device_contiguous(self, self.dtype(), out.device());
  Tensor ci = device_contiguous(index, index.dtype(), out.device());
  // See Note [Debug asserts] in kiln/core/error.h: the launchers take int32 or int64 indices.
  KILN_DEBUG_ASSERT(index.dtype() == kInt64 || index.dtype() == kInt32,
                    "[index_select] index is {}", index.dtype());
  KILN_DEBUG_ASSERT(fits_grid(out.numel()), "[index_select] {} elements", out.numel());
  with_result(out, self.dtype(), true, [&](const Tensor& r) {
    launch_index_select(dt(self.dtype()), cs.impl()->data(), dt(index.dtype()), ci.impl()->data(),
                        r.impl()->data(), s.outer, s.size, index.numel(), s.inner, err_word_of(out),
                        kBadIndex, stream_for(out));
    check_launch("index_select");
  });
}

void gather_impl(const Tensor& out, const Tensor& self, int64_t dim, const Tensor& index) {
  static const int kBadIndex =
      error_code("[gather] an index is out of range [0, size of dim) (found on the device)");
  // 0-d operands act as 1-d of size 1, as in PyTorch.
  const std::vector<int64_t> one{1};
  int64_t d = wrap_dim(dim, self.dim(), "gather");
  IntArrayRef self_sizes = self.dim() == 0 ? IntArrayRef(one) : self.sizes();
  IntArrayRef index_sizes = index.dim() == 0 ? IntArrayRef(one) : index.sizes();
  IndexGeom g = make_geom("gather", index_sizes, self_sizes, d, self_sizes[d]);
  Tensor cs = device_contiguous(self, self.dtype(), out.device());
  Tensor ci = device_contiguous(index, kInt64, out.device());
  with_result(out, self.dtype(), true, [&](const Tensor& r) {
    launch_gather(dt(self.dtype()), cs.impl()->data(),
                  static_cast<const int64_t*>(ci.impl()->data()), r.impl()->data(), g,
                  err_word_of(out), kBadIndex, stream_for(out));
    check_launch("gather");
  });
}

void scatter_add_impl(const Tensor& out, const Tensor& self, int64_t dim, const Tensor& index,
                      const Tensor& src) {
  static const int kBadIndex =
      error_code("[scatter_add] an index is out of range [0, size of dim) (found on the device)");
  const meta::ScatterOperands o = meta::scatter_operands("scatter_add", self, dim, index, src);
  IndexGeom g = make_geom("scatter_add", o.index_sizes, o.self_sizes, o.d, o.bound);
  Tensor cs = device_contiguous(o.src, self.dtype(), out.device());
  Tensor ci = device_contiguous(index, kInt64, out.device());
  with_result(out, self.dtype(), true, [&](const Tensor& r) {
    copy_kernel(r, self);
    launch_scatter_add(dt(self.dtype()), r.impl()->data(),
                       static_cast<const int64_t*>(ci.impl()->data()), cs.impl()->data(), g,
                       err_word_of(out), kBadIndex, stream_for(out));
    check_launch("scatter_add");
  });
}

void scatter_impl(const Tensor& out, const Tensor& self, int64_t dim, const Tensor& index,
                  const Tensor& src) {
  static const int kBadIndex =
      error_code("[scatter] an index is out of range [0, size of dim) (found on the device)");
  const meta::ScatterOperands o = meta::scatter_operands("scatter", self, dim, index, src);
  IndexGeom g = make_geom("scatter", o.index_sizes, o.self_sizes, o.d, o.bound);
  Tensor cs = device_contiguous(o.src, self.dtype(), out.device());
  Tensor ci = device_contiguous(index, kInt64, out.device());
  with_result(out, self.dtype(), true, [&](const Tensor& r) {
    copy_kernel(r, self);
    launch_scatter(dt(self.dtype()), r.impl()->data(),
                   static_cast<const int64_t*>(ci.impl()->data()), cs.impl()->data(), g,
                   err_word_of(out), kBadIndex, stream_for(out));
    check_launch("scatter");
  });
}

// See Note [scatter_reduce] in kiln/ops/scatter_meta.cpp: computed in float, double or int64 on
// a copy of self, cast once into out.
void scatter_reduce_impl(const Tensor& out, const Tensor& self, int64_t dim, const Tensor& index,
                         const Tensor& src, int64_t reduce, bool include_self) {
  static const int kBadIndex = error_code(
      "[scatter_reduce] an index is out of range [0, size of dim) (found on the device)");
  const meta::ScatterOperands o = meta::scatter_operands("scatter_reduce", self, dim, index, src);
  IndexGeom g = make_geom("scatter_reduce", o.index_sizes, o.self_sizes, o.d, o.bound);
  const DType a = self.dtype() == kFloat64    ? kFloat64
                  : is_floating(self.dtype()) ? kFloat32
                                              : kInt64;
  Tensor cs = device_contiguous(o.src, a, out.device());
  Tensor ci = device_contiguous(index, kInt64, out.device());
  Tensor acc = empty_cuda(self.sizes(), a, out.device());
  copy_kernel(acc, self);
  cudaStream_t stream = stream_for(out);
  Tensor count;
  if (reduce == 2) {
    count = empty_cuda(self.sizes(), kInt32, out.device());
    KILN_CUDA_CHECK(
        cudaMemsetAsync(count.impl()->data(), 0, static_cast<size_t>(count.numel()) * 4, stream));
  }
  launch_scatter_reduce(dt(a), acc.impl()->data(), static_cast<const int64_t*>(ci.impl()->data()),
                        cs.impl()->data(),
                        count.defined() ? static_cast<int*>(count.impl()->data()) : nullptr,
                        acc.numel(), g, reduce, include_self, err_word_of(out), kBadIndex, stream);
  check_launch("scatter_reduce");
  copy_kernel(out, acc);
}

void select_scatter_impl(const Tensor& out, const Tensor& self, const Tensor& src, int64_t dim,
                         int64_t index) {
  meta::select_scatter_by(&copy_kernel, out, self, src, dim, index);
}

void slice_scatter_impl(const Tensor& out, const Tensor& self, const Tensor& src, int64_t dim,
                        const OptInt& start, const OptInt& end, int64_t step) {
  meta::slice_scatter_by(&copy_kernel, out, self, src, dim, start, end, step);
}

void index_add_impl(const Tensor& out, const Tensor& self, int64_t dim, const Tensor& index,
                    const Tensor& source, const Scalar& alpha) {
  static const int kBadIndex =
      error_code("[index_add] an index is out of range [0, size of dim) (found on the device)");
  // A 0-d self acts as (1, 1, 1); source then holds one value per index, in any shape.
  Split s =
      self.dim() == 0 ? Split{} : split_at(self.sizes(), wrap_dim(dim, self.dim(), "index_add"));
  Tensor cs = device_contiguous(source, self.dtype(), out.device());
  Tensor ci = device_contiguous(index, index.dtype(), out.device());
  KILN_DEBUG_ASSERT(index.dtype() == kInt64 || index.dtype() == kInt32, "[index_add] index is {}",
                    index.dtype());
  KILN_DEBUG_ASSERT(fits_grid(source.numel()), "[index_add] {} elements", source.numel());
  with_result(out, self.dtype(), true, [&](const Tensor& r) {
    copy_kernel(r, self);
    launch_index_add(dt(self.dtype()), r.impl()->data(), dt(index.dtype()), ci.impl()->data(),
                     cs.impl()->data(), s.outer, s.size, index.numel(), s.inner, alpha.to_double(),
                     alpha.to_int(), err_word_of(out), kBadIndex, stream_for(out));
    check_launch("index_add");
  });
}

void tri_common(const Tensor& out, const Tensor& self, int64_t k, bool upper) {
  KILN_DEBUG_ASSERT(self.dim() >= 2 && fits_grid(self.numel()), "[{}] self {}",
                    upper ? "triu" : "tril", self.sizes());
  int64_t rows = self.sizes()[self.dim() - 2], cols = self.sizes()[self.dim() - 1];
  int64_t batch = rows * cols == 0 ? 0 : self.numel() / (rows * cols);
  Tensor cx = contiguous_as(self, self.dtype());
  with_result(out, self.dtype(), true, [&](const Tensor& r) {
    launch_tri(dt(self.dtype()), cx.impl()->data(), r.impl()->data(), batch, rows, cols, k, upper,
               stream_for(out));
    check_launch(upper ? "triu" : "tril");
  });
}
void triu_impl(const Tensor& out, const Tensor& self, int64_t k) { tri_common(out, self, k, true); }
void tril_impl(const Tensor& out, const Tensor& self, int64_t k) {
  tri_common(out, self, k, false);
}

// num_classes is known here: kiln::one_hot reads the max index on the host when given -1.
void one_hot_impl(const Tensor& out, const Tensor& self, int64_t num_classes) {
  static const int kBadIndex =
      error_code("[one_hot] a class index is out of range [0, num_classes) (found on the device)");
  Tensor cs = contiguous_as(self, kInt64);
  with_result(out, kInt64, true, [&](const Tensor& r) {
    launch_one_hot(static_cast<const int64_t*>(cs.impl()->data()),
                   static_cast<int64_t*>(r.impl()->data()), self.numel(), num_classes,
                   err_word_of(out), kBadIndex, stream_for(out));
    check_launch("one_hot");
  });
}

}  // namespace

KILN_CUDA_STRUCTURED(cat, &cat_impl);
KILN_CUDA_STRUCTURED(index_select, &index_select_impl);
KILN_CUDA_STRUCTURED(gather, &gather_impl);
KILN_CUDA_STRUCTURED(scatter_add, &scatter_add_impl);
KILN_CUDA_STRUCTURED(index_add, &index_add_impl);
KILN_CUDA_STRUCTURED(scatter, &scatter_impl);
KILN_CUDA_STRUCTURED(scatter_reduce, &scatter_reduce_impl);
KILN_CUDA_STRUCTURED(select_scatter, &select_scatter_impl);
KILN_CUDA_STRUCTURED(slice_scatter, &slice_scatter_impl);
KILN_CUDA_STRUCTURED(triu, &triu_impl);
KILN_CUDA_STRUCTURED(tril, &tril_impl);
KILN_CUDA_STRUCTURED(one_hot, &one_hot_impl);

}  // namespace kiln::cuda

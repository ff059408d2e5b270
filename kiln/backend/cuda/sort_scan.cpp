// Host glue of the CUDA kernels of sort, topk, cumsum and prod (sort_scan.h): each moves the
// dim of interest innermost (a copy unless it already is), runs the rows there, and copies the
// rows back into the result's layout, as the CPU kernels do (kiln/backend/cpu/sort_scan.cpp).
#include "kiln/backend/cuda/sort_scan.h"
#include "kiln/backend/cuda/common.h"
#include "kiln/ops/other_meta.h"
#include "kiln/ops/structured.h"

namespace kiln::cuda {
namespace {

Shape dim_last(int64_t ndim, int64_t d) {
  Shape perm;
  for (int64_t i = 0; i < ndim; ++i)
    if (i != d) perm.push_back(i);
  if (ndim > 0) perm.push_back(d);
  return perm;
}
Tensor workspace(size_t bytes, Device device) {
  return bytes ? empty_cuda({static_cast<int64_t>(bytes)}, kUInt8, device) : Tensor();
}
void* data_of(const Tensor& t) { return t.defined() ? t.impl()->data() : nullptr; }

// topk is the first k of a stable sort (Note [topk order] in kiln/ops/sort_meta.cpp): the whole
// row is sorted by CUB's segmented sort and cut to k.
TensorPair sort_topk(const char* op, const Tensor& self, const TensorSpec& s, int64_t d, int64_t k,
                     bool descending) {
  Tensor values = empty_cuda(s.sizes, s.dtype, s.device);
  Tensor indices = empty_cuda(s.sizes, kInt64, s.device);
  if (values.numel() == 0) return {values, indices};
  const int64_t nd = self.dim(), n = nd == 0 ? 1 : self.sizes()[d], rows = self.numel() / n;
  Shape perm = dim_last(nd, d);
  Tensor x = contiguous_as(ops::op_permute(self, perm), self.dtype());
  Tensor v = empty_cuda(x.sizes(), s.dtype, s.device);
  Tensor ix = empty_cuda(x.sizes(), kInt64, s.device);
  Tensor ws = workspace(sort_workspace_bytes(dt(self.dtype()), rows, n), s.device);
  launch_sort(dt(self.dtype()), data_of(x), data_of(v), static_cast<int64_t*>(data_of(ix)), rows, n,
              descending, data_of(ws), stream_for(self));
  check_launch(op);
  if (nd == 0) {
    copy_kernel(values, v);
    copy_kernel(indices, ix);
  } else {
    copy_kernel(ops::op_permute(values, perm), ops::op_slice(v, nd - 1, 0, k, 1));
    copy_kernel(ops::op_permute(indices, perm), ops::op_slice(ix, nd - 1, 0, k, 1));
  }
  return {values, indices};
}
TensorPair sort_kernel(const Tensor& self, int64_t dim, bool descending) {
  TensorSpec s = meta::sort(self, dim, descending);
  int64_t d = wrap_dim(dim, self.dim(), "sort");
  return sort_topk("sort", self, s, d, self.dim() == 0 ? 1 : self.sizes()[d], descending);
}
TensorPair topk_kernel(const Tensor& self, int64_t k, int64_t dim, bool largest, bool sorted) {
  TensorSpec s = meta::topk(self, k, dim, largest, sorted);
  return sort_topk("topk", self, s, wrap_dim(dim, self.dim(), "topk"), k, largest);
}

// The accumulator of cumsum and prod on CUDA: float for the 16-bit floats and float32,
// double for float64, int64 for integers (ATen's CUDA acc types). The input is cast to the
// result's dtype first, then to the accumulator.
DType accumulator(DType out) {
  if (!is_floating(out)) return kInt64;
  return out == kFloat64 ? kFloat64 : kFloat32;
}

void cumsum_impl(const Tensor& out, const Tensor& self, int64_t dim, const OptDType&) {
  int64_t d = wrap_dim(dim, self.dim(), "cumsum");
  if (self.numel() == 0) return;
  const int64_t nd = self.dim(), n = nd == 0 ? 1 : self.sizes()[d], rows = self.numel() / n;
  DType acc = accumulator(out.dtype());
  Shape perm = dim_last(nd, d);
  Tensor x = contiguous_as(as_dtype(ops::op_permute(self, perm), out.dtype()), acc);
  Tensor y = empty_cuda(x.sizes(), acc, self.device());
  Tensor ws = workspace(cumsum_workspace_bytes(dt(acc), rows, n), self.device());
  launch_cumsum(dt(acc), data_of(x), data_of(y), rows, n, data_of(ws), stream_for(self));
  check_launch("cumsum");
  copy_kernel(ops::op_permute(out, perm), y);
}

void prod_impl(const Tensor& out, const Tensor& self, const OptInt& dim, bool, const OptDType&) {
  if (out.numel() == 0) return;
  DType acc = accumulator(out.dtype());
  int64_t n = self.numel();
  Tensor x;
  if (dim && self.dim() > 0) {
    int64_t d = wrap_dim(*dim, self.dim(), "prod");
    n = self.sizes()[d];
    x = contiguous_as(as_dtype(ops::op_permute(self, dim_last(self.dim(), d)), out.dtype()), acc);
  } else {
    if (dim) (void)wrap_dim(*dim, 0, "prod");
    x = contiguous_as(as_dtype(self, out.dtype()), acc);
  }
  const int64_t rows = out.numel();
  Tensor y = empty_cuda(out.sizes(), acc, self.device());
  Tensor ws = workspace(prod_workspace_bytes(dt(acc), rows, n), self.device());
  launch_prod(dt(acc), data_of(x), data_of(y), rows, n, data_of(ws), stream_for(self));
  check_launch("prod");
  copy_kernel(out, y);
}

}  // namespace

KILN_CUDA_STRUCTURED(cumsum, &cumsum_impl);
KILN_CUDA_STRUCTURED(prod, &prod_impl);
KILN_CUDA_KERNELS(::kiln::backend_kernel(ops::op_sort, &sort_kernel),
                  ::kiln::backend_kernel(ops::op_topk, &topk_kernel));

}  // namespace kiln::cuda

// Meta functions of sort, topk, cumsum and prod, and the meta-device kernels of sort and topk
// (cumsum's and prod's come from KILN_FORALL_STRUCTURED in meta_structured.cpp).
#include "kiln/ops/other_meta.h"
#include "kiln/ops/structured.h"

namespace kiln::meta {

// Note [topk order]
// topk returns the k largest (smallest) elements of each slice in sorted order whatever
// `sorted` says (ATen leaves the order unspecified when it is false, so sorted is one valid
// answer), and ties go to the lower index: its result is exactly the first k of a stable sort
// of the slice (descending for largest), on every backend. NaN counts as the largest value, as
// in ATen's sort and topk.

namespace {
int64_t slice_length(const Tensor& self, int64_t d) {
  return self.dim() == 0 ? 1 : self.sizes()[d];
}
}  // namespace

TensorSpec sort(const Tensor& self, int64_t dim, bool) {
  check_defined("sort", self, "self");
  (void)wrap_dim(dim, self.dim(), "sort");
  return {Shape(self.sizes()), self.dtype(), self.device()};
}

TensorSpec topk(const Tensor& self, int64_t k, int64_t dim, bool, bool) {
  check_defined("topk", self, "self");
  int64_t d = wrap_dim(dim, self.dim(), "topk");
  int64_t n = slice_length(self, d);
  KILN_CHECK_INDEX(k >= 0 && k <= n, "[topk] k ({}) is out of range for dim {} of size {}", k, d,
                   n);
  KILN_CHECK_INDEX(self.dim() > 0 || k == 1,
                   "[topk] k ({}) must be 1 for a 0-d tensor (its result has one element)", k);
  Shape sizes(self.sizes());
  if (self.dim() > 0) sizes[d] = k;
  return {sizes, self.dtype(), self.device()};
}

// cumsum and prod: integer and bool inputs accumulate in int64 unless dtype= says otherwise,
// as ATen (the input is cast to that dtype first). A bool accumulator is refused.
namespace {
DType accumulating_dtype(const Tensor& self, const OptDType& dtype) {
  if (dtype) return *dtype;
  return is_floating(self.dtype()) ? self.dtype() : kInt64;
}
}  // namespace

TensorSpec cumsum(const Tensor& self, int64_t dim, const OptDType& dtype) {
  check_defined("cumsum", self, "self");
  (void)wrap_dim(dim, self.dim(), "cumsum");
  DType t = accumulating_dtype(self, dtype);
  KILN_CHECK_TYPE(t != kBool, "[cumsum] dtype bool is not supported (input {})", self.dtype());
  return {Shape(self.sizes()), t, self.device()};
}

TensorSpec prod(const Tensor& self, const OptInt& dim, bool keepdim, const OptDType& dtype) {
  check_defined("prod", self, "self");
  DType t = accumulating_dtype(self, dtype);
  KILN_CHECK_TYPE(t != kBool, "[prod] dtype bool is not supported (input {})", self.dtype());
  Shape dims;
  if (dim) {
    dims.push_back(*dim);
  } else {
    for (int64_t i = 0; i < self.dim(); ++i) dims.push_back(i);
  }
  auto mask = reduce_mask("prod", self, dims);
  return {reduced_shape(self.sizes(), mask, keepdim), t, self.device()};
}

}  // namespace kiln::meta

namespace kiln::detail {
namespace {
Device meta_dev() { return Device(kMeta); }
TensorPair meta_sort(const Tensor& self, int64_t dim, bool descending) {
  TensorSpec s = meta::sort(self, dim, descending);
  return {empty_tensor(s.sizes, s.dtype, meta_dev()), empty_tensor(s.sizes, kInt64, meta_dev())};
}
TensorPair meta_topk(const Tensor& self, int64_t k, int64_t dim, bool largest, bool sorted) {
  TensorSpec s = meta::topk(self, k, dim, largest, sorted);
  return {empty_tensor(s.sizes, s.dtype, meta_dev()), empty_tensor(s.sizes, kInt64, meta_dev())};
}
template <class Sig>
void reg(TypedOp<Sig>& op, Sig* fn) {
  op.def.set_meta_raw(reinterpret_cast<void*>(fn));
  op.set_kernel(DispatchKey::Meta, fn);
}
const bool registered = [] {
  reg(ops::op_sort, &meta_sort);
  reg(ops::op_topk, &meta_topk);
  return true;
}();
}  // namespace
}  // namespace kiln::detail

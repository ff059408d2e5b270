// Meta functions of scatter (scatter.src), scatter_reduce (scatter_reduce.two), select_scatter
// and slice_scatter: the checks ATen makes, with the values, before any kernel writes.
#include "kiln/ops/index_meta.h"
#include "kiln/ops/ops.h"
#include "kiln/ops/scatter_operands.h"

namespace kiln::meta {

Device check_scatter_args(const char* op, const Tensor& self, int64_t dim, const Tensor& index,
                          const Tensor& src) {
  check_defined(op, self, "self");
  check_defined(op, index, "index");
  check_defined(op, src, "src");
  KILN_CHECK_TYPE(index.dtype() == kInt64, "[{}] index must be int64, got {}", op, index.dtype());
  KILN_CHECK_TYPE(src.dtype() == self.dtype(), "[{}] src dtype {} differs from self {}", op,
                  src.dtype(), self.dtype());
  const int64_t d = wrap_dim(dim, self.dim(), op);
  KILN_CHECK(std::max<int64_t>(index.dim(), 1) == std::max<int64_t>(self.dim(), 1) &&
                 std::max<int64_t>(src.dim(), 1) == std::max<int64_t>(self.dim(), 1),
             "[{}] index, src and self must have the same number of dimensions, got {}, {} and {}",
             op, index.dim(), src.dim(), self.dim());
  for (int64_t i = 0; i < index.dim(); ++i) {
    KILN_CHECK(src.dim() == 0 || index.sizes()[i] <= src.sizes()[i],
               "[{}] index size {} exceeds src size {} at dim {}", op, index.sizes()[i],
               src.sizes()[i], i);
    KILN_CHECK(i == d || self.dim() == 0 || index.sizes()[i] <= self.sizes()[i],
               "[{}] index size {} exceeds self size {} at dim {}", op, index.sizes()[i],
               self.sizes()[i], i);
  }
  return common_device(op, {&self, &index, &src});
}

ScatterOperands scatter_operands(const char* op, const Tensor& self, int64_t dim,
                                 const Tensor& index, const Tensor& src) {
  ScatterOperands o;
  o.d = wrap_dim(dim, self.dim(), op);
  o.self_sizes = self.dim() == 0 ? Shape{1} : Shape(self.sizes());
  o.index_sizes = index.dim() == 0 ? Shape{1} : Shape(index.sizes());
  o.bound = o.self_sizes[o.d];
  o.src = src;
  for (int64_t k = 0; k < index.dim() && k < src.dim(); ++k)
    o.src = ops::op_slice(o.src, k, 0, index.sizes()[k], 1);
  return o;
}

void select_scatter_by(CopyKernel copy, const Tensor& out, const Tensor& self, const Tensor& src,
                       int64_t dim, int64_t index) {
  const int64_t d = wrap_dim(dim, self.dim(), "select_scatter");
  const int64_t size = self.sizes()[d];
  copy(out, self);
  copy(ops::op_select(out, d, index < 0 ? index + size : index), src);
}

void slice_scatter_by(CopyKernel copy, const Tensor& out, const Tensor& self, const Tensor& src,
                      int64_t dim, const OptInt& start, const OptInt& end, int64_t step) {
  const int64_t d = wrap_dim(dim, self.dim(), "slice_scatter");
  const auto [s, e] = slice_bounds(self.sizes()[d], start, end);
  copy(out, self);
  copy(ops::op_slice(out, d, s, e, step), src);
}

TensorSpec scatter(const Tensor& self, int64_t dim, const Tensor& index, const Tensor& src) {
  const Device device = check_scatter_args("scatter", self, dim, index, src);
  return {Shape(self.sizes()), self.dtype(), device};
}

// Note [scatter_reduce]
// scatter_reduce(self, dim, index, src, reduce, include_self) is ATen's scatter_reduce.two:
// out = self, then every src element (read at the index's coordinates, as scatter reads it)
// is reduced into out at its index along dim. ATen takes reduce as a string; Kiln's op
// arguments have no string type, so the op takes ATen's names as ints (ScatterReduce in
// kiln/ops/scatter_reduce_math.h: 0 sum, 1 prod, 2 mean, 3 amax, 4 amin) and the public
// kiln::scatter_reduce (kiln/ops/indexing.h) takes the names. include_self=false leaves self's
// value out of every position that some index writes (positions no index writes keep self's).
// mean divides by the count of values reduced into the position (floor division for
// integers, as ATen's); amax/amin propagate NaN. Every backend computes in a wider type
// (float for the 16-bit floats, int64 for the integers: wrapping sums and products agree
// after the cast back) and writes each result once; bool is refused.
TensorSpec scatter_reduce(const Tensor& self, int64_t dim, const Tensor& index, const Tensor& src,
                          int64_t reduce, bool) {
  const Device device = check_scatter_args("scatter_reduce", self, dim, index, src);
  KILN_CHECK(reduce >= 0 && reduce <= 4,
             "[scatter_reduce] reduce must be 0-4 (sum, prod, mean, amax, amin), got {}", reduce);
  KILN_CHECK_TYPE(self.dtype() != kBool, "[scatter_reduce] bool tensors are not supported, got {}",
                  self.dtype());
  return {Shape(self.sizes()), self.dtype(), device};
}

namespace {
void check_src(const char* op, const Tensor& self, const Tensor& src, IntArrayRef view) {
  check_defined(op, self, "self");
  check_defined(op, src, "src");
  KILN_CHECK_TYPE(src.dtype() == self.dtype(), "[{}] src dtype {} differs from self {}", op,
                  src.dtype(), self.dtype());
  KILN_CHECK(src.sizes() == view,
             "[{}] expected src to have a size equal to the slice of self. src size = [{}], slice "
             "size = [{}]",
             op, fmt::join(src.sizes(), ", "), fmt::join(view, ", "));
}
}  // namespace

TensorSpec select_scatter(const Tensor& self, const Tensor& src, int64_t dim, int64_t index) {
  check_defined("select_scatter", self, "self");
  KILN_CHECK_INDEX(self.dim() > 0, "[select_scatter] self must have at least one dimension");
  const int64_t d = wrap_dim(dim, self.dim(), "select_scatter");
  const int64_t size = self.sizes()[d];
  KILN_CHECK_INDEX(index >= -size && index < size,
                   "[select_scatter] index {} is out of bounds for dimension {} with size {}",
                   index, d, size);
  Shape view;
  for (int64_t i = 0; i < self.dim(); ++i)
    if (i != d) view.push_back(self.sizes()[i]);
  check_src("select_scatter", self, src, view);
  return {Shape(self.sizes()), self.dtype(), common_device("select_scatter", {&self, &src})};
}

TensorSpec slice_scatter(const Tensor& self, const Tensor& src, int64_t dim, const OptInt& start,
                         const OptInt& end, int64_t step) {
  check_defined("slice_scatter", self, "self");
  KILN_CHECK_INDEX(self.dim() > 0, "[slice_scatter] self must have at least one dimension");
  KILN_CHECK(step > 0, "[slice_scatter] slice step must be positive, got {}", step);
  const int64_t d = wrap_dim(dim, self.dim(), "slice_scatter");
  const int64_t size = self.sizes()[d];
  const auto [s, e] = slice_bounds(size, start, end);
  Shape view(self.sizes());
  view[d] = (e - s + step - 1) / step;
  check_src("slice_scatter", self, src, view);
  return {Shape(self.sizes()), self.dtype(), common_device("slice_scatter", {&self, &src})};
}

}  // namespace kiln::meta

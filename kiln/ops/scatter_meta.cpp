// Meta functions of scatter (scatter.src), select_scatter and slice_scatter: the checks ATen
// makes, with the values, before any kernel writes.
#include "kiln/ops/index_meta.h"

namespace kiln::meta {

TensorSpec scatter(const Tensor& self, int64_t dim, const Tensor& index, const Tensor& src) {
  check_defined("scatter", self, "self");
  check_defined("scatter", index, "index");
  check_defined("scatter", src, "src");
  KILN_CHECK_TYPE(index.dtype() == kInt64, "[scatter] index must be int64, got {}", index.dtype());
  KILN_CHECK_TYPE(src.dtype() == self.dtype(), "[scatter] src dtype {} differs from self {}",
                  src.dtype(), self.dtype());
  const int64_t d = wrap_dim(dim, self.dim(), "scatter");
  KILN_CHECK(std::max<int64_t>(index.dim(), 1) == std::max<int64_t>(self.dim(), 1) &&
                 std::max<int64_t>(src.dim(), 1) == std::max<int64_t>(self.dim(), 1),
             "[scatter] index, src and self must have the same number of dimensions, got {}, {} "
             "and {}",
             index.dim(), src.dim(), self.dim());
  for (int64_t i = 0; i < index.dim(); ++i) {
    KILN_CHECK(src.dim() == 0 || index.sizes()[i] <= src.sizes()[i],
               "[scatter] index size {} exceeds src size {} at dim {}", index.sizes()[i],
               src.sizes()[i], i);
    KILN_CHECK(i == d || self.dim() == 0 || index.sizes()[i] <= self.sizes()[i],
               "[scatter] index size {} exceeds self size {} at dim {}", index.sizes()[i],
               self.sizes()[i], i);
  }
  return {Shape(self.sizes()), self.dtype(), common_device("scatter", {&self, &index, &src})};
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

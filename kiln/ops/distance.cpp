// cdist, pdist, randperm and empty_strided over their ops (kiln/ops/distance.h).
#include "kiln/ops/distance.h"

#include "kiln/ops/op_list.h"

namespace kiln {

Tensor cdist(const Tensor& x1, const Tensor& x2, double p, std::optional<int64_t> compute_mode) {
  return ops::op_cdist_forward(x1, x2, p, compute_mode);
}
Tensor pdist(const Tensor& input, double p) { return ops::op_pdist_forward(input, p); }

Tensor randperm(int64_t n, Generator* gen, std::optional<DType> dtype,
                std::optional<Device> device) {
  return ops::op_randperm(n, gen, dtype.value_or(kInt64), device.value_or(default_device()));
}
Tensor empty_strided(IntArrayRef sizes, IntArrayRef strides, std::optional<DType> dtype,
                     std::optional<Device> device) {
  return ops::op_empty_strided(sizes, strides, dtype.value_or(default_dtype()),
                               device.value_or(default_device()));
}

}  // namespace kiln

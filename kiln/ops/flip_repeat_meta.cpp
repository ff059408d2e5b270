// Meta functions of flip and repeat.
#include "kiln/ops/meta.h"

namespace kiln::meta {

TensorSpec flip(const Tensor& self, IntArrayRef dims) {
  check_defined("flip", self, "self");
  if (!dims.empty()) (void)reduce_mask("flip", self, dims);  // wrapped, no repeats
  return {Shape(self.sizes()), self.dtype(), self.device()};
}

TensorSpec repeat(const Tensor& self, IntArrayRef repeats) {
  check_defined("repeat", self, "self");
  const auto nr = static_cast<int64_t>(repeats.size());
  KILN_CHECK(nr >= self.dim(),
             "[repeat] number of dimensions of repeat dims ({}) can not be smaller than number "
             "of dimensions of tensor ({})",
             nr, self.dim());
  Shape sizes;
  const int64_t lead = nr - self.dim();
  for (int64_t i = 0; i < nr; ++i) {
    KILN_CHECK(repeats[i] >= 0, "[repeat] repeats must be non-negative, got {} at dim {}",
               repeats[i], i);
    int64_t base = i < lead ? 1 : self.sizes()[i - lead], n = 0;
    KILN_CHECK(!__builtin_mul_overflow(base, repeats[i], &n),
               "[repeat] dim {} of size {} repeated {} times overflows", i, base, repeats[i]);
    sizes.push_back(n);
  }
  checked_numel(sizes, "repeat");
  return {sizes, self.dtype(), self.device()};
}

}  // namespace kiln::meta

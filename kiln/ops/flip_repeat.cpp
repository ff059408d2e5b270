// flip and repeat (see flip_repeat.h), and their CPU registration (CUDA's is in
// kiln/backend/cuda/elu.cpp).
#include "kiln/ops/flip_repeat.h"

#include "kiln/ops/meta.h"
#include "kiln/ops/structured.h"

namespace kiln::detail {

void flip_impl(const Tensor& out, const Tensor& self, IntArrayRef dims) {
  if (out.numel() == 0) return;
  Tensor x = self;
  if (self.dim() > 0) {
    auto mask = meta::reduce_mask("flip", self, dims.empty() ? IntArrayRef() : dims);
    for (int64_t d = 0; d < self.dim(); ++d) {
      if (dims.empty() || !mask[d] || self.sizes()[d] < 2) continue;
      const int64_t n = self.sizes()[d];
      Tensor rev = ops::op_arange(n - 1, -1, -1, kInt64, self.device());
      x = ops::op_index_select(x, d, rev);
    }
  }
  ops::op_copy_(out, x);
}

void repeat_impl(const Tensor& out, const Tensor& self, IntArrayRef repeats) {
  if (out.numel() == 0) return;
  const int64_t nr = static_cast<int64_t>(repeats.size()), lead = nr - self.dim();
  Shape sizes, strides;
  for (int64_t i = 0; i < nr; ++i) {
    sizes.push_back(repeats[i]);
    strides.push_back(0);
    sizes.push_back(i < lead ? 1 : self.sizes()[i - lead]);
    strides.push_back(i < lead ? 0 : self.strides()[i - lead]);
  }
  Tensor src = ops::op_as_strided(self, sizes, strides, self.storage_offset());
  Tensor dst = out.is_contiguous() ? out : empty_tensor(out.sizes(), out.dtype(), out.device());
  ops::op_copy_(ops::op_view(dst, sizes), src);
  if (!out.is_contiguous()) ops::op_copy_(out, dst);
}

namespace {
KILN_REGISTER_STRUCTURED(flip, DispatchKey::CPU, &flip_impl);
KILN_REGISTER_STRUCTURED(repeat, DispatchKey::CPU, &repeat_impl);
}  // namespace

}  // namespace kiln::detail

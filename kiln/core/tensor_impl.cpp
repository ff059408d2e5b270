#include "kiln/core/tensor_impl.h"

#include "kiln/core/error.h"

namespace kiln {

TensorImpl::TensorImpl(Ref<StorageImpl> storage, DType dtype, IntArrayRef sizes,
                       IntArrayRef strides, int64_t offset)
    : sizes_(sizes),
      strides_(strides),
      offset_(offset),
      storage_(std::move(storage)),
      dtype_(dtype),
      device_(storage_->device()),
      keys_(device_.dispatch_key()) {
  refresh();
}

void TensorImpl::set_geometry(IntArrayRef sizes, IntArrayRef strides, int64_t offset) {
  sizes_ = sizes;
  strides_ = strides;
  offset_ = offset;
  refresh();
}

void TensorImpl::refresh() {
  KILN_ASSERT(sizes_.size() == strides_.size());
  int64_t n = 1;
  for (int64_t s : sizes_) n *= s;
  numel_ = n;
  // Contiguous means row-major; dims of size 1 may have any stride, as in PyTorch.
  bool c = true;
  int64_t expected = 1;
  for (size_t i = sizes_.size(); i-- > 0;) {
    if (sizes_[i] == 1) continue;
    if (strides_[i] != expected) {
      c = false;
      break;
    }
    expected *= sizes_[i];
  }
  contiguous_ = c || n == 0;
}

Shape contiguous_strides(IntArrayRef sizes) {
  Shape st(sizes.size());
  int64_t s = 1;
  for (size_t i = sizes.size(); i-- > 0;) {
    st[i] = s;
    s *= sizes[i] > 1 ? sizes[i] : 1;
  }
  return st;
}

int64_t checked_numel(IntArrayRef sizes, const char* op) {
  int64_t n = 1;
  for (int64_t s : sizes) {
    KILN_CHECK(s >= 0, "[{}] negative dimension in size [{}]", op, fmt::join(sizes, ", "));
    KILN_CHECK(!__builtin_mul_overflow(n, s, &n), "[{}] size [{}] has too many elements", op,
               fmt::join(sizes, ", "));
  }
  return n;
}

}  // namespace kiln

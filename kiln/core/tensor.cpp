#include "kiln/core/tensor.h"

#include "kiln/core/error.h"

namespace kiln {

int64_t wrap_dim(int64_t dim, int64_t ndim, const char* op) {
  int64_t n = ndim == 0 ? 1 : ndim;  // a 0-d tensor accepts dim 0 and -1, as in PyTorch
  KILN_CHECK_INDEX(dim >= -n && dim < n,
                   "[{}] dimension out of range (expected to be in range of [{}, {}], but got {})",
                   op, -n, n - 1, dim);
  return dim < 0 ? dim + n : dim;
}

int64_t Tensor::size(int64_t d) const { return sizes()[wrap_dim(d, dim(), "size")]; }
int64_t Tensor::stride(int64_t d) const { return strides()[wrap_dim(d, dim(), "stride")]; }

void* Tensor::data_ptr() const {
  KILN_CHECK(defined(), "[data_ptr] tensor is undefined");
  KILN_CHECK_DEVICE(device().is_cpu(),
                    "[data_ptr] cannot read host data of a tensor on {}; copy it to cpu first",
                    device());
  KILN_CHECK(!impl_->key_set().has(DispatchKey::Sharded),
             "[data_ptr] a DTensor has no data of its own; read kiln::dtensor::to_local(t)");
  detail::note_host_read(*impl_, "data_ptr");
  return impl_->data();
}

uint64_t Tensor::version() const {
  if (!defined()) detail::throw_undefined("version");
  return impl_->storage()->version();
}

namespace detail {
void throw_undefined(const char* what) { KILN_THROW(Value, "[{}] tensor is undefined", what); }
void throw_data_type_mismatch(DType expected, DType actual) {
  KILN_THROW(Type, "[data] requested {} pointer but the tensor's dtype is {}", expected, actual);
}
}  // namespace detail

}  // namespace kiln

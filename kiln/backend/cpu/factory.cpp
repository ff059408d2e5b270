// CPU kernels of randperm (Note [randperm] in kiln/ops/factory_meta.cpp) and empty_strided.
#include "kiln/ops/factory_meta.h"

namespace kiln::cpu {
namespace {

Tensor cpu_randperm(int64_t n, Generator* gen, DType dtype, Device) {
  return detail::randperm_by_sort(DispatchKey::CPU, n, gen, dtype, Device(kCPU));
}
Tensor cpu_empty_strided(IntArrayRef sizes, IntArrayRef strides, DType dtype, Device) {
  return detail::empty_strided_tensor(sizes, strides, dtype, Device(kCPU));
}

const bool registered = [] {
  ops::op_randperm.set_kernel(DispatchKey::CPU, &cpu_randperm);
  ops::op_empty_strided.set_kernel(DispatchKey::CPU, &cpu_empty_strided);
  return true;
}();

}  // namespace
}  // namespace kiln::cpu

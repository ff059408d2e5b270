// CUDA kernels of randperm (Note [randperm] in kiln/ops/factory_meta.cpp: CUDA's randint and
// CUB's stable sort on the device, no host work) and empty_strided.
#include "kiln/backend/cuda/common.h"
#include "kiln/ops/factory_meta.h"

namespace kiln::cuda {
namespace {

Device resolved(Device device) { return device.index() < 0 ? Device(device.type(), 0) : device; }

Tensor cuda_randperm(int64_t n, Generator* gen, DType dtype, Device device) {
  Device dev = resolved(device);
  return detail::randperm_by_sort(dev.dispatch_key(), n, gen, dtype, dev);
}
Tensor cuda_empty_strided(IntArrayRef sizes, IntArrayRef strides, DType dtype, Device device) {
  return detail::empty_strided_tensor(sizes, strides, dtype, resolved(device));
}

}  // namespace

KILN_CUDA_KERNELS(backend_kernel(ops::op_randperm, &cuda_randperm),
                  backend_kernel(ops::op_empty_strided, &cuda_empty_strided));

}  // namespace kiln::cuda

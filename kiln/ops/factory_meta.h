#pragma once
// Meta functions of randperm and empty_strided (kiln/ops/factory_meta.cpp). Internal: backends
// call them first, so validation happens before any allocation or draw.
#include "kiln/ops/meta.h"

namespace kiln::meta {

// randperm: n >= 0 and every value 0..n-1 exactly representable in `dtype` (not bool), as
// ATen's check_supported_max_int_with_precision.
void randperm(int64_t n, DType dtype);
// empty_strided: as many strides as sizes, none negative; returns the storage's element count,
// 1 + the largest offset (0 when a size is 0), as ATen's computeStorageNbytes.
int64_t empty_strided(IntArrayRef sizes, IntArrayRef strides, DType dtype);

}  // namespace kiln::meta

namespace kiln::detail {
// An uninitialised tensor of `sizes` and `strides` on `device` (any backend: the device's
// allocator), its storage just large enough (meta::empty_strided's element count).
Tensor empty_strided_tensor(IntArrayRef sizes, IntArrayRef strides, DType dtype, Device device);
// randperm through the randint, sort and to_copy kernels at `key` (Note [randperm] in
// kiln/ops/factory_meta.cpp); `device` is the result's, its index resolved.
Tensor randperm_by_sort(DispatchKey key, int64_t n, Generator* gen, DType dtype, Device device);
}  // namespace kiln::detail

#pragma once
// Converts tensors between Kiln and ATen (libtorch's tensor library, the tests' reference
// oracle) by copying their elements. Only <ATen/ATen.h> is used, to keep compile times down.
#include <ATen/ATen.h>

#include <vector>

#include "kiln/core/tensor.h"

namespace kiln::test {

at::ScalarType to_aten(DType dtype);
DType from_aten(at::ScalarType dtype);

// A contiguous ATen copy of a cpu tensor's elements, read through its sizes and strides
// directly (not through Kiln's copy kernels, which are themselves under test).
at::Tensor to_aten(const Tensor& t);
std::vector<at::Tensor> to_aten(const std::vector<Tensor>& ts);

// A contiguous Kiln copy of an ATen tensor.
Tensor from_aten(const at::Tensor& t);

}  // namespace kiln::test

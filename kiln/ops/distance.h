#pragma once
// Pairwise p-norm distances as torch.cdist and torch.pdist, and the factories randperm and
// empty_strided (ATen's core ops; Notes [cdist and pdist] in kiln/ops/distance_meta.cpp and
// [randperm] in kiln/ops/factory_meta.cpp).
#include <optional>

#include "kiln/core/generator.h"
#include "kiln/core/tensor.h"

namespace kiln {

// x1 [*, P, M] and x2 [*, R, M] (batch dims broadcast, one floating dtype): [*, P, R] of
// ||x1[.., i, :] - x2[.., j, :]||_p, p >= 0 (0 counts nonzero differences, infinity takes the
// largest). compute_mode (0-2, ATen's) is validated; Kiln always sums the differences directly.
Tensor cdist(const Tensor& x1, const Tensor& x2, double p = 2,
             std::optional<int64_t> compute_mode = {});
// input [N, M]: the N (N - 1) / 2 distances of rows i < j, row-major.
Tensor pdist(const Tensor& input, double p = 2);

// A random permutation of 0..n-1 drawn from `gen` (null: the device's default generator), the
// same on every device for the same generator state; dtype defaults to int64, device to
// default_device().
Tensor randperm(int64_t n, Generator* gen = nullptr, std::optional<DType> dtype = {},
                std::optional<Device> device = {});
// An uninitialised tensor with the given sizes and strides (storage of 1 + the largest offset);
// dtype defaults to default_dtype(), device to default_device().
Tensor empty_strided(IntArrayRef sizes, IntArrayRef strides, std::optional<DType> dtype = {},
                     std::optional<Device> device = {});

}  // namespace kiln

#pragma once
// Geometry helpers shared by view ops and reshape. Internal.
#include <optional>

#include "kiln/core/tensor.h"

namespace kiln::detail {

// A tensor over self's storage with the given geometry.
Tensor make_view(const Tensor& self, IntArrayRef sizes, IntArrayRef strides, int64_t offset);
// Resolves one -1 in `shape` so its product is numel; errors name `op`.
Shape infer_size(const char* op, IntArrayRef shape, int64_t numel);
// Strides that view the same elements with new_sizes, or nullopt when a copy is needed.
std::optional<Shape> view_strides(IntArrayRef old_sizes, IntArrayRef old_strides,
                                  IntArrayRef new_sizes);

}  // namespace kiln::detail

#pragma once
// The kernels of flip and repeat, one for every backend: flip is index_select with reversed
// positions along each flipped dim, repeat a copy from a strided view of the input (stride 0
// over the repeats) into the result viewed as [r0, s0, r1, s1, ...]. Internal to kiln/ops and
// the backends.
#include "kiln/ops/op_list.h"

namespace kiln::detail {

void flip_impl(const Tensor& out, const Tensor& self, IntArrayRef dims);
void repeat_impl(const Tensor& out, const Tensor& self, IntArrayRef repeats);

}  // namespace kiln::detail

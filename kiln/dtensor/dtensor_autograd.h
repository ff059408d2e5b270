#pragma once
// Autograd across the DTensor boundaries (internal to kiln/dtensor): the nodes that redistribute,
// to_local and from_local record, and the hooks that make gradients DTensors. See Note
// [Gradients of DTensors] in dtensor_autograd.cpp.
#include "kiln/core/tensor.h"

namespace kiln::dtensor {

// Whether a call on `t` should be recorded (grad mode on and `t` requires grad).
bool records_grad(const Tensor& t);
// `out` = redistribute(in, ...): its gradient is redistributed back (global values unchanged).
void record_redistribute(const Tensor& in, const Tensor& out);
// The tensor to_local(dt) hands out when dt requires grad: an alias of `local` whose gradient
// becomes dt's (a DTensor with dt's placements, Partial read as Replicate).
Tensor record_to_local(const Tensor& dt, const Tensor& local);
// `out` = from_local(local, ...): local's gradient is this rank's piece of out's gradient.
void record_from_local(const Tensor& local, const Tensor& out);

}  // namespace kiln::dtensor

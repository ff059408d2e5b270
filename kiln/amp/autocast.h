#pragma once
// Mixed precision (DESIGN.md "Mixed precision"): while an AutocastGuard lives on a thread, the
// Autocast key (above Autograd) casts the floating inputs of functional ops on the guarded device
// type by each op's policy (AutocastPolicy in kiln/dispatch/op.h; the table is in
// autocast_policies.cpp): products, attention and (later) convolutions in the 16-bit dtype;
// reductions, softmax, norms and losses in float32; ops mixing inputs at their widest dtype.
// Autograd records the casts like any op, so float32 master weights get float32 gradients, and
// compile traces them; a compiled function is guarded by the autocast state it was traced under.
// Backward passes run with autocast off: their ops follow the dtypes the forward's casts saved.
// See Note [Autocast] in autocast.cpp.
//
//   {
//     amp::AutocastGuard autocast(Device(kCUDA), kBFloat16);
//     Tensor loss = model.loss(x, y);   // matmuls in bfloat16, the loss in float32
//   }
//   loss.backward();
#include "kiln/core/device.h"
#include "kiln/core/dtype.h"

namespace kiln {
class Tensor;
}  // namespace kiln

namespace kiln::amp {

class AutocastGuard {
 public:
  // Autocast for ops on `device`'s type (its index does not matter) in `dtype` (float16 or
  // bfloat16; anything else is a ValueError); `enabled` false turns it off inside an outer one.
  explicit AutocastGuard(Device device, DType dtype = kBFloat16, bool enabled = true);
  ~AutocastGuard();
  AutocastGuard(const AutocastGuard&) = delete;
  AutocastGuard& operator=(const AutocastGuard&) = delete;

 private:
  bool saved_enabled_;
  DeviceType saved_device_;
  DType saved_dtype_;
};

// Whether autocast is on on this thread, and for which device type and dtype.
bool autocast_enabled();
DeviceType autocast_device_type();
DType autocast_dtype();

// t cast to dtype d as autocast casts an op's inputs: in t's memory order when t is a
// permutation of a contiguous tensor (a transposed weight casts flat and stays transposed, as
// PyTorch's preserve_format), else contiguous (Note [Casts in memory order]).
Tensor cast_in_memory_order(const Tensor& t, DType d);

// Makes the autocast state a guard of the trace being recorded on this thread, if any (called
// when a trace starts: every op of the trace depends on it).
void guard_autocast_state();

}  // namespace kiln::amp

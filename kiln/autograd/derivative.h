#pragma once
// Backward formulas: how each op's argument gradients follow from its output gradients.
// Internal to kiln/autograd. See Note [Autograd recording] in node.h.
#include <cstdint>

#include "kiln/autograd/node.h"
#include "kiln/dispatch/op.h"

namespace kiln::autograd {

class OpNode;

// What a formula sees of the forward call. Tensor arguments are numbered by *slot*: the k-th
// tensor of the call, a TensorList contributing one slot per element. Other arguments are
// read by their position in the op's signature.
class BackwardCtx {
 public:
  explicit BackwardCtx(const OpNode& node) : node_(node) {}
  // Non-tensor argument at signature position `pos`.
  const IValue& arg(size_t pos) const;
  template <class T>
  T get(size_t pos) const {
    return std::get<T>(arg(pos));
  }
  // Saved tensor argument `slot` / output `i` (the formula's Derivative must save them).
  Tensor input(size_t slot) const;
  Tensor output(size_t i) const;
  const TensorGeometry& geometry(size_t slot) const;
  IntArrayRef sizes(size_t slot) const { return geometry(slot).sizes; }
  // Whether tensor argument `slot` needs a gradient.
  bool needs(size_t slot) const;
  size_t num_slots() const;

 private:
  const OpNode& node_;
};

// Fills `grad_inputs` (one entry per slot, preset undefined) from the output gradients.
// grads[0] is always defined for single-output ops; a slot that needs no gradient may be left
// undefined. Results may have the broadcast shape or another float dtype: the node reduces
// them to each argument's shape (sum over broadcast dims) and casts to its dtype.
using BackwardFn = void (*)(const BackwardCtx& ctx, const TensorList& grads,
                            TensorList& grad_inputs);

enum class Differentiability : uint8_t {
  Formula,      // has a backward formula
  None,         // outputs never carry gradients (comparisons, indices, factories, detach)
  Unsupported,  // raises when an argument requires grad (out= variants, foreach updates)
};

struct Derivative {
  Differentiability kind = Differentiability::Unsupported;
  BackwardFn fn = nullptr;
  uint32_t save_inputs = 0;   // bit k: save tensor slot k (kSaveAll: every slot)
  uint32_t save_outputs = 0;  // bit i: save output i
};
inline constexpr uint32_t kSaveAll = ~0u;

// The derivative registered for `op` (Unsupported when none).
const Derivative& derivative_of(const OpDef& op);

// --- helpers shared by the formulas and the engine ---
// Sums `g` over the dims that broadcasting added or expanded so it has `sizes`.
Tensor sum_to(const Tensor& g, IntArrayRef sizes);
// The gradient of a view with geometry (sizes, strides, offset) into a tensor with geometry
// `base` over the same storage: zeros laid out like the base with `g` written (added, where
// the view overlaps itself) at the view's elements.
Tensor as_strided_backward(const Tensor& g, IntArrayRef base_sizes, IntArrayRef base_strides,
                           int64_t base_offset, IntArrayRef sizes, IntArrayRef strides,
                           int64_t offset);

}  // namespace kiln::autograd

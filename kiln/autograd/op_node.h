#pragma once
// The node recorded for one op call, and the nodes for in-place ops on views. Internal.
#include "kiln/autograd/derivative.h"

namespace kiln::autograd {

// Backward of one recorded op: its Derivative applied to what the call saved.
class OpNode : public Node {
 public:
  OpNode(const OpDef& op, const Derivative& d) : op(op), derivative(d) {}
  std::string name() const override;
  TensorList apply(TensorList&& grads) override;
  void release_saved() override;

  const OpDef& op;
  const Derivative& derivative;
  Stack args;                            // non-tensor arguments; tensor positions hold None
  std::vector<SavedTensor> inputs;       // per slot; empty where not saved
  std::vector<SavedTensor> outputs;      // per output; empty where not saved
  std::vector<TensorGeometry> geometry;  // per slot
  std::vector<uint8_t> needs;            // per slot: whether it needs a gradient
};

// Geometry of a view relative to its storage.
struct ViewGeometry {
  Shape sizes, strides;
  int64_t offset = 0;
  static ViewGeometry of(const Tensor& t) {
    return {Shape(t.sizes()), Shape(t.strides()), t.storage_offset()};
  }
};

// The gradient of a view of `base` whose history was rewritten by an in-place op on the base
// or on another view: scatters the view's gradient into the base's layout.
class ViewBackward : public Node {
 public:
  ViewBackward(ViewGeometry base, ViewGeometry view)
      : base(std::move(base)), view(std::move(view)) {}
  std::string name() const override { return "AsStridedBackward"; }
  TensorList apply(TensorList&& grads) override;
  ViewGeometry base, view;
};

// Note [In-place ops on views]
// An in-place op `fn` on a view V of base B changes B too. B's history becomes CopySlices:
// its backward lays B's gradient out like B, hands the slice V covers to fn's backward, writes
// fn's gradient for V back into that slice, and passes fn's other gradients on. V's grad_fn
// becomes a ViewBackward into B's new history. Other views of B notice the change through the
// storage version and regenerate their grad_fn the same way (gradient_edge()).
class CopySlices : public Node {
 public:
  CopySlices(ViewGeometry base, ViewGeometry view, Ref<OpNode> fn)
      : base(std::move(base)), view(std::move(view)), fn(std::move(fn)) {}
  std::string name() const override { return "CopySlices"; }
  TensorList apply(TensorList&& grads) override;
  void release_saved() override { fn->release_saved(); }
  ViewGeometry base, view;
  Ref<OpNode> fn;
};

}  // namespace kiln::autograd

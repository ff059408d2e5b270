#pragma once
// The autograd graph: nodes, edges, saved tensors and per-tensor autograd state.
//
// Note [Autograd recording]
// A tensor requires grad exactly when its key set holds DispatchKey::Autograd. An op with such
// an argument reaches the Autograd fallback (autograd_kernel.cpp), which runs the op below
// Autograd and, when grad mode is on, records one Node per call: the op's Derivative, the
// arguments it saved, and one Edge per tensor argument to where that argument's gradient goes
// (the grad_fn of the op that made it, or an AccumulateGrad for a leaf). The outputs get the
// node as their grad_fn and the Autograd key. Nothing is recorded for tensors without the key,
// so plain eager calls never pay for autograd.
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "kiln/autograd/engine.h"
#include "kiln/core/ref.h"
#include "kiln/core/tensor.h"

namespace kiln::autograd {

class Node;

// The hooks of one tensor, shared by its autograd state and the node that receives its
// gradient. `retained` holds the gradient of a non-leaf after retain_grad().
struct GradHooks {
  std::vector<GradHook> fns;
  std::vector<PostAccumulateGradHook> post;  // leaves only
  bool retain = false;
  Tensor retained;
  // Runs the hooks on `g`, then keeps it if asked; returns the (possibly replaced) gradient.
  Tensor run(Tensor g);
};

// Where a gradient goes: input `input_nr` of node `fn`. A null fn means "nowhere".
struct Edge {
  Ref<Node> fn;
  uint32_t input_nr = 0;
  bool valid() const { return static_cast<bool>(fn); }
};

// Geometry, dtype and device of a tensor argument, kept for its gradient.
struct TensorGeometry {
  Shape sizes, strides;
  int64_t offset = 0;
  DType dtype = kFloat32;
  Device device;
  bool defined = false;  // false for an undefined (optional) tensor argument
  // A DTensor's layout (ShardedMetaBase::layout()): tensors made for its gradient are DTensors.
  const void* layout = nullptr;
  static TensorGeometry of(const Tensor& t) {
    const ShardedMetaBase* s = t.impl()->sharded_meta();
    return {Shape(t.sizes()),
            Shape(t.strides()),
            t.storage_offset(),
            t.dtype(),
            t.device(),
            true,
            s ? s->layout() : nullptr};
  }
};

// One backward step. apply() takes one gradient per forward output (undefined when none
// reached it) and returns one per next edge.
class Node : public RefCounted {
 public:
  Node();
  virtual std::string name() const = 0;
  virtual TensorList apply(TensorList&& grads) = 0;
  // Frees saved tensors after a backward without retain_graph.
  virtual void release_saved() {}

  std::vector<Edge> next_edges;
  // Creation order; the engine runs later nodes first when several are ready.
  uint64_t sequence_nr;
  // Number of forward outputs (inputs of apply()).
  uint32_t num_outputs = 1;
  // Hooks of the tensors this node made, by output number; run before apply().
  std::vector<std::pair<uint32_t, std::shared_ptr<GradHooks>>> pre_hooks;
};

// A tensor saved for backward, with the version it had when saved. Outputs are saved as
// detached aliases so that a node never owns its own output's autograd state (no cycle).
class SavedTensor {
 public:
  SavedTensor() = default;
  SavedTensor(const Tensor& t, bool is_output);
  // The tensor; throws if it was modified in place since it was saved or was freed.
  Tensor unpack(const Node& owner, size_t index) const;
  void reset() {
    data_ = Tensor();
    released_ = true;
  }
  bool defined() const { return data_.defined() || released_; }

 private:
  Tensor data_;
  uint64_t version_ = 0;
  bool is_output_ = false;
  bool released_ = false;
};

// Autograd state of one tensor (kept in TensorImpl::autograd_meta()).
class AutogradMeta : public AutogradMetaBase {
 public:
  Tensor grad;
  Ref<Node> grad_fn;  // null for leaves
  uint32_t output_nr = 0;
  // For differentiable views: the tensor they view and the storage version at which grad_fn
  // was last set. An in-place op on the base or another view makes grad_fn stale; the next
  // use regenerates it from the base. See Note [In-place ops on views].
  Tensor view_base;
  uint64_t view_version = 0;
  // register_hook / retain_grad; for a non-leaf also attached to grad_fn's pre_hooks.
  std::shared_ptr<GradHooks> hooks;
};

// The autograd state of `t`, or nullptr.
inline AutogradMeta* meta_of(const Tensor& t) {
  return t.defined() ? static_cast<AutogradMeta*>(t.impl()->autograd_meta()) : nullptr;
}
// The autograd state of `t`, created if missing.
AutogradMeta& ensure_meta(const Tensor& t);

// Where the gradient of `t` goes: its grad_fn, an AccumulateGrad for a leaf that requires grad,
// or an invalid edge. Regenerates a stale view's grad_fn first.
Edge gradient_edge(const Tensor& t);

// Makes `t` an output of `fn` (output `nr`): sets grad_fn and adds the Autograd key.
void set_history(const Tensor& t, const Ref<Node>& fn, uint32_t nr);

// Where a leaf's gradient arrives. The engine sums what reaches every AccumulateGrad of the
// same leaf, runs the leaf's hooks once on the sum, then accumulates (accumulate_grad()).
class AccumulateGrad : public Node {
 public:
  explicit AccumulateGrad(Tensor variable) : variable(std::move(variable)) {}
  std::string name() const override { return "AccumulateGrad"; }
  TensorList apply(TensorList&& grads) override;
  Tensor variable;
};
// Lays out a DTensor leaf's incoming gradient like the leaf (its placements), before it is
// accumulated: installed by kiln/dtensor (Note [Gradients of DTensors] there). Null: as is.
using GradLayoutHook = Tensor (*)(const Tensor& leaf, Tensor grad);
void set_grad_layout_hook(GradLayoutHook hook);
// Adds `g` into variable's .grad (in place once it exists, so its address stays stable).
void accumulate_grad(const Tensor& variable, Tensor g);

}  // namespace kiln::autograd

#pragma once
// The backward pass. Runs each reachable node once all gradients flowing into it are summed
// (dependency counting, later nodes first), with grad mode off.
#include <functional>

#include "kiln/core/tensor.h"

namespace kiln::autograd {

// Backpropagates from `outputs` into the .grad of every leaf that requires grad. grad_outputs
// (one per output, or empty) seed the pass; an undefined one means 1 for a single-element
// output. Without retain_graph the saved tensors are freed as the pass goes.
void backward(const TensorList& outputs, const TensorList& grad_outputs = {},
              bool retain_graph = false);

// The gradients of `outputs` with respect to `inputs`, returned rather than accumulated into
// .grad. An input the outputs do not depend on raises unless allow_unused (then undefined).
TensorList grad(const TensorList& outputs, const TensorList& inputs,
                const TensorList& grad_outputs = {}, bool retain_graph = false,
                bool allow_unused = false);

// A gradient hook: gets the gradient flowing into a tensor and returns a replacement (or an
// undefined tensor to keep it).
using GradHook = std::function<Tensor(const Tensor&)>;

// Adds a hook to `t` (which must require grad). Hooks run in registration order on the
// gradient of t's current value (they move with t through in-place ops); a leaf's hooks run
// once per backward, on the total gradient.
void register_hook(const Tensor& t, GradHook hook);

// Runs after a leaf's gradient of the current backward was accumulated into its .grad, which
// it receives (PyTorch's post-accumulate-grad hook). A leaf is finished, and its hooks run,
// as soon as every node that sends it a gradient has run, not at the end of the pass (See
// Note [Leaves finish early] in engine.cpp). grad() accumulates nothing and runs none.
using PostAccumulateGradHook = std::function<void(const Tensor&)>;
void register_post_accumulate_grad_hook(const Tensor& leaf, PostAccumulateGradHook hook);

// Queues `fn` to run on this thread when the backward pass now running (backward() or grad())
// ends, after every leaf is finished; callbacks run in queue order, may queue more, and one
// that throws ends the pass with its exception. Only from inside a pass (a hook).
void queue_callback(std::function<void()> fn);

}  // namespace kiln::autograd

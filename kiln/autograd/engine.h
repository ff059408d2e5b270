#pragma once
// The backward pass. Runs each reachable node once all gradients flowing into it are summed
// (dependency counting, later nodes first), with grad mode off.
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

}  // namespace kiln::autograd

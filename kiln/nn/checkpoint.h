#pragma once
// Activation checkpointing (PyTorch's torch.utils.checkpoint, its reentrant form): run part of
// a model without keeping what its backward would need, and run it again in backward. Memory
// for compute: a checkpointed segment keeps only its inputs between forward and backward.
//
//   Tensor y = nn::checkpoint([&](const Tensor& x) { return block(x); }, x);
//   loss(y).backward();   // block's forward runs again here, then its backward
#include <functional>
#include <vector>

#include "kiln/core/generator.h"
#include "kiln/core/tensor.h"

namespace kiln::nn {

struct CheckpointOptions {
  // Generators whose state the recomputation starts from again, so that random ops inside (a
  // dropout's mask) draw what the forward drew. The default CPU generator is always replayed;
  // list the generators `fn` draws from explicitly. (A device's own generator is not: give the
  // random ops inside an explicit Generator off the CPU. Note [Checkpoint replays].)
  std::vector<Generator*> generators;
};

// Runs `fn(inputs)` without recording a graph and returns its results, which require grad when
// grad mode is on. In backward, `fn` runs again on the saved inputs (with the generators'
// states of the forward, restored afterwards), and the gradients flow through that second run:
// into the inputs that require grad, and into every tensor `fn` reads that requires grad (a
// module's parameters accumulate into their .grad during that inner pass). `fn` must compute
// the same thing both times: an input changed in place after the forward is an error in
// backward. With grad mode off it is just `fn(inputs)`.
TensorList checkpoint(const std::function<TensorList(const TensorList&)>& fn,
                      const TensorList& inputs, const CheckpointOptions& options = {});
Tensor checkpoint(const std::function<Tensor(const Tensor&)>& fn, const Tensor& input,
                  const CheckpointOptions& options = {});

}  // namespace kiln::nn

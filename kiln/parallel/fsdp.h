#pragma once
// Fully sharded data parallel on DTensors (DESIGN.md "Distributed"; docs/dtensor.md "FSDP"),
// after PyTorch's FSDP2 (`fully_shard`): every rank runs the model on its own share of the
// batch, but holds only a Shard(0) piece of each parameter. Before a sharded module's forward
// its parameters are all-gathered (one collective per module and dtype) into plain tensors the
// forward uses; in backward their gradients are reduce-scattered (averaged over the ranks) into
// the sharded parameters' .grad, which are Shard(0) DTensors; an optimizer then updates each
// rank's shards. See Note [FSDP units] and Note [What FSDP keeps for backward] in fsdp.cpp.
//
//   const auto& mesh = dtensor::init_device_mesh(Device(kCPU), {world}, {"dp"});
//   for (auto& block : blocks) parallel::fully_shard(*block, mesh);  // submodules first
//   parallel::fully_shard(model, mesh);                             // then the root
//   Tensor loss = model.loss(ids_share, targets_share);  // this rank's share of the batch
//   loss.backward();            // each .grad: Shard(0), the gradient averaged over the ranks
//   opt.step();                 // on the local shards
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "kiln/dtensor/device_mesh.h"
#include "kiln/nn/module.h"

namespace kiln::parallel {

// Mixed precision for a unit (PyTorch FSDP2's MixedPrecisionPolicy). The sharded parameters
// (the optimizer's master copy) keep their dtype; each dtype here applies to floating
// parameters only, and unset means the parameter's own dtype. See Note [FSDP mixed precision]
// in fsdp_unit.cpp.
struct MixedPrecisionPolicy {
  // The dtype of the gathered parameters: each shard is cast before the all-gather (fewer bytes
  // moved), so forward and backward compute in it.
  std::optional<DType> param_dtype = std::nullopt;
  // The dtype of the gradients' reduce-scatter (each whole gradient is cast to it first); the
  // sharded gradient is then cast to the parameter's dtype.
  std::optional<DType> reduce_dtype = std::nullopt;
  // The module's floating output is cast to it.
  std::optional<DType> output_dtype = std::nullopt;
  // With param_dtype set, the module's floating input is cast to param_dtype.
  bool cast_forward_inputs = true;
};

struct FullyShardOptions {
  // Free the gathered parameters when the module's forward returns and gather them again
  // before its backward (PyTorch's reshard_after_forward): the forward's peak holds a few
  // units whole instead of all. A root unit (one under no other unit: shard the whole model
  // last) keeps its parameters, which backward needs first. Note [FSDP reshards after forward].
  bool reshard_after_forward = true;
  // Start the all-gather of the unit that comes next (in the last forward's order, or in
  // backward) while this one computes. Only inside a root unit's forward. Note [FSDP prefetch].
  bool prefetch = true;
  // Gather, reduce and output dtypes; the default changes nothing. 1-D meshes only.
  MixedPrecisionPolicy mp = {};
};

// Shards the parameters of `module` and of its submodules that no earlier fully_shard call
// manages (apply it to submodules before their parents) as Shard(0) DTensor leaves on `mesh`
// (1-D), from rank 0's values (uneven dim 0 follows chunk's rule), and registers the forward
// hooks that gather them around each call of the module. On a 2-D mesh [dp, tp], parameters
// that tensor parallel made DTensors on mesh.submesh({tp}) keep their placement on tp and are
// sharded over dp (Note [FSDP and tensor parallel]). `module` must be a UnaryModule (its calls
// run hooks). Everything is checked before anything changes: a ValueError for a mesh of more
// than 2 dims, a policy dtype that is not floating, a policy on a 2-D mesh, a module already
// sharded, a submodule sharded after its parent, a 0-d parameter, or one already a DTensor on
// another mesh than the 2-D mesh's tp dim; a TypeError for a module that is not a UnaryModule.
// Collective: every rank of the mesh calls it, in the same order, on the same model.
void fully_shard(nn::Module& module, const dtensor::DeviceMesh& mesh,
                 FullyShardOptions options = {});

// Whether fully_shard was applied to `module` itself.
bool is_fully_sharded(const nn::Module& module);

// The parameters that fully_shard(module) manages (not those of sharded submodules), by path
// relative to `module`; empty when `module` is not sharded.
std::vector<std::string> fully_sharded_parameters(const nn::Module& module);

}  // namespace kiln::parallel

#pragma once
// SyncBatchNorm, as torch.nn.SyncBatchNorm: batch norm whose training statistics span the
// global batch of a process group, for data-parallel training (DDP, FSDP) where each rank
// holds a slice of the batch; and convert_sync_batchnorm, which swaps a model's BatchNorms
// for it. See Note [Synchronised batch statistics] in sync_batch_norm.cpp.
#include <memory>

#include "kiln/distributed/process_group.h"
#include "kiln/nn/normalization.h"

namespace kiln::nn {

// Batch norm over [N, C, *] (any rank >= 2) per channel, with BatchNorm's parameters and
// buffers under the same names (state dicts interchange). Training on a group of more than
// one rank normalises with the mean and variance of every rank's batch together (ranks may
// hold different batch sizes) and updates the running stats with them, identically on every
// rank; every rank of the group must call forward together. Eval, a group of one, or no
// group given while the distributed layer was never initialised: exactly BatchNorm's path.
// `group` (default: the world) must outlive the module.
class SyncBatchNorm : public BatchNormNd {
 public:
  explicit SyncBatchNorm(int64_t num_features, const BatchNormOptions& options = {},
                         const distributed::ProcessGroup* group = nullptr, const Init& init = {});
  Tensor forward(const Tensor& x) override;
  const distributed::ProcessGroup* group() const { return group_; }

 private:
  const distributed::ProcessGroup* group_;
};

// Replaces every BatchNorm1d/2d/3d in `module` (itself included) by a SyncBatchNorm on
// `group` with its settings, training flag, parameters and buffers (the same tensors, so
// optimizers built before keep working and the state dict keys stay). Returns the module, or
// the new SyncBatchNorm when `module` itself is a BatchNorm. A BatchNorm whose parent
// cannot swap it (Module::replace_module: Sequential can) raises "[replace_module] ...";
// the swaps before it stay.
std::shared_ptr<Module> convert_sync_batchnorm(std::shared_ptr<Module> module,
                                               const distributed::ProcessGroup* group = nullptr);

}  // namespace kiln::nn

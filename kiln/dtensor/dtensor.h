#pragma once
// DTensor: a Tensor whose impl carries the Sharded dispatch key, the global sizes, strides and
// dtype, the device of its local tensor, and (in TensorImpl::sharded_meta()) the local tensor
// and the interned spec (DESIGN.md "Distributed"). See Note [DTensor impls] in dtensor.cpp.
#include "kiln/core/tensor.h"
#include "kiln/dtensor/device_mesh.h"
#include "kiln/dtensor/placement.h"
#include "kiln/dtensor/spec.h"

namespace kiln::dtensor {

// A DTensor impl's state: set once when the impl is made, never changed.
class ShardedMeta final : public ShardedMetaBase {
 public:
  ShardedMeta(Tensor local, const DTensorSpec* spec) : local(std::move(local)), spec(spec) {}
  std::unique_ptr<ShardedMetaBase> clone() const override {
    return std::make_unique<ShardedMeta>(local, spec);
  }
  const void* layout() const override { return spec; }
  const Tensor local;
  const DTensorSpec* const spec;
};

// Whether `t` is a DTensor (its key set holds Sharded).
inline bool is_dtensor(const Tensor& t) { return t.key_set().has(DispatchKey::Sharded); }
// The hot path's access (the Sharded layer, after its key check): two loads, no checks.
inline const ShardedMeta& sharded_meta(const Tensor& t) {
  return *static_cast<const ShardedMeta*>(t.impl()->sharded_meta());
}
// The spec of a DTensor; a TypeError naming `op` for a plain tensor.
const DTensorSpec* spec_of(const Tensor& t);
// This rank's shard (the tensor itself, not a copy; an alias that carries the gradient back when
// `t` requires grad); a TypeError for a plain tensor.
Tensor to_local(const Tensor& t);

// A DTensor over `local` with `spec`; `local`'s shape must be the spec's local shape on this rank,
// and its dtype and device the spec's and the mesh's. No communication. For layers that make
// DTensors (redistribute, the Sharded layer); users call from_local.
Tensor make_dtensor(Tensor local, const DTensorSpec* spec);

// Every rank passes the whole tensor `t` (on the mesh's device); rank 0's values win (broadcast
// along each mesh dim from coordinate 0 first), then each rank keeps its piece: Shard chunks,
// Partial(sum) keeps the value on coordinate 0 of that mesh dim and zeros elsewhere, Partial
// (avg|max|min) keeps it everywhere. The local tensor is a new tensor, never `t`'s storage.
Tensor distribute_tensor(const Tensor& t, const DeviceMesh& mesh, ArrayRef<Placement> placements);

// A DTensor over each rank's `local` shard. The global shape is `shape` when given, else inferred
// as if every shard were even (local size times the mesh sizes that shard that dim); strides
// default to row-major. With run_check (collective: every rank of the mesh takes part), every
// rank's local shape and dtype must be what the spec gives that rank, and along each Replicate
// mesh dim every rank's values must equal coordinate 0's bitwise; otherwise every rank raises
// the same ValueError naming the ranks. Without it only this rank's shape is checked.
Tensor from_local(const Tensor& local, const DeviceMesh& mesh, ArrayRef<Placement> placements,
                  bool run_check = false, IntArrayRef shape = {}, IntArrayRef strides = {});

// The whole tensor on every rank (redistribute to Replicate everywhere, then the local tensor).
Tensor full_tensor(const Tensor& t);

// Copies `src` into `dst` in place (no autograd), where `dst` may be a DTensor and `src` the
// whole tensor (a plain one, the same on every rank, as a checkpoint loader reads it): each rank
// keeps its piece of it (no communication; a Partial(sum) destination holds it on coordinate
// 0 of that mesh dim, as distribute_tensor does). Otherwise copy_. Loading state dicts into
// sharded modules and optimizers goes through it.
void copy_whole_into(Tensor& dst, const Tensor& src);

// RAII (PyTorch's implicit_replication()): while one lives on this thread, an op that mixes
// DTensors with plain tensors takes each plain tensor as a Replicate DTensor on the DTensors'
// mesh (every rank must pass the same values; nothing checks it) instead of raising. A plain
// tensor that requires grad is still refused (its gradient would be a DTensor). Compiled
// functions bake in what their trace did. See Note [Implicit replication] in sharded_layer.cpp.
class ImplicitReplication {
 public:
  ImplicitReplication();
  ~ImplicitReplication();
  ImplicitReplication(const ImplicitReplication&) = delete;
  ImplicitReplication& operator=(const ImplicitReplication&) = delete;

 private:
  bool previous_;
};

}  // namespace kiln::dtensor

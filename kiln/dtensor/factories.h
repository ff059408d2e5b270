#pragma once
// DTensor factories: a tensor made directly in its shards (PyTorch's
// torch.distributed.tensor.zeros/ones/full/empty/rand/randn). Every rank of the mesh calls them
// alike; no communication. Partial placements are refused for fills other than zeros (every rank's
// term holding the value would sum to the mesh size times it) and for random tensors.
#include "kiln/core/generator.h"
#include "kiln/dtensor/dtensor.h"

namespace kiln::dtensor {

Tensor full(IntArrayRef sizes, const Scalar& value, const DeviceMesh& mesh,
            ArrayRef<Placement> placements, DType dtype = kFloat32);
Tensor zeros(IntArrayRef sizes, const DeviceMesh& mesh, ArrayRef<Placement> placements,
             DType dtype = kFloat32);
Tensor ones(IntArrayRef sizes, const DeviceMesh& mesh, ArrayRef<Placement> placements,
            DType dtype = kFloat32);
Tensor empty(IntArrayRef sizes, const DeviceMesh& mesh, ArrayRef<Placement> placements,
             DType dtype = kFloat32);

// Random DTensors (PyTorch's torch.distributed.tensor.rand/randn): each rank draws only its
// shard, with exactly the values kiln::rand/randn/randint(sizes, gen, dtype) give at its
// positions, and every rank advances `gen` as that call does, so later replicated draws agree
// across ranks. Without a generator: the default one of the mesh's device; where that lives on
// the device (CUDA, sim), each rank draws the whole tensor and keeps its shard (the same values,
// at the whole tensor's cost). A Replicate tensor is drawn whole on every rank. Partial
// placements are refused (a random term per rank is no draw of the sum). See Note [Global
// positions] in global_positions.cpp.
Tensor rand(IntArrayRef sizes, const DeviceMesh& mesh, ArrayRef<Placement> placements,
            Generator* gen = nullptr, DType dtype = kFloat32);
Tensor randn(IntArrayRef sizes, const DeviceMesh& mesh, ArrayRef<Placement> placements,
             Generator* gen = nullptr, DType dtype = kFloat32);
Tensor randint(int64_t low, int64_t high, IntArrayRef sizes, const DeviceMesh& mesh,
               ArrayRef<Placement> placements, Generator* gen = nullptr, DType dtype = kInt64);

// A 0-d replicated tensor on `like`'s mesh when `like` is a DTensor, else on its device: the
// learning rates and step counts optimizers keep beside their parameters.
Tensor scalar_beside(const Tensor& like, const Scalar& value, DType dtype);

namespace detail {
// rand_like (`normal` false) and randn_like of the DTensor `like`, for kiln/ops' like factory:
// a random DTensor of its mesh, shape and dtype with `placements`.
Tensor random_like(const Tensor& like, ArrayRef<Placement> placements, bool normal, Generator* gen);
}  // namespace detail

}  // namespace kiln::dtensor

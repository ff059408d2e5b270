#pragma once
// DTensor factories: a tensor made directly in its shards, never whole on any rank (PyTorch's
// torch.distributed.tensor.zeros/ones/full/empty). Every rank of the mesh calls them alike; no
// communication. Partial placements are refused for fills other than zeros (every rank's term
// holding the value would sum to the mesh size times it).
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
// A 0-d replicated tensor on `like`'s mesh when `like` is a DTensor, else on its device: the
// learning rates and step counts optimizers keep beside their parameters.
Tensor scalar_beside(const Tensor& like, const Scalar& value, DType dtype);

}  // namespace kiln::dtensor

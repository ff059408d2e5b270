#include "kiln/dtensor/factories.h"

#include "kiln/core/error.h"
#include "kiln/ops/ops.h"

namespace kiln::dtensor {
namespace {

Tensor make(IntArrayRef sizes, const Scalar* value, const DeviceMesh& mesh,
            ArrayRef<Placement> placements, DType dtype, const char* op) {
  const bool zero = value && value->to<double>() == 0.0;
  for (const Placement& p : placements)
    KILN_CHECK(!p.is_partial() || !value || zero,
               "[{}] a fill of {} cannot be Partial ({}): every rank's term would hold it", op,
               value->to<double>(), placements_str(placements));
  const DTensorSpec* spec =
      intern_spec(mesh, placements, sizes, contiguous_strides(sizes), dtype, op);
  Tensor local = value ? kiln::full(spec->local_shape(), *value, dtype, mesh.device())
                       : kiln::empty(spec->local_shape(), dtype, mesh.device());
  return make_dtensor(std::move(local), spec);
}

}  // namespace

Tensor full(IntArrayRef sizes, const Scalar& value, const DeviceMesh& mesh,
            ArrayRef<Placement> placements, DType dtype) {
  return make(sizes, &value, mesh, placements, dtype, "dtensor::full");
}
Tensor zeros(IntArrayRef sizes, const DeviceMesh& mesh, ArrayRef<Placement> placements,
             DType dtype) {
  const Scalar zero(0);
  return make(sizes, &zero, mesh, placements, dtype, "dtensor::zeros");
}
Tensor ones(IntArrayRef sizes, const DeviceMesh& mesh, ArrayRef<Placement> placements,
            DType dtype) {
  const Scalar one(1);
  return make(sizes, &one, mesh, placements, dtype, "dtensor::ones");
}
Tensor empty(IntArrayRef sizes, const DeviceMesh& mesh, ArrayRef<Placement> placements,
             DType dtype) {
  return make(sizes, nullptr, mesh, placements, dtype, "dtensor::empty");
}

Tensor scalar_beside(const Tensor& like, const Scalar& value, DType dtype) {
  if (!is_dtensor(like)) return kiln::full({}, value, dtype, like.device());
  const DeviceMesh& mesh = spec_of(like)->mesh();
  return full({}, value, mesh, Placements(static_cast<size_t>(mesh.ndim()), Replicate()), dtype);
}

}  // namespace kiln::dtensor

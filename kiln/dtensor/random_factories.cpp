// Random DTensors: dtensor::rand, randn and randint, and rand_like/randn_like of a DTensor. Each
// rank draws the values of its shard's global positions. See Note [Global positions] in
// global_positions.cpp.
#include "kiln/core/error.h"
#include "kiln/dtensor/factories.h"
#include "kiln/dtensor/global_positions.h"
#include "kiln/ops/ops.h"

namespace kiln::dtensor {
namespace {

enum class Draw { kUniform, kNormal, kInteger };

struct Request {
  Draw draw;
  int64_t low = 0, high = 0;  // kInteger's range
  const char* op;
};

Tensor draw_whole(const Request& r, IntArrayRef sizes, Generator* gen, DType dtype, Device dev) {
  switch (r.draw) {
    case Draw::kUniform:
      return kiln::rand(sizes, gen, dtype, dev);
    case Draw::kNormal:
      return kiln::randn(sizes, gen, dtype, dev);
    case Draw::kInteger:
      break;
  }
  return kiln::randint(r.low, r.high, sizes, gen, dtype, dev);
}

int per_block(const Request& r, DType dtype) {
  switch (r.draw) {
    case Draw::kUniform:
      return detail::rand_per_block(dtype);
    case Draw::kNormal:
      return detail::randn_per_block(dtype);
    case Draw::kInteger:
      break;
  }
  return detail::kRandintPerBlock;
}

Tensor make(const Request& r, IntArrayRef sizes, const DeviceMesh& mesh,
            ArrayRef<Placement> placements, Generator* gen, DType dtype) {
  for (const Placement& p : placements)
    KILN_CHECK(!p.is_partial(),
               "[{}] a random tensor cannot be Partial ({}): each rank's term would be a draw, "
               "and their sum is not one",
               r.op, placements_str(placements));
  checked_numel(sizes, r.op);
  if (r.draw == Draw::kInteger)
    KILN_CHECK(r.low < r.high, "[{}] expected low < high, but got low={} and high={}", r.op, r.low,
               r.high);
  else
    KILN_CHECK_TYPE(is_floating(dtype), "[{}] expected a floating-point dtype, got {}", r.op,
                    dtype);
  const DTensorSpec* spec =
      intern_spec(mesh, placements, sizes, contiguous_strides(sizes), dtype, r.op);
  const Device device = mesh.device();
  if (spec->is_replicated()) return make_dtensor(draw_whole(r, sizes, gen, dtype, device), spec);
  const detail::Box box = detail::box_of(*spec);
  const detail::BoxDraw at(box, gen, device, per_block(r, dtype));
  Tensor drawn = draw_whole(r, at.sizes(), at.generator(), dtype, device);
  return make_dtensor(at.view(drawn).contiguous(), spec);
}

}  // namespace

Tensor rand(IntArrayRef sizes, const DeviceMesh& mesh, ArrayRef<Placement> placements,
            Generator* gen, DType dtype) {
  return make({Draw::kUniform, 0, 0, "dtensor::rand"}, sizes, mesh, placements, gen, dtype);
}
Tensor randn(IntArrayRef sizes, const DeviceMesh& mesh, ArrayRef<Placement> placements,
             Generator* gen, DType dtype) {
  return make({Draw::kNormal, 0, 0, "dtensor::randn"}, sizes, mesh, placements, gen, dtype);
}
Tensor randint(int64_t low, int64_t high, IntArrayRef sizes, const DeviceMesh& mesh,
               ArrayRef<Placement> placements, Generator* gen, DType dtype) {
  return make({Draw::kInteger, low, high, "dtensor::randint"}, sizes, mesh, placements, gen, dtype);
}

Tensor detail::random_like(const Tensor& like, ArrayRef<Placement> placements, bool normal,
                           Generator* gen) {
  const DTensorSpec& s = *spec_of(like);
  const Request r{normal ? Draw::kNormal : Draw::kUniform, 0, 0,
                  normal ? "randn_like" : "rand_like"};
  return make(r, s.shape(), s.mesh(), placements, gen, s.dtype());
}

}  // namespace kiln::dtensor

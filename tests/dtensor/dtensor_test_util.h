#pragma once
// Helpers shared by the DTensor tests (tests/dtensor): the meshes they run on (made once per
// device, in the same order on every rank: init_device_mesh is collective), a global tensor with
// exact small-integer values, and the expected local shard of a spec cut out of it.
#include <gtest/gtest.h>

#include <map>
#include <string>
#include <vector>

#include "kiln/dtensor/dtensor.h"
#include "kiln/dtensor/redistribute.h"
#include "tests/distributed/dist_test_util.h"

namespace kiln::test {

namespace dt = kiln::dtensor;
using kiln_test::vec;

// A 1-D mesh over the world, named "x".
inline const dt::DeviceMesh& mesh_1d(Device device) {
  static std::map<std::string, const dt::DeviceMesh*> meshes;
  auto& m = meshes[device.str()];
  if (!m) m = &dt::init_device_mesh(device, {dist::world_size()}, {"x"});
  return *m;
}
// A 2-D mesh over the world, dims "dp" and "tp": [2, n/2] for an even world of 4 or more,
// else [1, n].
inline const dt::DeviceMesh& mesh_2d(Device device) {
  static std::map<std::string, const dt::DeviceMesh*> meshes;
  auto& m = meshes[device.str()];
  const int64_t n = dist::world_size();
  if (!m)
    m = &dt::init_device_mesh(device, n >= 4 && n % 2 == 0 ? Shape{2, n / 2} : Shape{1, n},
                              {"dp", "tp"});
  return *m;
}

// Values 1, 2, 3, ... (exact in every dtype used, and never -0.0) plus `bias`.
inline Tensor global_tensor(IntArrayRef shape, DType dtype, Device device, int64_t bias = 0) {
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  return add(arange(n, kFloat64), static_cast<double>(bias + 1))
      .reshape(shape)
      .to(dtype)
      .to(device);
}

// The piece of `global` that `spec` gives this rank (no Partial placements).
inline Tensor expected_local(const Tensor& global, const dt::DTensorSpec& spec) {
  Tensor x = global;
  for (int64_t d = 0; d < spec.ndim(); ++d)
    x = narrow(x, d, spec.local_offset()[d], spec.local_shape()[d]);
  return x;
}

// Every placement a tensor of `ndim` dims may take along one mesh dim: Replicate, Shard of each
// dim, and Partial(sum) when `partial` (floating tensors).
inline std::vector<dt::Placement> placements_of_rank(int64_t ndim, bool partial) {
  std::vector<dt::Placement> ps{dt::Replicate()};
  for (int64_t d = 0; d < ndim; ++d) ps.push_back(dt::Shard(d));
  if (partial) ps.push_back(dt::Partial());
  return ps;
}

// `got` equals `want` in sizes and dtype, and in values within `rtol` of want's largest
// magnitude (compared in float64 on the cpu): the sweeps' comparison with the whole tensors.
inline ::testing::AssertionResult all_close(const Tensor& got, const Tensor& want,
                                            double rtol = 1e-5) {
  if (got.sizes() != want.sizes() || got.dtype() != want.dtype())
    return ::testing::AssertionFailure()
           << "got " << fmt::format("{} {}", got.sizes(), got.dtype()) << ", want "
           << fmt::format("{} {}", want.sizes(), want.dtype());
  Tensor g = got.to(Device(kCPU)).to(kFloat64), w = want.to(Device(kCPU)).to(kFloat64);
  double err = g.numel() ? amax(abs(sub(g, w))).item<double>() : 0;
  double scale = w.numel() ? amax(abs(w)).item<double>() : 0;
  if (err <= rtol * (1 + scale)) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "max error " << err << " (scale " << scale << ")";
}

// The next combination of choices in odometer order (`counts[i]` choices at position i); false
// once every combination was visited (and `pick` is back at all zeros).
inline bool next_pick(std::vector<size_t>& pick, const std::vector<size_t>& counts) {
  size_t i = 0;
  while (i < pick.size() && ++pick[i] == counts[i]) pick[i++] = 0;
  return i < pick.size();
}

inline std::string label(const dt::DeviceMesh& mesh, ArrayRef<dt::Placement> from,
                         ArrayRef<dt::Placement> to, IntArrayRef shape) {
  return fmt::format("{} -> {} shape [{}] on {}", dt::placements_str(from), dt::placements_str(to),
                     fmt::join(shape, ", "), mesh.str());
}

}  // namespace kiln::test

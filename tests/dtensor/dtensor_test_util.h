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

inline std::string label(const dt::DeviceMesh& mesh, ArrayRef<dt::Placement> from,
                         ArrayRef<dt::Placement> to, IntArrayRef shape) {
  return fmt::format("{} -> {} shape [{}] on {}", dt::placements_str(from), dt::placements_str(to),
                     fmt::join(shape, ", "), mesh.str());
}

}  // namespace kiln::test

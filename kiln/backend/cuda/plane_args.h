#pragma once
// Host glue shared by the CUDA kernels that walk [planes, *x] inputs and [planes, *y] outputs of
// up to 3 spatial dims (padding, pooling): their launch arguments (PadArgs, PoolArgs) take the
// meta geometry's std::arrays as plain arrays, the form a kernel argument can have.
#include <array>
#include <cstdint>

namespace kiln::cuda {

// to[j] = from[j] for the 3 spatial dims (unused dims are 1, or 0 for offsets, in the geometry).
inline void copy3(int64_t (&to)[3], const std::array<int64_t, 3>& from) {
  for (size_t j = 0; j < 3; ++j) to[j] = from[j];
}

// a.planes, a.x and a.y from the geometry's (detail::PadGeom, detail::PoolGeom).
template <class Args, class Geom>
void set_planes(Args& a, const Geom& g) {
  a.planes = g.planes;
  copy3(a.x, g.x);
  copy3(a.y, g.y);
}

}  // namespace kiln::cuda

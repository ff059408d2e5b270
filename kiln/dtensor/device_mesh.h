#pragma once
// DeviceMesh: the world's ranks arranged as an N-dimensional array with named dims, one process
// group per mesh dim (DESIGN.md "Distributed"). See Note [Device meshes] in device_mesh.cpp.
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "kiln/core/device.h"
#include "kiln/core/small_vector.h"
#include "kiln/distributed/process_group.h"

namespace kiln::dtensor {

// Meshes live until exit (their groups do), so specs and DTensors hold plain pointers to them
// and two meshes are the same mesh exactly when they are the same object.
class DeviceMesh {
 public:
  DeviceMesh(const DeviceMesh&) = delete;
  DeviceMesh& operator=(const DeviceMesh&) = delete;

  // The device that this rank's local tensors live on (every DTensor of the mesh).
  Device device() const { return device_; }
  int64_t ndim() const { return static_cast<int64_t>(shape_.size()); }
  IntArrayRef shape() const { return shape_; }
  int64_t size(int64_t dim) const { return shape_[check_dim(dim, "DeviceMesh.size")]; }
  // Number of ranks in the mesh.
  int64_t size() const { return static_cast<int64_t>(ranks_.size()); }
  const std::vector<std::string>& dim_names() const { return names_; }
  // The mesh dim named `name`; a ValueError listing the names when there is none.
  int64_t dim_index(std::string_view name) const;
  // World ranks in row-major mesh order.
  const std::vector<int>& ranks() const { return ranks_; }
  // This rank's coordinate along every mesh dim.
  IntArrayRef coordinate() const { return coord_; }
  int64_t coordinate(int64_t dim) const { return coord_[check_dim(dim, "DeviceMesh.coordinate")]; }
  // The group of the ranks that differ from this one only along `dim`; its group rank is this
  // rank's coordinate along `dim`.
  const distributed::ProcessGroup& group(int64_t dim) const {
    return *groups_[check_dim(dim, "DeviceMesh.group")];
  }
  // The world rank at a mesh coordinate.
  int world_rank_at(IntArrayRef coord) const;
  // The sub-mesh of the named dims (in the order given) through this rank: the ranks that share
  // its coordinates along the other dims. Made once per (mesh, names) and kept; no collective.
  const DeviceMesh& submesh(const std::vector<std::string>& names) const;
  // "DeviceMesh(cpu, [2, 2], names=[dp, tp])".
  std::string str() const;

  int64_t check_dim(int64_t dim, const char* op) const;

 private:
  friend struct MeshFactory;
  friend const DeviceMesh& init_device_mesh(Device, IntArrayRef, std::vector<std::string>);
  DeviceMesh() = default;

  Device device_;
  Shape shape_;
  std::vector<std::string> names_;
  std::vector<int> ranks_;
  Shape coord_;
  std::vector<const distributed::ProcessGroup*> groups_;
};

// A mesh of `shape` over the whole world, ranks in row-major order (rank r at the coordinate
// whose row-major index is r). `names` name the dims (default "dim0", "dim1", ...; distinct).
// Every rank calls it with the same arguments (it makes one group per mesh dim, collectively).
// The product of `shape` must equal the world size.
const DeviceMesh& init_device_mesh(Device device, IntArrayRef shape,
                                   std::vector<std::string> names = {});

}  // namespace kiln::dtensor

#include "kiln/dtensor/device_mesh.h"

#include <fmt/ranges.h>

#include <map>
#include <mutex>

#include "kiln/core/error.h"
#include "kiln/distributed/init.h"

namespace kiln::dtensor {

// Note [Device meshes]
// A mesh of shape [n0, n1, ...] lists the world ranks in row-major order. For each mesh dim d,
// the ranks that share every coordinate but d's form one group, made by split_group of the
// world with the row-major index of the other coordinates as colour and the coordinate along d
// as key, so that the group rank is the coordinate. A collective along mesh dim d is a
// collective of that group. A sub-mesh keeps a subset of the dims through this rank: its groups
// are the parent's groups of those dims (the ranks that differ from this one along a kept dim
// only are the same in both), so sub-meshes cost no collective and are made lazily, per rank.
// Meshes and their groups are never freed: specs and DTensors point at them.

struct MeshFactory {
  static DeviceMesh* make() { return new DeviceMesh(); }
};

namespace {

std::mutex g_mesh_mu;
// Owns every mesh and every group a mesh made; never freed (Note [Device meshes]).
std::vector<std::unique_ptr<DeviceMesh>>& all_meshes() {
  static auto* v = new std::vector<std::unique_ptr<DeviceMesh>>();
  return *v;
}
std::vector<std::shared_ptr<distributed::ProcessGroup>>& all_groups() {
  static auto* v = new std::vector<std::shared_ptr<distributed::ProcessGroup>>();
  return *v;
}
// Sub-meshes by (parent, names).
std::map<std::pair<const DeviceMesh*, std::vector<std::string>>, const DeviceMesh*>& submeshes() {
  static auto* m =
      new std::map<std::pair<const DeviceMesh*, std::vector<std::string>>, const DeviceMesh*>();
  return *m;
}

}  // namespace

int64_t DeviceMesh::check_dim(int64_t dim, const char* op) const {
  int64_t n = ndim();
  if (dim < -n || dim >= n)
    KILN_THROW(Index, "[{}] mesh dim {} is out of range for a {}-d mesh {}", op, dim, n, str());
  return dim < 0 ? dim + n : dim;
}

int64_t DeviceMesh::dim_index(std::string_view name) const {
  for (size_t i = 0; i < names_.size(); ++i)
    if (names_[i] == name) return static_cast<int64_t>(i);
  KILN_THROW(Value, "[DeviceMesh] no mesh dim is named '{}'; the dims are [{}]", name,
             fmt::join(names_, ", "));
}

int DeviceMesh::world_rank_at(IntArrayRef coord) const {
  KILN_CHECK(static_cast<int64_t>(coord.size()) == ndim(),
             "[DeviceMesh] coordinate [{}] has {} entries for a {}-d mesh", fmt::join(coord, ", "),
             coord.size(), ndim());
  int64_t idx = 0;
  for (int64_t d = 0; d < ndim(); ++d) {
    KILN_CHECK(coord[d] >= 0 && coord[d] < shape_[d],
               "[DeviceMesh] coordinate [{}] is outside the mesh shape [{}]",
               fmt::join(coord, ", "), fmt::join(shape_, ", "));
    idx = idx * shape_[d] + coord[d];
  }
  return ranks_[idx];
}

std::string DeviceMesh::str() const {
  return fmt::format("DeviceMesh({}, [{}], names=[{}])", device_, fmt::join(shape_, ", "),
                     fmt::join(names_, ", "));
}

const DeviceMesh& DeviceMesh::submesh(const std::vector<std::string>& names) const {
  KILN_CHECK(!names.empty(), "[DeviceMesh.submesh] no dim names given; the dims are [{}]",
             fmt::join(names_, ", "));
  std::vector<int64_t> dims;
  for (const std::string& n : names) {
    int64_t d = dim_index(n);
    for (int64_t e : dims)
      KILN_CHECK(e != d, "[DeviceMesh.submesh] dim '{}' is named twice in [{}]", n,
                 fmt::join(names, ", "));
    dims.push_back(d);
  }
  std::lock_guard<std::mutex> lock(g_mesh_mu);
  auto key = std::make_pair(this, names);
  if (auto it = submeshes().find(key); it != submeshes().end()) return *it->second;

  DeviceMesh* m = MeshFactory::make();
  m->device_ = device_;
  for (int64_t d : dims) {
    m->shape_.push_back(shape_[d]);
    m->names_.push_back(names_[d]);
    m->coord_.push_back(coord_[d]);
    m->groups_.push_back(groups_[d]);
  }
  // Row-major over the kept dims, the other coordinates fixed at this rank's.
  Shape c = coord_;
  int64_t total = 1;
  for (int64_t s : m->shape_) total *= s;
  for (int64_t i = 0; i < total; ++i) {
    int64_t rem = i;
    for (size_t k = dims.size(); k-- > 0;) {
      c[dims[k]] = rem % m->shape_[k];
      rem /= m->shape_[k];
    }
    m->ranks_.push_back(world_rank_at(c));
  }
  all_meshes().emplace_back(m);
  submeshes().emplace(std::move(key), m);
  return *m;
}

const DeviceMesh& init_device_mesh(Device device, IntArrayRef shape,
                                   std::vector<std::string> names) {
  const int world = distributed::world_size();
  KILN_CHECK(!shape.empty(), "[init_device_mesh] the mesh shape is empty; the world has {} ranks",
             world);
  int64_t product = 1;
  for (int64_t s : shape) {
    KILN_CHECK(s >= 1, "[init_device_mesh] mesh shape [{}] has a dim of size {}",
               fmt::join(shape, ", "), s);
    product *= s;
  }
  KILN_CHECK(product == world,
             "[init_device_mesh] mesh shape [{}] holds {} ranks but the world has {}",
             fmt::join(shape, ", "), product, world);
  if (names.empty())
    for (size_t i = 0; i < shape.size(); ++i) names.push_back(fmt::format("dim{}", i));
  KILN_CHECK(names.size() == shape.size(),
             "[init_device_mesh] {} dim names [{}] for a {}-d mesh shape [{}]", names.size(),
             fmt::join(names, ", "), shape.size(), fmt::join(shape, ", "));
  for (size_t i = 0; i < names.size(); ++i)
    for (size_t j = 0; j < i; ++j)
      KILN_CHECK(names[i] != names[j], "[init_device_mesh] dim name '{}' is used twice in [{}]",
                 names[i], fmt::join(names, ", "));

  const int me = distributed::rank();
  const int64_t n = static_cast<int64_t>(shape.size());
  Shape coord(shape.size());
  for (int64_t d = n, rem = me; d-- > 0;) {
    coord[d] = rem % shape[d];
    rem /= shape[d];
  }
  std::lock_guard<std::mutex> lock(g_mesh_mu);
  DeviceMesh* m = MeshFactory::make();
  all_meshes().emplace_back(m);
  m->device_ = device;
  m->shape_ = Shape(shape);
  m->names_ = std::move(names);
  m->coord_ = coord;
  for (int r = 0; r < world; ++r) m->ranks_.push_back(r);
  for (int64_t d = 0; d < n; ++d) {
    // Colour: the row-major index of the other coordinates (Note [Device meshes]).
    int64_t color = 0;
    for (int64_t e = 0; e < n; ++e)
      if (e != d) color = color * shape[e] + coord[e];
    auto g = distributed::split_group(distributed::world(), static_cast<int>(color),
                                      static_cast<int>(coord[d]));
    KILN_ASSERT(g && g->rank() == coord[d] && g->size() == shape[d],
                "mesh dim {} group has rank {} of {} at coordinate {}", d, g ? g->rank() : -1,
                g ? g->size() : 0, coord[d]);
    m->groups_.push_back(g.get());
    all_groups().push_back(std::move(g));
  }
  return *m;
}

}  // namespace kiln::dtensor

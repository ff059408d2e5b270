#pragma once
// DTensorSpec: how one DTensor is laid out (mesh, placements, global shape, strides, dtype),
// interned: one immutable object per distinct spec, so comparing and hashing specs are pointer
// operations. See Note [Interned specs] in spec.cpp.
#include <cstdint>
#include <span>
#include <string>

#include "kiln/core/dtype.h"
#include "kiln/core/small_vector.h"
#include "kiln/dtensor/device_mesh.h"
#include "kiln/dtensor/placement.h"

namespace kiln::dtensor {

class DTensorSpec {
 public:
  DTensorSpec(const DTensorSpec&) = delete;
  DTensorSpec& operator=(const DTensorSpec&) = delete;

  const DeviceMesh& mesh() const { return *mesh_; }
  // One per mesh dim; Shard dims are in [0, ndim).
  ArrayRef<Placement> placements() const { return {placements_.data(), placements_.size()}; }
  const Placement& placement(int64_t mesh_dim) const { return placements_[mesh_dim]; }
  IntArrayRef shape() const { return shape_; }
  IntArrayRef strides() const { return strides_; }
  int64_t ndim() const { return static_cast<int64_t>(shape_.size()); }
  DType dtype() const { return dtype_; }

  // Precomputed for this rank: the shape of its local tensor and where it starts in the global
  // tensor, per tensor dim (Note [Nested shards] in spec.cpp).
  IntArrayRef local_shape() const { return local_shape_; }
  IntArrayRef local_offset() const { return local_offset_; }
  // Whether every shard on every rank has the same shape (no dim's chunks are uneven).
  bool is_even() const { return even_; }
  bool has_partial() const { return has_partial_; }
  bool is_replicated() const { return replicated_; }  // every placement is Replicate
  // Distinct per spec, dense from 0 (a cache may index by it).
  uint32_t id() const { return id_; }
  // The local shape of the rank at mesh coordinate `coord`.
  Shape local_shape_at(IntArrayRef coord) const;

  // "Spec([S(0), R], [4, 6], float32, DeviceMesh(...))".
  std::string str() const;

 private:
  friend struct SpecTable;
  DTensorSpec() = default;

  const DeviceMesh* mesh_ = nullptr;
  std::vector<Placement> placements_;
  Shape shape_;
  Shape strides_;
  DType dtype_{};
  Shape local_shape_;
  Shape local_offset_;
  bool even_ = true;
  bool has_partial_ = false;
  bool replicated_ = true;
  uint32_t id_ = 0;
  uint64_t hash_ = 0;
};

// The interned spec; validates first: one placement per mesh dim, Shard dims in range (negative
// ones count from the end and are stored normalised), Partial's reduction one of sum, avg, max,
// min, strides as many as sizes. `op` names the caller in errors. Thread-safe; finding an
// existing spec takes no lock and allocates nothing. Raises when the table is full (see
// max_specs()).
const DTensorSpec* intern_spec(const DeviceMesh& mesh, ArrayRef<Placement> placements,
                               IntArrayRef shape, IntArrayRef strides, DType dtype,
                               const char* op = "DTensorSpec");
// The same spec with other placements.
const DTensorSpec* with_placements(const DTensorSpec& spec, ArrayRef<Placement> placements,
                                   const char* op = "DTensorSpec");

// The bound of the intern table (KILN_DTENSOR_MAX_SPECS, default 65536, read once) and how many
// specs it holds now.
size_t max_specs();
size_t interned_spec_count();

}  // namespace kiln::dtensor

template <>
struct fmt::formatter<kiln::dtensor::DTensorSpec> : fmt::formatter<std::string_view> {
  auto format(const kiln::dtensor::DTensorSpec& s, format_context& ctx) const {
    return fmt::formatter<std::string_view>::format(s.str(), ctx);
  }
};

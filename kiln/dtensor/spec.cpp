#include "kiln/dtensor/spec.h"

#include <fmt/ranges.h>

#include <atomic>
#include <cstdlib>
#include <memory>
#include <mutex>

#include "kiln/core/error.h"

namespace kiln::dtensor {

// Note [Interned specs]
// Every spec lives in one table for the life of the process, one object per distinct (mesh,
// placements, shape, strides, dtype), so two DTensors have the same layout exactly when their
// spec pointers are equal, and a cache keyed by specs hashes pointers (or ids). The table is an
// open-addressing hash set of atomic pointers, twice as many slots as the bound: a lookup hashes
// the key where the caller holds it (spans, no copy), walks the slots with acquire loads and
// compares in place, so finding an existing spec takes no lock and allocates nothing. Inserting
// takes a mutex, probes again, and publishes the new spec with a release store; specs are never
// removed, so a reader can never see a freed one. The bound (KILN_DTENSOR_MAX_SPECS, default
// 65536) keeps a program whose shapes never repeat from growing without end: the spec after the
// last one is a ValueError naming the bound, never an eviction (a live DTensor may point at any
// spec). Specs are small (a few hundred bytes), so the default is tens of MB at most.
//
// Note [Nested shards]
// Placements apply in mesh-dim order: mesh dim 0 chunks the global tensor, mesh dim 1 chunks
// what dim 0 left this rank, and so on; two mesh dims that shard the same tensor dim nest (the
// later one splits the earlier one's chunk), as in PyTorch. Each chunking follows chunk's rule
// (ceil-sized pieces, the last ones smaller or empty).

struct SpecTable {
  static size_t bound() {
    static const size_t b = [] {
      const char* e = std::getenv("KILN_DTENSOR_MAX_SPECS");
      long v = e ? std::atol(e) : 0;
      return v > 0 ? static_cast<size_t>(v) : size_t{65536};
    }();
    return b;
  }
  static size_t slot_count() {
    static const size_t n = [] {
      size_t s = 16;
      while (s < 2 * bound()) s *= 2;
      return s;
    }();
    return n;
  }
  static std::atomic<const DTensorSpec*>* slots() {
    static auto* s = new std::atomic<const DTensorSpec*>[slot_count()]();
    return s;
  }
  static std::mutex& mu() {
    static auto* m = new std::mutex();
    return *m;
  }
  static inline std::atomic<size_t> count{0};

  static uint64_t mix(uint64_t h, uint64_t v) {
    h ^= v + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
    return h;
  }
  static uint64_t hash(const DeviceMesh* mesh, ArrayRef<Placement> ps, IntArrayRef shape,
                       IntArrayRef strides, DType dtype) {
    uint64_t h = reinterpret_cast<uintptr_t>(mesh);
    for (const Placement& p : ps)
      h = mix(h, static_cast<uint64_t>(p.kind()) | static_cast<uint64_t>(p.dim()) << 8 |
                     static_cast<uint64_t>(p.reduce_op()) << 40);
    for (int64_t s : shape) h = mix(h, static_cast<uint64_t>(s));
    h = mix(h, 0xfeed);
    for (int64_t s : strides) h = mix(h, static_cast<uint64_t>(s));
    return mix(h, static_cast<uint64_t>(dtype));
  }
  static bool same(const DTensorSpec& s, const DeviceMesh* mesh, ArrayRef<Placement> ps,
                   IntArrayRef shape, IntArrayRef strides, DType dtype) {
    if (s.mesh_ != mesh || s.dtype_ != dtype || s.placements_.size() != ps.size() ||
        !(s.shape_.span() == shape) || !(s.strides_.span() == strides))
      return false;
    for (size_t i = 0; i < ps.size(); ++i)
      if (!(s.placements_[i] == ps[i])) return false;
    return true;
  }

  static const DTensorSpec* find(uint64_t h, const DeviceMesh* mesh, ArrayRef<Placement> ps,
                                 IntArrayRef shape, IntArrayRef strides, DType dtype,
                                 size_t* empty_slot) {
    const size_t mask = slot_count() - 1;
    std::atomic<const DTensorSpec*>* s = slots();
    for (size_t i = h & mask;; i = (i + 1) & mask) {
      const DTensorSpec* p = s[i].load(std::memory_order_acquire);
      if (!p) {
        if (empty_slot) *empty_slot = i;
        return nullptr;
      }
      if (p->hash_ == h && same(*p, mesh, ps, shape, strides, dtype)) return p;
    }
  }

  static DTensorSpec* make(uint64_t h, const DeviceMesh& mesh, ArrayRef<Placement> ps,
                           IntArrayRef shape, IntArrayRef strides, DType dtype, uint32_t id);
};

Shape DTensorSpec::local_shape_at(IntArrayRef coord) const {
  Shape local = shape_;
  for (size_t i = 0; i < placements_.size(); ++i) {
    const Placement& p = placements_[i];
    if (!p.is_shard()) continue;
    int64_t& s = local[p.dim()];
    s = chunk_length(s, mesh_->shape()[i], coord[i]);
  }
  return local;
}

DTensorSpec* SpecTable::make(uint64_t h, const DeviceMesh& mesh, ArrayRef<Placement> ps,
                             IntArrayRef shape, IntArrayRef strides, DType dtype, uint32_t id) {
  auto s = std::unique_ptr<DTensorSpec>(new DTensorSpec());
  s->id_ = id;
  s->mesh_ = &mesh;
  s->placements_.assign(ps.begin(), ps.end());
  s->shape_ = Shape(shape);
  s->strides_ = Shape(strides);
  s->dtype_ = dtype;
  s->hash_ = h;
  s->local_shape_ = Shape(shape);
  s->local_offset_ = Shape(shape.size(), 0);
  // See Note [Nested shards].
  for (size_t i = 0; i < ps.size(); ++i) {
    const Placement& p = ps[i];
    s->has_partial_ |= p.is_partial();
    s->replicated_ &= p.is_replicate();
    if (!p.is_shard()) continue;
    const int64_t d = p.dim(), k = mesh.shape()[i], c = mesh.coordinate()[i];
    int64_t& len = s->local_shape_[d];
    if (len % k != 0) s->even_ = false;
    s->local_offset_[d] += chunk_offset(len, k, c);
    len = chunk_length(len, k, c);
  }
  return s.release();
}

const DTensorSpec* intern_spec(const DeviceMesh& mesh, ArrayRef<Placement> placements,
                               IntArrayRef shape, IntArrayRef strides, DType dtype,
                               const char* op) {
  // Fast path: an existing spec (normalised placements, as every caller past the first passes).
  const uint64_t h0 = SpecTable::hash(&mesh, placements, shape, strides, dtype);
  if (const DTensorSpec* s = SpecTable::find(h0, &mesh, placements, shape, strides, dtype, nullptr))
    return s;

  const int64_t nd = static_cast<int64_t>(shape.size());
  KILN_CHECK(static_cast<int64_t>(placements.size()) == mesh.ndim(),
             "[{}] {} placements {} for a {}-d mesh {}", op, placements.size(),
             placements_str(placements), mesh.ndim(), mesh.str());
  KILN_CHECK(strides.size() == shape.size(), "[{}] {} strides [{}] for shape [{}]", op,
             strides.size(), fmt::join(strides, ", "), fmt::join(shape, ", "));
  for (int64_t s : shape)
    KILN_CHECK(s >= 0, "[{}] negative size in shape [{}]", op, fmt::join(shape, ", "));
  std::vector<Placement> norm(placements.begin(), placements.end());
  for (Placement& p : norm) {
    if (p.is_shard()) {
      if (p.dim() < -nd || p.dim() >= nd)
        KILN_THROW(Index, "[{}] placement {} in {} is out of range for a {}-d tensor of shape [{}]",
                   op, p.str(), placements_str(placements), nd, fmt::join(shape, ", "));
      if (p.dim() < 0) p = Shard(p.dim() + nd);
    } else if (p.is_partial()) {
      ReduceOp r = p.reduce_op();
      KILN_CHECK(
          r == ReduceOp::Sum || r == ReduceOp::Avg || r == ReduceOp::Max || r == ReduceOp::Min,
          "[{}] Partial({}) is not a placement: Partial takes sum, avg, max or min", op,
          distributed::reduce_op_name(r));
      KILN_CHECK(r != ReduceOp::Avg || is_floating(dtype),
                 "[{}] Partial(avg) needs a floating dtype, got {}", op, dtype);
    }
  }
  const uint64_t h = SpecTable::hash(&mesh, norm, shape, strides, dtype);
  if (h != h0)
    if (const DTensorSpec* s = SpecTable::find(h, &mesh, norm, shape, strides, dtype, nullptr))
      return s;

  std::lock_guard<std::mutex> lock(SpecTable::mu());
  size_t slot = 0;
  if (const DTensorSpec* s = SpecTable::find(h, &mesh, norm, shape, strides, dtype, &slot))
    return s;
  const size_t n = SpecTable::count.load(std::memory_order_relaxed);
  KILN_CHECK(n < SpecTable::bound(),
             "[{}] the DTensor spec table is full ({} specs, KILN_DTENSOR_MAX_SPECS); cannot "
             "intern {} of shape [{}]",
             op, n, placements_str(norm), fmt::join(shape, ", "));
  DTensorSpec* s = SpecTable::make(h, mesh, norm, shape, strides, dtype, static_cast<uint32_t>(n));
  SpecTable::count.store(n + 1, std::memory_order_relaxed);
  SpecTable::slots()[slot].store(s, std::memory_order_release);
  return s;
}

const DTensorSpec* with_placements(const DTensorSpec& spec, ArrayRef<Placement> placements,
                                   const char* op) {
  return intern_spec(spec.mesh(), placements, spec.shape(), spec.strides(), spec.dtype(), op);
}

size_t max_specs() { return SpecTable::bound(); }
size_t interned_spec_count() { return SpecTable::count.load(std::memory_order_relaxed); }

std::string DTensorSpec::str() const {
  return fmt::format("Spec({}, [{}], {}, {})", placements_str(placements()),
                     fmt::join(shape_, ", "), dtype_, mesh_->str());
}

}  // namespace kiln::dtensor

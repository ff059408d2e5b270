#pragma once
// Placements: how a DTensor is laid out along one mesh dimension (DESIGN.md "Distributed").
// Shard(d): split along tensor dim d by chunk's rule; Replicate: every rank holds the whole;
// Partial(op): every rank holds a term, the value is their reduction.
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "kiln/core/small_vector.h"
#include "kiln/distributed/process_group.h"

namespace kiln::dtensor {

using distributed::ReduceOp;

// The argument types that build a Placement: {Shard(0), Replicate(), Partial(ReduceOp::Avg)}.
struct Shard {
  explicit constexpr Shard(int64_t d) : dim(d) {}
  int64_t dim;
};
struct Replicate {};
struct Partial {
  explicit constexpr Partial(ReduceOp o = ReduceOp::Sum) : op(o) {}
  ReduceOp op;
};

// One mesh dimension's placement: 8 bytes, compared by value. A Shard dim may be negative until
// a spec normalises it against the tensor's rank.
class Placement {
 public:
  enum class Kind : uint8_t { Shard, Replicate, Partial };

  constexpr Placement(Shard s) : kind_(Kind::Shard), dim_(s.dim) {}    // NOLINT: implicit
  constexpr Placement(Replicate) : kind_(Kind::Replicate) {}           // NOLINT: implicit
  constexpr Placement(Partial p) : kind_(Kind::Partial), op_(p.op) {}  // NOLINT: implicit

  Kind kind() const { return kind_; }
  bool is_shard() const { return kind_ == Kind::Shard; }
  bool is_shard(int64_t d) const { return kind_ == Kind::Shard && dim_ == d; }
  bool is_replicate() const { return kind_ == Kind::Replicate; }
  bool is_partial() const { return kind_ == Kind::Partial; }
  // The tensor dim of a Shard (0 otherwise).
  int64_t dim() const { return dim_; }
  // The reduction of a Partial (Sum otherwise).
  ReduceOp reduce_op() const { return op_; }

  // "S(0)", "R", "P(sum)".
  std::string str() const;
  bool operator==(const Placement& o) const {
    return kind_ == o.kind_ && dim_ == o.dim_ && op_ == o.op_;
  }

 private:
  Kind kind_;
  int64_t dim_ = 0;
  ReduceOp op_ = ReduceOp::Sum;
};

using Placements = std::vector<Placement>;

// "[S(0), R]".
std::string placements_str(ArrayRef<Placement> ps);

// Chunk's rule for `size` elements over `parts` ranks: ceil-sized pieces, the last ones smaller
// or empty. Piece `index`'s length and its offset.
inline int64_t chunk_size(int64_t size, int64_t parts) { return (size + parts - 1) / parts; }
inline int64_t chunk_length(int64_t size, int64_t parts, int64_t index) {
  int64_t c = chunk_size(size, parts);
  int64_t rest = size - c * index;
  return rest <= 0 ? 0 : (rest < c ? rest : c);
}
inline int64_t chunk_offset(int64_t size, int64_t parts, int64_t index) {
  int64_t o = chunk_size(size, parts) * index;
  return o < size ? o : size;
}

}  // namespace kiln::dtensor

template <>
struct fmt::formatter<kiln::dtensor::Placement> : fmt::formatter<std::string_view> {
  auto format(const kiln::dtensor::Placement& p, format_context& ctx) const {
    return fmt::formatter<std::string_view>::format(p.str(), ctx);
  }
};

#pragma once
// Tensor indexing from C++, as libtorch's torch::indexing:
//   using namespace kiln::indexing;
//   x.index({Slice(1, 3), idx, None, Ellipsis, 0});
//   x.index_put_({mask}, 0.0);
// An integer selects (the dim goes), Slice(start, stop, step) slices (ends optional, negative
// ones count from the end, clamped as Python's), None inserts a dim of size 1, Ellipsis stands for
// the dims not named, a bool is None followed by an index of [0] (true) or of nothing (false),
// and a Tensor is an advanced index: int64/int32 values, or a bool/uint8 mask over as many dims
// as it has (its nonzero() positions: a host read). Integers, slices and None make views; the
// advanced indices then go to kiln::index / index_put_ together (Note [Advanced indexing]).
#include <optional>

#include "kiln/ops/ops.h"

namespace kiln {

namespace indexing {
// std::nullopt, so that Slice(None, 3) reads as libtorch's.
inline constexpr std::nullopt_t None = std::nullopt;
struct EllipsisIndex {};
inline constexpr EllipsisIndex Ellipsis{};
// Python's start:stop:step; an empty end is the whole dim's.
struct Slice {
  Slice(std::optional<int64_t> start = std::nullopt, std::optional<int64_t> stop = std::nullopt,
        std::optional<int64_t> step = std::nullopt)
      : start(start), stop(stop), step(step) {}
  std::optional<int64_t> start, stop, step;
};
}  // namespace indexing

class TensorIndex;
namespace indexing {
// What x.index(indices) and x.index_put_(indices, values) run (libtorch's get_item and
// set_item); values broadcast to the indexed shape in self's dtype.
Tensor get_item(const Tensor& self, ArrayRef<TensorIndex> indices);
Tensor& set_item(Tensor& self, ArrayRef<TensorIndex> indices, const Tensor& values);
}  // namespace indexing

class TensorIndex {
 public:
  enum class Kind { Integer, Slice, None, Ellipsis, Boolean, Tensor };
  TensorIndex(int64_t i) : kind_(Kind::Integer), integer_(i) {}
  TensorIndex(int i) : TensorIndex(static_cast<int64_t>(i)) {}
  TensorIndex(bool b) : kind_(Kind::Boolean), boolean_(b) {}
  TensorIndex(indexing::Slice s) : kind_(Kind::Slice), slice_(s) {}
  TensorIndex(std::nullopt_t) : kind_(Kind::None) {}
  TensorIndex(indexing::EllipsisIndex) : kind_(Kind::Ellipsis) {}
  TensorIndex(Tensor t) : kind_(Kind::Tensor), tensor_(std::move(t)) {}

  Kind kind() const { return kind_; }
  int64_t integer() const { return integer_; }
  bool boolean() const { return boolean_; }
  const indexing::Slice& slice() const { return slice_; }
  const Tensor& tensor() const { return tensor_; }

 private:
  Kind kind_;
  int64_t integer_ = 0;
  bool boolean_ = false;
  indexing::Slice slice_;
  Tensor tensor_;
};

}  // namespace kiln

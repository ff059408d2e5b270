#include "kiln/dtensor/placement.h"

namespace kiln::dtensor {

std::string Placement::str() const {
  switch (kind_) {
    case Kind::Shard:
      return fmt::format("S({})", dim_);
    case Kind::Replicate:
      return "R";
    case Kind::Partial:
      return fmt::format("P({})", distributed::reduce_op_name(op_));
  }
  return "?";
}

std::string placements_str(ArrayRef<Placement> ps) {
  std::string s = "[";
  for (size_t i = 0; i < ps.size(); ++i) {
    if (i) s += ", ";
    s += ps[i].str();
  }
  return s + "]";
}

}  // namespace kiln::dtensor

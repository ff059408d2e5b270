#pragma once
// Sizes of dynamic dims: graphs for new sizes derived from two traced ones, without tracing.
// See Note [Dynamic dims] in compile.cpp.
#include <optional>
#include <string>

#include "kiln/compile/graph.h"

namespace kiln::compiler {

// Every integer of a graph that may depend on the dynamic size (value geometry, buffer sizes,
// integer attributes, 0-d integer constants) as a + b * t, fitted from two graphs traced at
// t1 != t2 that agree in everything else.
class SizeTemplate {
 public:
  // A template, or nullopt with `why` set ("node 12 'div' has attribute 0.25 at size 4 and
  // 0.125 at size 8").
  static std::optional<SizeTemplate> fit(const Graph& g1, int64_t t1, const Graph& g2, int64_t t2,
                                         std::string& why);
  // The graph at size `t`, checked by running every node's meta function on shape-only
  // tensors of the derived geometry; nullopt with `why` when a check fails.
  std::optional<Graph> instantiate(int64_t t, std::string& why) const;
  // References the template holds to `t` (its copy of the first graph's free tensors).
  int refs_to(const TensorImpl* t) const;

 private:
  Graph base_;
  std::vector<int64_t> intercept_, slope_;
};

}  // namespace kiln::compiler

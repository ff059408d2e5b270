#pragma once
// Graph IR: what a traced call did, as values and nodes. See DESIGN.md "Compile".
//
// Note [Values, buffers and mutation]
// A *value* is one tensor the traced call saw: its meta (dtype, device, sizes, strides, offset)
// and the *buffer* (storage) it lives in. Each value is defined once (SSA): by an input, by a
// free tensor lifted by identity, by a constant, or by the node that produced it. Views are
// values in their base's buffer with their own geometry, so they cost nothing at replay.
// Mutation (in-place and out= ops) is a node's effect on buffers, not a new value: nodes are
// kept in trace order and the passes never move or merge a node across a write to a buffer it
// reads.
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "kiln/dispatch/ivalue.h"
#include "kiln/dispatch/op.h"

namespace kiln::compiler {

enum class BufferKind : uint8_t {
  Input,         // a call's input tensor's storage, bound anew at every call
  Free,          // storage of a tensor the function reached without being given it
  Constant,      // made inside the call without an op (e.g. a wrapped number); kept as traced
  Intermediate,  // made by a node
};
std::string_view buffer_kind_name(BufferKind k);

struct Buffer {
  BufferKind kind;
  Device device;
  size_t nbytes = 0;
  int input = -1;     // Input: which input
  int producer = -1;  // Intermediate: the node that made it
  // The traced storage: held for inputs, free tensors and constants; intermediates are not
  // kept alive by the trace (it would hold every activation of a step at once).
  Ref<StorageImpl> storage;
};

struct Value {
  DType dtype;
  Device device;
  Shape sizes;
  Shape strides;
  int64_t offset = 0;  // in elements, within the buffer
  int buffer = -1;
  int producer = -1;  // node that defined it; -1 for inputs, free tensors and constants
  int input = -1;     // the input it is, if any
  // The tensor seen while tracing, held for inputs, free tensors and constants (free tensors
  // keep their identity); undefined for values made by nodes.
  Tensor traced;
  int outside_refs = 0;  // free tensors: references held outside the graph when traced
};

// A node's argument: one value, a list of values, or an attribute (a non-tensor argument).
struct Arg {
  enum class Kind : uint8_t { Value, List, Attr } kind = Kind::Attr;
  int value = -1;           // Value: the value id (-1 for an undefined optional tensor)
  std::vector<int> values;  // List
  IValue attr;              // Attr
};

struct Node {
  const OpDef* op = nullptr;  // nullptr for a host read
  std::vector<Arg> args;
  std::vector<int> outputs;         // values this node defines
  std::vector<int> writes;          // buffers this node mutates
  const char* host_read = nullptr;  // "item", "to_vector", ...: a read of `args[0]` on the host
  bool random = false;              // draws from a generator (never merged or dropped)
  bool communicates = false;        // a collective (OpDef::side_effects): never merged or dropped

  std::string_view name() const;
  bool has_effects() const { return !writes.empty() || host_read || random || communicates; }
};

class Graph {
 public:
  std::vector<Buffer> buffers;
  std::vector<Value> values;
  std::vector<Node> nodes;
  std::vector<int> inputs;   // value ids of the inputs, in call order
  std::vector<int> outputs;  // value ids returned, in order

  // Text: one line per node, `%3 = add(%1, %2, alpha=1)`.
  std::string str() const;
  // Graphviz DOT: values and nodes as a data-flow graph.
  std::string dot() const;
  std::string value_str(int v) const;
};

// The boxed arguments of `n`, with value v given as tensors[v] (and every Device attribute
// replaced by `device` when one is given: shape-only runs put factories on the meta device).
Stack node_args(const Node& n, const std::vector<Tensor>& tensors,
                std::optional<Device> device = std::nullopt);
// An attribute as the text dump prints it.
std::string attr_str(const IValue& v);
// Removes the nodes without `keep`, renumbering producers.
void compact(Graph& g, const std::vector<bool>& keep);

}  // namespace kiln::compiler

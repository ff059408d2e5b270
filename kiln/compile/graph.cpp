#include "kiln/compile/graph.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

namespace kiln::compiler {

std::string_view buffer_kind_name(BufferKind k) {
  switch (k) {
    case BufferKind::Input:
      return "input";
    case BufferKind::Free:
      return "free";
    case BufferKind::Constant:
      return "constant";
    case BufferKind::Intermediate:
      return "intermediate";
  }
  return "?";
}

std::string_view Node::name() const { return op ? op->name() : std::string_view(host_read); }

std::string attr_str(const IValue& v) {
  return std::visit(
      [](const auto& x) -> std::string {
        using T = std::decay_t<decltype(x)>;
        if constexpr (std::is_same_v<T, std::monostate>)
          return "None";
        else if constexpr (std::is_same_v<T, Tensor> || std::is_same_v<T, TensorList>)
          return "<tensor>";
        else if constexpr (std::is_same_v<T, Scalar>)
          return fmt::format("{}", x);
        else if constexpr (std::is_same_v<T, Shape>)
          return fmt::format("[{}]", fmt::join(x.span(), ", "));
        else if constexpr (std::is_same_v<T, DType>)
          return std::string(name(x));
        else if constexpr (std::is_same_v<T, Device>)
          return x.str();
        else if constexpr (std::is_same_v<T, Generator*>)
          return x ? "<generator>" : "None";
        else if constexpr (std::is_same_v<T, bool>)
          return x ? "True" : "False";
        else
          return fmt::format("{}", x);
      },
      v);
}

Stack node_args(const Node& n, const std::vector<Tensor>& tensors, std::optional<Device> device) {
  Stack s;
  s.reserve(n.args.size());
  for (const Arg& a : n.args) {
    if (a.kind == Arg::Kind::Value) {
      s.emplace_back(a.value < 0 ? Tensor() : tensors[a.value]);
    } else if (a.kind == Arg::Kind::List) {
      TensorList l;
      for (int v : a.values) l.push_back(v < 0 ? Tensor() : tensors[v]);
      s.emplace_back(std::move(l));
    } else if (device && std::holds_alternative<Device>(a.attr)) {
      s.emplace_back(*device);
    } else {
      s.push_back(a.attr);
    }
  }
  return s;
}

void compact(Graph& g, const std::vector<bool>& keep) {
  std::vector<int> index(g.nodes.size(), -1);
  std::vector<Node> kept;
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    if (!keep[i]) continue;
    index[i] = static_cast<int>(kept.size());
    kept.push_back(std::move(g.nodes[i]));
  }
  g.nodes = std::move(kept);
  for (Value& v : g.values)
    if (v.producer >= 0) v.producer = index[v.producer];
  for (Buffer& b : g.buffers)
    if (b.producer >= 0) b.producer = index[b.producer];
}

namespace {

std::string args_str(const Graph& g, const Node& n) {
  std::vector<std::string> parts;
  for (const Arg& a : n.args) {
    switch (a.kind) {
      case Arg::Kind::Value:
        parts.push_back(a.value < 0 ? "None" : fmt::format("%{}", a.value));
        break;
      case Arg::Kind::List: {
        std::vector<std::string> l;
        for (int v : a.values) l.push_back(v < 0 ? std::string("None") : fmt::format("%{}", v));
        parts.push_back(fmt::format("[{}]", fmt::join(l, ", ")));
        break;
      }
      case Arg::Kind::Attr:
        parts.push_back(attr_str(a.attr));
        break;
    }
  }
  (void)g;
  return fmt::format("{}", fmt::join(parts, ", "));
}

}  // namespace

std::string Graph::value_str(int id) const {
  const Value& v = values[id];
  const Buffer& b = buffers[v.buffer];
  return fmt::format("%{}: {}[{}] {} (buffer {}, {})", id, name(v.dtype), fmt::join(v.sizes, ", "),
                     v.device.str(), v.buffer, buffer_kind_name(b.kind));
}

std::string Graph::str() const {
  std::string s;
  for (size_t i = 0; i < inputs.size(); ++i)
    s += fmt::format("input {}: {}\n", i, value_str(inputs[i]));
  for (size_t v = 0; v < values.size(); ++v) {
    BufferKind k = buffers[values[v].buffer].kind;
    if (values[v].producer < 0 && (k == BufferKind::Free || k == BufferKind::Constant))
      s += fmt::format("{}: {}\n", buffer_kind_name(k), value_str(static_cast<int>(v)));
  }
  for (size_t i = 0; i < nodes.size(); ++i) {
    const Node& n = nodes[i];
    std::vector<std::string> outs;
    for (int o : n.outputs)
      outs.push_back(
          fmt::format("%{}: {}[{}]", o, name(values[o].dtype), fmt::join(values[o].sizes, ", ")));
    std::string lhs = outs.empty() ? "" : fmt::format("{} = ", fmt::join(outs, ", "));
    std::string effects;
    if (!n.writes.empty()) effects = fmt::format("  # writes buffer {}", fmt::join(n.writes, ", "));
    if (n.host_read) effects = "  # host read: graph break";
    s += fmt::format("n{}: {}{}({}){}\n", i, lhs, n.name(), args_str(*this, n), effects);
  }
  std::vector<std::string> outs;
  for (int o : outputs) outs.push_back(fmt::format("%{}", o));
  s += fmt::format("return ({})\n", fmt::join(outs, ", "));
  return s;
}

std::string Graph::dot() const {
  std::string s = "digraph kiln {\n  rankdir=TB;\n  node [fontname=\"monospace\"];\n";
  for (size_t v = 0; v < values.size(); ++v) {
    const Value& x = values[v];
    s += fmt::format("  v{} [shape=ellipse, label=\"%{}\\n{}[{}]\\n{}\"];\n", v, v, name(x.dtype),
                     fmt::join(x.sizes, ","), buffer_kind_name(buffers[x.buffer].kind));
  }
  for (size_t i = 0; i < nodes.size(); ++i) {
    const Node& n = nodes[i];
    s += fmt::format("  n{} [shape=box, style=filled, fillcolor=\"{}\", label=\"n{}: {}\"];\n", i,
                     n.host_read        ? "salmon"
                     : n.writes.empty() ? "lightblue"
                                        : "khaki",
                     i, n.name());
    for (const Arg& a : n.args) {
      if (a.kind == Arg::Kind::Value && a.value >= 0)
        s += fmt::format("  v{} -> n{};\n", a.value, i);
      if (a.kind == Arg::Kind::List)
        for (int v : a.values)
          if (v >= 0) s += fmt::format("  v{} -> n{};\n", v, i);
    }
    for (int o : n.outputs) s += fmt::format("  n{} -> v{};\n", i, o);
  }
  for (size_t k = 0; k < outputs.size(); ++k)
    s += fmt::format("  out{} [shape=doublecircle, label=\"out {}\"];\n  v{} -> out{};\n", k, k,
                     outputs[k], k);
  s += "}\n";
  return s;
}

}  // namespace kiln::compiler

#include "kiln/compile/dynamic.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "kiln/ops/ops.h"

namespace kiln::compiler {

namespace {

// Where an integer of the graph lives: a value's size ('s', dim), stride ('t', dim) or offset
// ('o'), a buffer's byte size ('b'), a node's attribute ('n'), a constant's value ('c').
struct Where {
  char kind;
  int id;
  int dim;
  std::string str(const Graph& g) const {
    switch (kind) {
      case 's':
        return fmt::format("size {} of %{}", dim, id);
      case 't':
        return fmt::format("stride {} of %{}", dim, id);
      case 'o':
        return fmt::format("the offset of %{}", id);
      case 'b':
        return fmt::format("the bytes of buffer {}", id);
      case 'n':
        return fmt::format("an attribute of node {} '{}'", id, g.nodes[id].name());
      default:
        return fmt::format("constant %{}", id);
    }
  }
};

bool integral_scalar_constant(const Graph& g, const Value& v) {
  return g.buffers[v.buffer].kind == BufferKind::Constant && v.producer < 0 && v.traced.defined() &&
         v.traced.dim() == 0 && !is_floating(v.dtype) && v.dtype != kBool;
}

// Calls f(x, where) on every integer x that may depend on the dynamic size, in one fixed
// order; `where` names it for messages. What f changes is written back (a 0-d integer
// constant gets a new tensor).
template <class F>
void walk(Graph& g, F&& f) {
  for (Value& v : g.values) {
    const int id = static_cast<int>(&v - g.values.data());
    for (size_t d = 0; d < v.sizes.size(); ++d) f(v.sizes[d], Where{'s', id, static_cast<int>(d)});
    for (size_t d = 0; d < v.strides.size(); ++d)
      f(v.strides[d], Where{'t', id, static_cast<int>(d)});
    f(v.offset, Where{'o', id, 0});
  }
  for (Buffer& b : g.buffers) {
    int64_t n = static_cast<int64_t>(b.nbytes);
    f(n, Where{'b', static_cast<int>(&b - g.buffers.data()), 0});
    b.nbytes = static_cast<size_t>(n);
  }
  for (Node& n : g.nodes) {
    const Where w{'n', static_cast<int>(&n - g.nodes.data()), 0};
    for (Arg& a : n.args) {
      if (a.kind != Arg::Kind::Attr) continue;
      if (auto* i = std::get_if<int64_t>(&a.attr)) {
        f(*i, w);
      } else if (auto* s = std::get_if<Shape>(&a.attr)) {
        for (size_t k = 0; k < s->size(); ++k) f((*s)[k], w);
      } else if (auto* sc = std::get_if<Scalar>(&a.attr); sc && sc->is_integral()) {
        int64_t x = sc->to<int64_t>();
        f(x, w);
        *sc = Scalar(x);
      }
    }
  }
  for (Value& v : g.values) {
    if (!integral_scalar_constant(g, v)) continue;
    const int64_t old = v.traced.item<int64_t>();
    int64_t x = old;
    f(x, Where{'c', static_cast<int>(&v - g.values.data()), 0});
    if (x == old) continue;
    Tensor c = scalar_tensor(x, v.dtype, v.device);
    c.impl()->set_wrapped_number(v.traced.impl()->is_wrapped_number());
    g.buffers[v.buffer].storage = c.impl()->storage_ref();
    v.traced = c;
  }
}

// Everything walk() does not visit, as text: two graphs with one skeleton differ only in
// those integers.
std::string skeleton(const Graph& g) {
  fmt::memory_buffer s;
  auto out = std::back_inserter(s);
  for (const Value& v : g.values) {
    fmt::format_to(out, "v{}:{}:{}:{}:{}:{};", name(v.dtype), v.device.str(), v.buffer, v.producer,
                   v.input, v.sizes.size());
    // The same free tensors, by identity.
    if (g.buffers[v.buffer].kind == BufferKind::Free && v.traced.defined())
      fmt::format_to(out, "f{}", static_cast<const void*>(v.traced.impl()));
    if (g.buffers[v.buffer].kind == BufferKind::Constant && v.producer < 0 && v.traced.defined() &&
        !integral_scalar_constant(g, v))
      fmt::format_to(out, "c{}", fmt::join(v.traced.to(kFloat64).to_vector<double>(), ","));
  }
  for (const Buffer& b : g.buffers)
    fmt::format_to(out, "b{}:{}:{}:{};", buffer_kind_name(b.kind), b.device.str(), b.input,
                   b.producer);
  for (const Node& n : g.nodes) {
    fmt::format_to(out, "n{}:{}:[{}]:[{}]", n.name(), n.random, fmt::join(n.outputs, ","),
                   fmt::join(n.writes, ","));
    for (const Arg& a : n.args) {
      if (a.kind == Arg::Kind::Value) {
        fmt::format_to(out, ",v{}", a.value);
      } else if (a.kind == Arg::Kind::List) {
        fmt::format_to(out, ",[{}]", fmt::join(a.values, ","));
      } else if (std::holds_alternative<int64_t>(a.attr)) {
        fmt::format_to(out, ",i");
      } else if (auto* sh = std::get_if<Shape>(&a.attr)) {
        fmt::format_to(out, ",s{}", sh->size());
      } else if (auto* sc = std::get_if<Scalar>(&a.attr); sc && sc->is_integral()) {
        fmt::format_to(out, ",si");
      } else if (auto* sc2 = std::get_if<Scalar>(&a.attr); sc2 && sc2->is_floating()) {
        fmt::format_to(out, ",sf{:a}", sc2->to<double>());
      } else if (auto* d = std::get_if<double>(&a.attr)) {
        fmt::format_to(out, ",d{:a}", *d);
      } else if (auto* gen = std::get_if<Generator*>(&a.attr)) {
        fmt::format_to(out, ",g{}", static_cast<const void*>(*gen));
      } else {
        fmt::format_to(out, ",{}:{}", a.attr.index(), attr_str(a.attr));
      }
    }
    fmt::format_to(out, ";\n");
  }
  fmt::format_to(out, "in[{}]out[{}]", fmt::join(g.inputs, ","), fmt::join(g.outputs, ","));
  return fmt::to_string(s);
}

std::vector<int64_t> collect(const Graph& g) {
  Graph copy = g;
  std::vector<int64_t> v;
  walk(copy, [&](int64_t& x, const Where&) { v.push_back(x); });
  return v;
}

// The first line where two skeletons differ, for messages.
std::string first_difference(const std::string& a, const std::string& b) {
  size_t i = 0;
  while (i < a.size() && i < b.size() && a[i] == b[i]) ++i;
  size_t start = a.rfind('\n', i);
  start = start == std::string::npos ? 0 : start + 1;
  return a.substr(start, std::min<size_t>(80, a.find('\n', start) - start));
}

std::string geometry(IntArrayRef sizes, IntArrayRef strides, int64_t offset) {
  return fmt::format("[{}] strides [{}] offset {}", fmt::join(sizes, ", "),
                     fmt::join(strides, ", "), offset);
}

}  // namespace

std::optional<SizeTemplate> SizeTemplate::fit(const Graph& g1, int64_t t1, const Graph& g2,
                                              int64_t t2, std::string& why) {
  KILN_ASSERT(t1 != t2, "size template fitted from one size");
  std::string s1 = skeleton(g1), s2 = skeleton(g2);
  if (s1 != s2) {
    why = fmt::format("the graphs traced at sizes {} and {} differ beyond their sizes (at '{}')",
                      t1, t2, first_difference(s1, s2));
    return std::nullopt;
  }
  std::vector<int64_t> q1 = collect(g1), q2 = collect(g2);
  KILN_ASSERT(q1.size() == q2.size());
  SizeTemplate t;
  t.base_ = g1;
  for (size_t i = 0; i < q1.size(); ++i) {
    const int64_t dq = q2[i] - q1[i], dt = t2 - t1;
    if (dq % dt != 0) {
      why = fmt::format(
          "an integer of the graph goes from {} to {} as the size goes from {} to {}, which is "
          "not a whole multiple of the size",
          q1[i], q2[i], t1, t2);
      return std::nullopt;
    }
    t.slope_.push_back(dq / dt);
    t.intercept_.push_back(q1[i] - dq / dt * t1);
  }
  return t;
}

int SizeTemplate::refs_to(const TensorImpl* t) const {
  int n = 0;
  for (const Value& v : base_.values) n += v.traced.impl() == t;
  return n;
}

std::optional<Graph> SizeTemplate::instantiate(int64_t t, std::string& why) const {
  Graph g = base_;
  size_t i = 0;
  std::string negative;
  walk(g, [&](int64_t& x, const Where& w) {
    x = intercept_[i] + slope_[i] * t;
    const bool geometry = w.kind == 's' || w.kind == 't' || w.kind == 'o' || w.kind == 'b';
    if (geometry && x < 0 && negative.empty())
      negative =
          fmt::format("{} would be {} ({} + {} t)", w.str(base_), x, intercept_[i], slope_[i]);
    ++i;
  });
  // Sizes, strides, offsets and byte counts are never negative (attributes may be: dim=-1).
  if (!negative.empty()) {
    why = fmt::format("at size {}, {}", t, negative);
    return std::nullopt;
  }
  // Every value fits in its buffer.
  for (size_t v = 0; v < g.values.size(); ++v) {
    const Value& x = g.values[v];
    int64_t last = x.offset;
    bool empty = false;
    for (size_t d = 0; d < x.sizes.size(); ++d) {
      empty = empty || x.sizes[d] == 0;
      last += (x.sizes[d] - 1) * x.strides[d];
    }
    if (!empty && static_cast<size_t>(last + 1) * itemsize(x.dtype) > g.buffers[x.buffer].nbytes) {
      why = fmt::format("at size {}, %{} would reach past its buffer", t, v);
      return std::nullopt;
    }
  }
  // Every node's meta function agrees with the derived geometry of its results.
  std::vector<Ref<StorageImpl>> storage;
  for (const Buffer& b : g.buffers)
    storage.push_back(make_ref<StorageImpl>(b.nbytes, Device(kMeta), nullptr));
  std::vector<Tensor> meta;
  for (const Value& x : g.values) {
    meta.emplace_back(make_ref<TensorImpl>(storage[x.buffer], x.dtype, x.sizes.span(),
                                           x.strides.span(), x.offset));
    // Wrapped numbers promote like Scalars.
    if (x.traced.defined())
      meta.back().impl()->set_wrapped_number(x.traced.impl()->is_wrapped_number());
  }
  for (size_t n = 0; n < g.nodes.size(); ++n) {
    const Node& node = g.nodes[n];
    if (!node.op) continue;
    Stack stack = node_args(node, meta, Device(kMeta));  // factories: shapes only
    try {
      node.op->call_boxed_at(DispatchKey::Meta, stack);
    } catch (const Error& e) {
      why = fmt::format("at size {}, node {} '{}' rejects the derived arguments: {}", t, n,
                        node.name(), e.what());
      return std::nullopt;
    }
    size_t k = 0;
    for (const IValue& r : stack) {
      auto check = [&](const Tensor& got) {
        if (k >= node.outputs.size()) return true;
        const Value& want = g.values[node.outputs[k++]];
        bool view = node.op->kind() == OpKind::View;
        if (got.sizes() == want.sizes.span() && got.dtype() == want.dtype &&
            (!view ||
             (got.strides() == want.strides.span() && got.storage_offset() == want.offset)))
          return true;
        why = fmt::format(
            "at size {}, node {} '{}' makes {} {} where {} {} was derived", t, n, node.name(),
            name(got.dtype()), geometry(got.sizes(), got.strides(), got.storage_offset()),
            name(want.dtype), geometry(want.sizes.span(), want.strides.span(), want.offset));
        return false;
      };
      if (auto* x = std::get_if<Tensor>(&r); x && !check(*x)) return std::nullopt;
      if (auto* l = std::get_if<TensorList>(&r))
        for (const Tensor& x2 : *l)
          if (!check(x2)) return std::nullopt;
    }
  }
  return g;
}

}  // namespace kiln::compiler

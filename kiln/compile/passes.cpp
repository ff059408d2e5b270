#include "kiln/compile/passes.h"

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <unordered_map>

#include <fmt/format.h>

namespace kiln::compiler {

namespace {

template <class F>
void for_each_value_arg(const Node& n, F&& f) {
  for (const Arg& a : n.args) {
    if (a.kind == Arg::Kind::Value && a.value >= 0) f(a.value);
    if (a.kind == Arg::Kind::List)
      for (int v : a.values)
        if (v >= 0) f(v);
  }
}

// Attributes spelled so that equal text means an equal argument (1 and 1.0 differ).
std::string attr_key(const IValue& v) {
  if (auto* s = std::get_if<Scalar>(&v))
    return s->is_floating() ? fmt::format("f{:a}", s->to<double>())
           : s->is_bool()   ? fmt::format("b{}", s->to<bool>())
                            : fmt::format("i{}", s->to<int64_t>());
  if (auto* d = std::get_if<double>(&v)) return fmt::format("d{:a}", *d);
  return fmt::format("{}:{}", v.index(), attr_str(v));
}

}  // namespace

int eliminate_dead_code(Graph& g) {
  std::vector<bool> used(g.values.size(), false);
  // A node is needed when anything reads the buffer it makes, through its outputs or through
  // another value over that buffer (autograd's saved result, traced without a node of its own).
  std::vector<bool> buffer_used(g.buffers.size(), false);
  auto use = [&](int v) {
    used[v] = true;
    buffer_used[g.values[v].buffer] = true;
  };
  for (int v : g.outputs) use(v);
  std::vector<bool> keep(g.nodes.size(), false);
  int removed = 0;
  for (size_t i = g.nodes.size(); i-- > 0;) {
    const Node& n = g.nodes[i];
    bool needed = n.has_effects();
    for (int o : n.outputs) {
      const int b = g.values[o].buffer;
      needed =
          needed || used[o] || (g.buffers[b].producer == static_cast<int>(i) && buffer_used[b]);
    }
    if (!needed) {
      ++removed;
      continue;
    }
    keep[i] = true;
    for_each_value_arg(n, use);
  }
  if (removed) compact(g, keep);
  return removed;
}

// Note [Merging equal nodes]
// A pure functional node whose op, attributes and input values (at the versions they had when
// it ran) equal an earlier node's is dropped, and its outputs become the earlier node's. Two
// things make that more than renaming outputs:
//   - A node's result is one buffer, and values other than its outputs may live in it (the
//     tensor autograd saved for backward, traced as a value of its own over the same storage).
//     The dropped node's buffers are therefore merged into the kept node's: every value in one
//     moves to the other, at the same offset, so it has storage at replay.
//   - After the merge both names share one buffer, so a write to either would show through the
//     other. Nodes whose own result buffers are ever written (by an in-place or out= node, or a
//     write through a view) are never merged, neither as the kept node nor as the dropped one.
// The merged result buffers must be the same size; otherwise the nodes stay apart.
int eliminate_common_subexpressions(Graph& g) {
  std::vector<int> remap(g.values.size());
  std::iota(remap.begin(), remap.end(), 0);
  std::vector<uint64_t> version(g.buffers.size(), 0);  // writes seen so far, per buffer
  std::vector<bool> written(g.buffers.size(), false);  // by any node of the graph
  for (const Node& n : g.nodes)
    for (int b : n.writes) written[b] = true;
  // Whether output k of node i can be merged: its buffer is its own and never written, or it is
  // a view of something else (then equal inputs make it the same view).
  auto mergeable = [&](int i, int v) {
    const Buffer& b = g.buffers[g.values[v].buffer];
    return b.producer != i || !written[g.values[v].buffer];
  };
  // Values per buffer, to move a dropped node's buffers wholesale.
  std::vector<std::vector<int>> in_buffer(g.buffers.size());
  for (size_t v = 0; v < g.values.size(); ++v)
    in_buffer[g.values[v].buffer].push_back(static_cast<int>(v));
  struct Seen {
    int node;
    std::vector<uint64_t> out_versions;
  };
  std::unordered_map<std::string, Seen> seen;
  std::vector<bool> keep(g.nodes.size(), true);
  int merged = 0;
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    Node& n = g.nodes[i];
    for (Arg& a : n.args) {
      if (a.kind == Arg::Kind::Value && a.value >= 0) a.value = remap[a.value];
      for (int& v : a.values)
        if (v >= 0) v = remap[v];
    }
    const bool pure = !n.has_effects() && n.op && n.op->kind() == OpKind::Functional;
    if (pure) {
      fmt::memory_buffer kb;
      auto out = std::back_inserter(kb);
      fmt::format_to(out, "{}", static_cast<const void*>(n.op));
      for (const Arg& a : n.args) {
        if (a.kind == Arg::Kind::Value) {
          if (a.value < 0)
            fmt::format_to(out, ",-");
          else
            fmt::format_to(out, ",v{}@{}", a.value, version[g.values[a.value].buffer]);
        } else if (a.kind == Arg::Kind::List) {
          fmt::format_to(out, ",[");
          for (int v : a.values)
            if (v < 0)
              fmt::format_to(out, "None,");
            else
              fmt::format_to(out, "v{}@{},", v, version[g.values[v].buffer]);
          fmt::format_to(out, "]");
        } else {
          fmt::format_to(out, ",{}", attr_key(a.attr));
        }
      }
      std::string key = fmt::to_string(kb);
      auto it = seen.find(key);
      if (it != seen.end()) {
        const int f = it->second.node;
        const Node& first = g.nodes[f];
        bool unchanged = first.outputs.size() == n.outputs.size();
        for (size_t k = 0; unchanged && k < first.outputs.size(); ++k) {
          const Value &a = g.values[first.outputs[k]], &b = g.values[n.outputs[k]];
          const bool own_a = g.buffers[a.buffer].producer == f;
          const bool own_b = g.buffers[b.buffer].producer == static_cast<int>(i);
          unchanged =
              version[a.buffer] == it->second.out_versions[k] && mergeable(f, first.outputs[k]) &&
              mergeable(static_cast<int>(i), n.outputs[k]) && own_a == own_b &&
              (!own_b ||
               (a.offset == b.offset && g.buffers[a.buffer].nbytes == g.buffers[b.buffer].nbytes));
        }
        if (unchanged) {
          for (size_t k = 0; k < n.outputs.size(); ++k) {
            remap[n.outputs[k]] = first.outputs[k];
            // See Note [Merging equal nodes]: the dropped buffer's other values move along.
            const int from = g.values[n.outputs[k]].buffer, to = g.values[first.outputs[k]].buffer;
            if (from == to || g.buffers[from].producer != static_cast<int>(i)) continue;
            for (int v : in_buffer[from]) g.values[v].buffer = to;
            in_buffer[to].insert(in_buffer[to].end(), in_buffer[from].begin(),
                                 in_buffer[from].end());
            in_buffer[from].clear();
          }
          keep[i] = false;
          ++merged;
          continue;
        }
      }
      Seen s{static_cast<int>(i), {}};
      for (int o : n.outputs) s.out_versions.push_back(version[g.values[o].buffer]);
      seen[key] = std::move(s);
    }
    for (int b : n.writes) ++version[b];
  }
  for (int& v : g.outputs) v = remap[v];
  if (merged) compact(g, keep);
  return merged;
}

int remove_noops(Graph& g) {
  std::vector<bool> keep(g.nodes.size(), true);
  int removed = 0;
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    const Node& n = g.nodes[i];
    if (!n.op || n.op->name() != "copy_" || n.args.size() != 2) continue;
    if (n.args[0].kind == Arg::Kind::Value && n.args[1].kind == Arg::Kind::Value &&
        n.args[0].value >= 0 && n.args[0].value == n.args[1].value) {
      keep[i] = false;
      ++removed;
    }
  }
  if (removed) compact(g, keep);
  return removed;
}

PassReport run_passes(Graph& g) {
  PassReport r;
  r.nodes_traced = static_cast<int>(g.nodes.size());
  r.noops_removed = remove_noops(g);
  r.cse_merged = eliminate_common_subexpressions(g);
  r.dead_removed = eliminate_dead_code(g);
  for (const Node& n : g.nodes)
    if (n.op && n.op->kind() == OpKind::View) ++r.views_resolved;
  return r;
}

MemoryPlan plan_memory(const Graph& g, const std::vector<bool>& in_arena) {
  const size_t nb = g.buffers.size();
  MemoryPlan plan;
  plan.offset.assign(nb, SIZE_MAX);
  std::vector<int> first(nb, INT32_MAX), last(nb, -1);
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    const Node& n = g.nodes[i];
    auto touch = [&](int b) {
      first[b] = std::min(first[b], static_cast<int>(i));
      last[b] = std::max(last[b], static_cast<int>(i));
    };
    for_each_value_arg(n, [&](int v) { touch(g.values[v].buffer); });
    for (int o : n.outputs) touch(g.values[o].buffer);
  }
  std::vector<int> order;
  for (size_t b = 0; b < nb; ++b)
    if (in_arena[b] && last[b] >= 0) order.push_back(static_cast<int>(b));
  auto rounded = [](size_t n) { return (n + kArenaAlign - 1) / kArenaAlign * kArenaAlign; };
  std::stable_sort(order.begin(), order.end(),
                   [&](int a, int b) { return g.buffers[a].nbytes > g.buffers[b].nbytes; });
  struct Placed {
    size_t begin, end;
    int first, last;
  };
  std::vector<Placed> placed;
  for (int b : order) {
    const size_t size = rounded(std::max<size_t>(g.buffers[b].nbytes, 1));
    plan.sum_bytes += size;
    // Byte ranges taken by buffers alive at the same time, in address order.
    std::vector<std::pair<size_t, size_t>> busy;
    for (const Placed& p : placed)
      if (p.first <= last[b] && first[b] <= p.last) busy.emplace_back(p.begin, p.end);
    std::sort(busy.begin(), busy.end());
    size_t at = 0;
    for (const auto& [begin, end] : busy) {
      if (begin >= at + size) break;
      at = std::max(at, end);
    }
    plan.offset[b] = at;
    placed.push_back({at, at + size, first[b], last[b]});
    plan.arena_bytes = std::max(plan.arena_bytes, at + size);
  }
  return plan;
}

}  // namespace kiln::compiler

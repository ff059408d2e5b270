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
  for (int v : g.outputs) used[v] = true;
  std::vector<bool> keep(g.nodes.size(), false);
  int removed = 0;
  for (size_t i = g.nodes.size(); i-- > 0;) {
    const Node& n = g.nodes[i];
    bool needed = n.has_effects();
    for (int o : n.outputs) needed = needed || used[o];
    if (!needed) {
      ++removed;
      continue;
    }
    keep[i] = true;
    for_each_value_arg(n, [&](int v) { used[v] = true; });
  }
  if (removed) compact(g, keep);
  return removed;
}

int eliminate_common_subexpressions(Graph& g) {
  std::vector<int> remap(g.values.size());
  std::iota(remap.begin(), remap.end(), 0);
  std::vector<uint64_t> version(g.buffers.size(), 0);  // writes seen so far, per buffer
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
        const Node& first = g.nodes[it->second.node];
        bool unchanged = first.outputs.size() == n.outputs.size();
        for (size_t k = 0; unchanged && k < first.outputs.size(); ++k)
          unchanged = version[g.values[first.outputs[k]].buffer] == it->second.out_versions[k];
        if (unchanged) {
          for (size_t k = 0; k < n.outputs.size(); ++k) remap[n.outputs[k]] = first.outputs[k];
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

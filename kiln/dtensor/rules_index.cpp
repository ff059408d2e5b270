// Sharding rules of cat, the indexing ops (index_select, gather, scatter_add, index_add, index,
// index_put), triu, tril and one_hot, with their out= forms. See Note [Indexing placements].
#include <algorithm>

#include "kiln/dtensor/rule_options.h"
#include "kiln/ops/op_list.h"

namespace kiln::dtensor {
namespace {

// Note [Indexing placements]
// Each way below runs the op locally along one mesh dim; the cheapest wins (Note [Choosing by
// bytes]), replicating everything is always a way, and an out= tensor takes the result's
// placement. `d` is the op's dim.
//   - cat: inputs sharded alike along a dim other than d stay sharded (every input has that
//     dim's size, so the chunks line up); an input sharded along d is gathered. Inputs that are
//     all Partial of one reduction stay Partial (cat moves terms without combining them); with a
//     Partial(sum) input, replicated ones may become terms too (a local step), so the Partial
//     one need not be reduced.
//   - index_select(self, d, index): self sharded along another dim with the whole index; or
//     self whole with the index chunked, giving the result's dim d chunked alike (one result
//     slice per index); a Partial self stays Partial of its reduction (a selection of terms).
//   - gather(self, d, index): the result has index's shape. Self whole with index chunked along
//     d gives the result chunked along d; both chunked along another dim k where they have
//     k's size (gather reads self[..., index, ...] at the same k); a Partial self stays.
//   - scatter_add(self, d, index, src) and index_add(self, d, index, source): the result has
//     self's shape and is linear in self and src together. Everything chunked alike along a dim
//     other than d where self, index and src have its size (index_add's index is whole then).
//     Partial(sum) self and src with the whole index give Partial(sum) (a replicated self or
//     src becomes a term by a local step). Index and src chunked along d (index_add: index's
//     only dim) scatter each rank's part into its own term of self: Partial(sum), self a term.
//   - triu, tril: any placement stays, Partial included (a masked element is 0 on every rank,
//     and every reduction of zeros is 0). A rank's chunk starting at row i0 and column j0 keeps
//     global (i, j) with j - i >= diagonal, that is local j' - i' >= diagonal + i0 - j0: the
//     local op gets the diagonal shifted by this rank's offsets (ShardingDecision::local_args;
//     the decision is this process's own).
//   - index(self, indices) (advanced indexing): a Partial self with replicated indices stays
//     Partial of its reduction (the op picks elements, which commutes with any elementwise
//     reduction over ranks); otherwise everything is gathered to Replicate. Shards are not kept
//     yet: which list element indexes which dim is not visible from the DTensor inputs alone.
//   - index_put(self, indices, values, accumulate), scatter, scatter_reduce, select_scatter and
//     slice_scatter: gathered to Replicate (not yet: keeping shards of the dims they do not
//     write; scatter_reduce's prod, mean, amax and amin are not linear, so no Partial either).
//   - one_hot: input dims keep their shards; the new last dim (the classes) is whole; a Partial
//     input (of integers) is reduced first, since one_hot is not linear.

size_t base(const ShardingCall& call) { return call.op().kind() == OpKind::Out ? 1 : 0; }
size_t results(const ShardingCall& call) { return call.op().kind() == OpKind::Out ? 0 : 1; }

// Builds options by stack position: `role(pos)` says what the DTensor at a stack position
// needs; the out= tensor (position 0 of an out= form) takes the result's placement.
struct Way {
  std::vector<std::pair<size_t, Placement>> by_pos;  // placements by stack position
  Placement out;
};

RuleOption option_of(const ShardingCall& call, const Way& w) {
  RuleOption o;
  const bool out_form = call.op().kind() == OpKind::Out;
  for (size_t i = 0; i < call.num_inputs(); ++i) {
    const size_t pos = call.position(i);
    Placement p = Replicate();
    if (out_form && pos == 0) {
      p = w.out;
    } else {
      for (const auto& [q, pl] : w.by_pos)
        if (q == pos) p = pl;
    }
    o.in.push_back(p);
  }
  o.out.assign(results(call), w.out);
  return o;
}

bool is_sum(const Placement& p) { return p.is_partial() && p.reduce_op() == ReduceOp::Sum; }

// The spec of the DTensor at stack position `pos` (asserted present).
const DTensorSpec& at(const ShardingCall& call, size_t pos) {
  const int64_t i = call.input_at(pos);
  KILN_CHECK(i >= 0, "[{}] argument {} must be a DTensor when the others are (inputs: {})",
             call.op().name(), pos, inputs_str(call));
  return call.input(static_cast<size_t>(i));
}

// ---------------------------------------------------------------- cat

// cat(tensors, dim); out=: cat(out, tensors, dim).
void cat_rule(const ShardingCall& call, ShardingDecision& d) {
  const size_t list = base(call);
  std::vector<size_t> elems;  // the DTensor inputs that are list elements
  for (size_t i = 0; i < call.num_inputs(); ++i)
    if (call.position(i) == list) elems.push_back(i);
  KILN_CHECK(!elems.empty(), "[{}] expected a non-empty list of tensors", call.op().name());
  const int64_t nd = call.input(elems[0]).ndim();
  bool same_ndim = nd > 0;
  for (size_t i : elems) same_ndim = same_ndim && call.input(i).ndim() == nd;
  // Legacy 1-D empty inputs or a bad dim: replicate, and let the op decide.
  const int64_t dim = call.int_arg(list + 1);
  const bool ok = same_ndim && dim >= -nd && dim < nd;
  const int64_t cd = ok ? (dim < 0 ? dim + nd : dim) : -1;
  decide_by_options(call, d, results(call), [&](int64_t m) {
    RuleOptions opts;
    auto all = [&](const Placement& p) {
      RuleOption o;
      for (size_t i = 0; i < call.num_inputs(); ++i) o.in.push_back(p);
      o.out.assign(results(call), p);
      opts.push_back(std::move(o));
    };
    if (ok) {
      std::vector<Placement> seen;
      for (size_t i : elems) {
        const Placement& p = call.input(i).placement(m);
        if (std::find(seen.begin(), seen.end(), p) != seen.end()) continue;
        seen.push_back(p);
        if (p.is_shard() && p.dim() != cd) all(p);
      }
      for (const Placement& p : seen)
        if (p.is_partial()) {
          const bool every = std::all_of(elems.begin(), elems.end(),
                                         [&](size_t i) { return call.input(i).placement(m) == p; });
          if (every || is_sum(p)) all(p);
        }
    }
    all(Replicate());
    return opts;
  });
}

// ---------------------------------------------------------------- index_select, gather

// index_select(self, dim, index).
void index_select_rule(const ShardingCall& call, ShardingDecision& d) {
  const size_t b = base(call);
  const DTensorSpec& self = at(call, b);
  const DTensorSpec& index = at(call, b + 2);
  const int64_t nd = self.ndim();
  const int64_t dim = nd == 0 ? 0 : wrap_dim(call.int_arg(b + 1), nd, "index_select");
  decide_by_options(call, d, results(call), [&](int64_t m) {
    RuleOptions opts;
    const Placement& ps = self.placement(m);
    if (nd > 0 && ps.is_shard() && ps.dim() != dim)
      opts.push_back(option_of(call, {{{b, ps}}, ps}));
    if (nd > 0 && index.ndim() == 1 && index.placement(m).is_shard())
      opts.push_back(option_of(call, {{{b + 2, Shard(0)}}, Shard(dim)}));
    if (ps.is_partial()) opts.push_back(option_of(call, {{{b, ps}}, ps}));
    opts.push_back(option_of(call, {{}, Replicate()}));
    return opts;
  });
}

// gather(self, dim, index).
void gather_rule(const ShardingCall& call, ShardingDecision& d) {
  const size_t b = base(call);
  const DTensorSpec& self = at(call, b);
  const DTensorSpec& index = at(call, b + 2);
  const int64_t nd = self.ndim();
  const bool ok = nd > 0 && index.ndim() == nd;
  const int64_t dim = ok ? wrap_dim(call.int_arg(b + 1), nd, "gather") : -1;
  decide_by_options(call, d, results(call), [&](int64_t m) {
    RuleOptions opts;
    if (ok) {
      std::vector<int64_t> dims;
      for (const Placement& p : {self.placement(m), index.placement(m)})
        if (p.is_shard() && std::find(dims.begin(), dims.end(), p.dim()) == dims.end())
          dims.push_back(p.dim());
      for (int64_t k : dims) {
        if (k == dim)
          opts.push_back(option_of(call, {{{b + 2, Shard(k)}}, Shard(k)}));
        else if (self.shape()[k] == index.shape()[k])
          opts.push_back(option_of(call, {{{b, Shard(k)}, {b + 2, Shard(k)}}, Shard(k)}));
      }
    }
    const Placement& ps = self.placement(m);
    if (ps.is_partial()) opts.push_back(option_of(call, {{{b, ps}}, ps}));
    opts.push_back(option_of(call, {{}, Replicate()}));
    return opts;
  });
}

// ---------------------------------------------------------------- scatter_add, index_add

// scatter_add(self, dim, index, src) and index_add(self, dim, index, source, alpha) (`index_1d`).
void accumulate(const ShardingCall& call, ShardingDecision& d, bool index_1d) {
  const size_t b = base(call);
  const DTensorSpec& self = at(call, b);
  const DTensorSpec& index = at(call, b + 2);
  const DTensorSpec& src = at(call, b + 3);
  const int64_t nd = self.ndim();
  const bool ok = nd > 0 && src.ndim() == nd && (index_1d ? index.ndim() == 1 : index.ndim() == nd);
  const int64_t dim =
      ok ? wrap_dim(call.int_arg(b + 1), nd, index_1d ? "index_add" : "scatter_add") : -1;
  const Placement sum = Partial(ReduceOp::Sum);
  decide_by_options(call, d, results(call), [&](int64_t m) {
    RuleOptions opts;
    if (ok) {
      std::vector<int64_t> dims;
      for (const Placement& p : {self.placement(m), src.placement(m)})
        if (p.is_shard() && std::find(dims.begin(), dims.end(), p.dim()) == dims.end())
          dims.push_back(p.dim());
      if (!index_1d && index.placement(m).is_shard() &&
          std::find(dims.begin(), dims.end(), index.placement(m).dim()) == dims.end())
        dims.push_back(index.placement(m).dim());
      for (int64_t k : dims) {
        if (k == dim) continue;
        if (index_1d) {
          opts.push_back(option_of(call, {{{b, Shard(k)}, {b + 3, Shard(k)}}, Shard(k)}));
        } else if (self.shape()[k] == index.shape()[k] && src.shape()[k] == index.shape()[k]) {
          opts.push_back(
              option_of(call, {{{b, Shard(k)}, {b + 2, Shard(k)}, {b + 3, Shard(k)}}, Shard(k)}));
        }
      }
      const bool split = index_1d
                             ? index.placement(m).is_shard() || src.placement(m).is_shard(dim)
                             : index.placement(m).is_shard(dim) || src.placement(m).is_shard(dim);
      const bool aligned = index_1d || index.shape()[dim] == src.shape()[dim];
      if (split && aligned)
        opts.push_back(option_of(
            call, {{{b, sum}, {b + 2, Shard(index_1d ? 0 : dim)}, {b + 3, Shard(dim)}}, sum}));
    }
    if (is_sum(self.placement(m)) || is_sum(src.placement(m)))
      opts.push_back(option_of(call, {{{b, sum}, {b + 3, sum}}, sum}));
    opts.push_back(option_of(call, {{}, Replicate()}));
    return opts;
  });
}

void scatter_add_rule(const ShardingCall& call, ShardingDecision& d) { accumulate(call, d, false); }
void index_add_rule(const ShardingCall& call, ShardingDecision& d) { accumulate(call, d, true); }

// ---------------------------------------------------------------- triu, tril, one_hot

// triu(self, diagonal), tril(self, diagonal).
void triangle_rule(const ShardingCall& call, ShardingDecision& d) {
  const size_t b = base(call);
  const int64_t self_i = call.input_at(b);
  const DTensorSpec& self = at(call, b);
  const int64_t out_i = call.op().kind() == OpKind::Out ? call.input_at(0) : -1;
  decide_by_options(call, d, results(call), [&](int64_t m) {
    RuleOptions opts;
    opts.push_back(option_of(call, {{{b, self.placement(m)}}, self.placement(m)}));
    if (out_i >= 0) {
      const Placement& po = call.input(static_cast<size_t>(out_i)).placement(m);
      opts.push_back(option_of(call, {{{b, po}}, po}));
    }
    opts.push_back(option_of(call, {{}, Replicate()}));
    return opts;
  });
  if (self.ndim() < 2) return;  // the op raises
  const DTensorSpec* local =
      with_placements(self, d.inputs[static_cast<size_t>(self_i)], "triu/tril");
  IntArrayRef off = local->local_offset();
  const int64_t shift = off[off.size() - 2] - off[off.size() - 1];
  // emplace_back, not a braced list: GCC 12 at -O1 with the sanitizers warns of an
  // uninitialized variant inside the initializer list's copy (-Wmaybe-uninitialized).
  if (shift != 0) d.local_args.emplace_back(b + 1, IValue(call.int_arg(b + 1) + shift));
}

// one_hot(self, num_classes).
void one_hot_rule(const ShardingCall& call, ShardingDecision& d) {
  const size_t b = base(call);
  const DTensorSpec& self = at(call, b);
  decide_by_options(call, d, results(call), [&](int64_t m) {
    RuleOptions opts;
    const Placement& p = self.placement(m);
    if (p.is_shard()) opts.push_back(option_of(call, {{{b, p}}, p}));
    opts.push_back(option_of(call, {{}, Replicate()}));
    return opts;
  });
}

// ---------------------------------------------------------------- index, index_put

// index(self, indices); out=: index(out, self, indices).
void index_rule(const ShardingCall& call, ShardingDecision& d) {
  const size_t b = base(call);
  const int64_t self_i = call.input_at(b);
  decide_by_options(call, d, results(call), [&](int64_t m) {
    RuleOptions opts;
    if (self_i >= 0) {
      const Placement& p = call.input(static_cast<size_t>(self_i)).placement(m);
      if (p.is_partial()) opts.push_back(option_of(call, {{{b, p}}, p}));
    }
    opts.push_back(option_of(call, {{}, Replicate()}));
    return opts;
  });
}

// index_put(self, indices, values, accumulate) and its out= form.
void index_put_rule(const ShardingCall& call, ShardingDecision& d) {
  decide_by_options(call, d, results(call), [&](int64_t) {
    RuleOptions opts;
    opts.push_back(option_of(call, {{}, Replicate()}));
    return opts;
  });
}

const ShardingRule kCat{"cat (shards off the cat dim, or Partial, or replicated)", &cat_rule};
const ShardingRule kIndexSelect{"index_select (self's other dims, or the index, chunked)",
                                &index_select_rule};
const ShardingRule kGather{"gather (the index chunked, or both along another dim)", &gather_rule};
const ShardingRule kScatterAdd{"scatter_add (other dims chunked, or Partial(sum) terms)",
                               &scatter_add_rule};
const ShardingRule kIndexAdd{"index_add (other dims chunked, or Partial(sum) terms)",
                             &index_add_rule};
const ShardingRule kIndex{"index (a Partial self stays Partial, else replicated)", &index_rule};
const ShardingRule kIndexPut{"index_put (replicated)", &index_put_rule};
const ShardingRule kReplicated{
    "scatter, scatter_reduce, select_scatter, slice_scatter (replicated)", &index_put_rule};
const ShardingRule kTriangle{"triu/tril (any placement; the diagonal shifted per rank)",
                             &triangle_rule};
const ShardingRule kOneHot{"one_hot (input dims keep their shards)", &one_hot_rule};

const bool g_registered = [] {
  auto both = [](auto& op, auto& out, const ShardingRule* r) {
    set_sharding_rule(op.def, r);
    set_sharding_rule(out.def, r);
  };
  both(ops::op_cat, ops::op_cat_out, &kCat);
  both(ops::op_index_select, ops::op_index_select_out, &kIndexSelect);
  both(ops::op_gather, ops::op_gather_out, &kGather);
  both(ops::op_scatter_add, ops::op_scatter_add_out, &kScatterAdd);
  both(ops::op_index_add, ops::op_index_add_out, &kIndexAdd);
  both(ops::op_index, ops::op_index_out, &kIndex);
  both(ops::op_index_put, ops::op_index_put_out, &kIndexPut);
  both(ops::op_scatter, ops::op_scatter_out, &kReplicated);
  both(ops::op_scatter_reduce, ops::op_scatter_reduce_out, &kReplicated);
  both(ops::op_select_scatter, ops::op_select_scatter_out, &kReplicated);
  both(ops::op_slice_scatter, ops::op_slice_scatter_out, &kReplicated);
  set_sharding_exclusion(ops::op_nonzero.def,
                         "nonzero's result size is the count of nonzero values over every shard, "
                         "a host read; call it on full_tensor() (or each rank's to_local())");
  both(ops::op_triu, ops::op_triu_out, &kTriangle);
  both(ops::op_tril, ops::op_tril_out, &kTriangle);
  both(ops::op_one_hot, ops::op_one_hot_out, &kOneHot);
  return true;
}();

}  // namespace
}  // namespace kiln::dtensor

// Sharding rules of the reductions (sum, mean, var, amax, amin, all, any, argmax, argmin,
// max_dim, min_dim) and of softmax and log_softmax. See Note [Reduction placements].
#include <algorithm>

#include "kiln/distributed/collectives.h"
#include "kiln/dtensor/rule_options.h"
#include "kiln/ops/op_list.h"
#include "kiln/ops/ops.h"

namespace kiln::dtensor {
namespace {

// Note [Reduction placements]
// Reducing a dim that a mesh dim shards leaves each rank a term of the result: the rank's own
// reduction of its chunk. For sum that is Partial(sum); for mean Partial(avg) when every chunk
// has the same size (an uneven or empty chunk would weigh its mean wrongly); amax and amin give
// Partial(max) and Partial(min) when no chunk is empty (the maximum of nothing is an error);
// all and any give Partial(min) and Partial(max) of bools (an empty chunk gives the identity).
// var, argmax, argmin, max_dim and min_dim need the reduced dim whole, so it is gathered first
// (softmax and log_softmax: Note [Sharded softmax]). A dim that is not reduced keeps its shard
// (renumbered when the reduced dims before it go). A Partial input stays Partial where the
// reduction is linear in it (sum or mean of Partial(sum) terms) or the same kind (amax of
// Partial(max)); otherwise it is reduced first, to Replicate or by a reduce-scatter straight into a
// shard of a dim that stays.
enum class Kind { Sum, Mean, Max, Min, All, Any, Whole };

struct Layout {
  size_t self = 0;  // stack position of the input
  std::vector<bool> reduced;
  bool keepdim = false;
};

int64_t wrap_dim(int64_t d, int64_t ndim) { return d < 0 ? d + ndim : d; }

// Where the result dim of input dim k is (-1: reduced away).
int64_t result_dim(const Layout& l, int64_t k) {
  if (l.reduced[k]) return l.keepdim ? k : -1;
  if (l.keepdim) return k;
  int64_t r = k;
  for (int64_t j = 0; j < k; ++j) r -= l.reduced[j] ? 1 : 0;
  return r;
}

bool chunks_nonempty(const DTensorSpec& s, int64_t m) {
  const Placement& p = s.placement(m);
  const int64_t n = s.mesh().size(m);
  return chunk_length(s.shape()[p.dim()], n, n - 1) > 0;
}

// The term a rank holds after reducing a dim sharded along mesh dim m, or Replicate when the
// dim must be whole first.
Placement term_of(Kind kind, const DTensorSpec& s, int64_t m) {
  switch (kind) {
    case Kind::Sum:
      return Partial(ReduceOp::Sum);
    case Kind::Mean:
      return s.is_even() && chunks_nonempty(s, m) ? Placement(Partial(ReduceOp::Avg))
                                                  : Placement(Replicate());
    case Kind::Max:
      return chunks_nonempty(s, m) ? Placement(Partial(ReduceOp::Max)) : Placement(Replicate());
    case Kind::Min:
      return chunks_nonempty(s, m) ? Placement(Partial(ReduceOp::Min)) : Placement(Replicate());
    case Kind::All:
      return Partial(ReduceOp::Min);
    case Kind::Any:
      return Partial(ReduceOp::Max);
    case Kind::Whole:
      return Replicate();
  }
  return Replicate();
}

// Whether a Partial input of `op` may stay Partial through the reduction.
bool keeps_partial(Kind kind, ReduceOp op) {
  switch (kind) {
    case Kind::Sum:
    case Kind::Mean:
      return op == ReduceOp::Sum;
    case Kind::Max:
      return op == ReduceOp::Max;
    case Kind::Min:
      return op == ReduceOp::Min;
    default:
      return false;
  }
}

void reduce(const ShardingCall& call, ShardingDecision& d, const Layout& l, Kind kind,
            size_t n_out) {
  const int64_t self = call.input_at(l.self);
  KILN_ASSERT(self >= 0 && call.num_inputs() == (call.op().kind() == OpKind::Out ? 2u : 1u),
              "[{}] a reduction's input is not where its rule expects", call.op().name());
  const DTensorSpec& s = call.input(static_cast<size_t>(self));
  const int64_t nd = s.ndim();
  decide_by_options(call, d, n_out, [&](int64_t m) {
    RuleOptions opts;
    const Placement& p = s.placement(m);
    auto option = [&](const Placement& in, const Placement& out) {
      RuleOption o;
      for (size_t i = 0; i < call.num_inputs(); ++i)
        o.in.push_back(static_cast<int64_t>(i) == self ? in : out);  // out= takes the result's
      o.out.assign(n_out, out);
      opts.push_back(std::move(o));
    };
    if (p.is_shard()) {
      const int64_t r = result_dim(l, p.dim());
      if (!l.reduced[p.dim()]) {
        option(p, Shard(r));
      } else {
        Placement term = term_of(kind, s, m);
        if (!term.is_replicate()) option(p, term);
      }
    } else if (p.is_partial()) {
      if (keeps_partial(kind, p.reduce_op())) option(p, p);
      for (int64_t k = 0; k < nd; ++k)  // reduce-scatter into a shard of a dim that stays
        if (!l.reduced[k] && s.shape()[k] > 1) option(Shard(k), Shard(result_dim(l, k)));
    }
    option(Replicate(), Replicate());
    return opts;
  });
}

Layout layout(const ShardingCall& call, size_t self, IntArrayRef dims, bool keepdim) {
  Layout l;
  l.self = self;
  l.keepdim = keepdim;
  const int64_t nd = call.tensor_ndim(self);
  l.reduced.assign(static_cast<size_t>(nd), dims.empty());
  for (int64_t d : dims) {
    const int64_t k = wrap_dim(d, nd);
    if (k >= 0 && k < nd) l.reduced[k] = true;
  }
  return l;
}

size_t base(const ShardingCall& call) { return call.op().kind() == OpKind::Out ? 1 : 0; }
size_t results(const ShardingCall& call) { return call.op().kind() == OpKind::Out ? 0 : 1; }

// sum, mean, amax, amin, all, any: (self, int[] dim, bool keepdim, ...).
template <Kind K>
void over_dims(const ShardingCall& call, ShardingDecision& d) {
  const size_t b = base(call);
  reduce(call, d, layout(call, b, call.ints_arg(b + 1), call.bool_arg(b + 2)), K, results(call));
}
// var: (self, int[] dim, int correction, bool keepdim).
void var_rule(const ShardingCall& call, ShardingDecision& d) {
  const size_t b = base(call);
  reduce(call, d, layout(call, b, call.ints_arg(b + 1), call.bool_arg(b + 3)), Kind::Whole,
         results(call));
}
// argmax, argmin: (self, int? dim, bool keepdim); no dim: every dim.
void arg_rule(const ShardingCall& call, ShardingDecision& d) {
  const size_t b = base(call);
  Shape dims;
  if (!call.is_none(b + 1)) dims.push_back(call.int_arg(b + 1));
  reduce(call, d, layout(call, b, dims, call.bool_arg(b + 2)), Kind::Whole, results(call));
}
// max_dim, min_dim: (self, int dim, bool keepdim) -> (values, indices).
void dim_pair_rule(const ShardingCall& call, ShardingDecision& d) {
  Shape dims{call.int_arg(1)};
  reduce(call, d, layout(call, 0, dims, call.bool_arg(2)), Kind::Whole, 2);
}
// Note [Sharded softmax]
// softmax and log_softmax along a dim that exactly one mesh dim shards, every rank's chunk
// non-empty and no input Partial, stay sharded: each rank takes the maxima and the sums of
// exponentials of its chunk's rows, all-reduced (max, then sum) over that mesh dim's group, and
// computes its chunk of the result, which has the input's placements. What moves is the input's
// shape with the dim at 1, twice, instead of an all-gather of the input; the sums' order differs
// from the unsharded kernel's, so values agree to rounding. Their backward formulas (a sum
// along the dim: Partial(sum), all-reduced where it meets the sharded output) stay sharded too.
// With nll_loss's rule for class-sharded log-probabilities (Note [Loss parallel] in
// rules_nn.cpp) this makes cross_entropy on class-sharded logits loss parallel. Elsewhere (a
// nested shard of the dim, an empty chunk, a Partial input, out= forms) the dim is gathered.
bool sharded_softmax(const ShardingCall& call, ShardingDecision& d, bool log) {
  if (call.op().kind() == OpKind::Out) return false;
  const DTensorSpec& s = call.input(0);
  const int64_t dim = wrap_dim(call.int_arg(1), s.ndim());
  if (dim < 0 || dim >= s.ndim() || s.has_partial()) return false;
  int64_t along = -1;
  for (int64_t m = 0; m < s.mesh().ndim(); ++m) {
    if (!s.placement(m).is_shard() || s.placement(m).dim() != dim) continue;
    if (along >= 0) return false;  // nested
    along = m;
  }
  if (along < 0 || !no_empty_chunk(s, dim)) return false;
  const Placements kept(s.placements().begin(), s.placements().end());
  d.inputs.assign(1, kept);
  d.outputs.assign(1, kept);
  const distributed::ProcessGroup* group = &s.mesh().group(along);
  d.local_run = [group, dim, log](Stack& stack) {
    const Tensor x = std::get<Tensor>(stack[0]);
    Tensor m = distributed::all_reduce(amax(x, {dim}, true), ReduceOp::Max, group);
    Tensor shifted = sub(x, m), e = exp(shifted);
    Tensor total = distributed::all_reduce(sum(e, {dim}, true), ReduceOp::Sum, group);
    Tensor r = log ? sub(shifted, kiln::log(total)) : div(e, total);
    stack.clear();
    stack.emplace_back(std::move(r));
  };
  return true;
}

// softmax, log_softmax: (self, int dim); the result keeps the input's shape.
template <bool Log>
void softmax_rule(const ShardingCall& call, ShardingDecision& d) {
  if (sharded_softmax(call, d, Log)) return;
  const size_t b = base(call);
  Shape dims{call.int_arg(b + 1)};
  reduce(call, d, layout(call, b, dims, true), Kind::Whole, results(call));
}

const ShardingRule kSum{"reduction (a sharded reduced dim leaves Partial(sum))",
                        &over_dims<Kind::Sum>};
const ShardingRule kMean{"reduction (Partial(avg) over even chunks)", &over_dims<Kind::Mean>};
const ShardingRule kAmax{"reduction (Partial(max))", &over_dims<Kind::Max>};
const ShardingRule kAmin{"reduction (Partial(min))", &over_dims<Kind::Min>};
const ShardingRule kAll{"reduction (Partial(min) of bools)", &over_dims<Kind::All>};
const ShardingRule kAny{"reduction (Partial(max) of bools)", &over_dims<Kind::Any>};
const ShardingRule kVar{"reduction (the reduced dims whole)", &var_rule};
const ShardingRule kArg{"reduction (the reduced dims whole)", &arg_rule};
const ShardingRule kDimPair{"reduction (the reduced dim whole)", &dim_pair_rule};
const ShardingRule kSoftmax{"softmax (a sharded dim reduced across ranks)", &softmax_rule<false>};
const ShardingRule kLogSoftmax{"log_softmax (a sharded dim reduced across ranks)",
                               &softmax_rule<true>};

const bool g_registered = [] {
  auto both = [](auto& op, auto& out, const ShardingRule* r) {
    set_sharding_rule(op.def, r);
    set_sharding_rule(out.def, r);
  };
  both(ops::op_sum, ops::op_sum_out, &kSum);
  both(ops::op_mean, ops::op_mean_out, &kMean);
  both(ops::op_amax, ops::op_amax_out, &kAmax);
  both(ops::op_amin, ops::op_amin_out, &kAmin);
  both(ops::op_all, ops::op_all_out, &kAll);
  both(ops::op_any, ops::op_any_out, &kAny);
  both(ops::op_var, ops::op_var_out, &kVar);
  both(ops::op_argmax, ops::op_argmax_out, &kArg);
  both(ops::op_argmin, ops::op_argmin_out, &kArg);
  both(ops::op_softmax, ops::op_softmax_out, &kSoftmax);
  both(ops::op_log_softmax, ops::op_log_softmax_out, &kLogSoftmax);
  set_sharding_rule(ops::op_max_dim.def, &kDimPair);
  set_sharding_rule(ops::op_min_dim.def, &kDimPair);
  return true;
}();

}  // namespace
}  // namespace kiln::dtensor

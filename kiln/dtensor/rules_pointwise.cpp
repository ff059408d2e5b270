// Sharding rules of the pointwise ops (their functional, in-place and out= forms), where,
// clamp, gelu_backward, threshold_backward, casts and copies. See Note [Pointwise placements].
#include <algorithm>

#include "kiln/dtensor/dtensor.h"
#include "kiln/dtensor/rule_options.h"
#include "kiln/ops/op_list.h"

namespace kiln::dtensor {
namespace {

// Note [Pointwise placements]
// A pointwise op lines its inputs up by broadcasting, so along a mesh dim it can run locally
// when every input is chunked the same way along the same result dim (an input that broadcasts
// along that dim, or lacks it, is replicated), or when every input is replicated. A Partial
// input must be reduced first (to Replicate, or straight to a Shard by a reduce-scatter), except
// where the op is linear in it: add and sub of Partial(sum) terms (a replicated operand becomes
// a term on one rank: a local step), mul with one Partial(sum) factor, div of a Partial(sum)
// numerator, neg, and a copy of a Partial(sum) source. A number mixed into add or sub (`t + 2`)
// would be added once per rank, so it rules the linear way out. Options are tried in order:
// follow an input's shard, stay Partial, reduce-scatter a Partial input into a shard, replicate
// (Note [Choosing by bytes]).
enum class Linear { No, Sum, AnyOne, First, Unary };

struct Operands {
  std::vector<int64_t> out;   // the broadcast result shape
  std::vector<int64_t> ndim;  // per DTensor input
  std::vector<bool> operand;  // the input takes part in broadcasting (not an out= argument)
  bool number = false;        // a wrapped number is among the arguments
  size_t first_pos = 0;       // stack position of the first operand
};

Operands operands_of(const ShardingCall& call) {
  Operands o;
  const bool out_form = call.op().kind() == OpKind::Out;
  o.first_pos = out_form ? 1 : 0;
  const Stack& args = call.args();
  for (size_t p = 0; p < args.size(); ++p) {
    const Tensor* t = std::get_if<Tensor>(&args[p]);
    if (!t || !t->defined()) continue;
    if (!is_dtensor(*t)) {
      o.number = true;  // only wrapped numbers pass the layer beside DTensors
      continue;
    }
    IntArrayRef s = t->sizes();
    if (o.out.size() < s.size()) o.out.insert(o.out.begin(), s.size() - o.out.size(), 1);
    for (size_t k = 0; k < s.size(); ++k) {
      int64_t& r = o.out[o.out.size() - s.size() + k];
      if (r == 1) r = s[k];
    }
  }
  const size_t n = call.num_inputs();
  o.ndim.resize(n);
  o.operand.resize(n);
  for (size_t i = 0; i < n; ++i) {
    o.ndim[i] = call.input(i).ndim();
    o.operand[i] = !(out_form && call.position(i) == 0);
  }
  return o;
}

// The placement input i needs for a result placed `p` along a mesh dim.
Placement input_target(const ShardingCall& call, const Operands& o, size_t i, const Placement& p) {
  if (!p.is_shard()) return p;
  const int64_t k = p.dim() - (static_cast<int64_t>(o.out.size()) - o.ndim[i]);
  if (k < 0) return Replicate();
  const int64_t size = call.input(i).shape()[k];
  if (size == 1 && o.out[p.dim()] != 1) return Replicate();  // broadcast along it
  return Shard(k);
}

RuleOption option_for(const ShardingCall& call, const Operands& o, size_t n_out,
                      const Placement& p) {
  RuleOption opt;
  for (size_t i = 0; i < call.num_inputs(); ++i) opt.in.push_back(input_target(call, o, i, p));
  opt.out.assign(n_out, p);
  return opt;
}

bool is_sum(const Placement& p) { return p.is_partial() && p.reduce_op() == ReduceOp::Sum; }

void pointwise(const ShardingCall& call, ShardingDecision& d, Linear lin) {
  const Operands o = operands_of(call);
  const size_t n = call.num_inputs();
  const size_t n_out = call.op().kind() == OpKind::Functional ? 1 : 0;
  const int64_t out_nd = static_cast<int64_t>(o.out.size());
  decide_by_options(call, d, n_out, [&](int64_t m) {
    RuleOptions opts;
    std::vector<int64_t> shard_dims;
    bool partial = false;
    for (size_t i = 0; i < n; ++i) {
      const Placement& p = call.input(i).placement(m);
      partial = partial || p.is_partial();
      if (!p.is_shard()) continue;
      const int64_t od = p.dim() + (out_nd - o.ndim[i]);
      if (std::find(shard_dims.begin(), shard_dims.end(), od) == shard_dims.end())
        shard_dims.push_back(od);
    }
    for (int64_t od : shard_dims) opts.push_back(option_for(call, o, n_out, Shard(od)));
    // The linear ways of keeping Partial(sum) terms.
    const Placement sum = Partial(ReduceOp::Sum);
    auto partial_option = [&](const std::function<bool(size_t)>& stays_partial) {
      RuleOption opt;
      for (size_t i = 0; i < n; ++i)
        opt.in.push_back(stays_partial(i) || !o.operand[i] ? sum : Placement(Replicate()));
      opt.out.assign(n_out, sum);
      opts.push_back(std::move(opt));
    };
    auto input_is_sum = [&](size_t i) { return is_sum(call.input(i).placement(m)); };
    switch (lin) {
      case Linear::Sum:
        if (!o.number && std::any_of(o.operand.begin(), o.operand.end(), [](bool b) { return b; }))
          for (size_t i = 0; i < n; ++i)
            if (input_is_sum(i)) {
              partial_option([](size_t) { return true; });
              break;
            }
        break;
      case Linear::Unary:
        for (size_t i = 0; i < n; ++i)
          if (input_is_sum(i)) {
            partial_option([](size_t) { return true; });
            break;
          }
        break;
      case Linear::AnyOne:
        for (size_t i = 0; i < n; ++i)
          if (o.operand[i] && input_is_sum(i)) partial_option([i](size_t j) { return j == i; });
        break;
      case Linear::First:
        for (size_t i = 0; i < n; ++i)
          if (call.position(i) == o.first_pos && input_is_sum(i))
            partial_option([i](size_t j) { return j == i; });
        break;
      case Linear::No:
        break;
    }
    // A Partial input reduced straight into a shard of the result.
    if (partial)
      for (int64_t od = 0; od < out_nd; ++od)
        if (std::find(shard_dims.begin(), shard_dims.end(), od) == shard_dims.end())
          opts.push_back(option_for(call, o, n_out, Shard(od)));
    opts.push_back(option_for(call, o, n_out, Replicate()));
    // An in-place or out= call keeps the written tensor's placement: its own option too (it may
    // be a Partial that only a linear op can keep; decide_by_options rejects what does not fit).
    return opts;
  });
}

void pointwise_no(const ShardingCall& c, ShardingDecision& d) { pointwise(c, d, Linear::No); }
void pointwise_sum(const ShardingCall& c, ShardingDecision& d) { pointwise(c, d, Linear::Sum); }
void pointwise_any(const ShardingCall& c, ShardingDecision& d) { pointwise(c, d, Linear::AnyOne); }
void pointwise_first(const ShardingCall& c, ShardingDecision& d) { pointwise(c, d, Linear::First); }
void pointwise_unary(const ShardingCall& c, ShardingDecision& d) { pointwise(c, d, Linear::Unary); }

const ShardingRule kNo{"pointwise", &pointwise_no};
const ShardingRule kSum{"pointwise (linear: Partial(sum) terms add)", &pointwise_sum};
const ShardingRule kAny{"pointwise (linear in one Partial(sum) factor)", &pointwise_any};
const ShardingRule kFirst{"pointwise (linear in its first operand)", &pointwise_first};
const ShardingRule kUnary{"pointwise (linear)", &pointwise_unary};

const ShardingRule* pointwise_rule_for(std::string_view name) {
  if (name == "add" || name == "sub") return &kSum;
  if (name == "mul") return &kAny;
  if (name == "div") return &kFirst;
  if (name == "neg") return &kUnary;
  return &kNo;
}

const bool g_registered = [] {
#define KILN_POINTWISE_RULE(name, ARGS, schema)                        \
  set_sharding_rule(ops::op_##name.def, pointwise_rule_for(#name));    \
  set_sharding_rule(ops::op_##name##_.def, pointwise_rule_for(#name)); \
  set_sharding_rule(ops::op_##name##_out.def, pointwise_rule_for(#name));
  KILN_FORALL_POINTWISE(KILN_POINTWISE_RULE)
#undef KILN_POINTWISE_RULE
  set_sharding_rule(ops::op_gelu_backward.def, &kFirst);
  set_sharding_rule(ops::op_gelu_backward_out.def, &kFirst);
  set_sharding_rule(ops::op_threshold_backward.def, &kFirst);
  set_sharding_rule(ops::op_threshold_backward_out.def, &kFirst);
  set_sharding_rule(ops::op_elu_backward.def, &kFirst);
  set_sharding_rule(ops::op_elu_backward_out.def, &kFirst);
  set_sharding_rule(ops::op_to_copy.def, &kNo);
  set_sharding_rule(ops::op_copy_.def, &kUnary);
  set_sharding_rule(ops::op_fill_.def, &kNo);
  return true;
}();

}  // namespace
}  // namespace kiln::dtensor

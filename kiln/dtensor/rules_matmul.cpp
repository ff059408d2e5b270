// Sharding rules of the matrix products: mm, bmm, addmm, addmm_gelu. See Note [Matmul
// placements].
#include "kiln/dtensor/rule_options.h"
#include "kiln/ops/op_list.h"

namespace kiln::dtensor {
namespace {

// Note [Matmul placements]
// C[M,N] = A[M,K] B[K,N] runs locally along a mesh dim in four ways: rows (A Shard(0), B
// replicated: C Shard(0)), columns (A replicated, B Shard(1): C Shard(1)), the contracted dim
// (A Shard(1), B Shard(0), chunked alike: each rank's product is a term, C Partial(sum)), and
// replicated. A Partial(sum) factor times a replicated one is a term too. bmm adds the batch
// dim (both Shard(0)) and shifts the others by one. addmm's bias follows C's placement as a
// broadcast operand: chunked along C's sharded dim where it has that dim, replicated where it
// broadcasts, and a term on one rank when C is Partial (beta * bias is then added once).
// addmm_gelu applies GELU after the sum, so a Partial C is not one of its ways. The cheapest way
// wins (Note [Choosing by bytes]).
struct Way {
  Placement a, b, c;
};

// The ways of a product whose last two dims are the matrix dims (`batch`: a leading batch dim).
std::vector<Way> ways(bool batch, bool partial) {
  const int64_t o = batch ? 1 : 0;
  std::vector<Way> w;
  if (batch) w.push_back({Shard(0), Shard(0), Shard(0)});
  w.push_back({Shard(o), Replicate(), Shard(o)});
  w.push_back({Replicate(), Shard(o + 1), Shard(o + 1)});
  if (partial) {
    const Placement sum = Partial(ReduceOp::Sum);
    w.push_back({Shard(o + 1), Shard(o), sum});
    w.push_back({sum, Replicate(), sum});
    w.push_back({Replicate(), sum, sum});
  }
  w.push_back({Replicate(), Replicate(), Replicate()});
  return w;
}

// Roles of a product's arguments by stack position.
struct Roles {
  int64_t out = -1, bias = -1, a = -1, b = -1;  // stack positions (-1: none)
};

// The placement the bias (of `bias_ndim` dims, broadcast to C's `c_ndim`) needs for C placed `c`.
Placement bias_target(const ShardingCall& call, size_t bias_input, int64_t c_ndim,
                      IntArrayRef c_shape, const Placement& c) {
  if (!c.is_shard()) return c;
  const DTensorSpec& s = call.input(bias_input);
  const int64_t k = c.dim() - (c_ndim - s.ndim());
  if (k < 0 || (s.shape()[k] == 1 && c_shape[c.dim()] != 1)) return Replicate();
  return Shard(k);
}

void product(const ShardingCall& call, ShardingDecision& d, const Roles& r, bool batch,
             bool partial, size_t n_out) {
  const int64_t ia = call.input_at(r.a), ib = call.input_at(r.b);
  const int64_t ibias = r.bias >= 0 ? call.input_at(r.bias) : -1;
  KILN_CHECK(ia >= 0 && ib >= 0, "[{}] both factors must be DTensors when one is (inputs: {})",
             call.op().name(), inputs_str(call));
  const DTensorSpec& A = call.input(ia);
  const DTensorSpec& B = call.input(ib);
  Shape c_shape(A.shape());
  c_shape[c_shape.size() - 1] = B.shape()[B.ndim() - 1];
  const int64_t c_ndim = static_cast<int64_t>(c_shape.size());
  const std::vector<Way> all = ways(batch, partial);
  decide_by_options(call, d, n_out, [&](int64_t) {
    RuleOptions opts;
    for (const Way& w : all) {
      RuleOption o;
      for (size_t i = 0; i < call.num_inputs(); ++i) {
        const auto in = static_cast<int64_t>(i);
        if (in == ia)
          o.in.push_back(w.a);
        else if (in == ib)
          o.in.push_back(w.b);
        else if (in == ibias)
          o.in.push_back(bias_target(call, i, c_ndim, c_shape, w.c));
        else
          o.in.push_back(w.c);  // the out= tensor
      }
      o.out.assign(n_out, w.c);
      opts.push_back(std::move(o));
    }
    return opts;
  });
}

size_t shift(const ShardingCall& call) { return call.op().kind() == OpKind::Out ? 1 : 0; }
size_t outs(const ShardingCall& call) { return call.op().kind() == OpKind::Out ? 0 : 1; }

void mm_rule(const ShardingCall& call, ShardingDecision& d) {
  const auto s = static_cast<int64_t>(shift(call));
  product(call, d, {s ? 0 : -1, -1, s, s + 1}, false, true, outs(call));
}
void bmm_rule(const ShardingCall& call, ShardingDecision& d) {
  const auto s = static_cast<int64_t>(shift(call));
  product(call, d, {s ? 0 : -1, -1, s, s + 1}, true, true, outs(call));
}
// addmm(self (the bias), mat1, mat2, beta, alpha).
void addmm_rule(const ShardingCall& call, ShardingDecision& d) {
  const auto s = static_cast<int64_t>(shift(call));
  product(call, d, {s ? 0 : -1, s, s + 1, s + 2}, false, true, outs(call));
}
// addmm_gelu(bias?, mat1, mat2) -> (out, preactivation).
void addmm_gelu_rule(const ShardingCall& call, ShardingDecision& d) {
  product(call, d, {-1, 0, 1, 2}, false, false, 2);
}

const ShardingRule kMm{"mm (rows, columns, contracted dim or replicated)", &mm_rule};
const ShardingRule kBmm{"bmm (batch, rows, columns, contracted dim or replicated)", &bmm_rule};
const ShardingRule kAddmm{"addmm (mm's ways; the bias follows the result)", &addmm_rule};
const ShardingRule kAddmmGelu{"addmm_gelu (mm's ways without Partial)", &addmm_gelu_rule};

const bool g_registered = [] {
  set_sharding_rule(ops::op_mm.def, &kMm);
  set_sharding_rule(ops::op_mm_out.def, &kMm);
  set_sharding_rule(ops::op_bmm.def, &kBmm);
  set_sharding_rule(ops::op_bmm_out.def, &kBmm);
  set_sharding_rule(ops::op_addmm.def, &kAddmm);
  set_sharding_rule(ops::op_addmm_out.def, &kAddmm);
  set_sharding_rule(ops::op_addmm_gelu.def, &kAddmmGelu);
  return true;
}();

}  // namespace
}  // namespace kiln::dtensor

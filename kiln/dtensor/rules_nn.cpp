// Sharding rules of the nn ops: layer_norm, rms_norm, layer_norm_backward and
// layer_norm_fused_backward (Note [Norm placements]), embedding (Note [Vocab-parallel embedding]),
// nll_loss (Note [Loss parallel]) and flash_attention with its backward (Note [Attention
// placements]); their out= forms alike. native_dropout's rule is in rules_dropout.cpp.
#include "kiln/dtensor/dtensor.h"
#include "kiln/dtensor/rule_options.h"
#include "kiln/ops/op_list.h"
#include "kiln/ops/ops.h"

namespace kiln::dtensor {
namespace {

size_t base(const ShardingCall& call) { return call.op().kind() == OpKind::Out ? 1 : 0; }
bool is_out_arg(const ShardingCall& call, size_t i) {
  return call.op().kind() == OpKind::Out && call.position(i) == 0;
}
bool is_sum(const Placement& p) { return p.is_partial() && p.reduce_op() == ReduceOp::Sum; }

// The option giving input i placement `in(i)` and every result `out` (an out= argument takes
// the result's placement: the layer requires it to have that one already).
RuleOption make_option(const ShardingCall& call, size_t n_out,
                       const std::function<Placement(size_t)>& in, std::vector<Placement> out) {
  RuleOption o;
  for (size_t i = 0; i < call.num_inputs(); ++i)
    o.in.push_back(is_out_arg(call, i) ? out.at(0) : in(i));
  o.out = n_out ? std::move(out) : std::vector<Placement>{};
  return o;
}

// Leaves the local result(s) on the stack as the op would: an out= form copies them into its
// `out` (stack position 0) and leaves nothing.
void finish(Stack& stack, bool out_form, Tensor result) {
  if (out_form) {
    std::get<Tensor>(stack[0]).copy_(result);
    stack.clear();
    return;
  }
  stack.clear();
  stack.emplace_back(std::move(result));
}

// ---------------------------------------------------------------- norms

// Note [Norm placements]
// layer_norm and rms_norm normalise each row over the trailing normalized_shape dims, so a
// shard of a leading dim (batch, sequence) runs locally and the result keeps it; a shard of a
// normalised dim is gathered first. weight and bias are replicated (sharding them alike along
// the normalised dims would need the row statistics whole: not done). A Partial input is
// reduced first, to Replicate or by a reduce-scatter into a leading shard. layer_norm_backward
// (grad_input only) treats grad_output and input alike, and is linear in grad_output: a
// Partial(sum) grad_output with a replicated input gives a Partial(sum) grad_input.
// layer_norm_fused_backward (Backward, three results) is layer_norm_backward with grad_weight =
// sum(grad * xhat) and grad_bias = sum(grad) over the leading dims: where those are sharded the
// sums are Partial(sum) (sequence parallel's LayerNorm weight gradient), as they are where
// grad_output is Partial(sum); replicated data gives replicated sums.
template <bool Backward>
void norm_rule(const ShardingCall& call, ShardingDecision& d) {
  const size_t b = base(call);
  const bool grads = &call.op() == &ops::op_layer_norm_fused_backward.def;
  const size_t n_out = b ? 0 : (grads ? 3 : 1);
  // The results for data (grad_input's) placement `p`.
  auto results = [&](const Placement& p) {
    if (!grads) return std::vector<Placement>{p};
    const Placement sum = p.is_replicate() ? p : Placement(Partial(ReduceOp::Sum));
    return std::vector<Placement>{p, sum, sum};
  };
  const size_t x_pos = b + (Backward ? 1 : 0);
  const int64_t lead =
      call.tensor_ndim(x_pos) - static_cast<int64_t>(call.ints_arg(x_pos + 1).size());
  auto is_data = [&](size_t i) {
    const size_t pos = call.position(i);
    return pos == x_pos || (Backward && pos == b);
  };
  decide_by_options(call, d, n_out, [&](int64_t m) {
    RuleOptions opts;
    auto option = [&](const Placement& data) {
      opts.push_back(make_option(
          call, n_out, [&](size_t i) { return is_data(i) ? data : Placement(Replicate()); },
          results(data)));
    };
    std::vector<bool> followed(static_cast<size_t>(std::max<int64_t>(lead, 0)), false);
    bool partial = false;
    for (size_t i = 0; i < call.num_inputs(); ++i) {
      if (!is_data(i)) continue;
      const Placement& p = call.input(i).placement(m);
      partial = partial || p.is_partial();
      if (p.is_shard() && p.dim() < lead && !followed[p.dim()]) {
        followed[p.dim()] = true;
        option(p);
      }
    }
    if (Backward) {
      const int64_t g = call.input_at(b);
      if (g >= 0 && is_sum(call.input(static_cast<size_t>(g)).placement(m))) {
        const Placement sum = Partial(ReduceOp::Sum);
        opts.push_back(make_option(
            call, n_out,
            [&](size_t i) { return call.position(i) == b ? sum : Placement(Replicate()); },
            results(sum)));
      }
    }
    if (partial)  // a reduce-scatter straight into a leading shard
      for (int64_t k = 0; k < lead; ++k)
        if (!followed[k]) option(Shard(k));
    option(Replicate());
    return opts;
  });
}

// ---------------------------------------------------------------- embedding

// Note [Vocab-parallel embedding]
// embedding(weight [V, E], indices [...]) -> [..., E]. Along one mesh dim:
//   - indices Shard(k), weight replicated: the result is Shard(k);
//   - weight Shard(1) (the embedding dim), indices replicated: the result's last dim is sharded;
//   - weight Shard(0) (rows of the vocabulary), indices replicated: each rank looks up the
//     indices in its rows [r0, r0 + n) and zeroes the others, and the ranks' results sum to the
//     lookup: Partial(sum). The op itself would read out of its rows, so the decision's local_run
//     does the masked lookup: index i - r0 where r0 <= i < r0 + n, else row 0 (or, for a rank
//     with no rows, nothing), then the rows of out-of-range indices zeroed. One rank holds each
//     value and the others add zeros, so the sum is exact;
//   - weight Partial(sum), indices replicated: the lookup is linear in the weight: Partial(sum);
//   - else everything replicated.
// The indices are never Partial (integers are summed as they are, which no rule wants).
Tensor masked_embedding(const Tensor& w, const Tensor& idx, int64_t r0, int64_t rows) {
  if (rows == 0) {
    Shape shape(idx.sizes());
    shape.push_back(w.size(1));
    return zeros(shape, w.dtype(), w.device());
  }
  Tensor outside = logical_or(lt(idx, r0), ge(idx, r0 + rows));
  Tensor local = where(outside, zeros({}, idx.dtype(), idx.device()), sub(idx, r0));
  return where(unsqueeze(outside, -1), zeros({}, w.dtype(), w.device()), embedding(w, local));
}

void embedding_rule(const ShardingCall& call, ShardingDecision& d) {
  const size_t b = base(call);
  const size_t n_out = b ? 0 : 1;
  const int64_t w = call.input_at(b), ix = call.input_at(b + 1);
  KILN_CHECK(w >= 0, "[{}] needs its weight to be a DTensor beside DTensor indices",
             call.op().name());
  const int64_t idx_nd = call.tensor_ndim(b + 1);
  const Placement R = Replicate(), sum = Partial(ReduceOp::Sum);
  decide_by_options(call, d, n_out, [&](int64_t m) {
    RuleOptions opts;
    auto option = [&](const Placement& wp, const Placement& ip, const Placement& out) {
      opts.push_back(make_option(
          call, n_out, [&](size_t i) { return static_cast<int64_t>(i) == w ? wp : ip; }, {out}));
    };
    const Placement& wp = call.input(static_cast<size_t>(w)).placement(m);
    if (ix >= 0) {
      const Placement& ip = call.input(static_cast<size_t>(ix)).placement(m);
      if (ip.is_shard()) option(R, ip, ip);
    }
    if (wp.is_shard() && wp.dim() == 1) option(wp, R, Shard(idx_nd));
    if (wp.is_shard() && wp.dim() == 0) option(wp, R, sum);
    if (is_sum(wp)) option(wp, R, sum);
    option(R, R, R);
    return opts;
  });
  const Placements& wp = d.inputs[static_cast<size_t>(w)];
  bool rows = false;
  for (const Placement& p : wp) rows = rows || (p.is_shard() && p.dim() == 0);
  if (!rows) return;
  const DTensorSpec* local = with_placements(call.input(static_cast<size_t>(w)), wp);
  const int64_t r0 = local->local_offset()[0], n = local->local_shape()[0];
  d.local_run = [b, r0, n](Stack& stack) {
    Tensor r = masked_embedding(std::get<Tensor>(stack[b]), std::get<Tensor>(stack[b + 1]), r0, n);
    finish(stack, b == 1, std::move(r));
  };
}

// ---------------------------------------------------------------- nll_loss

// Note [Loss parallel]
// nll_loss(input [N, C] or [C], target [N] or [], ignore_index) is -sum_n input[n, target[n]]
// over the kept rows (target != ignore_index), divided by their count. It is linear in the
// input, and the count depends on the target alone, so with a replicated target:
//   - a Partial(sum) input gives a Partial(sum) loss (the op as it is: each rank divides its
//     term by the same count);
//   - an input sharded along the rows or the classes gives a Partial(sum) loss: each rank sums
//     -input[n, target[n]] over its rows n whose target falls in its classes and divides by the
//     count of all kept rows (the decision's local_run, from the rank's row and class ranges);
//     a class-sharded input is loss parallel.
// The target is gathered where it is sharded (an int64 per row, far less than the input). The
// sum's order differs from the unsharded op's, so the loss agrees to rounding. Targets outside
// [0, C) are not detected on a sharded input (the unsharded kernel raises for them).
Tensor local_nll(const Tensor& x, const Tensor& target, int64_t ignore, int64_t r0, int64_t c0) {
  const bool rows = x.dim() == 2;
  const int64_t n = rows ? x.size(0) : 1, c = x.size(-1);
  Tensor t = rows ? narrow(target, 0, r0, n) : target.reshape({1});
  Tensor x2 = x.reshape({n, c});
  Tensor keep = ne(t, ignore);
  Tensor mine = logical_and(keep, logical_and(ge(t, c0), lt(t, c0 + c)));
  Tensor picked;
  if (c == 0 || n == 0) {
    picked = zeros({n}, x.dtype(), x.device());
  } else {
    Tensor col = where(mine, sub(t, c0), zeros({}, t.dtype(), t.device()));
    picked = squeeze(gather(x2, 1, unsqueeze(col, 1)), 1);
    picked = where(mine, picked, zeros({}, x.dtype(), x.device()));
  }
  Tensor count = sum(ne(target, ignore), {}, false, x.dtype());
  return div(neg(sum(picked)), count);
}

void nll_rule(const ShardingCall& call, ShardingDecision& d) {
  const size_t b = base(call);
  const size_t n_out = b ? 0 : 1;
  const int64_t x = call.input_at(b);
  KILN_CHECK(x >= 0, "[{}] needs its input to be a DTensor beside a DTensor target",
             call.op().name());
  const Placement R = Replicate(), sum = Partial(ReduceOp::Sum);
  decide_by_options(call, d, n_out, [&](int64_t m) {
    RuleOptions opts;
    auto option = [&](const Placement& xp, const Placement& out) {
      opts.push_back(make_option(
          call, n_out, [&](size_t i) { return static_cast<int64_t>(i) == x ? xp : R; }, {out}));
    };
    const Placement& xp = call.input(static_cast<size_t>(x)).placement(m);
    if (xp.is_shard() || is_sum(xp)) option(xp, sum);
    option(R, R);
    return opts;
  });
  const Placements& xp = d.inputs[static_cast<size_t>(x)];
  bool sharded = false;
  for (const Placement& p : xp) sharded = sharded || p.is_shard();
  if (!sharded) return;
  const DTensorSpec* local = with_placements(call.input(static_cast<size_t>(x)), xp);
  const int64_t nd = local->ndim();
  const int64_t r0 = nd == 2 ? local->local_offset()[0] : 0;
  const int64_t c0 = local->local_offset()[nd - 1];
  const int64_t ignore = call.int_arg(b + 2);
  d.local_run = [b, r0, c0, ignore](Stack& stack) {
    Tensor r =
        local_nll(std::get<Tensor>(stack[b]), std::get<Tensor>(stack[b + 1]), ignore, r0, c0);
    finish(stack, b == 1, std::move(r));
  };
}

// ---------------------------------------------------------------- attention

// Note [Attention placements]
// flash_attention(q, k, v) [..., L or S, E] -> (out [..., L, E], logsumexp [..., L]) attends
// each (batch, head) on its own, so a shard of a leading dim (heads: dim 1 of [B, H, L, E], or
// the batch) runs locally when q, k and v are all sharded alike, and both results keep it.
// Without a causal mask each query row is on its own too: q (and, in the backward, grad_out, out
// and logsumexp) sharded along the query rows with k and v replicated gives results sharded
// along the rows, and in the backward grad_key and grad_value Partial(sum) (sums over the
// queries). A causal mask places a query by its row index, which a local row would lose, and a
// shard of the embedding dim splits the scores' sums: both are gathered first, as Partial
// inputs are reduced.
template <bool Backward>
void attention_options(const ShardingCall& call, ShardingDecision& d, bool rows_allowed) {
  // Stack positions: backward (grad_out, q, k, v, out, logsumexp, is_causal, scale), forward
  // (q, k, v, is_causal, scale).
  const size_t q_pos = Backward ? 1 : 0;
  const int64_t nd = call.tensor_ndim(q_pos);
  const bool causal = call.bool_arg(Backward ? 6 : 3);
  const size_t n_out = Backward ? 3 : 2;
  const Placement R = Replicate(), sum = Partial(ReduceOp::Sum);
  auto is_kv = [&](size_t i) {
    const size_t pos = call.position(i);
    return pos == q_pos + 1 || pos == q_pos + 2;
  };
  decide_by_options(call, d, n_out, [&](int64_t m) {
    RuleOptions opts;
    std::vector<bool> followed(static_cast<size_t>(nd), false);
    for (size_t i = 0; i < call.num_inputs(); ++i) {
      const Placement& p = call.input(i).placement(m);
      if (!p.is_shard() || followed[p.dim()]) continue;
      const int64_t k = p.dim();
      followed[k] = true;
      if (k < nd - 2) {  // a leading dim (logsumexp's too), alike everywhere
        std::vector<Placement> out(n_out, Shard(k));
        opts.push_back(make_option(
            call, n_out, [&](size_t) { return Placement(Shard(k)); }, out));
      }
    }
    // Query rows: dim nd - 2 of q, grad_out and out, dim nd - 2 of logsumexp ([..., L]).
    bool rows = false;
    for (size_t i = 0; i < call.num_inputs(); ++i) {
      const Placement& p = call.input(i).placement(m);
      rows = rows || (p.is_shard() && !is_kv(i) && p.dim() == nd - 2);
    }
    if (rows && rows_allowed && !causal) {
      std::vector<Placement> out{Shard(nd - 2), Backward ? sum : Placement(Shard(nd - 2))};
      if (Backward) out.push_back(sum);
      opts.push_back(make_option(
          call, n_out, [&](size_t i) { return is_kv(i) ? R : Placement(Shard(nd - 2)); }, out));
    }
    opts.push_back(uniform_option(call, n_out, R));
    return opts;
  });
}

// The kernels need at least one query: where some rank's rows would be empty (4 rows over 3
// ranks: 2, 2, 0), the rows are gathered instead, decided alike on every rank.
template <bool Backward>
void attention_rule(const ShardingCall& call, ShardingDecision& d) {
  attention_options<Backward>(call, d, true);
  const int64_t q = call.input_at(Backward ? 1 : 0);
  if (q < 0) return;
  const DTensorSpec& qs = call.input(static_cast<size_t>(q));
  const DTensorSpec* local = with_placements(qs, d.inputs[static_cast<size_t>(q)]);
  if (no_empty_chunk(*local, qs.ndim() - 2)) return;
  attention_options<Backward>(call, d, false);
}

const ShardingRule kNorm{"norm (leading dims keep their shards)", &norm_rule<false>};
const ShardingRule kNormBackward{"norm backward (leading dims keep their shards)",
                                 &norm_rule<true>};
const ShardingRule kEmbedding{"embedding (vocab-parallel rows give Partial(sum))", &embedding_rule};
const ShardingRule kNll{"nll_loss (loss parallel: Partial(sum))", &nll_rule};
const ShardingRule kAttention{"attention (heads or batch, or non-causal query rows)",
                              &attention_rule<false>};
const ShardingRule kAttentionBackward{"attention backward (heads or batch, or query rows)",
                                      &attention_rule<true>};

const bool g_registered = [] {
  auto both = [](auto& op, auto& out, const ShardingRule* r) {
    set_sharding_rule(op.def, r);
    set_sharding_rule(out.def, r);
  };
  both(ops::op_layer_norm, ops::op_layer_norm_out, &kNorm);
  both(ops::op_rms_norm, ops::op_rms_norm_out, &kNorm);
  both(ops::op_layer_norm_backward, ops::op_layer_norm_backward_out, &kNormBackward);
  set_sharding_rule(ops::op_layer_norm_fused_backward.def, &kNormBackward);
  both(ops::op_embedding, ops::op_embedding_out, &kEmbedding);
  both(ops::op_nll_loss, ops::op_nll_loss_out, &kNll);
  set_sharding_rule(ops::op_flash_attention.def, &kAttention);
  set_sharding_rule(ops::op_flash_attention_backward.def, &kAttentionBackward);
  return true;
}();

}  // namespace
}  // namespace kiln::dtensor

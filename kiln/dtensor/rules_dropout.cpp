// The sharding rule of native_dropout: each shard draws the numbers of its global positions.
// See Note [Sharded dropout].
#include "kiln/compile/trace.h"
#include "kiln/core/generator.h"
#include "kiln/dtensor/rule_options.h"
#include "kiln/ops/op_list.h"
#include "kiln/ops/ops.h"

namespace kiln::dtensor {
namespace {

// Note [Sharded dropout]
// native_dropout(x, p, generator) draws one uniform per element of x in row-major order, element
// i from Philox block (offset + i / 4), lane i % 4 (Note [Philox layout] in
// kiln/core/generator.h), and advances the generator by ceil(numel / 4) blocks. A sharded call
// gives the unsharded op's values and leaves every rank's generator where the unsharded op
// would:
//   - a shard (any placement with a Shard) runs the decision's local_run. It reserves the global
//     draw's blocks on the generator, then draws only the span of global positions from the
//     shard's first element to its last: a zero tensor of that span (plus the first element's
//     lane, so lanes line up), the shard copied into its positions, dropped out with a
//     generator of the same seed at the span's first block, and the shard's positions read
//     back. A row shard's span is the shard itself; a column shard's is nearly the whole.
//     Where the generator's state is not on the host (a device's own generator: no generator
//     given, on a device other than the CPU) or a trace is recording (which would keep the
//     temporary generator), the shard is dropped out inside a zero tensor of the global shape
//     with the call's generator instead: the same values, at the whole tensor's cost;
//   - a Partial input keeps its kind (the mask and the scale are the same on every rank and not
//     negative, so the op commutes with sum, avg, max and min) and its mask is replicated: each
//     rank draws the whole, at the same positions;
//   - a replicated input: the op as it is, on every rank.
// Ranks agree only if their generators do (the same seed and the same draws before).

struct Box {
  Shape shape;    // the global shape
  Shape offset;   // where this rank's shard starts
  Shape local;    // its shape
  Shape strides;  // the global row-major strides
};

TensorPair dropout_shard(const Tensor& x, double p, Generator* gen, const Box& b) {
  int64_t global_n = 1, local_n = 1;
  for (size_t d = 0; d < b.shape.size(); ++d) global_n *= b.shape[d], local_n *= b.local[d];
  Generator* g = gen;
  if (!g && x.device().type() == kCPU) g = &default_generator();
  const compiler::Tracer* tracer = compiler::current_tracer();
  if (!g || (tracer && tracer->tracing())) {
    Tensor whole = zeros(b.shape, x.dtype(), x.device());
    auto box = [&](const Tensor& t) {
      Tensor v = t;
      for (size_t d = 0; d < b.shape.size(); ++d)
        v = narrow(v, static_cast<int64_t>(d), b.offset[d], b.local[d]);
      return v;
    };
    box(whole).copy_(x);
    auto [out, mask] = ops::op_native_dropout(whole, p, gen);
    return {box(out).contiguous(), box(mask).contiguous()};
  }
  const uint64_t base = g->advance(static_cast<uint64_t>(global_n));
  if (local_n == 0)
    return {zeros(b.local, x.dtype(), x.device()), zeros(b.local, kBool, x.device())};
  int64_t first = 0, last = 0;
  for (size_t d = 0; d < b.shape.size(); ++d) {
    first += b.offset[d] * b.strides[d];
    last += (b.offset[d] + b.local[d] - 1) * b.strides[d];
  }
  const int64_t lane = first % 4;
  Generator at(g->seed());
  at.set_offset(base + static_cast<uint64_t>(first / 4));
  Tensor span = zeros({last - first + 1 + lane}, x.dtype(), x.device());
  as_strided(span, b.local, b.strides, lane).copy_(x);
  auto [out, mask] = ops::op_native_dropout(span, p, &at);
  return {as_strided(out, b.local, b.strides, lane).contiguous(),
          as_strided(mask, b.local, b.strides, lane).contiguous()};
}

void dropout_rule(const ShardingCall& call, ShardingDecision& d) {
  KILN_ASSERT(call.num_inputs() == 1, "[native_dropout] expected one DTensor input, got {}",
              call.num_inputs());
  const DTensorSpec& s = call.input(0);
  decide_by_options(call, d, 2, [&](int64_t m) {
    const Placement& p = s.placement(m);
    if (p.is_shard())
      return RuleOptions{{{p}, {p, p}}, {{Replicate()}, {Replicate(), Replicate()}}};
    if (p.is_partial()) return RuleOptions{{{p}, {p, Replicate()}}};
    return RuleOptions{{{Replicate()}, {Replicate(), Replicate()}}};
  });
  bool sharded = false;
  for (const Placement& p : d.inputs[0]) sharded = sharded || p.is_shard();
  if (!sharded) return;
  const DTensorSpec* local = with_placements(s, d.inputs[0], "native_dropout");
  Box b{Shape(s.shape()), Shape(local->local_offset()), Shape(local->local_shape()),
        Shape(s.shape())};
  int64_t stride = 1;
  for (int64_t k = s.ndim() - 1; k >= 0; --k) {
    b.strides[k] = stride;
    stride *= s.shape()[k];
  }
  d.local_run = [b = std::move(b)](Stack& stack) {
    Tensor x = std::get<Tensor>(stack[0]);
    const double p = std::get<double>(stack[1]);
    Generator* gen = std::get<Generator*>(stack[2]);
    auto [out, mask] = dropout_shard(x, p, gen, b);
    stack.clear();
    stack.emplace_back(std::move(out));
    stack.emplace_back(std::move(mask));
  };
}

const ShardingRule kDropout{"dropout (each shard draws its global positions)", &dropout_rule};

const bool g_registered = [] {
  set_sharding_rule(ops::op_native_dropout.def, &kDropout);
  return true;
}();

}  // namespace
}  // namespace kiln::dtensor

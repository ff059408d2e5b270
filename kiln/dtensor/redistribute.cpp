#include "kiln/dtensor/redistribute.h"

#include "kiln/dtensor/dtensor_autograd.h"

#include <fmt/ranges.h>

#include <shared_mutex>
#include <unordered_map>

#include "kiln/core/error.h"
#include "kiln/distributed/collectives.h"
#include "kiln/dtensor/dtensor.h"
#include "kiln/ops/ops.h"

namespace kiln::dtensor {

// Note [Redistribute plans]
// A plan changes one mesh dim at a time, each step a single collective (or none) along that
// dim's group. Shards of one tensor dim nest in mesh-dim order (Note [Nested shards] in
// spec.cpp), so a step along mesh dim i on tensor dim x is only valid while no later mesh dim
// shards x. The plan is therefore:
//   T = the mesh dims whose placement changes, closed under: if i is in T and its source or
//       target shards x, every later mesh dim whose source or target shards x joins T (its
//       shard must be taken apart and rebuilt around i's);
//   phase 1, mesh dims of T from last to first: Shard -> Replicate (all_gather), Partial ->
//       Replicate (all_reduce), or straight to the target where no earlier mesh dim of T
//       touches the tensor dims involved: Partial -> Shard (reduce_scatter), Shard(d) ->
//       Shard(e) (all_to_all);
//   phase 2, mesh dims of T from first to last: Replicate -> Shard (local chunk) and
//       Replicate -> Partial (local: coordinate 0 keeps the value for sum, every rank for avg,
//       max and min, so that reducing gives the value back).
// When phase 1 reaches mesh dim i, every later mesh dim that shards i's tensor dims is in T and
// already Replicate; phase 2 chunks outer dims before inner ones. Every step is planned with the
// interned specs before and after it, so running it needs no shape arithmetic beyond chunk's
// rule, and a backward can walk the steps in reverse.
//
// Uneven shards: all_gather and reduce_scatter need equal pieces, so the tensor dim is moved to
// dim 0 and padded to ceil-sized pieces (the padding is dropped after); all_to_all_single takes
// per-rank element counts, so Shard(d) -> Shard(e) sends flattened pieces of any size.
//
// Plans are cached by (source id, target id) under a shared mutex; at 4096 plans the cache is
// emptied (plans in use are shared_ptrs and live on) and refills.

namespace {

constexpr size_t kMaxPlans = 4096;

std::shared_mutex g_plan_mu;
std::unordered_map<uint64_t, std::shared_ptr<const RedistributePlan>>& plan_cache() {
  static auto* m = new std::unordered_map<uint64_t, std::shared_ptr<const RedistributePlan>>();
  return *m;
}

bool shards(const Placement& p, int64_t x) { return p.is_shard(x); }

std::shared_ptr<const RedistributePlan> make_plan(const DTensorSpec& from, const DTensorSpec& to) {
  auto plan = std::make_shared<RedistributePlan>();
  plan->from = &from;
  plan->to = &to;
  const int64_t n = from.mesh().ndim();
  ArrayRef<Placement> src = from.placements(), dst = to.placements();

  std::vector<bool> in_t(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) in_t[i] = !(src[i] == dst[i]);
  for (bool grew = true; grew;) {
    grew = false;
    for (int64_t i = 0; i < n; ++i) {
      if (!in_t[i]) continue;
      for (const Placement& p : {src[i], dst[i]}) {
        if (!p.is_shard()) continue;
        for (int64_t j = i + 1; j < n; ++j)
          if (!in_t[j] && (shards(src[j], p.dim()) || shards(dst[j], p.dim()))) {
            in_t[j] = true;
            grew = true;
          }
      }
    }
  }
  // Whether no earlier mesh dim of T touches tensor dim x (a direct step at i is valid).
  auto direct_ok = [&](int64_t i, std::initializer_list<int64_t> xs) {
    for (int64_t j = 0; j < i; ++j)
      for (int64_t x : xs)
        if (in_t[j] && (shards(src[j], x) || shards(dst[j], x))) return false;
    return true;
  };

  Placements cur(src.begin(), src.end());
  const DTensorSpec* before = &from;
  auto step = [&](StepKind kind, int64_t i, Placement target) {
    cur[i] = target;
    const DTensorSpec* after = with_placements(from, cur, "redistribute");
    plan->steps.push_back({kind, i, before, after});
    before = after;
  };
  for (int64_t i = n; i-- > 0;) {
    if (!in_t[i]) continue;
    const Placement s = cur[i], t = dst[i];
    if (s.is_partial()) {
      if (t.is_shard() && direct_ok(i, {t.dim()}))
        step(StepKind::ReduceScatter, i, t);
      else
        step(StepKind::AllReduce, i, Replicate());
    } else if (s.is_shard()) {
      if (t.is_shard() && t.dim() != s.dim() && direct_ok(i, {s.dim(), t.dim()}))
        step(StepKind::AllToAll, i, t);
      else
        step(StepKind::AllGather, i, Replicate());
    }
  }
  for (int64_t i = 0; i < n; ++i) {
    if (cur[i] == dst[i]) continue;
    KILN_ASSERT(cur[i].is_replicate(), "redistribute phase 2 found {} at mesh dim {}", cur[i].str(),
                i);
    step(dst[i].is_shard() ? StepKind::LocalChunk : StepKind::LocalPartial, i, dst[i]);
  }
  KILN_ASSERT(before == &to, "redistribute plan ends at {} instead of {}", before->str(), to.str());
  return plan;
}

// `x` with tensor dim `d` moved to dim 0 (a transpose: its own inverse), contiguous.
Tensor to_front(const Tensor& x, int64_t d) {
  return d == 0 ? x.contiguous() : transpose(x, 0, d).contiguous();
}
Tensor from_front(const Tensor& x, int64_t d) {
  return d == 0 ? x : transpose(x, 0, d).contiguous();
}

// `x` (dim 0 first) padded with zero rows to `rows`.
Tensor pad_rows(const Tensor& x, int64_t rows) {
  if (x.size(0) == rows) return x;
  Shape pad(x.sizes());
  pad[0] = rows - x.size(0);
  return cat({x, zeros(pad, x.dtype(), x.device())}, 0);
}

Tensor all_gather_step(const Tensor& local, const RedistributeStep& s) {
  const DeviceMesh& mesh = s.before->mesh();
  const int64_t d = s.before->placement(s.mesh_dim).dim(), k = mesh.size(s.mesh_dim);
  const int64_t whole = s.after->local_shape()[d], c = chunk_size(whole, k);
  if (c == 0) return zeros(s.after->local_shape(), local.dtype(), local.device());
  Tensor g =
      distributed::all_gather_into_tensor(pad_rows(to_front(local, d), c), &mesh.group(s.mesh_dim));
  if (whole != c * k) {
    std::vector<Tensor> pieces;
    for (int64_t r = 0; r < k; ++r)
      if (int64_t len = chunk_length(whole, k, r)) pieces.push_back(narrow(g, 0, r * c, len));
    g = cat(pieces, 0);
  }
  return from_front(g, d);
}

Tensor reduce_scatter_step(const Tensor& local, const RedistributeStep& s) {
  const DeviceMesh& mesh = s.before->mesh();
  const int64_t d = s.after->placement(s.mesh_dim).dim(), k = mesh.size(s.mesh_dim);
  const int64_t whole = s.before->local_shape()[d], c = chunk_size(whole, k);
  if (c == 0) return zeros(s.after->local_shape(), local.dtype(), local.device());
  Tensor r = distributed::reduce_scatter_tensor(pad_rows(to_front(local, d), c * k),
                                                s.before->placement(s.mesh_dim).reduce_op(),
                                                &mesh.group(s.mesh_dim));
  const int64_t len = chunk_length(whole, k, mesh.coordinate(s.mesh_dim));
  if (len != c) r = narrow(r, 0, 0, len);
  return from_front(r, d);
}

Tensor all_to_all_step(const Tensor& local, const RedistributeStep& s) {
  const DeviceMesh& mesh = s.before->mesh();
  const int64_t i = s.mesh_dim, k = mesh.size(i), me = mesh.coordinate(i);
  const int64_t d = s.before->placement(i).dim(), e = s.after->placement(i).dim();
  const int64_t whole_d = s.after->local_shape()[d], whole_e = s.before->local_shape()[e];
  // Piece c of dim e goes to coordinate c; from coordinate r comes its dim-d shard of my e-chunk.
  std::vector<Tensor> send;
  std::vector<int64_t> in_splits, out_splits;
  std::vector<Shape> recv_shapes;
  for (int64_t c = 0; c < k; ++c) {
    Tensor piece = narrow(local, e, chunk_offset(whole_e, k, c), chunk_length(whole_e, k, c));
    send.push_back(piece.contiguous().reshape({piece.numel()}));
    in_splits.push_back(piece.numel());
    Shape shape(local.sizes());
    shape[d] = chunk_length(whole_d, k, c);
    shape[e] = chunk_length(whole_e, k, me);
    int64_t n = 1;
    for (int64_t x : shape) n *= x;
    out_splits.push_back(n);
    recv_shapes.push_back(shape);
  }
  Tensor recv = distributed::all_to_all_single(cat(send, 0), out_splits, in_splits, &mesh.group(i));
  std::vector<Tensor> pieces;
  int64_t off = 0;
  for (int64_t r = 0; r < k; ++r) {
    pieces.push_back(narrow(recv, 0, off, out_splits[r]).reshape(recv_shapes[r]));
    off += out_splits[r];
  }
  return cat(pieces, d);
}

Tensor run_step(const Tensor& local, const RedistributeStep& s) {
  const DeviceMesh& mesh = s.before->mesh();
  const int64_t i = s.mesh_dim;
  switch (s.kind) {
    case StepKind::AllGather:
      return all_gather_step(local, s);
    case StepKind::AllReduce:
      return distributed::all_reduce(local.contiguous(), s.before->placement(i).reduce_op(),
                                     &mesh.group(i));
    case StepKind::ReduceScatter:
      return reduce_scatter_step(local, s);
    case StepKind::AllToAll:
      return all_to_all_step(local, s);
    case StepKind::LocalChunk: {
      const int64_t d = s.after->placement(i).dim(), k = mesh.size(i), c = mesh.coordinate(i);
      const int64_t whole = s.before->local_shape()[d];
      return narrow(local, d, chunk_offset(whole, k, c), chunk_length(whole, k, c)).contiguous();
    }
    case StepKind::LocalPartial:
      if (s.after->placement(i).reduce_op() == ReduceOp::Sum && mesh.coordinate(i) != 0)
        return zeros_like(local);
      return local;
  }
  KILN_THROW(Internal, "[redistribute] unknown step kind {}", static_cast<int>(s.kind));
}

}  // namespace

std::string_view step_kind_name(StepKind k) {
  switch (k) {
    case StepKind::AllGather:
      return "all_gather";
    case StepKind::AllReduce:
      return "all_reduce";
    case StepKind::ReduceScatter:
      return "reduce_scatter";
    case StepKind::AllToAll:
      return "all_to_all";
    case StepKind::LocalChunk:
      return "local_chunk";
    case StepKind::LocalPartial:
      return "local_partial";
  }
  return "?";
}

std::shared_ptr<const RedistributePlan> plan_redistribute(const DTensorSpec& from,
                                                          const DTensorSpec& to) {
  const uint64_t key = static_cast<uint64_t>(from.id()) << 32 | to.id();
  {
    std::shared_lock<std::shared_mutex> lock(g_plan_mu);
    auto it = plan_cache().find(key);
    if (it != plan_cache().end()) return it->second;
  }
  KILN_CHECK(&from.mesh() == &to.mesh(), "[redistribute] from {} to {}: the meshes differ",
             from.str(), to.str());
  KILN_CHECK(
      from.shape() == to.shape() && from.strides() == to.strides() && from.dtype() == to.dtype(),
      "[redistribute] from {} to {}: only the placements may change", from.str(), to.str());
  auto plan = make_plan(from, to);
  std::unique_lock<std::shared_mutex> lock(g_plan_mu);
  if (plan_cache().size() >= kMaxPlans) plan_cache().clear();
  return plan_cache().emplace(key, std::move(plan)).first->second;
}

Tensor run_redistribute(const Tensor& local, const RedistributePlan& plan) {
  Tensor x = local;
  for (const RedistributeStep& s : plan.steps) x = run_step(x, s);
  return x;
}

Tensor redistribute(const Tensor& t, ArrayRef<Placement> placements) {
  const DTensorSpec* from = spec_of(t);
  const DTensorSpec* to = with_placements(*from, placements, "redistribute");
  if (to == from) return t;
  Tensor out =
      make_dtensor(run_redistribute(sharded_meta(t).local, *plan_redistribute(*from, *to)), to);
  if (records_grad(t)) record_redistribute(t, out);  // Note [Gradients of DTensors]
  return out;
}

size_t redistribute_plan_cache_size() {
  std::shared_lock<std::shared_mutex> lock(g_plan_mu);
  return plan_cache().size();
}

}  // namespace kiln::dtensor

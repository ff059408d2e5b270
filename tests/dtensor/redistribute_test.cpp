// kiln/dtensor's redistribute: every transition, even and uneven, on a 1-D mesh over the world
// and on a 2-D mesh, on CPU and sim tensors. Each source DTensor holds
// values that depend on the rank (Partial terms differ per rank but reduce to the global
// tensor); full_tensor() and the local shards are compared bitwise with the unsharded tensor.
#include <fmt/ranges.h>

#include "tests/dtensor/dtensor_test_util.h"

namespace kiln::test {
namespace {

using dt::Partial;
using dt::Placement;
using dt::Replicate;
using dt::Shard;
using R = dist::ReduceOp;

const std::vector<Placement>& one_dim_placements() {
  static const std::vector<Placement> ps = {Shard(0),        Shard(1),        Replicate(),
                                            Partial(R::Sum), Partial(R::Avg), Partial(R::Max),
                                            Partial(R::Min)};
  return ps;
}

// A source DTensor of `g` with placements `ps`. On a 1-D mesh a Partial's terms are made to
// differ per rank and still reduce to `g` exactly (small integers): sum: coordinate 0 holds
// g - (k-1)*q and the others q; avg: g + c - (k-1)/2; max: g - c; min: g + c.
Tensor make_source(const Tensor& g, const dt::DeviceMesh& mesh, const dt::Placements& ps) {
  Tensor d = dt::distribute_tensor(g, mesh, ps);
  if (mesh.ndim() != 1 || !ps[0].is_partial()) return d;
  const int64_t k = mesh.size(0), c = mesh.coordinate(0);
  Tensor local = dt::distribute_tensor(g, mesh, {Replicate()});
  local = dt::to_local(local);
  Tensor term;
  switch (ps[0].reduce_op()) {
    case R::Sum: {
      Tensor q = add(zeros_like(local), 7 + c);
      Tensor qsum = zeros_like(local);
      for (int64_t r = 1; r < k; ++r) qsum = add(qsum, 7 + r);
      term = c == 0 ? sub(local, qsum) : q;
      break;
    }
    case R::Avg:
      term = add(local, static_cast<double>(c) - static_cast<double>(k - 1) / 2);
      break;
    case R::Max:
      term = sub(local, c);
      break;
    default:
      term = add(local, c);
      break;
  }
  return dt::from_local(term, mesh, ps, false, g.sizes());
}

void check_transition(const Tensor& g, const dt::DeviceMesh& mesh, const dt::Placements& from,
                      const dt::Placements& to) {
  SCOPED_TRACE(label(mesh, from, to, g.sizes()));
  Tensor src = make_source(g, mesh, from);
  Tensor out = dt::redistribute(src, to);
  const dt::DTensorSpec* spec = dt::spec_of(out);
  EXPECT_EQ(spec->placements(), ArrayRef<Placement>(to));
  EXPECT_EQ(vec(out.sizes()), vec(g.sizes()));
  EXPECT_EQ(vec(dt::to_local(out).sizes()), vec(spec->local_shape()));
  if (!spec->has_partial()) {
    EXPECT_TRUE(bitwise_equal(dt::to_local(out), expected_local(g, *spec)));
  }
  EXPECT_TRUE(bitwise_equal(dt::full_tensor(out), g));
}

class Redistribute : public ::testing::TestWithParam<std::string> {
 protected:
  Device device() const { return device_named(GetParam()); }
};

// Every pair of placements on a 1-D mesh over the world, at an even and at uneven shapes
// (with 3 ranks: [5, 4] is 2, 2, 1 by 2, 2, 0 and [2, 7] leaves rank 2 an empty shard of dim 0).
TEST_P(Redistribute, EveryTransitionOnOneDim) {
  const dt::DeviceMesh& mesh = mesh_1d(device());
  const int64_t k = mesh.size();
  for (Shape shape : {Shape{2 * k, 3 * k}, Shape{5, 4}, Shape{2, 7}}) {
    Tensor g = global_tensor(shape, kFloat32, device());
    for (Placement a : one_dim_placements())
      for (Placement b : one_dim_placements()) check_transition(g, mesh, {a}, {b});
  }
}

TEST_P(Redistribute, IntegersAndThreeDims) {
  const dt::DeviceMesh& mesh = mesh_1d(device());
  Tensor g = global_tensor({3, 5, 2}, kInt64, device());
  const std::vector<Placement> ps = {Shard(0),        Shard(1),        Shard(2),       Replicate(),
                                     Partial(R::Sum), Partial(R::Max), Partial(R::Min)};
  for (Placement a : ps)
    for (Placement b : ps) check_transition(g, mesh, {a}, {b});
}

// Every pair of 2-D placements from {S(0), S(1), R, P(sum), P(max)} on the 2-D mesh ([2, 2]
// with 4 ranks), which includes the nested cases (two mesh dims sharding one tensor dim) and
// both mesh dims changing in one call; a few avg pairs beside them.
TEST_P(Redistribute, EveryPairOnTwoDims) {
  const dt::DeviceMesh& mesh = mesh_2d(device());
  const std::vector<Placement> ps = {Shard(0), Shard(1), Replicate(), Partial(R::Sum),
                                     Partial(R::Max)};
  std::vector<dt::Placements> all;
  for (Placement a : ps)
    for (Placement b : ps) all.push_back({a, b});
  std::vector<std::pair<dt::Placements, dt::Placements>> pairs = {
      {{Partial(R::Avg), Shard(1)}, {Replicate(), Partial(R::Avg)}},
      {{Shard(0), Partial(R::Avg)}, {Partial(R::Avg), Shard(0)}},
      {{Partial(R::Min), Shard(0)}, {Shard(0), Partial(R::Min)}},
  };
  for (const auto& a : all)
    for (const auto& b : all) pairs.push_back({a, b});
  for (Shape shape : {Shape{4, 4}, Shape{7, 5}}) {
    Tensor g = global_tensor(shape, kFloat32, device());
    for (const auto& [a, b] : pairs) check_transition(g, mesh, a, b);
  }
}

INSTANTIATE_TEST_SUITE_P(Devices, Redistribute, ::testing::ValuesIn(device_names()),
                         [](const auto& info) { return info.param; });

// ---------------------------------------------------------------- plans

std::vector<std::string> step_names(const dt::RedistributePlan& p) {
  std::vector<std::string> s;
  for (const auto& st : p.steps)
    s.push_back(fmt::format("{}@{}", dt::step_kind_name(st.kind), st.mesh_dim));
  return s;
}

TEST(RedistributePlan, OneCollectivePerTransitionAndCached) {
  const dt::DeviceMesh& m = mesh_1d(Device(kCPU));
  auto spec = [&](Placement p) { return dt::intern_spec(m, {p}, {4, 6}, {6, 1}, kFloat32); };
  auto plan = [&](Placement a, Placement b) {
    return step_names(*dt::plan_redistribute(*spec(a), *spec(b)));
  };
  using V = std::vector<std::string>;
  EXPECT_EQ(plan(Shard(0), Replicate()), V{"all_gather@0"});
  EXPECT_EQ(plan(Partial(), Replicate()), V{"all_reduce@0"});
  EXPECT_EQ(plan(Partial(), Shard(1)), V{"reduce_scatter@0"});
  EXPECT_EQ(plan(Replicate(), Shard(1)), V{"local_chunk@0"});
  EXPECT_EQ(plan(Shard(0), Shard(1)), V{"all_to_all@0"});
  EXPECT_EQ(plan(Replicate(), Partial(R::Max)), V{"local_partial@0"});
  EXPECT_EQ(plan(Shard(0), Partial()), (V{"all_gather@0", "local_partial@0"}));
  EXPECT_EQ(plan(Shard(0), Shard(0)), V{});
  auto p1 = dt::plan_redistribute(*spec(Shard(0)), *spec(Replicate()));
  EXPECT_EQ(p1, dt::plan_redistribute(*spec(Shard(0)), *spec(Replicate())));
  EXPECT_EQ(p1->from, spec(Shard(0)));
  EXPECT_EQ(p1->steps[0].before, spec(Shard(0)));
  EXPECT_EQ(p1->steps[0].after, spec(Replicate()));
  EXPECT_GE(dt::redistribute_plan_cache_size(), 1u);
}

TEST(RedistributePlan, NestedShardsAreTakenApartInnerFirst) {
  const dt::DeviceMesh& m = mesh_2d(Device(kCPU));
  auto spec = [&](dt::Placements p) { return dt::intern_spec(m, p, {8, 8}, {8, 1}, kFloat32); };
  auto plan = [&](dt::Placements a, dt::Placements b) {
    return step_names(*dt::plan_redistribute(*spec(a), *spec(b)));
  };
  using V = std::vector<std::string>;
  // Mesh dim 0's shard of dim 0 holds mesh dim 1's inside it: 1 goes first and comes back.
  EXPECT_EQ(plan({Shard(0), Shard(0)}, {Replicate(), Shard(0)}),
            (V{"all_gather@1", "all_gather@0", "local_chunk@1"}));
  EXPECT_EQ(plan({Shard(0), Shard(1)}, {Replicate(), Replicate()}),
            (V{"all_gather@1", "all_gather@0"}));
  EXPECT_EQ(plan({Partial(), Partial()}, {Shard(0), Shard(1)}),
            (V{"reduce_scatter@1", "reduce_scatter@0"}));
  // Both mesh dims end on tensor dim 0: the outer one may not go straight there.
  EXPECT_EQ(plan({Partial(), Partial()}, {Shard(0), Shard(0)}),
            (V{"all_reduce@1", "reduce_scatter@0", "local_chunk@1"}));
  EXPECT_THROW_PREFIX(
      dt::plan_redistribute(*spec({Shard(0), Shard(0)}),
                            *dt::intern_spec(m, {Shard(0), Shard(0)}, {8, 4}, {4, 1}, kFloat32)),
      ValueError, "[redistribute] from Spec([S(0), S(0)], [8, 8]");
}

}  // namespace
}  // namespace kiln::test

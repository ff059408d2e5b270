// Random DTensors (kiln/dtensor/factories.h: dtensor::rand, randn, randint; rand_like and
// randn_like of a DTensor): for every factory, dtype and placement, on 1-D and 2-D meshes, the
// full tensor is bitwise the unsharded call's from a generator of the same seed, and the
// generator ends where the unsharded call leaves it; shapes whose shards start inside a Philox
// block; the default generator (the CPU's, and the sim device's own, drawn whole); later
// replicated draws agree across ranks; compiled equals eager; errors before any draw. On CPU and
// sim; a world of one, 2, 3 (uneven and empty shards) and 4 ranks (a 2x2 mesh).
#include <gtest/gtest.h>

#include <functional>

#include "kiln/compile/compile.h"
#include "kiln/core/generator.h"
#include "kiln/dtensor/factories.h"
#include "tests/dtensor/dtensor_test_util.h"

namespace kiln::test {
namespace {

using dt::Partial;
using dt::Placement;
using dt::Replicate;
using dt::Shard;

struct Factory {
  std::string name;
  std::function<Tensor(IntArrayRef, Generator*, Device)> whole;
  std::function<Tensor(IntArrayRef, const dt::DeviceMesh&, ArrayRef<Placement>, Generator*)>
      sharded;
};

// Every factory in the dtypes whose kernels lay values differently on Philox blocks: 4, 2 or 1
// per block (Note [Philox layout] in kiln/core/generator.h).
std::vector<Factory> factories() {
  std::vector<Factory> f;
  for (DType t : {kFloat32, kFloat64, kBFloat16}) {
    f.push_back({fmt::format("rand {}", t),
                 [t](IntArrayRef s, Generator* g, Device d) { return rand(s, g, t, d); },
                 [t](IntArrayRef s, const dt::DeviceMesh& m, ArrayRef<Placement> p, Generator* g) {
                   return dt::rand(s, m, p, g, t);
                 }});
    f.push_back({fmt::format("randn {}", t),
                 [t](IntArrayRef s, Generator* g, Device d) { return randn(s, g, t, d); },
                 [t](IntArrayRef s, const dt::DeviceMesh& m, ArrayRef<Placement> p, Generator* g) {
                   return dt::randn(s, m, p, g, t);
                 }});
  }
  for (DType t : {kInt64, kInt32})
    f.push_back(
        {fmt::format("randint {}", t),
         [t](IntArrayRef s, Generator* g, Device d) { return randint(-5, 1000, s, g, t, d); },
         [t](IntArrayRef s, const dt::DeviceMesh& m, ArrayRef<Placement> p, Generator* g) {
           return dt::randint(-5, 1000, s, m, p, g, t);
         }});
  return f;
}

// Odd sizes: on 2 and 3 ranks most shards start inside a Philox block (row 3 of [5, 3] is
// element 9), and [2, 5] has empty shards along dim 0 at 3 ranks.
const std::vector<Shape>& shapes() {
  static const std::vector<Shape> s{{5, 3}, {3, 7}, {2, 3, 5}, {7}, {2, 5}, {0, 4}};
  return s;
}

class RandomDTensor : public ::testing::TestWithParam<std::string> {
 protected:
  Device dev() const { return device_named(GetParam()); }
};
INSTANTIATE_TEST_SUITE_P(Devices, RandomDTensor, ::testing::ValuesIn(device_names()),
                         [](const auto& info) { return info.param; });

// Draws with `sharded` and the unsharded call from generators of one seed: the full tensor is
// bitwise the unsharded one, the local tensor has the spec's local shape, and the next draws of
// both generators agree (the offsets match).
void check(const Factory& f, const dt::DeviceMesh& mesh, IntArrayRef shape,
           const std::vector<Placement>& ps, uint64_t seed) {
  const std::string label =
      fmt::format("{} [{}] {}", f.name, fmt::join(shape, ", "), dt::placements_str(ps));
  const Device d = mesh.device();
  Generator a(seed), b(seed);
  a.set_offset(seed % 5), b.set_offset(seed % 5);
  Tensor want = f.whole(shape, &a, d);
  Tensor got = f.sharded(shape, mesh, ps, &b);
  ASSERT_TRUE(dt::is_dtensor(got)) << label;
  EXPECT_EQ(dt::to_local(got).sizes(), dt::spec_of(got)->local_shape()) << label;
  EXPECT_TRUE(bitwise_equal(dt::full_tensor(got), want)) << label;
  EXPECT_EQ(b.offset(), a.offset()) << label;
  EXPECT_TRUE(bitwise_equal(rand({5}, &b, kFloat32, d), rand({5}, &a, kFloat32, d))) << label;
}

TEST_P(RandomDTensor, ShardsHoldTheUnshardedValuesOnOneDim) {
  const dt::DeviceMesh& mesh = mesh_1d(dev());
  uint64_t seed = 1;
  for (const Factory& f : factories())
    for (const Shape& s : shapes())
      for (const Placement& p : placements_of_rank(static_cast<int64_t>(s.size()), false))
        check(f, mesh, s, {p}, seed++);
}

// Nested shards (two mesh dims splitting one tensor dim) included; a real 2x2 mesh at 4 ranks.
TEST_P(RandomDTensor, ShardsHoldTheUnshardedValuesOnTwoDims) {
  const dt::DeviceMesh& mesh = mesh_2d(dev());
  const std::vector<Placement> ps = placements_of_rank(2, false);
  uint64_t seed = 100;
  for (const Factory& f : factories())
    for (const Placement& p : ps)
      for (const Placement& q : ps) check(f, mesh, {5, 7}, {p, q}, seed++);
}

// Without a generator: the default one of the mesh's device. The CPU's is drawn at the shard's
// positions; the sim device's lives on the device, so each rank draws the whole and keeps its
// shard; either way the values and the next draws are the unsharded call's.
TEST_P(RandomDTensor, DefaultGeneratorGivesTheUnshardedValues) {
  const Device d = dev();
  const dt::DeviceMesh& mesh = mesh_1d(d);
  for (const Placement& p : {Placement(Shard(0)), Placement(Shard(1)), Placement(Replicate())}) {
    manual_seed(21);
    Tensor want = randn({5, 3}, nullptr, kFloat32, d);
    Tensor want_next = rand({3}, nullptr, kFloat32, d);
    manual_seed(21);
    Tensor got = dt::randn({5, 3}, mesh, {p});
    EXPECT_TRUE(bitwise_equal(dt::full_tensor(got), want)) << p.str();
    EXPECT_TRUE(bitwise_equal(rand({3}, nullptr, kFloat32, d), want_next)) << p.str();
  }
}

// Every rank's generator advances by the global draw, so a replicated draw after a sharded one
// is the same on every rank (and a rank-dependent advance would show here at 2+ ranks).
TEST_P(RandomDTensor, LaterReplicatedDrawsAgreeAcrossRanks) {
  const dt::DeviceMesh& mesh = mesh_1d(dev());
  Generator g(33);
  (void)dt::rand({5, 3}, mesh, {Shard(0)}, &g);
  (void)dt::randn({3, 7}, mesh, {Shard(1)}, &g);
  (void)dt::randint(0, 9, {2, 5}, mesh, {Shard(0)}, &g);
  Tensor r = rand({16}, &g, kFloat32, dev());
  EXPECT_TRUE(same_on_every_rank(r, &mesh.group(0)));
  Generator h(33);
  (void)rand({5, 3}, &h);
  (void)randn({3, 7}, &h);
  (void)randint(0, 9, {2, 5}, &h);
  EXPECT_TRUE(bitwise_equal(r, rand({16}, &h, kFloat32, dev())));
  EXPECT_EQ(g.offset(), h.offset());
}

// rand_like and randn_like of a DTensor: a DTensor with its spec (Partial read as Replicate,
// as full_like does) holding the unsharded draw.
TEST_P(RandomDTensor, LikeFactoriesOfDTensors) {
  const Device d = dev();
  const dt::DeviceMesh& mesh = mesh_1d(d);
  for (DType t : {kFloat32, kFloat64}) {
    Tensor x = global_tensor({5, 3}, t, d);
    for (const Placement& p :
         {Placement(Shard(0)), Placement(Shard(1)), Placement(Replicate()), Placement(Partial())}) {
      const std::string label = fmt::format("{} {}", t, p.str());
      Tensor s = dt::distribute_tensor(x, mesh, {p});
      const Placement want_p = p.is_partial() ? Placement(Replicate()) : p;
      Generator a(5), b(5);
      Tensor u = rand_like(s, &b);
      ASSERT_TRUE(dt::is_dtensor(u)) << label;
      EXPECT_EQ(dt::spec_of(u)->placements()[0], want_p) << label;
      EXPECT_TRUE(bitwise_equal(dt::full_tensor(u), rand_like(x, &a))) << label;
      Tensor n = randn_like(s, &b);
      EXPECT_EQ(dt::spec_of(n)->placements()[0], want_p) << label;
      EXPECT_TRUE(bitwise_equal(dt::full_tensor(n), randn_like(x, &a))) << label;
      EXPECT_EQ(b.offset(), a.offset()) << label;
    }
  }
}

// Inside a compiled function the trace records the whole draw (a generator of a shard's own
// would be kept by the trace), so each replay draws the next values of the default generator,
// as the unsharded function would.
TEST_P(RandomDTensor, CompiledDrawsEqualEager) {
  const Device d = dev();
  const dt::DeviceMesh& mesh = mesh_1d(d);
  Tensor x = global_tensor({5, 3}, kFloat32, d);
  manual_seed(4);
  TensorList want;
  for (int call = 0; call < 3; ++call) want.push_back(add(x, randn({5, 3}, nullptr, kFloat32, d)));
  auto f = compile(
      [&](std::span<const Tensor> in) -> TensorList {
        return {add(in[0], dt::randn({5, 3}, mesh, {Shard(1)}))};
      },
      {.name = "random_dtensor_fn"});
  manual_seed(4);
  for (int call = 0; call < 3; ++call) {
    TensorList got = f({dt::distribute_tensor(x, mesh, {Shard(1)})});
    EXPECT_TRUE(bitwise_equal(dt::full_tensor(got[0]), want[call])) << "call " << call;
  }
  EXPECT_EQ(f.entries().size(), 1u) << f.explain();
}

// Errors name the call and the values, and come before any draw: the generator stays put.
TEST_P(RandomDTensor, Errors) {
  const Device d = dev();
  const dt::DeviceMesh& mesh = mesh_1d(d);
  Generator g(1);
  EXPECT_THROW_PREFIX(dt::rand({4}, mesh, {Partial()}, &g), ValueError,
                      "[dtensor::rand] a random tensor cannot be Partial ([P(sum)])");
  EXPECT_THROW_PREFIX(dt::randn({4}, mesh, {Partial(dt::ReduceOp::Max)}, &g), ValueError,
                      "[dtensor::randn] a random tensor cannot be Partial ([P(max)])");
  EXPECT_THROW_PREFIX(dt::randint(0, 3, {4}, mesh, {Partial()}, &g), ValueError,
                      "[dtensor::randint] a random tensor cannot be Partial");
  EXPECT_THROW_PREFIX(dt::rand({4}, mesh, {Shard(0)}, &g, kInt64), TypeError,
                      "[dtensor::rand] expected a floating-point dtype, got int64");
  EXPECT_THROW_PREFIX(dt::randint(3, 3, {4}, mesh, {Shard(0)}, &g), ValueError,
                      "[dtensor::randint] expected low < high, but got low=3 and high=3");
  EXPECT_THROW_PREFIX(dt::randn({4}, mesh, {Shard(1)}, &g), IndexError,
                      "[dtensor::randn] placement S(1) in [S(1)] is out of range");
  EXPECT_THROW_PREFIX(dt::rand({-1, 2}, mesh, {Shard(0)}, &g), ValueError,
                      "[dtensor::rand] negative dimension in size [-1, 2]");
  Tensor ints = dt::distribute_tensor(global_tensor({4}, kInt64, d), mesh, {Shard(0)});
  EXPECT_THROW_PREFIX(rand_like(ints, &g), TypeError,
                      "[rand_like] expected a floating-point dtype, got int64");
  EXPECT_EQ(g.offset(), 0u);
}

}  // namespace
}  // namespace kiln::test

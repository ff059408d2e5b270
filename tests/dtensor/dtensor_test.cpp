// kiln/dtensor: meshes, placements, interned specs and the DTensor object (tests/dtensor). Run
// as a world of one and under scripts/mpirun.sh 2, 3 and 4; every rank runs every test.
#include <fmt/ranges.h>

#include <atomic>
#include <cstdlib>
#include <set>
#include <thread>

#include "kiln/dispatch/op.h"
#include "tests/dtensor/dtensor_test_util.h"

namespace kiln::test {
namespace {

using dt::Partial;
using dt::Placement;
using dt::Replicate;
using dt::Shard;
using R = dist::ReduceOp;

// ---------------------------------------------------------------- placements

TEST(DTensorPlacement, PrintsAndCompares) {
  EXPECT_EQ(Placement(Shard(0)).str(), "S(0)");
  EXPECT_EQ(Placement(Replicate()).str(), "R");
  EXPECT_EQ(Placement(Partial()).str(), "P(sum)");
  EXPECT_EQ(Placement(Partial(R::Max)).str(), "P(max)");
  EXPECT_EQ(dt::placements_str({Shard(1), Replicate(), Partial(R::Avg)}), "[S(1), R, P(avg)]");
  EXPECT_EQ(Placement(Shard(1)), Placement(Shard(1)));
  EXPECT_FALSE(Placement(Shard(1)) == Placement(Shard(0)));
  EXPECT_FALSE(Placement(Partial(R::Sum)) == Placement(Partial(R::Min)));
  EXPECT_FALSE(Placement(Replicate()) == Placement(Partial()));
}

TEST(DTensorPlacement, ChunkRule) {
  // chunk's rule: ceil-sized pieces, the last ones smaller or empty.
  std::vector<int64_t> lens, offs;
  for (int64_t i = 0; i < 4; ++i) {
    lens.push_back(dt::chunk_length(5, 4, i));
    offs.push_back(dt::chunk_offset(5, 4, i));
  }
  EXPECT_EQ(lens, (std::vector<int64_t>{2, 2, 1, 0}));
  EXPECT_EQ(offs, (std::vector<int64_t>{0, 2, 4, 5}));
  EXPECT_EQ(dt::chunk_length(2, 3, 2), 0);
  EXPECT_EQ(dt::chunk_length(0, 3, 0), 0);
}

// ---------------------------------------------------------------- meshes

TEST(DeviceMesh, OneDimOverTheWorld) {
  const dt::DeviceMesh& m = mesh_1d(Device(kCPU));
  EXPECT_EQ(m.ndim(), 1);
  EXPECT_EQ(m.size(), dist::world_size());
  EXPECT_EQ(m.coordinate(0), dist::rank());
  EXPECT_EQ(m.group(0).size(), dist::world_size());
  EXPECT_EQ(m.group(0).rank(), dist::rank());
  EXPECT_EQ(m.dim_index("x"), 0);
  EXPECT_EQ(m.device(), Device(kCPU));
  EXPECT_THROW_PREFIX(m.dim_index("y"), ValueError, "[DeviceMesh] no mesh dim is named 'y'");
  EXPECT_THROW_PREFIX(m.group(1), IndexError, "[DeviceMesh.group] mesh dim 1 is out of range");
}

TEST(DeviceMesh, TwoDimGroupsAndSubmeshes) {
  const dt::DeviceMesh& m = mesh_2d(Device(kCPU));
  const int me = dist::rank();
  const int64_t cols = m.shape()[1];
  ASSERT_EQ(m.ndim(), 2);
  EXPECT_EQ(m.coordinate(0), me / cols);
  EXPECT_EQ(m.coordinate(1), me % cols);
  EXPECT_EQ(m.world_rank_at(m.coordinate()), me);
  // Group along dim 1: my row; along dim 0: my column; group rank = coordinate.
  std::vector<int> row, col;
  for (int64_t c = 0; c < cols; ++c) row.push_back(static_cast<int>((me / cols) * cols + c));
  for (int64_t r = 0; r < m.shape()[0]; ++r) col.push_back(static_cast<int>(r * cols + me % cols));
  EXPECT_EQ(m.group(1).world_ranks(), row);
  EXPECT_EQ(m.group(0).world_ranks(), col);
  EXPECT_EQ(m.group(0).rank(), m.coordinate(0));

  const dt::DeviceMesh& tp = m.submesh({"tp"});
  EXPECT_EQ(&tp, &m.submesh({"tp"}));  // made once
  EXPECT_EQ(tp.ndim(), 1);
  EXPECT_EQ(tp.ranks(), row);
  EXPECT_EQ(&tp.group(0), &m.group(1));
  EXPECT_EQ(tp.coordinate(0), m.coordinate(1));
  const dt::DeviceMesh& swapped = m.submesh({"tp", "dp"});
  EXPECT_EQ(vec(swapped.shape()), (std::vector<int64_t>{cols, m.shape()[0]}));
  EXPECT_EQ(&swapped.group(0), &m.group(1));
  EXPECT_THROW_PREFIX(m.submesh({"tp", "tp"}), ValueError,
                      "[DeviceMesh.submesh] dim 'tp' is named twice");
  EXPECT_THROW_PREFIX(m.submesh({"pp"}), ValueError, "[DeviceMesh] no mesh dim is named 'pp'");
}

TEST(DeviceMesh, BadShapesAndNames) {
  const int n = dist::world_size();
  EXPECT_THROW_PREFIX(dt::init_device_mesh(Device(kCPU), {n + 1}), ValueError,
                      fmt::format("[init_device_mesh] mesh shape [{}] holds {} ranks but the "
                                  "world has {}",
                                  n + 1, n + 1, n));
  EXPECT_THROW_PREFIX(dt::init_device_mesh(Device(kCPU), {n, 0}), ValueError,
                      "[init_device_mesh] mesh shape");
  EXPECT_THROW_PREFIX(dt::init_device_mesh(Device(kCPU), {}), ValueError,
                      "[init_device_mesh] the mesh shape is empty");
  EXPECT_THROW_PREFIX(dt::init_device_mesh(Device(kCPU), {n, 1}, {"a"}), ValueError,
                      "[init_device_mesh] 1 dim names [a] for a 2-d mesh");
  EXPECT_THROW_PREFIX(dt::init_device_mesh(Device(kCPU), {n, 1}, {"a", "a"}), ValueError,
                      "[init_device_mesh] dim name 'a' is used twice");
}

// ---------------------------------------------------------------- specs

TEST(DTensorSpec, InternedOncePerDistinctSpec) {
  const dt::DeviceMesh& m = mesh_1d(Device(kCPU));
  const dt::DeviceMesh& m2 = mesh_2d(Device(kCPU));
  auto spec = [&](const dt::DeviceMesh& mesh, std::vector<Placement> p, Shape shape,
                  DType t = kFloat32) {
    return dt::intern_spec(mesh, p, shape, contiguous_strides(shape), t);
  };
  const dt::DTensorSpec* a = spec(m, {Shard(0)}, {4, 6});
  EXPECT_EQ(a, spec(m, {Shard(0)}, {4, 6}));
  EXPECT_EQ(spec(m, {Shard(1)}, {4, 6}), spec(m, {Shard(-1)}, {4, 6}));  // normalised
  EXPECT_EQ(spec(m, {Shard(-1)}, {4, 6})->placement(0), Placement(Shard(1)));
  EXPECT_NE(a, spec(m, {Shard(1)}, {4, 6}));
  EXPECT_NE(a, spec(m, {Replicate()}, {4, 6}));
  EXPECT_NE(a, spec(m, {Shard(0)}, {6, 4}));
  EXPECT_NE(a, spec(m, {Shard(0)}, {4, 6}, kFloat64));
  EXPECT_NE(spec(m, {Partial(R::Sum)}, {4}), spec(m, {Partial(R::Max)}, {4}));
  EXPECT_NE(a, spec(m2, {Shard(0), Replicate()}, {4, 6}));
  EXPECT_NE(a, dt::intern_spec(m, {Shard(0)}, {4, 6}, {1, 4}, kFloat32));
  EXPECT_NE(a->id(), spec(m, {Shard(1)}, {4, 6})->id());
  // A lookup of an existing spec adds nothing.
  const size_t count = dt::interned_spec_count();
  for (int i = 0; i < 100; ++i) EXPECT_EQ(a, spec(m, {Shard(0)}, {4, 6}));
  EXPECT_EQ(dt::interned_spec_count(), count);
  if (!std::getenv("KILN_DTENSOR_MAX_SPECS")) {
    EXPECT_EQ(dt::max_specs(), 65536u);
  }
  EXPECT_EQ(a->str(), fmt::format("Spec([S(0)], [4, 6], float32, {})", m.str()));
}

TEST(DTensorSpec, ConcurrentInterningAgrees) {
  const dt::DeviceMesh& m = mesh_1d(Device(kCPU));
  constexpr int kThreads = 4, kShapes = 200;
  std::vector<std::vector<const dt::DTensorSpec*>> got(kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t)
    threads.emplace_back([&, t] {
      for (int i = 0; i < kShapes; ++i) {
        Shape shape{1000 + i, 3};
        got[t].push_back(
            dt::intern_spec(m, {Shard(0)}, shape, contiguous_strides(shape), kFloat16));
      }
    });
  for (auto& th : threads) th.join();
  for (int t = 1; t < kThreads; ++t) EXPECT_EQ(got[t], got[0]);
  std::set<const dt::DTensorSpec*> distinct(got[0].begin(), got[0].end());
  EXPECT_EQ(distinct.size(), static_cast<size_t>(kShapes));
}

// Run by kiln_dtensor_test.spec_bound with KILN_DTENSOR_MAX_SPECS=64 (skipped at the default
// bound: filling the table would leave no room for the other tests of the process).
TEST(DTensorSpec, FullTableRaisesAndKeepsItsSpecs) {
  if (dt::max_specs() > 1000) GTEST_SKIP() << "run with KILN_DTENSOR_MAX_SPECS=64";
  const dt::DeviceMesh& m = mesh_1d(Device(kCPU));
  std::vector<const dt::DTensorSpec*> made;
  for (int64_t i = 0; dt::interned_spec_count() < dt::max_specs(); ++i)
    made.push_back(dt::intern_spec(m, {Replicate()}, {i}, {1}, kFloat32));
  EXPECT_THROW_PREFIX(dt::intern_spec(m, {Replicate()}, {-1 + 100000}, {1}, kFloat32), ValueError,
                      fmt::format("[DTensorSpec] the DTensor spec table is full ({} specs, "
                                  "KILN_DTENSOR_MAX_SPECS)",
                                  dt::max_specs()));
  // Existing specs are still found, and are the same objects.
  for (size_t i = 0; i < made.size(); ++i)
    EXPECT_EQ(dt::intern_spec(m, {Replicate()}, {static_cast<int64_t>(i)}, {1}, kFloat32), made[i]);
}

TEST(DTensorSpec, LocalShapesFollowChunkAndNest) {
  const dt::DeviceMesh& m = mesh_1d(Device(kCPU));
  const int64_t k = m.size(), me = m.coordinate(0);
  const dt::DTensorSpec* s = dt::intern_spec(m, {Shard(0)}, {5, 3}, {3, 1}, kFloat32);
  EXPECT_EQ(vec(s->local_shape()), (std::vector<int64_t>{dt::chunk_length(5, k, me), 3}));
  EXPECT_EQ(vec(s->local_offset()), (std::vector<int64_t>{dt::chunk_offset(5, k, me), 0}));
  EXPECT_EQ(s->is_even(), 5 % k == 0);
  EXPECT_FALSE(s->has_partial());
  const dt::DTensorSpec* p = dt::intern_spec(m, {Partial()}, {5, 3}, {3, 1}, kFloat32);
  EXPECT_TRUE(p->has_partial());
  EXPECT_FALSE(p->is_replicated());
  EXPECT_EQ(vec(p->local_shape()), (std::vector<int64_t>{5, 3}));

  // Nested: two mesh dims shard tensor dim 0; the second splits the first's chunk.
  const dt::DeviceMesh& m2 = mesh_2d(Device(kCPU));
  const dt::DTensorSpec* n = dt::intern_spec(m2, {Shard(0), Shard(0)}, {7}, {1}, kFloat32);
  const int64_t a = m2.shape()[0], b = m2.shape()[1];
  const int64_t outer = dt::chunk_length(7, a, m2.coordinate(0));
  EXPECT_EQ(n->local_shape()[0], dt::chunk_length(outer, b, m2.coordinate(1)));
  EXPECT_EQ(n->local_offset()[0], dt::chunk_offset(7, a, m2.coordinate(0)) +
                                      dt::chunk_offset(outer, b, m2.coordinate(1)));
  if (a == 2 && b == 2) {  // 7 -> [4, 3] -> [2, 2 | 2, 1]
    EXPECT_EQ(n->local_shape_at(Shape{1, 1})[0], 1);
    EXPECT_EQ(n->local_shape_at(Shape{0, 1})[0], 2);
  }
}

TEST(DTensorSpec, BadPlacementsRaise) {
  const dt::DeviceMesh& m = mesh_1d(Device(kCPU));
  EXPECT_THROW_PREFIX(dt::intern_spec(m, {Shard(2)}, {4, 6}, {6, 1}, kFloat32), IndexError,
                      "[DTensorSpec] placement S(2) in [S(2)] is out of range for a 2-d tensor");
  EXPECT_THROW_PREFIX(dt::intern_spec(m, {Shard(-3)}, {4, 6}, {6, 1}, kFloat32), IndexError,
                      "[DTensorSpec] placement S(-3)");
  EXPECT_THROW_PREFIX(dt::intern_spec(m, {Shard(0), Replicate()}, {4, 6}, {6, 1}, kFloat32),
                      ValueError, "[DTensorSpec] 2 placements [S(0), R] for a 1-d mesh");
  EXPECT_THROW_PREFIX(dt::intern_spec(m, {Partial(R::Product)}, {4}, {1}, kFloat32), ValueError,
                      "[DTensorSpec] Partial(product) is not a placement");
  EXPECT_THROW_PREFIX(dt::intern_spec(m, {Partial(R::Avg)}, {4}, {1}, kInt64), ValueError,
                      "[DTensorSpec] Partial(avg) needs a floating dtype, got int64");
  EXPECT_THROW_PREFIX(dt::intern_spec(m, {Replicate()}, {4}, {1, 1}, kFloat32), ValueError,
                      "[DTensorSpec] 2 strides");
}

// ---------------------------------------------------------------- the DTensor object

class DTensorOnDevice : public ::testing::TestWithParam<std::string> {
 protected:
  Device device() const { return device_named(GetParam()); }
};

TEST_P(DTensorOnDevice, ImplCarriesGlobalShapeLocalAndSpec) {
  const dt::DeviceMesh& m = mesh_1d(device());
  Tensor g = global_tensor({5, 3}, kFloat32, device());
  Tensor d = dt::distribute_tensor(g, m, {Shard(0)});
  EXPECT_TRUE(dt::is_dtensor(d));
  EXPECT_FALSE(dt::is_dtensor(g));
  EXPECT_TRUE(d.key_set().has(DispatchKey::Sharded));
  EXPECT_EQ(d.key_set().highest(), DispatchKey::Sharded);
  EXPECT_EQ(vec(d.sizes()), (std::vector<int64_t>{5, 3}));
  EXPECT_EQ(d.dtype(), kFloat32);
  EXPECT_EQ(d.device(), device());
  const dt::DTensorSpec* s = dt::spec_of(d);
  EXPECT_EQ(s, dt::intern_spec(m, {Shard(0)}, {5, 3}, {3, 1}, kFloat32));
  EXPECT_EQ(dt::sharded_meta(d).local.impl(), dt::to_local(d).impl());  // the shard itself
  EXPECT_EQ(dt::sharded_meta(d).spec, s);
  EXPECT_TRUE(bitwise_equal(dt::to_local(d), expected_local(g, *s)));
  EXPECT_TRUE(bitwise_equal(dt::full_tensor(d), g));
}

TEST_P(DTensorOnDevice, DistributeThenFullTensorForEveryPlacement) {
  const dt::DeviceMesh& m = mesh_1d(device());
  const int me = dist::rank();
  for (Shape shape : {Shape{4, 6}, Shape{5, 3}, Shape{2, 7}}) {
    for (Placement p : {Placement(Shard(0)), Placement(Shard(1)), Placement(Replicate()),
                        Placement(Partial(R::Sum)), Placement(Partial(R::Avg)),
                        Placement(Partial(R::Max)), Placement(Partial(R::Min))}) {
      SCOPED_TRACE(fmt::format("{} shape [{}] on {}", p.str(), fmt::join(shape, ", "), device()));
      // Every rank passes its own values: rank 0's win.
      Tensor mine = global_tensor(shape, kFloat32, device(), 100 * me);
      Tensor rank0 = global_tensor(shape, kFloat32, device(), 0);
      Tensor d = dt::distribute_tensor(mine, m, {p});
      if (!p.is_partial()) {
        EXPECT_TRUE(bitwise_equal(dt::to_local(d), expected_local(rank0, *dt::spec_of(d))));
      }
      EXPECT_TRUE(bitwise_equal(dt::full_tensor(d), rank0));
      EXPECT_TRUE(bitwise_equal(mine, global_tensor(shape, kFloat32, device(), 100 * me)));
    }
  }
}

TEST_P(DTensorOnDevice, DistributeIntegersOnTwoDims) {
  const dt::DeviceMesh& m = mesh_2d(device());
  Tensor g = global_tensor({5, 4}, kInt64, device());
  for (auto ps : std::vector<dt::Placements>{{Shard(0), Shard(1)},
                                             {Shard(1), Shard(0)},
                                             {Shard(0), Shard(0)},
                                             {Replicate(), Shard(1)},
                                             {Partial(R::Sum), Shard(0)},
                                             {Partial(R::Max), Partial(R::Max)}}) {
    SCOPED_TRACE(dt::placements_str(ps));
    Tensor d = dt::distribute_tensor(g, m, ps);
    if (!dt::spec_of(d)->has_partial()) {
      EXPECT_TRUE(bitwise_equal(dt::to_local(d), expected_local(g, *dt::spec_of(d))));
    }
    EXPECT_TRUE(bitwise_equal(dt::full_tensor(d), g));
  }
}

TEST_P(DTensorOnDevice, FromLocalInfersEvenShapes) {
  const dt::DeviceMesh& m = mesh_1d(device());
  const int me = dist::rank(), n = dist::world_size();
  Tensor local = global_tensor({2, 3}, kFloat32, device(), 6 * me);
  Tensor d = dt::from_local(local, m, {Shard(0)}, /*run_check=*/true);
  EXPECT_EQ(vec(d.sizes()), (std::vector<int64_t>{2 * n, 3}));
  EXPECT_TRUE(dt::to_local(d).is_same(local));
  EXPECT_TRUE(bitwise_equal(dt::full_tensor(d), global_tensor({2 * n, 3}, kFloat32, device())));
  // Uneven: the global shape is given.
  Tensor u = dt::from_local(global_tensor({dt::chunk_length(5, n, me), 2}, kFloat32, device(),
                                          2 * dt::chunk_offset(5, n, me)),
                            m, {Shard(0)}, true, {5, 2});
  EXPECT_TRUE(bitwise_equal(dt::full_tensor(u), global_tensor({5, 2}, kFloat32, device())));
  // Partial(sum) from rank-dependent terms.
  Tensor p = dt::from_local(global_tensor({3}, kFloat32, device(), me), m, {Partial()}, true);
  Tensor want = zeros({3}, kFloat32, device());
  for (int r = 0; r < n; ++r) want = add(want, global_tensor({3}, kFloat32, device(), r));
  EXPECT_TRUE(bitwise_equal(dt::full_tensor(p), want));
}

TEST_P(DTensorOnDevice, FromLocalRunCheckNamesTheRanks) {
  const dt::DeviceMesh& m = mesh_1d(device());
  const int me = dist::rank(), n = dist::world_size(), last = n - 1;
  // The last rank's shard has the wrong shape: every rank raises the same error.
  Tensor local = zeros({me == last ? 3 : 2, 4}, kFloat32, device());
  EXPECT_THROW_CONTAINS(
      dt::from_local(local, m, {Shard(0)}, true, {2 * n, 4}), ValueError,
      fmt::format("rank {} has [3, 4] float32 where [2, 4] float32 is expected", last));
  // The last rank's dtype differs (so its own spec does too: each side names the other).
  if (n > 1) {
    Tensor typed = zeros({2}, me == last ? kFloat64 : kFloat32, device());
    EXPECT_THROW_CONTAINS(dt::from_local(typed, m, {Replicate()}, true, {2}), ValueError,
                          me == last
                              ? "rank 0 has [2] float32 where [2] float64 is expected"
                              : fmt::format("rank {} has [2] float64 where [2] float32", last));
  }
  // Replicate values differ on the last rank (in a world of one nothing can differ).
  Tensor values = global_tensor({4}, kFloat32, device(), me == last && n > 1 ? 1 : 0);
  if (n > 1) {
    EXPECT_THROW_CONTAINS(dt::from_local(values, m, {Replicate()}, true), ValueError,
                          fmt::format("[from_local] run_check: Replicate values disagree"));
    EXPECT_THROW_CONTAINS(dt::from_local(values, m, {Replicate()}, true), ValueError,
                          fmt::format("rank {} differs from rank 0 along mesh dim 0 ('x')", last));
    // Without run_check nothing is compared.
    EXPECT_NO_THROW(dt::from_local(values, m, {Replicate()}));
  } else {
    EXPECT_NO_THROW(dt::from_local(values, m, {Replicate()}, true));
  }
  // Without run_check this rank's own shape is still checked against an explicit shape.
  EXPECT_THROW_PREFIX(dt::from_local(zeros({7}, kFloat32, device()), m, {Replicate()}, false, {8}),
                      ValueError, "[make_dtensor] local shape [7] on rank");
}

TEST_P(DTensorOnDevice, BadInputRaises) {
  const dt::DeviceMesh& m = mesh_1d(device());
  Tensor g = global_tensor({4, 6}, kFloat32, device());
  EXPECT_THROW_PREFIX(dt::distribute_tensor(g, m, {Shard(2)}), IndexError,
                      "[distribute_tensor] placement S(2) in [S(2)] is out of range");
  EXPECT_THROW_PREFIX(dt::distribute_tensor(g, m, {Shard(0), Shard(1)}), ValueError,
                      "[distribute_tensor] 2 placements [S(0), S(1)] for a 1-d mesh");
  EXPECT_THROW_PREFIX(
      dt::distribute_tensor(g.to(device().is_cpu() ? sim() : Device(kCPU)), m, {Replicate()}),
      DeviceError, "[distribute_tensor] the tensor is on");
  if (dist::world_size() > 1) {  // every rank raises, naming the last rank
    const int last = dist::world_size() - 1;
    Tensor mine = global_tensor({dist::rank() == last ? 5 : 4, 6}, kFloat32, device());
    EXPECT_THROW_CONTAINS(
        dt::distribute_tensor(mine, m, {Shard(0)}), ValueError,
        dist::rank() == last
            ? "rank 0 has [4, 6] float32 where [5, 6] float32 is expected"
            : fmt::format("rank {} has [5, 6] float32 where [4, 6] float32", last));
  }
  EXPECT_THROW_PREFIX(dt::from_local(g, m, {Shard(0)}, false, {}, {1}), ValueError,
                      "[from_local] 1 strides [1] for shape");
  Tensor d = dt::distribute_tensor(g, m, {Shard(0)});
  EXPECT_THROW_PREFIX(dt::distribute_tensor(d, m, {Shard(0)}), TypeError,
                      "[distribute_tensor] the tensor is already a DTensor");
  EXPECT_THROW_PREFIX(dt::redistribute(d, {Shard(1), Replicate()}), ValueError,
                      "[redistribute] 2 placements [S(1), R] for a 1-d mesh");
  EXPECT_THROW_PREFIX(dt::redistribute(d, {Shard(5)}), IndexError, "[redistribute] placement S(5)");
  EXPECT_THROW_PREFIX(dt::to_local(g), TypeError,
                      "[to_local] expected a DTensor, got Tensor([4, 6]");
  EXPECT_THROW_PREFIX(dt::spec_of(g), TypeError, "[spec_of] expected a DTensor");
  EXPECT_THROW_PREFIX(dt::full_tensor(g), TypeError, "[spec_of] expected a DTensor");
  if (device().is_cpu()) {
    EXPECT_THROW_PREFIX(d.data_ptr(), ValueError, "[data_ptr] a DTensor has no data of its own");
  }
  // Host reads of a DTensor's values raise too (they read the wrapper's empty storage before).
  Tensor one = dt::distribute_tensor(global_tensor({1}, kFloat32, device()), m, {Replicate()});
  EXPECT_THROW_PREFIX(one.item(), ValueError, "[item] a DTensor has no data of its own");
  EXPECT_THROW_PREFIX(d.to_vector<float>(), ValueError,
                      "[to_vector] a DTensor has no data of its own");
}

TEST(DTensorFallback, PlainTensorsFallThroughAnIncludedShardedKey) {
  Tensor a = global_tensor({3}, kFloat32, Device(kCPU));
  IncludeKeyGuard sharded(DispatchKey::Sharded);
  EXPECT_TRUE(bitwise_equal(add(a, a), mul(global_tensor({3}, kFloat32, Device(kCPU)), 2)));
}

INSTANTIATE_TEST_SUITE_P(Devices, DTensorOnDevice, ::testing::ValuesIn(device_names()),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace kiln::test

// Ops on DTensors through the Sharded layer (kiln/dtensor/sharded_layer.cpp): a table of calls,
// each run on every combination of its inputs' placements on a 1-D mesh (Replicate, Shard of
// every dim, Partial(sum) for floating inputs), compared with the same call on the whole
// tensors; then the decision cache, the errors, and in-place forms. On CPU and sim; a world of
// one, 2 ranks (the full sweep) and 3 (uneven and empty shards).
#include <gtest/gtest.h>

#include <functional>
#include <random>

#include "kiln/dtensor/factories.h"
#include "kiln/dtensor/sharding_rule.h"
#include "kiln/ops/op_list.h"
#include "tests/dtensor/dtensor_test_util.h"

namespace kiln::test {
namespace {

using Fn = std::function<TensorList(const TensorList&)>;

struct Case {
  std::string name;
  std::vector<Shape> shapes;
  Fn fn;
  DType dtype = kFloat32;
  bool partial = true;  // try Partial(sum) inputs too
};

Tensor bias_of(const TensorList& x) { return x.size() > 2 ? x[2] : Tensor(); }

std::vector<Case> cases() {
  auto one = [](std::function<Tensor(const TensorList&)> f) -> Fn {
    return [f](const TensorList& x) { return TensorList{f(x)}; };
  };
  return {
      {"add", {{4, 6}, {4, 6}}, one([](auto& x) { return add(x[0], x[1]); })},
      {"add_broadcast_row", {{4, 6}, {6}}, one([](auto& x) { return add(x[0], x[1]); })},
      {"add_broadcast_col", {{4, 1}, {1, 6}}, one([](auto& x) { return add(x[0], x[1]); })},
      {"sub_alpha", {{4, 6}, {4, 6}}, one([](auto& x) { return sub(x[0], x[1], 2.0); })},
      {"mul", {{4, 6}, {4, 6}}, one([](auto& x) { return mul(x[0], x[1]); })},
      {"div", {{4, 6}, {6}}, one([](auto& x) { return div(x[0], add(x[1], 10.0)); })},
      {"add_number", {{4, 6}}, one([](auto& x) { return add(x[0], 2.0); })},
      {"mul_number", {{4, 6}}, one([](auto& x) { return mul(x[0], 3.0); })},
      {"neg", {{4, 6}}, one([](auto& x) { return neg(x[0]); })},
      {"relu", {{4, 6}}, one([](auto& x) { return relu(sub(x[0], 10.0)); })},
      {"exp", {{4, 6}}, one([](auto& x) { return exp(div(x[0], 10.0)); })},
      {"maximum", {{4, 6}, {4, 6}}, one([](auto& x) { return maximum(x[0], x[1]); })},
      {"gt", {{4, 6}, {6}}, one([](auto& x) { return gt(x[0], x[1]); })},
      {"where", {{4, 6}, {4, 6}, {4, 6}}, one([](auto& x) {
         return where(gt(x[0], 10.0), x[1], x[2]);
       })},
      {"clamp", {{4, 6}}, one([](auto& x) { return clamp(x[0], 3.0, 12.0); })},
      {"to_float64", {{4, 6}}, one([](auto& x) { return x[0].to(kFloat64); })},
      {"sum_dim0", {{4, 6}}, one([](auto& x) { return sum(x[0], {0}); })},
      {"sum_dim1_keepdim", {{4, 6}}, one([](auto& x) { return sum(x[0], {1}, true); })},
      {"sum_all", {{4, 6}}, one([](auto& x) { return sum(x[0]); })},
      {"mean_dim1", {{4, 6}}, one([](auto& x) { return mean(x[0], {1}); })},
      {"mean_all", {{4, 6}}, one([](auto& x) { return mean(x[0]); })},
      {"amax_dim0", {{4, 6}}, one([](auto& x) { return amax(x[0], {0}); })},
      {"amin_all", {{4, 6}}, one([](auto& x) { return amin(x[0]); })},
      {"var_dim1", {{4, 6}}, one([](auto& x) { return var(x[0], {1}); })},
      {"argmax_dim0", {{4, 6}}, one([](auto& x) { return argmax(x[0], 0); })},
      {"softmax_dim1", {{4, 6}}, one([](auto& x) { return softmax(div(x[0], 20.0), 1); })},
      {"log_softmax_dim0", {{4, 6}}, one([](auto& x) { return log_softmax(div(x[0], 20.0), 0); })},
      {"max_dim1",
       {{4, 6}},
       [](auto& x) {
         auto [v, i] = max(x[0], 1);
         return TensorList{v, i};
       }},
      {"sort_dim1_desc",
       {{4, 6}},
       [](auto& x) {
         auto [v, i] = sort(x[0], 1, true);
         return TensorList{v, i};
       }},
      {"topk_dim0",
       {{4, 6}},
       [](auto& x) {
         auto [v, i] = topk(x[0], 2, 0);
         return TensorList{v, i};
       }},
      {"cumsum_dim0", {{4, 6}}, one([](auto& x) { return cumsum(x[0], 0); })},
      {"cumsum_dim1", {{4, 6}}, one([](auto& x) { return cumsum(x[0], 1); })},
      {"prod_dim1", {{4, 6}}, one([](auto& x) { return prod(div(x[0], 10.0), 1); })},
      {"prod_all", {{4, 6}}, one([](auto& x) { return prod(div(x[0], 20.0)); })},
      {"flip_dim0", {{4, 6}}, one([](auto& x) { return flip(x[0], {0}); })},
      {"repeat", {{4, 6}}, one([](auto& x) {
         return repeat(x[0], {2, 1, 2});
       })},
      {"diagonal", {{4, 6}}, one([](auto& x) { return diagonal(x[0], 1); })},
      {"squeeze_dims", {{4, 1, 6}}, one([](auto& x) { return squeeze(x[0], IntArrayRef({1})); })},
      {"mm", {{4, 6}, {6, 8}}, one([](auto& x) { return mm(x[0], x[1]); })},
      {"bmm", {{2, 4, 6}, {2, 6, 4}}, one([](auto& x) { return bmm(x[0], x[1]); })},
      {"addmm", {{4, 6}, {6, 8}, {8}}, one([](auto& x) {
         return addmm(bias_of(x), x[0], x[1], 0.5, 2.0);
       })},
      // Pooling (Note [Pooling placements]): planes of [N, C, H, W]; the backward ops take the
      // indices of their own forward on self.
      {"max_pool2d_with_indices",
       {{4, 2, 6, 6}},
       [](auto& x) {
         auto [v, i] = max_pool2d_with_indices(x[0], {2});
         return TensorList{v, i};
       }},
      {"max_pool2d_backward", {{4, 2, 3, 3}, {4, 2, 6, 6}}, one([](auto& x) {
         Tensor i = std::get<1>(max_pool2d_with_indices(x[1], {2}));
         return max_pool2d_with_indices_backward(x[0], x[1], {2}, {}, {0}, {1}, false, i);
       })},
      {"avg_pool2d", {{4, 2, 6, 6}}, one([](auto& x) { return avg_pool2d(x[0], {3}, {2}, {1}); })},
      {"avg_pool2d_backward", {{4, 2, 3, 3}, {4, 2, 6, 6}}, one([](auto& x) {
         return avg_pool2d_backward(x[0], x[1], {3}, {2}, {1}, false, true, std::nullopt);
       })},
      {"adaptive_avg_pool2d", {{4, 2, 6, 6}}, one([](auto& x) {
         return adaptive_avg_pool2d(x[0], {4, 3});
       })},
      {"adaptive_avg_pool2d_backward", {{4, 2, 4, 3}, {4, 2, 6, 6}}, one([](auto& x) {
         return adaptive_avg_pool2d_backward(x[0], x[1]);
       })},
  };
}

std::vector<dt::Placement> placements_for(const Shape& shape, bool partial) {
  return placements_of_rank(static_cast<int64_t>(shape.size()), partial);
}

class ShardedOps : public ::testing::TestWithParam<std::string> {
 protected:
  Device dev() const { return device_named(GetParam()); }
};
INSTANTIATE_TEST_SUITE_P(Devices, ShardedOps, ::testing::ValuesIn(device_names()),
                         [](const auto& info) { return info.param; });

// The sweep: every case, every combination of its inputs' placements.
TEST_P(ShardedOps, EveryPlacementCombinationMatchesTheWholeTensors) {
  const Device d = dev();
  const dt::DeviceMesh& mesh = mesh_1d(d);
  for (const Case& c : cases()) {
    TensorList whole;
    for (size_t i = 0; i < c.shapes.size(); ++i)
      whole.push_back(global_tensor(c.shapes[i], c.dtype, d, static_cast<int64_t>(7 * i)));
    const TensorList want = c.fn(whole);
    std::vector<std::vector<dt::Placement>> choices;
    for (const Shape& s : c.shapes) choices.push_back(placements_for(s, c.partial));
    std::vector<size_t> pick(c.shapes.size(), 0);
    while (true) {
      TensorList in;
      std::string label = c.name + " [";
      for (size_t i = 0; i < pick.size(); ++i) {
        const dt::Placement p = choices[i][pick[i]];
        in.push_back(dt::distribute_tensor(whole[i], mesh, {p}));
        label += (i ? ", " : "") + p.str();
      }
      label += "]";
      TensorList got;
      try {
        got = c.fn(in);
      } catch (const std::exception& e) {
        ADD_FAILURE() << label << " raised: " << e.what();
      }
      if (got.size() == want.size())
        for (size_t k = 0; k < want.size(); ++k) {
          ASSERT_TRUE(dt::is_dtensor(got[k])) << label << " result " << k;
          EXPECT_TRUE(all_close(dt::full_tensor(got[k]), want[k])) << label << " result " << k;
        }
      std::vector<size_t> counts;
      for (const auto& ch : choices) counts.push_back(ch.size());
      if (!next_pick(pick, counts)) break;
    }
  }
}

// A seeded sample on the 2-D mesh (a real 2x2 at 4 ranks): each case on 8 random pairs of
// placements per input (the same draws on every rank), nested shards included.
TEST_P(ShardedOps, SampleOfPlacementPairsOnTwoMeshDims) {
  const Device d = dev();
  const dt::DeviceMesh& mesh = mesh_2d(d);
  std::mt19937 rng(15);
  for (const Case& c : cases()) {
    TensorList whole;
    for (size_t i = 0; i < c.shapes.size(); ++i)
      whole.push_back(global_tensor(c.shapes[i], c.dtype, d, static_cast<int64_t>(7 * i)));
    const TensorList want = c.fn(whole);
    for (int draw = 0; draw < 8; ++draw) {
      TensorList in;
      std::string label = c.name + " [";
      for (size_t i = 0; i < c.shapes.size(); ++i) {
        const std::vector<dt::Placement> ps = placements_for(c.shapes[i], c.partial);
        dt::Placement p0 = ps[rng() % ps.size()], p1 = ps[rng() % ps.size()];
        in.push_back(dt::distribute_tensor(whole[i], mesh, {p0, p1}));
        label += fmt::format("{}[{}, {}]", i ? ", " : "", p0.str(), p1.str());
      }
      label += "]";
      TensorList got;
      try {
        got = c.fn(in);
      } catch (const std::exception& e) {
        ADD_FAILURE() << label << " raised: " << e.what();
      }
      if (got.size() == want.size()) {
        for (size_t k = 0; k < want.size(); ++k)
          EXPECT_TRUE(all_close(dt::full_tensor(got[k]), want[k])) << label << " result " << k;
      }
    }
  }
}

// Pooling runs each (n, c) plane locally, so batch and channel shards stay where they are; a
// spatial shard, and a channel dim with an empty shard, are gathered first (Note [Pooling
// placements]).
TEST_P(ShardedOps, PoolingKeepsBatchAndChannelShards) {
  const Device d = dev();
  const dt::DeviceMesh& mesh = mesh_1d(d);
  const dt::Placement R = dt::Replicate(), S0 = dt::Shard(0), S1 = dt::Shard(1), S2 = dt::Shard(2);
  struct Case {
    Shape shape;
    dt::Placement in, out;
  };
  // 12 channels split without an empty shard on up to 4 ranks; 1 channel leaves ranks empty.
  for (const Case& c :
       {Case{{4, 12, 6, 6}, S0, S0}, Case{{4, 12, 6, 6}, S1, S1}, Case{{4, 12, 6, 6}, S2, R},
        Case{{4, 1, 6, 6}, S1, mesh.size(0) > 1 ? R : S1}}) {
    Tensor x = dt::distribute_tensor(global_tensor(c.shape, kFloat32, d), mesh, {c.in});
    auto [v, i] = max_pool2d_with_indices(x, {2});
    for (const Tensor& r : {v, i, avg_pool2d(x, {2}), adaptive_avg_pool2d(x, {3, 3})})
      EXPECT_EQ(dt::spec_of(r)->placements()[0], c.out) << c.in.str() << " " << c.shape.size();
  }
}

// Note [Padding and upsampling placements]: batch and channel shards stay local (a channel
// shard that leaves a rank empty, and a spatial shard, are gathered); constant_pad_nd keeps a
// shard of any dim it does not pad; every result equals the unsharded op.
TEST_P(ShardedOps, PaddingAndUpsamplingKeepLeadingShards) {
  const Device d = dev();
  const dt::DeviceMesh& mesh = mesh_1d(d);
  const dt::Placement R = dt::Replicate(), S0 = dt::Shard(0), S1 = dt::Shard(1), S2 = dt::Shard(2);
  struct Case {
    Shape shape;
    dt::Placement in, out;
  };
  for (const Case& c :
       {Case{{4, 12, 6, 6}, S0, S0}, Case{{4, 12, 6, 6}, S1, S1}, Case{{4, 12, 6, 6}, S2, R},
        Case{{4, 1, 6, 6}, S1, mesh.size(0) > 1 ? R : S1}}) {
    Tensor whole = global_tensor(c.shape, kFloat32, d);
    Tensor x = dt::distribute_tensor(whole, mesh, {c.in});
    const std::vector<std::pair<Tensor, Tensor>> results = {
        {reflection_pad2d(x, {1, 2, 2, 1}), reflection_pad2d(whole, {1, 2, 2, 1})},
        {replication_pad2d(x, {3, 0, 1, 2}), replication_pad2d(whole, {3, 0, 1, 2})},
        {upsample_nearest2d(x, {9, 12}), upsample_nearest2d(whole, {9, 12})},
        {upsample_bilinear2d(x, {9, 4}, true), upsample_bilinear2d(whole, {9, 4}, true)}};
    for (const auto& [got, want] : results) {
      EXPECT_EQ(dt::spec_of(got)->placements()[0], c.out) << c.in.str() << " " << c.shape[1];
      EXPECT_TRUE(all_close(dt::full_tensor(got), want)) << c.in.str();
    }
  }
  Tensor whole = global_tensor({4, 12, 6, 6}, kFloat32, d);
  Tensor x = dt::distribute_tensor(whole, mesh, {S2});
  Tensor y = constant_pad_nd(x, {1, 2}, 0.5);
  EXPECT_EQ(dt::spec_of(y)->placements()[0], S2);
  EXPECT_TRUE(all_close(dt::full_tensor(y), constant_pad_nd(whole, {1, 2}, 0.5)));
}

TEST_P(ShardedOps, RepeatedCallsHitTheDecisionCache) {
  const Device d = dev();
  const dt::DeviceMesh& mesh = mesh_1d(d);
  // A shape no other test uses, so that its decisions are made here.
  Tensor a = dt::distribute_tensor(global_tensor({5, 7}, kFloat32, d), mesh, {dt::Shard(0)});
  Tensor b = dt::distribute_tensor(global_tensor({5, 7}, kFloat32, d), mesh, {dt::Replicate()});
  (void)add(a, b);
  const auto before = dt::decision_cache_stats();
  for (int i = 0; i < 10; ++i) (void)add(a, b);
  EXPECT_EQ(dt::decision_cache_stats().misses, before.misses);
  (void)sum(a, {1});  // another op, another entry
  (void)sum(a, {0});  // other dims: another key
  EXPECT_EQ(dt::decision_cache_stats().misses, before.misses + 2);
  Tensor c = add(a, b);
  EXPECT_EQ(dt::spec_of(c)->placements()[0], dt::Placement(dt::Shard(0)));
}

TEST_P(ShardedOps, PlainTensorsDoNotMixWithDTensors) {
  const Device d = dev();
  Tensor a = dt::distribute_tensor(global_tensor({4, 6}, kFloat32, d), mesh_1d(d), {dt::Shard(0)});
  EXPECT_THROW_PREFIX(add(a, ones({4, 6}, kFloat32, d)), ValueError,
                      "[add] mixes DTensors with a plain tensor (argument 1");
}

TEST_P(ShardedOps, ImplicitReplicationTakesPlainTensorsAsReplicated) {
  const Device d = dev();
  Tensor whole = global_tensor({4, 6}, kFloat32, d), other = global_tensor({4, 6}, kFloat32, d, 5);
  Tensor a = dt::distribute_tensor(whole, mesh_1d(d), {dt::Shard(0)});
  {
    dt::ImplicitReplication implicit;
    Tensor c = add(a, other);
    EXPECT_EQ(dt::spec_of(c)->placements()[0], dt::Placement(dt::Shard(0)));
    EXPECT_TRUE(all_close(dt::full_tensor(c), add(whole, other)));
    Tensor s = cat({a, other}, 0);  // a list's element too
    EXPECT_TRUE(all_close(dt::full_tensor(s), cat({whole, other}, 0)));
    { dt::ImplicitReplication nested; }
    EXPECT_NO_THROW(add(a, other));  // still on after a nested guard ends
    Tensor g = other.detach().requires_grad_(true);
    EXPECT_THROW_PREFIX(add(a, g), ValueError, "[add] argument 1");
  }
  EXPECT_THROW_PREFIX(add(a, other), ValueError, "[add] mixes DTensors with a plain tensor");
}

TEST_P(ShardedOps, CopyWholeIntoKeepsEachRanksPiece) {
  const Device d = dev();
  Tensor whole = global_tensor({5, 3}, kFloat32, d), other = global_tensor({5, 3}, kFloat32, d, 9);
  for (const dt::Placement& p : placements_for({5, 3}, true)) {
    SCOPED_TRACE(p.str());
    Tensor dst = dt::distribute_tensor(other, mesh_1d(d), {p});
    const double mark = calls_mark();
    dt::copy_whole_into(dst, whole.to(kFloat64).to(Device(kCPU)));  // converted, moved
    // No communication. Checked on the CPU only: sim records a collective when its
    // communication stream runs it, so distribute_tensor's may land after the mark.
    if (d.is_cpu()) {
      EXPECT_EQ(calls_since(mark, "all_gather_into_tensor") + calls_since(mark, "broadcast"), 0)
          << calls_str(mark);
    }
    EXPECT_EQ(dt::spec_of(dst)->placements()[0], p);
    EXPECT_TRUE(all_close(dt::full_tensor(dst), whole));
  }
  Tensor plain = zeros({5, 3}, kFloat32, d);
  dt::copy_whole_into(plain, whole);
  EXPECT_TRUE(all_close(plain, whole));
  Tensor dst = dt::distribute_tensor(other, mesh_1d(d), {dt::Shard(0)});
  EXPECT_THROW(dt::copy_whole_into(dst, zeros({4, 3}, kFloat32, d)), Error);
}

TEST_P(ShardedOps, SoftmaxAlongAShardedDimMovesRowsNotTheInput) {
  const Device d = dev();
  const int64_t rows = 3, cols = 8;
  Tensor whole = div(global_tensor({rows, cols}, kFloat32, d), 20.0);
  Tensor a = dt::distribute_tensor(whole, mesh_1d(d), {dt::Shard(1)});
  const double mark = calls_mark();
  Tensor y = log_softmax(a, 1), z = softmax(a, -1);
  // What moved: checked on the CPU only (sim records a collective when its communication stream
  // runs it, so an earlier one may land after the mark).
  if (d.is_cpu()) {
    EXPECT_EQ(calls_since(mark, "all_gather_into_tensor"), 0) << calls_str(mark);
    for (const auto& e : dist::FlightRecorder::get().entries()) {
      if (e.started_s > mark && e.op == "all_reduce") {
        EXPECT_LE(e.numel, rows) << calls_str(mark);
      }
    }
  }
  EXPECT_EQ(dt::spec_of(y)->placements()[0], dt::Placement(dt::Shard(1)));
  EXPECT_EQ(dt::spec_of(z)->placements()[0], dt::Placement(dt::Shard(1)));
  EXPECT_TRUE(all_close(dt::full_tensor(y), log_softmax(whole, 1)));
  EXPECT_TRUE(all_close(dt::full_tensor(z), softmax(whole, 1)));
}

TEST_P(ShardedOps, InPlaceFormsKeepTheWrittenPlacement) {
  const Device d = dev();
  const dt::DeviceMesh& mesh = mesh_1d(d);
  Tensor whole = global_tensor({4, 6}, kFloat32, d), other = global_tensor({4, 6}, kFloat32, d, 3);
  Tensor a = dt::distribute_tensor(whole, mesh, {dt::Shard(0)});
  add_(a, dt::distribute_tensor(other, mesh, {dt::Replicate()}));
  EXPECT_EQ(dt::spec_of(a)->placements()[0], dt::Placement(dt::Shard(0)));
  EXPECT_TRUE(all_close(dt::full_tensor(a), add(whole, other)));
  // A Partial self stays Partial through a linear op, and cannot through another.
  Tensor p = dt::distribute_tensor(whole, mesh, {dt::Partial()});
  mul_(p, 2.0);
  EXPECT_TRUE(all_close(dt::full_tensor(p), mul(whole, 2.0)));
  if (dist::world_size() > 1) {
    EXPECT_THROW_PREFIX(relu_(p), ValueError, "[relu_] cannot keep the placements");
  }
}

TEST_P(ShardedOps, AnOpWithoutARuleNamesItselfAndTheSpecs) {
  const Device d = dev();
  Tensor a = dt::distribute_tensor(global_tensor({4, 6}, kFloat32, d), mesh_1d(d), {dt::Shard(0)});
  EXPECT_THROW_CONTAINS(dist::all_reduce(a), NotImplementedError,
                        "[all_reduce] has no sharding rule");
}

// dtensor::zeros/ones/full/empty make each rank's shard directly (uneven along dim 0 on 3
// ranks); a non-zero fill may not be Partial.
TEST_P(ShardedOps, FactoriesMakeTheShardsDirectly) {
  const Device d = dev();
  const dt::DeviceMesh& mesh = mesh_1d(d);
  Tensor f = dt::full({5, 3}, 2.5, mesh, {dt::Shard(0)}, kFloat32);
  EXPECT_EQ(dt::to_local(f).sizes(), dt::spec_of(f)->local_shape());
  EXPECT_TRUE(all_close(dt::full_tensor(f), full({5, 3}, 2.5, kFloat32, d)));
  EXPECT_TRUE(all_close(dt::full_tensor(dt::ones({5, 3}, mesh, {dt::Shard(1)})),
                        ones({5, 3}, kFloat32, d)));
  EXPECT_TRUE(
      all_close(dt::full_tensor(dt::zeros({4}, mesh, {dt::Partial()})), zeros({4}, kFloat32, d)));
  EXPECT_EQ(dt::empty({2, 2}, mesh, {dt::Replicate()}, kInt64).dtype(), kInt64);
  EXPECT_THROW_PREFIX(dt::ones({4}, mesh, {dt::Partial()}), ValueError,
                      "[dtensor::ones] a fill of 1 cannot be Partial");
}

}  // namespace
}  // namespace kiln::test

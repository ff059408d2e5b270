// Views, cat, the indexing ops, triu/tril and one_hot on DTensors (kiln/dtensor/rules_view.cpp,
// rules_index.cpp): a table of calls, each run on every combination of its inputs' placements
// (Replicate, Shard of every dim, Partial(sum) for floating inputs) and compared with the same
// call on the whole tensors, on the 1-D mesh and, for one-input calls, on the 2-D mesh (every
// pair, nested shards included); then the placements the rules keep, out= and in-place forms,
// and errors. On CPU and sim; a world of one, 2 ranks and 3 (uneven and empty shards).
#include <gtest/gtest.h>

#include <functional>
#include <limits>

#include "kiln/dtensor/sharding_rule.h"
#include "kiln/ops/op_list.h"
#include "tests/dtensor/dtensor_test_util.h"

namespace kiln::test {
namespace {

using Fn = std::function<TensorList(const TensorList&)>;
using Make = std::function<TensorList(Device)>;

struct Case {
  std::string name;
  Make make;  // the whole inputs
  Fn fn;
};

// Float inputs 1, 2, 3, ... (plus a bias per input).
Make floats(std::vector<Shape> shapes) {
  return [shapes](Device d) {
    TensorList x;
    for (size_t i = 0; i < shapes.size(); ++i)
      x.push_back(global_tensor(shapes[i], kFloat32, d, static_cast<int64_t>(7 * i)));
    return x;
  };
}
// An int64 index of `shape` with values in [0, bound), scrambled.
Tensor index(IntArrayRef shape, int64_t bound, Device d, int64_t seed = 0) {
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  std::vector<int64_t> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[i] = (i * 7 + 3 + seed) % bound;
  return from_vector(v, shape, d);
}

Fn one(std::function<Tensor(const TensorList&)> f) {
  return [f](const TensorList& x) { return TensorList{f(x)}; };
}

std::vector<Case> view_cases() {
  constexpr int64_t kEnd = std::numeric_limits<int64_t>::max();
  return {
      {"view_merge", floats({{6, 4}}), one([](auto& x) { return x[0].view({24}); })},
      {"view_merge_uneven", floats({{5, 4}}), one([](auto& x) { return x[0].view({20}); })},
      {"view_merge_3d", floats({{2, 3, 4}}), one([](auto& x) {
         return x[0].view({6, 4});
       })},
      {"view_merge_tail", floats({{2, 3, 4}}), one([](auto& x) {
         return x[0].view({2, 12});
       })},
      {"view_split", floats({{12, 2}}), one([](auto& x) {
         return x[0].view({6, 2, 2});
       })},
      {"view_split_3", floats({{12, 2}}), one([](auto& x) {
         return x[0].view({3, 4, 2});
       })},
      {"view_split_last", floats({{2, 10}}), one([](auto& x) {
         return x[0].view({2, 5, 2});
       })},
      {"view_infer", floats({{4, 6}}), one([](auto& x) {
         return x[0].view({-1, 3});
       })},
      {"view_regroup", floats({{6, 5}}), one([](auto& x) {
         return x[0].view({3, 10});
       })},
      {"view_drop_ones", floats({{4, 1, 6}}), one([](auto& x) {
         return x[0].view({4, 6});
       })},
      {"view_add_ones", floats({{4, 6}}), one([](auto& x) {
         return x[0].view({1, 4, 6, 1});
       })},
      {"view_leading_one", floats({{1, 6}}), one([](auto& x) { return x[0].view({6}); })},
      {"reshape_transposed", floats({{4, 6}}),
       one([](auto& x) { return reshape(transpose(x[0], 0, 1), {-1}); })},
      {"flatten", floats({{2, 3, 4}}), one([](auto& x) { return flatten(x[0], 1); })},
      {"flatten_all", floats({{3, 2, 2}}), one([](auto& x) { return flatten(x[0]); })},
      {"as_strided", floats({{4, 6}}), one([](auto& x) {
         return as_strided(x[0], {3, 4}, {6, 1}, 2);
       })},
      {"permute", floats({{2, 3, 4}}), one([](auto& x) {
         return permute(x[0], {2, 0, 1});
       })},
      {"transpose", floats({{4, 5}}), one([](auto& x) { return transpose(x[0], 0, 1); })},
      {"transpose_3d", floats({{2, 3, 4}}), one([](auto& x) { return transpose(x[0], -1, 0); })},
      {"slice_part", floats({{5, 6}}), one([](auto& x) { return slice(x[0], 0, 1, 4); })},
      {"slice_whole", floats({{5, 6}}), one([](auto& x) { return slice(x[0], 0, 0, kEnd); })},
      {"slice_step", floats({{5, 6}}), one([](auto& x) { return slice(x[0], 1, 1, kEnd, 2); })},
      {"narrow", floats({{5, 6}}), one([](auto& x) { return narrow(x[0], 1, 2, 3); })},
      {"select", floats({{5, 6}}), one([](auto& x) { return select(x[0], 0, 2); })},
      {"select_last", floats({{5, 6}}), one([](auto& x) { return select(x[0], 1, -1); })},
      {"expand", floats({{4, 1}}), one([](auto& x) {
         return expand(x[0], {2, 4, 6});
       })},
      {"expand_rows", floats({{1, 6}}), one([](auto& x) {
         return expand(x[0], {5, -1});
       })},
      {"squeeze_all", floats({{4, 1, 6}}), one([](auto& x) { return squeeze(x[0]); })},
      {"squeeze_dim", floats({{4, 1, 6}}), one([](auto& x) { return squeeze(x[0], 1); })},
      {"squeeze_noop", floats({{4, 6}}), one([](auto& x) { return squeeze(x[0], 0); })},
      {"squeeze_leading", floats({{1, 5}}), one([](auto& x) { return squeeze(x[0], 0); })},
      // Chunks of one row (2 or 3 ranks): the local op must not squeeze them.
      {"squeeze_row_chunks", floats({{3, 1, 2}}), one([](auto& x) { return squeeze(x[0]); })},
      {"squeeze_row_chunks_dim", floats({{3, 2}}), one([](auto& x) { return squeeze(x[0], 0); })},
      {"unsqueeze", floats({{4, 6}}), one([](auto& x) { return unsqueeze(x[0], 1); })},
      {"unsqueeze_last", floats({{4, 6}}), one([](auto& x) { return unsqueeze(x[0], -1); })},
      {"alias", floats({{5}}), one([](auto& x) { return t(x[0]); })},
      {"detach", floats({{4, 6}}), one([](auto& x) { return detach(x[0]); })},
      {"chunk", floats({{5, 6}}), [](auto& x) { return TensorList(chunk(x[0], 2, 1)); }},
  };
}

std::vector<Case> other_cases() {
  return {
      {"matmul_3d_transposed", floats({{2, 3, 4}, {5, 4}}),
       one([](auto& x) { return matmul(x[0], transpose(x[1], 0, 1)); })},
      {"linear_3d", floats({{2, 3, 4}, {5, 4}, {5}}),
       one([](auto& x) { return linear(x[0], x[1], x[2]); })},
      {"mm_transposed", floats({{6, 4}, {6, 5}}),
       one([](auto& x) { return mm(transpose(x[0], 0, 1), x[1]); })},
      {"cat_dim0", floats({{4, 6}, {3, 6}}), one([](auto& x) {
         return cat({x[0], x[1]}, 0);
       })},
      {"cat_dim1", floats({{5, 6}, {5, 2}}), one([](auto& x) {
         return cat({x[0], x[1]}, -1);
       })},
      {"cat_three", floats({{2, 3}, {2, 3}, {1, 3}}), one([](auto& x) {
         return cat({x[0], x[1], x[2]}, 0);
       })},
      {"stack", floats({{4, 3}, {4, 3}}), one([](auto& x) {
         return stack({x[0], x[1]}, 1);
       })},
      {"index_select_dim0",
       [](Device d) {
         return TensorList{global_tensor({5, 6}, kFloat32, d), index({4}, 5, d)};
       },
       one([](auto& x) { return index_select(x[0], 0, x[1]); })},
      {"index_select_dim1",
       [](Device d) {
         return TensorList{global_tensor({5, 6}, kFloat32, d), index({7}, 6, d)};
       },
       one([](auto& x) { return index_select(x[0], 1, x[1]); })},
      {"gather_dim1",
       [](Device d) {
         return TensorList{global_tensor({5, 6}, kFloat32, d), index({5, 3}, 6, d)};
       },
       one([](auto& x) { return gather(x[0], 1, x[1]); })},
      {"gather_dim0",
       [](Device d) {
         return TensorList{global_tensor({5, 6}, kFloat32, d), index({4, 6}, 5, d)};
       },
       one([](auto& x) { return gather(x[0], 0, x[1]); })},
      {"scatter_add_dim0",
       [](Device d) {
         return TensorList{global_tensor({5, 6}, kFloat32, d), index({3, 6}, 5, d),
                           global_tensor({3, 6}, kFloat32, d, 40)};
       },
       one([](auto& x) { return scatter_add(x[0], 0, x[1], x[2]); })},
      {"scatter_add_dim1",
       [](Device d) {
         return TensorList{global_tensor({5, 6}, kFloat32, d), index({5, 4}, 6, d),
                           global_tensor({5, 4}, kFloat32, d, 40)};
       },
       one([](auto& x) { return scatter_add(x[0], 1, x[1], x[2]); })},
      {"index_add_dim0",
       [](Device d) {
         return TensorList{global_tensor({5, 6}, kFloat32, d), index({4}, 5, d),
                           global_tensor({4, 6}, kFloat32, d, 40)};
       },
       one([](auto& x) { return index_add(x[0], 0, x[1], x[2], 2.0); })},
      {"index_add_dim1",
       [](Device d) {
         return TensorList{global_tensor({5, 6}, kFloat32, d), index({3}, 6, d),
                           global_tensor({5, 3}, kFloat32, d, 40)};
       },
       one([](auto& x) { return index_add(x[0], 1, x[1], x[2]); })},
      {"triu", floats({{5, 6}}), one([](auto& x) { return triu(x[0]); })},
      {"triu_above", floats({{5, 6}}), one([](auto& x) { return triu(x[0], 1); })},
      {"tril_below", floats({{6, 5}}), one([](auto& x) { return tril(x[0], -1); })},
      {"tril_batched", floats({{2, 5, 4}}), one([](auto& x) { return tril(x[0], 2); })},
      {"one_hot", [](Device d) { return TensorList{index({5}, 7, d)}; },
       one([](auto& x) { return one_hot(x[0], 7); })},
      {"one_hot_2d",
       [](Device d) {
         return TensorList{index({2, 3}, 4, d)};
       },
       one([](auto& x) { return one_hot(x[0], 4); })},
  };
}

// Every placement an input may take along one mesh dim.
std::vector<dt::Placement> placements_for(const Tensor& t) {
  return placements_of_rank(t.dim(), is_floating(t.dtype()));
}

// Runs `c` on every combination of its inputs' placements on `mesh` (each input's placement
// per mesh dim from placements_for) and compares with the whole tensors.
void sweep(const Case& c, const dt::DeviceMesh& mesh, Device d) {
  const TensorList whole = c.make(d);
  const TensorList want = c.fn(whole);
  // One choice per (input, mesh dim), odometer order.
  std::vector<std::vector<dt::Placement>> choices;
  for (const Tensor& t : whole)
    for (int64_t m = 0; m < mesh.ndim(); ++m) choices.push_back(placements_for(t));
  std::vector<size_t> pick(choices.size(), 0);
  const auto md = static_cast<size_t>(mesh.ndim());
  while (true) {
    TensorList in;
    std::string label = c.name + " [";
    for (size_t i = 0; i < whole.size(); ++i) {
      std::vector<dt::Placement> ps;
      for (size_t m = 0; m < md; ++m) ps.push_back(choices[i * md + m][pick[i * md + m]]);
      in.push_back(dt::distribute_tensor(whole[i], mesh, ps));
      label += (i ? ", " : "") + dt::placements_str(ps);
    }
    label += "] on " + mesh.str();
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

class ShardedViews : public ::testing::TestWithParam<std::string> {
 protected:
  Device dev() const { return device_named(GetParam()); }
  Tensor shard(IntArrayRef shape, dt::Placement p, int64_t bias = 0) {
    return dt::distribute_tensor(global_tensor(shape, kFloat32, dev(), bias), mesh_1d(dev()), {p});
  }
};
INSTANTIATE_TEST_SUITE_P(Devices, ShardedViews, ::testing::ValuesIn(device_names()),
                         [](const auto& info) { return info.param; });

TEST_P(ShardedViews, ViewsMatchTheWholeTensorsInEveryPlacement) {
  for (const Case& c : view_cases()) sweep(c, mesh_1d(dev()), dev());
}

TEST_P(ShardedViews, IndexingAndCompositesMatchTheWholeTensorsInEveryPlacement) {
  for (const Case& c : other_cases()) sweep(c, mesh_1d(dev()), dev());
}

// Every pair of placements on the 2-D mesh ([1, n] below 4 ranks, [2, 2] at 4): nested shards
// of merged and split dims.
TEST_P(ShardedViews, ViewsMatchOnTwoMeshDims) {
  for (const Case& c : view_cases()) sweep(c, mesh_2d(dev()), dev());
  for (const Case& c : other_cases())
    if (c.make(dev()).size() == 1) sweep(c, mesh_2d(dev()), dev());
}

// The gradients of every case's floating inputs, each placed every way on the 1-D mesh, equal
// the gradients on the whole tensors (every result element weighed by a distinct factor).
TEST_P(ShardedViews, GradientsMatchTheWholeTensorsInEveryPlacement) {
  const Device d = dev();
  const dt::DeviceMesh& mesh = mesh_1d(d);
  auto loss = [&](const TensorList& out, bool sharded) {
    Tensor l;
    for (const Tensor& o : out) {
      Tensor w = div(global_tensor(o.sizes(), kFloat32, d, 3), 10.0);
      if (sharded) w = dt::distribute_tensor(w, mesh, {dt::Replicate()});
      Tensor term = sum(mul(o, w));
      l = l.defined() ? add(l, term) : term;
    }
    return l;
  };
  std::vector<Case> all = view_cases();
  for (Case& c : other_cases()) all.push_back(std::move(c));
  for (const Case& c : all) {
    const TensorList whole = c.make(d);
    std::vector<size_t> diff;  // the floating inputs
    TensorList leaves;
    for (size_t i = 0; i < whole.size(); ++i) {
      leaves.push_back(whole[i]);
      if (is_floating(whole[i].dtype())) {
        diff.push_back(i);
        leaves[i] = whole[i].detach().requires_grad_(true);
      }
    }
    // as_strided's backward lays the gradient out in a flat buffer of the base's storage
    // (kiln/autograd/node.cpp), which has no DTensor form: it raises instead.
    if (diff.empty() || c.name == "detach" || c.name == "as_strided") continue;
    loss(c.fn(leaves), false).backward();
    std::vector<std::vector<dt::Placement>> choices;
    for (const Tensor& t : whole) choices.push_back(placements_for(t));
    std::vector<size_t> pick(whole.size(), 0);
    while (true) {
      TensorList in;
      std::string label = c.name + " [";
      for (size_t i = 0; i < whole.size(); ++i) {
        const dt::Placement p = choices[i][pick[i]];
        in.push_back(dt::distribute_tensor(whole[i], mesh, {p}));
        if (is_floating(whole[i].dtype())) in[i].requires_grad_(true);
        label += (i ? ", " : "") + p.str();
      }
      label += "]";
      try {
        loss(c.fn(in), true).backward();
        for (size_t i : diff) {
          ASSERT_TRUE(in[i].grad().defined()) << label << " input " << i;
          EXPECT_EQ(dt::spec_of(in[i].grad())->placements(), dt::spec_of(in[i])->placements())
              << label << " input " << i;
          EXPECT_TRUE(all_close(dt::full_tensor(in[i].grad()), leaves[i].grad()))
              << label << " input " << i;
        }
      } catch (const std::exception& e) {
        ADD_FAILURE() << label << " raised: " << e.what();
      }
      std::vector<size_t> counts;
      for (const auto& ch : choices) counts.push_back(ch.size());
      if (!next_pick(pick, counts)) break;
    }
  }
}

dt::Placement placement_of(const Tensor& t) { return dt::spec_of(t)->placements()[0]; }

// The rules keep shards where the Notes say, rather than gathering.
TEST_P(ShardedViews, ShardsSurviveWhereTheRulesSay) {
  const int64_t n = dist::world_size();
  const dt::Placement s0 = dt::Shard(0), s1 = dt::Shard(1), r = dt::Replicate();
  // view: a merge keeps the leading dim's shard when its chunks divide evenly.
  EXPECT_EQ(placement_of(shard({6, 4}, s0).view({24})), 6 % n == 0 ? s0 : r);
  EXPECT_EQ(placement_of(shard({5, 4}, s0).view({20})), 5 % n == 0 ? s0 : r);
  EXPECT_EQ(placement_of(shard({2, 3, 4}, s1).view({2, 12})), 3 % n == 0 ? s1 : r);
  EXPECT_EQ(placement_of(shard({6, 4}, s1).view({24})), r);  // not the leading dim
  // A split keeps it on the first result dim when that dim's size divides.
  EXPECT_EQ(placement_of(shard({12, 2}, s0).view({6, 2, 2})), 6 % n == 0 ? s0 : r);
  EXPECT_EQ(placement_of(shard({12, 2}, s0).view({3, 4, 2})), 3 % n == 0 ? s0 : r);
  EXPECT_EQ(placement_of(shard({4, 1, 6}, dt::Shard(2)).view({4, 6})), s1);
  EXPECT_EQ(placement_of(transpose(shard({4, 6}, s0), 0, 1)), s1);
  EXPECT_EQ(placement_of(permute(shard({2, 3, 4}, dt::Shard(2)), {2, 0, 1})), s0);
  EXPECT_EQ(placement_of(slice(shard({5, 6}, s0), 1, 1, 4)), s0);
  EXPECT_EQ(placement_of(slice(shard({5, 6}, s0), 0, 0, 5)), s0);
  EXPECT_EQ(placement_of(slice(shard({5, 6}, s0), 0, 1, 5)), r);
  EXPECT_EQ(placement_of(select(shard({5, 6}, s1), 0, 3)), s0);
  EXPECT_EQ(placement_of(expand(shard({4, 1}, s0), {2, 4, 6})), s1);
  EXPECT_EQ(placement_of(unsqueeze(shard({4, 6}, s1), 0)), dt::Placement(dt::Shard(2)));
  EXPECT_EQ(placement_of(squeeze(shard({4, 1, 6}, dt::Shard(2)))), s1);
  const dt::Placement p = dt::Partial();
  EXPECT_EQ(placement_of(shard({4, 6}, p).view({24})), p);
  EXPECT_EQ(placement_of(detach(shard({4, 6}, p))), p);
  EXPECT_EQ(placement_of(expand(shard({4, 1}, p), {4, 6})), p);
  // cat keeps shards off its dim, and all-Partial inputs.
  EXPECT_EQ(placement_of(cat({shard({4, 6}, s1), shard({3, 6}, s1)}, 0)), s1);
  EXPECT_EQ(placement_of(cat({shard({4, 6}, p), shard({3, 6}, p)}, 0)), p);
  // index_select follows a sharded index into the indexed dim.
  Tensor idx = dt::distribute_tensor(index({4}, 5, dev()), mesh_1d(dev()), {s0});
  EXPECT_EQ(placement_of(index_select(shard({5, 6}, r), 0, idx)), s0);
  EXPECT_EQ(placement_of(index_select(shard({6, 5}, r), 1, idx)), s1);
  // triu and tril keep rows and columns sharded, with the diagonal shifted per rank.
  EXPECT_EQ(placement_of(triu(shard({5, 6}, s0))), s0);
  EXPECT_EQ(placement_of(tril(shard({5, 6}, s1), 1)), s1);
  EXPECT_EQ(placement_of(triu(shard({5, 6}, p))), p);
}

TEST_P(ShardedViews, OutAndInPlaceFormsKeepTheWrittenPlacement) {
  const Device d = dev();
  const dt::DeviceMesh& mesh = mesh_1d(d);
  Tensor whole = global_tensor({5, 6}, kFloat32, d);
  Tensor out = shard({5, 6}, dt::Shard(1), 100);
  ops::op_triu_out(out, shard({5, 6}, dt::Shard(0)), 1);
  EXPECT_EQ(placement_of(out), dt::Placement(dt::Shard(1)));
  EXPECT_TRUE(all_close(dt::full_tensor(out), triu(whole, 1)));

  Tensor catted = shard({9, 6}, dt::Shard(1), 100);
  ops::op_cat_out(catted, {shard({5, 6}, dt::Shard(1)), shard({4, 6}, dt::Replicate())}, 0);
  EXPECT_TRUE(
      all_close(dt::full_tensor(catted), cat({whole, global_tensor({4, 6}, kFloat32, d)}, 0)));

  // index_add_ along rows keeps a column-sharded self.
  Tensor self = shard({5, 6}, dt::Shard(1));
  Tensor idx = dt::distribute_tensor(index({4}, 5, d), mesh, {dt::Replicate()});
  Tensor src = global_tensor({4, 6}, kFloat32, d, 40);
  index_add_(self, 0, idx, dt::distribute_tensor(src, mesh, {dt::Shard(0)}));
  EXPECT_EQ(placement_of(self), dt::Placement(dt::Shard(1)));
  EXPECT_TRUE(all_close(dt::full_tensor(self), index_add(whole, 0, index({4}, 5, d), src)));

  // scatter_add_ into Partial(sum) terms.
  Tensor terms = shard({5, 6}, dt::Partial());
  Tensor sidx = index({3, 6}, 5, d);
  Tensor ssrc = global_tensor({3, 6}, kFloat32, d, 40);
  scatter_add_(terms, 0, dt::distribute_tensor(sidx, mesh, {dt::Shard(0)}),
               dt::distribute_tensor(ssrc, mesh, {dt::Shard(0)}));
  EXPECT_EQ(placement_of(terms), dt::Placement(dt::Partial()));
  EXPECT_TRUE(all_close(dt::full_tensor(terms), scatter_add(whole, 0, sidx, ssrc)));
}

TEST_P(ShardedViews, WritingAlongAShardedIndexedDimRaises) {
  // index_add_ along the dim self is sharded on would have to gather self first.
  Tensor self = shard({5, 6}, dt::Shard(0));
  Tensor idx = dt::distribute_tensor(index({4}, 5, dev()), mesh_1d(dev()), {dt::Replicate()});
  Tensor src = shard({4, 6}, dt::Replicate());
  EXPECT_THROW_PREFIX(index_add_(self, 0, idx, src), ValueError,
                      "[index_add_out] cannot keep the placements of the tensor it writes");
}

TEST_P(ShardedViews, BadArgumentsRaiseTheOpsOwnErrors) {
  Tensor x = shard({4, 6}, dt::Shard(0));
  EXPECT_THROW_PREFIX(x.view({5, 5}), ValueError, "[view] shape [5, 5] is invalid");
  EXPECT_THROW_PREFIX(permute(x, {0}), ValueError, "[permute] number of dims don't match");
  EXPECT_THROW_PREFIX(transpose(x, 0, 2), IndexError, "[transpose]");
  EXPECT_THROW_PREFIX(expand(x, {6}), ValueError, "[expand] the number of sizes");
  EXPECT_THROW_PREFIX(triu(shard({4}, dt::Shard(0))), ValueError, "[triu] input must have");
  EXPECT_THROW_PREFIX(one_hot(shard({4}, dt::Shard(0)), 3), TypeError, "[one_hot] input must be");
}

}  // namespace
}  // namespace kiln::test

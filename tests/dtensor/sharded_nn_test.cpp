// The nn, dropout and foreach sharding rules (kiln/dtensor/rules_nn.cpp, rules_dropout.cpp,
// rules_foreach.cpp): a table of calls, each run on every combination of its inputs' placements
// on a 1-D mesh (or on a list of combinations where the product is too large), compared with
// the same call on the whole tensors, bitwise where the order of arithmetic is unchanged; then
// the placements the rules choose, 2-D meshes, the generator's state after a sharded dropout,
// and the errors. On CPU and sim; a world of one, 2 ranks (the full sweep) and 3 (uneven and
// empty shards).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>

#include "kiln/core/generator.h"
#include "kiln/dtensor/sharding_rule.h"
#include "kiln/ops/op_list.h"
#include "tests/dtensor/dtensor_test_util.h"

namespace kiln::test {
namespace {

using Fn = std::function<TensorList(const TensorList&)>;
using dt::Partial;
using dt::Placement;
using dt::Replicate;
using dt::Shard;

struct Case {
  std::string name;
  std::function<TensorList(Device)> make;  // the whole inputs
  Fn fn;
  bool exact = true;                                // bitwise equal to the whole tensors' result
  std::vector<std::vector<Placement>> combos = {};  // empty: every combination
  std::vector<size_t> no_partial = {};              // inputs never given Partial
};

Tensor g(IntArrayRef shape, Device d, int64_t bias = 0, double scale = 1) {
  return mul(global_tensor(shape, kFloat32, d, bias), scale);
}
Tensor ids(const std::vector<int64_t>& v, IntArrayRef shape, Device d) {
  return from_vector(v, shape, d);
}
TensorList mul1(const TensorList& x, size_t from, size_t n) {  // copies that keep placements
  TensorList out;
  for (size_t i = from; i < from + n; ++i) out.push_back(mul(x[i], 1.0));
  return out;
}
TensorList sl(const TensorList& x, size_t from, size_t n) {
  return TensorList(x.begin() + static_cast<ptrdiff_t>(from),
                    x.begin() + static_cast<ptrdiff_t>(from + n));
}

std::vector<Case> cases() {
  const Placement R = Replicate(), S0 = Shard(0), S1 = Shard(1), S2 = Shard(2), S3 = Shard(3),
                  P = Partial();
  auto one = [](std::function<Tensor(const TensorList&)> f) -> Fn {
    return [f](const TensorList& x) { return TensorList{f(x)}; };
  };
  auto attn = [](const TensorList& x, bool causal) {
    auto [o, l] = flash_attention(x[0], x[1], x[2], causal, 0.05);
    return TensorList{o, l};
  };
  auto attn_bw_inputs = [](Device d) {
    Tensor q = g({2, 3, 4, 5}, d, 0, 0.01), k = g({2, 3, 4, 5}, d, 9, 0.01),
           v = g({2, 3, 4, 5}, d, 3, 0.1), go = g({2, 3, 4, 5}, d, 5, 0.01);
    auto [o, l] = flash_attention(q, k, v, false, 0.5);
    return TensorList{go, q, k, v, o, l};
  };
  auto attn_bw = [](const TensorList& x) {
    auto [dq, dk, dv] = flash_attention_backward(x[0], x[1], x[2], x[3], x[4], x[5], false, 0.5);
    return TensorList{dq, dk, dv};
  };
  auto foreach_in = [](int lists) {
    return [lists](Device d) {
      TensorList t;
      for (int l = 0; l < lists; ++l) {
        t.push_back(g({4, 6}, d, 3 * l));
        t.push_back(g({5}, d, 3 * l + 1));
      }
      return t;
    };
  };
  // Every list's first elements take `a`, second `b`; `grads` varies.
  auto alike = [](size_t lists, const Placement& a, const Placement& b) {
    std::vector<Placement> c;
    for (size_t l = 0; l < lists; ++l) c.insert(c.end(), {a, b});
    return c;
  };
  std::vector<std::vector<Placement>> adamw_combos;
  for (Placement p : {R, S0, S1})
    for (Placement gr : {R, S0, S1, P}) adamw_combos.push_back({p, gr, p, p, R, R});
  return {
      {"layer_norm",
       [](Device d) {
         return TensorList{g({4, 6}, d), g({6}, d, 2), g({6}, d, 5)};
       },
       one([](auto& x) { return layer_norm(x[0], {6}, x[1], x[2]); })},
      {"layer_norm_3d_two_dims",
       [](Device d) {
         return TensorList{g({3, 2, 4}, d)};
       },
       one([](auto& x) {
         return layer_norm(x[0], {2, 4});
       })},
      {"rms_norm",
       [](Device d) {
         return TensorList{g({4, 6}, d), g({6}, d, 2)};
       },
       one([](auto& x) { return rms_norm(x[0], {6}, x[1]); })},
      {"layer_norm_backward",
       [](Device d) {
         return TensorList{g({4, 6}, d, 3), g({4, 6}, d), g({6}, d, 2)};
       },
       one([](auto& x) { return layer_norm_backward(x[0], x[1], {6}, x[2]); }), false},
      // layer_norm's three gradients in one op (its autograd formula's); the mask leaves out
      // grad_bias, whose result stays undefined.
      {"layer_norm_fused_backward",
       [](Device d) {
         return TensorList{g({4, 6}, d, 3), g({4, 6}, d), g({6}, d, 2)};
       },
       [](const TensorList& x) {
         auto [gi, gw, gb] = layer_norm_fused_backward(x[0], x[1], {6}, x[2], 1e-5, {1, 1, 1});
         auto [hi, hw, hb] = layer_norm_fused_backward(x[0], x[1], {6}, {}, 1e-5, {0, 1, 0});
         EXPECT_FALSE(hi.defined() || hb.defined());
         return TensorList{gi, gw, gb, hw};
       },
       false},
      {"layer_norm_weight_grad",
       [](Device d) {
         return TensorList{g({4, 6}, d, 3), g({4, 6}, d)};
       },
       one([](auto& x) { return sum(mul(x[0], layer_norm(x[1], {6})), {0}); }), false},
      // Batch norm (Note [Native norm placements] in rules_norm.cpp): training gathers to
      // Replicate (the statistics span the batch), so a Shard(0) batch equals the whole; the
      // running stats (replicated, copied so every run starts alike) are updated alike.
      {"batch_norm_train",
       [](Device d) {
         return TensorList{g({4, 3, 2}, d, 0, 0.1), g({3}, d, 1), g({3}, d, 2), g({3}, d, 0, 0.1),
                           g({3}, d, 1, 0.5)};
       },
       [](const TensorList& x) {
         TensorList st = mul1(x, 3, 2);
         auto [o, m, r] = native_batch_norm_legit(x[0], x[1], x[2], st[0], st[1], true, 0.1, 1e-5);
         return TensorList{o, m, r, st[0], st[1]};
       },
       true,
       {{S0, R, R, R, R},
        {S1, R, R, R, R},
        {S2, R, R, R, R},
        {P, R, R, R, R},
        {S0, S0, R, R, R},
        {R, R, R, R, R}}},
      {"batch_norm_eval",
       [](Device d) {
         return TensorList{g({4, 3, 2}, d, 0, 0.1), g({3}, d, 1), g({3}, d, 2), g({3}, d, 0, 0.1),
                           g({3}, d, 1, 0.5)};
       },
       [](const TensorList& x) {
         auto [o, m, r] =
             native_batch_norm_legit_no_training(x[0], x[1], x[2], x[3], x[4], 0.1, 1e-5);
         return TensorList{o};
       },
       true,
       {{S0, R, R, R, R}, {S1, R, R, R, R}, {S0, S0, R, S0, R}, {R, R, R, R, R}}},
      {"batch_norm_backward",
       [](Device d) {
         return TensorList{g({4, 3, 2}, d, 3, 0.01), g({4, 3, 2}, d, 0, 0.1), g({3}, d, 1),
                           g({3}, d, 0, 0.1), g({3}, d, 1, 0.5)};
       },
       [](const TensorList& x) {
         auto [gi, gw, gb] = native_batch_norm_backward(x[0], x[1], x[2], {}, {}, x[3], x[4], true,
                                                        1e-5, {1, 1, 1});
         return TensorList{gi, gw, gb};
       },
       true,
       {{S0, S0, R, R, R}, {S2, S0, R, R, R}, {R, R, R, R, R}}},
      {"group_norm",
       [](Device d) {
         return TensorList{g({4, 6, 2}, d, 0, 0.1), g({6}, d, 1), g({6}, d, 2)};
       },
       [](const TensorList& x) {
         auto [o, m, r] = native_group_norm(x[0], x[1], x[2], 4, 6, 2, 3, 1e-5);
         return TensorList{o, m, r};
       },
       true,
       {{S0, R, R}, {S1, R, R}, {S0, S0, R}, {R, R, R}, {S2, R, R}}},
      {"group_norm_backward",
       [](Device d) {
         Tensor x = g({4, 6, 2}, d, 0, 0.1);
         auto [o, m, r] = native_group_norm(x, {}, {}, 4, 6, 2, 3, 1e-5);
         return TensorList{g({4, 6, 2}, d, 3, 0.01), x, m, r, g({6}, d, 1)};
       },
       [](const TensorList& x) {
         auto [gi, gw, gb] =
             native_group_norm_backward(x[0], x[1], x[2], x[3], x[4], 4, 6, 2, 3, {1, 1, 1});
         return TensorList{gi, gw, gb};
       },
       false,
       {{S0, S0, S0, S0, R}, {S0, R, R, R, R}, {S1, S1, R, R, R}, {R, R, R, R, R}}},
      {"native_layer_norm",
       [](Device d) {
         return TensorList{g({4, 6}, d, 0, 0.1), g({6}, d, 1), g({6}, d, 2)};
       },
       [](const TensorList& x) {
         auto [o, m, r] = native_layer_norm(x[0], {6}, x[1], x[2], 1e-5);
         return TensorList{o, m, r};
       }},
      {"native_layer_norm_backward",
       [](Device d) {
         Tensor x = g({4, 6}, d, 0, 0.1);
         auto [o, m, r] = native_layer_norm(x, {6}, {}, {}, 1e-5);
         return TensorList{g({4, 6}, d, 3, 0.01), x, m, r, g({6}, d, 1), g({6}, d, 2)};
       },
       [](const TensorList& x) {
         auto [gi, gw, gb] =
             native_layer_norm_backward(x[0], x[1], {6}, x[2], x[3], x[4], x[5], {1, 1, 1});
         return TensorList{gi, gw, gb};
       },
       false,
       {{S0, S0, S0, S0, R, R}, {S1, S1, R, R, R, R}, {S0, R, S0, R, R, R}, {R, R, R, R, R, R}}},
      {"embedding",
       [](Device d) {
         return TensorList{g({7, 4}, d), ids({6, 0, 3, 5, 6, 1}, {2, 3}, d)};
       },
       one([](auto& x) { return embedding(x[0], x[1]); })},
      // embedding's gradient: embedding-dim shards stay, index shards give Partial(sum) (Note
      // [Embedding gradient placements]); the sums' order differs, so not bitwise.
      {"embedding_dense_backward",
       [](Device d) {
         return TensorList{g({2, 3, 4}, d), ids({6, 0, 3, 5, 6, 1}, {2, 3}, d)};
       },
       one([](auto& x) { return embedding_dense_backward(x[0], x[1], 7, 3, false); }),
       false,
       {},
       {1}},
      {"embedding_dense_backward_scaled",
       [](Device d) {
         return TensorList{g({6, 4}, d), ids({6, 0, 3, 5, 6, 1}, {6}, d)};
       },
       one([](auto& x) { return embedding_dense_backward(x[0], x[1], 7, -1, true); }),
       false,
       {},
       {1}},
      {"embedding_bag",
       [](Device d) {
         return TensorList{g({7, 4}, d), ids({6, 0, 3, 5, 6, 1}, {6}, d), ids({0, 2, 2}, {3}, d)};
       },
       [](auto& x) {
         auto [out, o2b, bs, mi] =
             ops::op_embedding_bag(x[0], x[1], x[2], false, 2, false, {}, false, 5);
         return TensorList{out, o2b, bs, mi};
       },
       true,
       {},
       {1, 2}},
      {"scatter_reduce",
       [](Device d) {
         return TensorList{g({4, 5}, d), ids({1, 1, 4, 0, 2, 0, 3, 3, 3, 4, 0, 1}, {4, 3}, d),
                           g({4, 3}, d, 2)};
       },
       one([](auto& x) { return scatter_reduce(x[0], 1, x[1], x[2], "amax", false); }),
       true,
       {},
       {1}},
      {"nll_loss",
       [](Device d) {
         return TensorList{g({4, 5}, d, 0, 0.1), ids({1, -100, 4, 0}, {4}, d)};
       },
       one([](auto& x) { return nll_loss(x[0], x[1]); }), false},
      {"nll_loss_1d",
       [](Device d) {
         return TensorList{g({5}, d), scalar_tensor(3, kInt64, d)};
       },
       one([](auto& x) { return nll_loss(x[0], x[1]); }), false},
      {"nll_loss_ignore_all",
       [](Device d) {
         return TensorList{g({3, 4}, d), ids({7, 7, 7}, {3}, d)};
       },
       one([](auto& x) { return nll_loss(x[0], x[1], 7); }), false},
      {"flash_attention",
       [](Device d) {
         return TensorList{g({2, 3, 4, 5}, d, 0, 0.01), g({2, 3, 4, 5}, d, 7, 0.01),
                           g({2, 3, 4, 5}, d, 3)};
       },
       [attn](auto& x) { return attn(x, false); }, false},
      {"flash_attention_causal",
       [](Device d) {
         return TensorList{g({2, 3, 4, 5}, d, 0, 0.01), g({2, 3, 4, 5}, d, 7, 0.01),
                           g({2, 3, 4, 5}, d, 3)};
       },
       [attn](auto& x) { return attn(x, true); }, false},
      {"flash_attention_backward",
       attn_bw_inputs,
       attn_bw,
       false,
       {{R, R, R, R, R, R},
        {S0, S0, S0, S0, S0, S0},
        {S1, S1, S1, S1, S1, S1},
        {S2, S2, S2, S2, S2, S2},
        {S3, S3, S3, S3, S3, R},
        {S2, S2, R, R, S2, S2},
        {S1, S0, S2, R, S3, S1},
        {P, R, R, R, R, R},
        {P, S1, S1, S1, S1, S1}}},
      {"dropout_generator",
       [](Device d) {
         return TensorList{g({5, 3}, d)};
       },
       [](auto& x) {
         Generator gen(11);
         gen.set_offset(3);
         auto [o, m] = ops::op_native_dropout(x[0], 0.4, &gen);
         return TensorList{o, m};
       }},
      {"dropout_default_3d",
       [](Device d) {
         return TensorList{g({3, 4, 5}, d)};
       },
       [](auto& x) {
         manual_seed(17);
         auto [o, m] = ops::op_native_dropout(x[0], 0.5, nullptr);
         return TensorList{o, m};
       }},
      {"foreach_add_", foreach_in(2),
       [](auto& x) {
         TensorList s = mul1(x, 0, 2);
         foreach_add_(s, sl(x, 2, 2), 2.0);
         return s;
       }},
      {"foreach_mul_scalar", foreach_in(1),
       [](auto& x) {
         TensorList s = mul1(x, 0, 2);
         foreach_mul_(s, 3.0);
         return s;
       }},
      {"foreach_mul_list_",
       foreach_in(2),
       [](auto& x) {
         TensorList s = mul1(x, 0, 2);
         foreach_mul_(s, sl(x, 2, 2));
         return s;
       },
       true,
       {},
       {0, 1}},
      {"foreach_lerp_", foreach_in(2),
       [](auto& x) {
         TensorList s = mul1(x, 0, 2);
         foreach_lerp_(s, sl(x, 2, 2), 0.25);
         return s;
       }},
      {"foreach_addcmul_addcdiv_sqrt_",
       foreach_in(3),
       [](auto& x) {
         TensorList s = mul1(x, 0, 2);
         foreach_addcmul_(s, sl(x, 2, 2), sl(x, 4, 2), 0.5);
         foreach_addcdiv_(s, sl(x, 2, 2), sl(x, 4, 2), 0.5);
         foreach_sqrt_(s);
         return s;
       },
       true,
       {alike(3, R, R),
        alike(3, S0, R),
        alike(3, S1, S0),
        alike(3, R, S0),
        {S0, R, P, P, R, S0},
        {S1, S0, R, S0, P, R}}},
      {"foreach_sqrt", foreach_in(1), [](auto& x) { return foreach_sqrt(sl(x, 0, 2)); }},
      // cdist and pdist (Note [Distance placements] in kiln/dtensor/rules_distance.cpp).
      {"cdist_p2",
       [](Device d) {
         return TensorList{g({5, 3}, d), g({4, 3}, d, 3, 0.5)};
       },
       one([](auto& x) { return cdist(x[0], x[1], 2); })},
      {"cdist_p1_batched",
       [](Device d) {
         return TensorList{g({2, 5, 3}, d), g({2, 4, 3}, d, 3, 0.5)};
       },
       one([](auto& x) { return cdist(x[0], x[1], 1); })},
      {"cdist_backward",
       [](Device d) {
         return TensorList{g({5, 4}, d, 1, 0.1), g({5, 3}, d), g({4, 3}, d, 3, 0.5)};
       },
       one([](auto& x) {
         return ops::op_cdist_backward(x[0], x[1], x[2], 2, cdist(x[1], x[2], 2));
       })},
      {"pdist_and_backward",
       [](Device d) {
         return TensorList{g({5, 3}, d), g({10}, d, 1, 0.1)};
       },
       [](auto& x) {
         Tensor y = pdist(x[0], 3);
         return TensorList{y, ops::op_pdist_backward(x[1], x[0], 3, y)};
       }},
      // im2col and col2im (Note [Sliding block placements] in kiln/dtensor/rules_fold.cpp).
      {"unfold",
       [](Device d) {
         return TensorList{g({3, 2, 5, 5}, d)};
       },
       one([](auto& x) { return unfold(x[0], {2}, {1}, {1}, {2}); })},
      {"fold",
       [](Device d) {
         return TensorList{g({3, 8, 9}, d)};
       },
       one([](auto& x) {
         return fold(x[0], {5, 5}, {2}, {1}, {1}, {2});
       })},
      // grid_sampler_2d (Note [Grid sampler placements] in kiln/dtensor/rules_grid_sample.cpp).
      {"grid_sample",
       [](Device d) {
         return TensorList{g({3, 2, 5, 6}, d), g({3, 4, 3, 2}, d, 1, 0.4)};
       },
       one([](auto& x) { return grid_sample(x[0], x[1], "bilinear", "border"); })},
      {"grid_sampler_2d_backward",
       [](Device d) {
         return TensorList{g({3, 2, 4, 3}, d), g({3, 2, 5, 6}, d), g({3, 4, 3, 2}, d, 1, 0.4)};
       },
       [](auto& x) {
         auto [gi, gg] = ops::op_grid_sampler_2d_backward(x[0], x[1], x[2], 0, 1, false, {1, 1});
         return TensorList{gi, gg};
       }},
      {"foreach_adamw_",
       [](Device d) {
         return TensorList{g({4, 6}, d),
                           g({4, 6}, d, 2, 0.1),
                           g({4, 6}, d, 3, 0.01),
                           g({4, 6}, d, 5),
                           scalar_tensor(2.0, kFloat64, d),
                           scalar_tensor(0.1, kFloat64, d)};
       },
       [](auto& x) {
         TensorList p = mul1(x, 0, 1), m = mul1(x, 2, 1), v = mul1(x, 3, 1);
         TensorList steps{add(x[4], 0.0)};
         foreach_adamw_(p, {x[1]}, m, v, steps, x[5], 0.9, 0.99, 1e-8, 0.01);
         return TensorList{p[0], m[0], v[0], steps[0]};
       },
       true, adamw_combos},
  };
}

// Every placement an input may take on a 1-D mesh.
std::vector<Placement> placements_for(const Tensor& t, bool partial) {
  std::vector<Placement> ps{Replicate()};
  for (int64_t d = 0; d < t.dim(); ++d) ps.push_back(Shard(d));
  if (partial && is_floating(t.dtype())) ps.push_back(Partial());
  return ps;
}

::testing::AssertionResult matches(const Tensor& got, const Tensor& want, bool exact) {
  if (got.sizes() != want.sizes() || got.dtype() != want.dtype())
    return ::testing::AssertionFailure()
           << "got " << fmt::format("{} {}", got.sizes(), got.dtype()) << ", want "
           << fmt::format("{} {}", want.sizes(), want.dtype());
  Tensor gc = got.to(Device(kCPU)).contiguous(), wc = want.to(Device(kCPU)).contiguous();
  const size_t bytes = static_cast<size_t>(gc.numel()) * itemsize(gc.dtype());
  if (bytes == 0 || std::memcmp(gc.impl()->data(), wc.impl()->data(), bytes) == 0)
    return ::testing::AssertionSuccess();
  // NaNs (nll_loss over no kept row) match NaNs; the rest within rounding.
  Tensor gd = gc.to(kFloat64), wd = wc.to(kFloat64);
  Tensor gnan = ne(gd, gd), wnan = ne(wd, wd);
  if (!equal(gnan, wnan)) return ::testing::AssertionFailure() << "NaNs at other positions";
  gd = where(gnan, zeros_like(gd), gd), wd = where(wnan, zeros_like(wd), wd);
  const double err = amax(abs(sub(gd, wd))).item<double>();
  const double scale = amax(abs(wd)).item<double>();
  if (!exact && err <= 1e-5 * (1 + scale)) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << (exact ? "not bitwise equal: " : "") << "max error "
                                       << err << " (scale " << scale << ")";
}

class ShardedNn : public ::testing::TestWithParam<std::string> {
 protected:
  Device dev() const { return device_named(GetParam()); }
};
INSTANTIATE_TEST_SUITE_P(Devices, ShardedNn, ::testing::ValuesIn(device_names()),
                         [](const auto& info) { return info.param; });

void run_case(const Case& c, const dt::DeviceMesh& mesh, const TensorList& whole,
              const TensorList& want, const std::vector<Placement>& combo) {
  TensorList in;
  std::string label = c.name + " [";
  for (size_t i = 0; i < combo.size(); ++i) {
    in.push_back(dt::distribute_tensor(whole[i], mesh, {combo[i]}));
    label += (i ? ", " : "") + combo[i].str();
  }
  label += "]";
  TensorList got;
  try {
    got = c.fn(in);
  } catch (const std::exception& e) {
    ADD_FAILURE() << label << " raised: " << e.what();
    return;
  }
  ASSERT_EQ(got.size(), want.size()) << label;
  for (size_t k = 0; k < want.size(); ++k) {
    ASSERT_TRUE(dt::is_dtensor(got[k])) << label << " result " << k;
    EXPECT_TRUE(matches(dt::full_tensor(got[k]), want[k], c.exact)) << label << " result " << k;
  }
}

// The sweep: every case, every combination of its inputs' placements (or its list).
TEST_P(ShardedNn, EveryPlacementCombinationMatchesTheWholeTensors) {
  const Device d = dev();
  const dt::DeviceMesh& mesh = mesh_1d(d);
  for (const Case& c : cases()) {
    const TensorList whole = c.make(d);
    const TensorList want = c.fn(whole);
    if (!c.combos.empty()) {
      for (const auto& combo : c.combos) run_case(c, mesh, whole, want, combo);
      continue;
    }
    std::vector<std::vector<Placement>> choices;
    for (size_t i = 0; i < whole.size(); ++i)
      choices.push_back(placements_for(
          whole[i], std::find(c.no_partial.begin(), c.no_partial.end(), i) == c.no_partial.end()));
    std::vector<size_t> pick(whole.size(), 0);
    while (true) {
      std::vector<Placement> combo;
      for (size_t i = 0; i < pick.size(); ++i) combo.push_back(choices[i][pick[i]]);
      run_case(c, mesh, whole, want, combo);
      size_t i = 0;
      while (i < pick.size() && ++pick[i] == choices[i].size()) pick[i++] = 0;
      if (i == pick.size()) break;
    }
  }
}

Placement placement_of(const Tensor& t) { return dt::spec_of(t)->placements()[0]; }

// The placements chosen where communication is avoidable (a world of one has nothing to avoid).
TEST_P(ShardedNn, RulesKeepShardsAndPartialsWithoutCommunication) {
  if (dist::world_size() == 1) GTEST_SKIP() << "one rank: every placement is free";
  const Device d = dev();
  const dt::DeviceMesh& mesh = mesh_1d(d);
  auto dist = [&](const Tensor& t, Placement p) { return dt::distribute_tensor(t, mesh, {p}); };
  Tensor x = g({4, 6}, d), w = g({6}, d);
  // Sequence parallel: a row-sharded LayerNorm keeps its rows; its weight's gradient is Partial.
  EXPECT_EQ(placement_of(layer_norm(dist(x, Shard(0)), {6}, dist(w, Replicate()))),
            Placement(Shard(0)));
  Tensor gw = sum(mul(dist(x, Shard(0)), layer_norm(dist(x, Shard(0)), {6})), {0});
  EXPECT_EQ(placement_of(gw), Placement(Partial()));
  EXPECT_EQ(placement_of(layer_norm_backward(dist(x, Partial()), dist(x, Replicate()), {6}, {})),
            Placement(Partial()));
  // layer_norm_fused_backward: a row shard keeps grad_input's rows and makes the parameter sums
  // Partial; so does a Partial grad_output with a replicated input.
  for (Placement data : {Placement(Shard(0)), Placement(Partial())}) {
    const Placement xp = data.is_partial() ? Placement(Replicate()) : data;
    auto [lgi, lgw, lgb] = layer_norm_fused_backward(dist(x, data), dist(x, xp), {6},
                                                     dist(w, Replicate()), 1e-5, {1, 1, 1});
    EXPECT_EQ(placement_of(lgi), data);
    EXPECT_EQ(placement_of(lgw), Placement(Partial()));
    EXPECT_EQ(placement_of(lgb), Placement(Partial()));
  }
  // Batch shards of group norm, eval batch norm and native_layer_norm stay local; training
  // batch norm is gathered.
  Tensor img = g({4, 6, 2}, d, 0, 0.1), ch = g({6}, d, 1);
  auto [gn, gm, gr] = native_group_norm(dist(img, Shard(0)), {}, {}, 4, 6, 2, 3, 1e-5);
  EXPECT_EQ(placement_of(gn), Placement(Shard(0)));
  EXPECT_EQ(placement_of(gr), Placement(Shard(0)));
  auto [ggi, ggw, ggb] =
      native_group_norm_backward(dist(img, Shard(0)), dist(img, Shard(0)), gm, gr,
                                 dist(ch, Replicate()), 4, 6, 2, 3, {1, 1, 1});
  EXPECT_EQ(placement_of(ggi), Placement(Shard(0)));
  EXPECT_EQ(placement_of(ggw), Placement(Partial()));
  const Tensor rs = dist(ch, Replicate());
  EXPECT_EQ(placement_of(std::get<0>(native_batch_norm_legit_no_training(dist(img, Shard(0)), {},
                                                                         {}, rs, rs, 0.1, 1e-5))),
            Placement(Shard(0)));
  EXPECT_EQ(placement_of(
                std::get<0>(native_batch_norm_legit(dist(img, Shard(0)), {}, {}, true, 0.1, 1e-5))),
            Placement(Replicate()));
  auto [ln, lm, lr] = native_layer_norm(dist(x, Shard(0)), {6}, {}, {}, 1e-5);
  EXPECT_EQ(placement_of(lr), Placement(Shard(0)));
  // Vocab-parallel embedding and loss parallel.
  Tensor table = g({7, 4}, d), idx = ids({6, 0, 3}, {3}, d);
  EXPECT_EQ(placement_of(embedding(dist(table, Shard(0)), dist(idx, Replicate()))),
            Placement(Partial()));
  EXPECT_EQ(placement_of(embedding(dist(table, Shard(1)), dist(idx, Replicate()))),
            Placement(Shard(1)));
  EXPECT_EQ(placement_of(nll_loss(dist(x, Shard(1)), dist(ids({1, 2, 3, 4}, {4}, d), Replicate()))),
            Placement(Partial()));
  // Heads.
  Tensor q = dist(g({2, 3, 4, 5}, d, 0, 0.01), Shard(1));
  auto [o, l] = flash_attention(q, q, q);
  EXPECT_EQ(placement_of(o), Placement(Shard(1)));
  EXPECT_EQ(placement_of(l), Placement(Shard(1)));
  // Row shards of cdist's operands stay local (rows of x1: the result's rows; rows of x2: its
  // columns); pdist is gathered.
  Tensor pts = g({5, 3}, d), other = g({4, 3}, d, 2);
  EXPECT_EQ(placement_of(cdist(dist(pts, Shard(0)), dist(other, Replicate()))),
            Placement(Shard(0)));
  EXPECT_EQ(placement_of(cdist(dist(pts, Replicate()), dist(other, Shard(0)))),
            Placement(Shard(1)));
  EXPECT_EQ(placement_of(ops::op_cdist_backward(dist(g({5, 4}, d), Shard(0)), dist(pts, Shard(0)),
                                                dist(other, Replicate()), 2,
                                                dist(cdist(pts, other), Shard(0)))),
            Placement(Shard(0)));
  EXPECT_EQ(placement_of(pdist(dist(pts, Shard(0)))), Placement(Replicate()));
  // A batch shard of im2col's and col2im's input stays local; a channel shard is gathered.
  Tensor image = g({3, 2, 5, 5}, d);
  EXPECT_EQ(placement_of(unfold(dist(image, Shard(0)), {2})), Placement(Shard(0)));
  EXPECT_EQ(placement_of(unfold(dist(image, Shard(1)), {2})), Placement(Replicate()));
  EXPECT_EQ(placement_of(fold(dist(unfold(image, {2}), Shard(0)), {5, 5}, {2})),
            Placement(Shard(0)));
  // A batch shard of grid_sampler_2d's input or grid stays local.
  Tensor points = g({3, 4, 3, 2}, d, 1, 0.4);
  EXPECT_EQ(placement_of(grid_sample(dist(image, Shard(0)), dist(points, Replicate()))),
            Placement(Shard(0)));
  EXPECT_EQ(placement_of(grid_sample(dist(image, Shard(1)), dist(points, Replicate()))),
            Placement(Replicate()));
  // A Partial gradient is reduce-scattered into a sharded parameter's placement.
  TensorList p{dist(x, Shard(0))};
  foreach_add_(p, {dist(x, Partial())});
  EXPECT_EQ(placement_of(p[0]), Placement(Shard(0)));
}

// The 2-D mesh: vocab-parallel rows on one mesh dim and the embedding dim on the other, loss
// parallel with rows and classes, norms and attention over batch and heads.
TEST_P(ShardedNn, TwoDimMesh) {
  const Device d = dev();
  const dt::DeviceMesh& mesh = mesh_2d(d);
  const Placement R = Replicate(), S0 = Shard(0), S1 = Shard(1), P = Partial();
  auto dist = [&](const Tensor& t, std::vector<Placement> p) {
    return dt::distribute_tensor(t, mesh, p);
  };
  Tensor table = g({7, 4}, d), idx = ids({6, 0, 3, 5, 6, 1}, {2, 3}, d);
  Tensor emb = embedding(table, idx);
  for (auto [wp, ip] : std::vector<std::pair<std::vector<Placement>, std::vector<Placement>>>{
           {{S0, S1}, {R, R}}, {{S0, S0}, {R, R}}, {{S1, S0}, {S0, R}}, {{R, S0}, {S1, R}}}) {
    SCOPED_TRACE(dt::placements_str(wp) + " " + dt::placements_str(ip));
    EXPECT_TRUE(matches(dt::full_tensor(embedding(dist(table, wp), dist(idx, ip))), emb, true));
  }
  Tensor x = g({4, 5}, d, 0, 0.1), t = ids({1, -100, 4, 0}, {4}, d);
  Tensor loss = nll_loss(x, t);
  for (auto xp : std::vector<std::vector<Placement>>{{S0, S1}, {S1, S0}, {P, S1}, {S1, S1}})
    EXPECT_TRUE(matches(dt::full_tensor(nll_loss(dist(x, xp), dist(t, {S0, R}))), loss, false))
        << dt::placements_str(xp);
  Tensor y = g({4, 6}, d), w = g({6}, d, 2);
  EXPECT_TRUE(matches(dt::full_tensor(rms_norm(dist(y, {S0, S1}), {6}, dist(w, {S0, R}))),
                      rms_norm(y, {6}, w), true));
  Tensor q = g({2, 3, 4, 5}, d, 0, 0.01);
  auto [o, l] = flash_attention(q, q, q);
  auto [so, sl2] = flash_attention(dist(q, {S0, S1}), dist(q, {S0, S1}), dist(q, {S0, S1}));
  EXPECT_TRUE(matches(dt::full_tensor(so), o, false));
  EXPECT_TRUE(matches(dt::full_tensor(sl2), l, false));
  manual_seed(3);
  auto [dy, dm] = ops::op_native_dropout(y, 0.5, nullptr);
  const uint64_t offset = default_generator().offset();
  manual_seed(3);
  auto [sy, sm] = ops::op_native_dropout(dist(y, {S1, S0}), 0.5, nullptr);
  EXPECT_TRUE(matches(dt::full_tensor(sy), dy, true));
  EXPECT_TRUE(matches(dt::full_tensor(sm), dm, true));
  EXPECT_EQ(default_generator().offset(), offset);
}

// Every rank's generator ends where the unsharded draw leaves it, so later replicated draws agree.
TEST_P(ShardedNn, DropoutAdvancesTheGeneratorByTheGlobalCount) {
  const Device d = dev();
  Tensor x = g({5, 3}, d);
  Generator a(5), b(5);
  (void)ops::op_native_dropout(x, 0.3, &a);
  for (Placement p : {Placement(Shard(0)), Placement(Shard(1)), Placement(Partial())})
    (void)ops::op_native_dropout(dt::distribute_tensor(x, mesh_1d(d), {p}), 0.3, &b);
  EXPECT_EQ(b.offset(), 3 * a.offset());
}

TEST_P(ShardedNn, Errors) {
  const Device d = dev();
  const dt::DeviceMesh& mesh = mesh_1d(d);
  Tensor x = g({4, 6}, d);
  // A Partial parameter of a non-linear foreach op is reduced by the caller, not here.
  TensorList p{dt::distribute_tensor(x, mesh, {Partial()})};
  EXPECT_THROW_PREFIX(foreach_sqrt_(p), ValueError,
                      "[foreach_sqrt_] self[0] is Spec([P(sum)], [4, 6], float32");
  // foreach_adamw_'s moments must already have their parameter's placements.
  if (dist::world_size() > 1) {
    TensorList q{dt::distribute_tensor(x, mesh, {Shard(0)})};
    TensorList m{dt::distribute_tensor(x, mesh, {Replicate()})};
    TensorList v{dt::distribute_tensor(x, mesh, {Shard(0)})};
    TensorList s{dt::distribute_tensor(scalar_tensor(1.0, kFloat64, d), mesh, {Replicate()})};
    Tensor lr = dt::distribute_tensor(scalar_tensor(0.1, kFloat64, d), mesh, {Replicate()});
    EXPECT_THROW_PREFIX(foreach_adamw_(q, q, m, v, s, lr, 0.9, 0.99, 1e-8, 0.0), ValueError,
                        "[foreach_adamw_] would have to redistribute the tensor it writes");
  }
  // A plain step count or lr beside DTensor parameters is refused (the layer's rule).
  TensorList q{dt::distribute_tensor(x, mesh, {Replicate()})};
  TensorList s{scalar_tensor(1.0, kFloat64, d)};
  EXPECT_THROW_PREFIX(
      foreach_adamw_(q, q, q, q, s, scalar_tensor(0.1, kFloat64, d), 0.9, 0.99, 1e-8, 0.0),
      ValueError, "[foreach_adamw_] mixes DTensors with a plain tensor");
  // Validation before anything runs: the meta function on the global shapes.
  EXPECT_THROW_PREFIX(
      ops::op_native_dropout(dt::distribute_tensor(x, mesh, {Shard(0)}), 1.5, nullptr), ValueError,
      "[dropout] probability has to be between 0 and 1");
  EXPECT_THROW_PREFIX(layer_norm(dt::distribute_tensor(x, mesh, {Shard(0)}), {5}), ValueError,
                      "[layer_norm] input of shape [4, 6] does not end with");
}

// out= forms take the result's placement.
TEST_P(ShardedNn, OutFormsWriteTheirShard) {
  const Device d = dev();
  const dt::DeviceMesh& mesh = mesh_1d(d);
  Tensor x = g({4, 6}, d), table = g({7, 4}, d), idx = ids({6, 0, 3}, {3}, d);
  Tensor out = dt::distribute_tensor(zeros({4, 6}, kFloat32, d), mesh, {Shard(0)});
  ops::op_layer_norm_out(out, dt::distribute_tensor(x, mesh, {Shard(0)}), {6}, {}, {}, 1e-5);
  EXPECT_TRUE(matches(dt::full_tensor(out), layer_norm(x, {6}), true));
  Tensor eout = dt::distribute_tensor(zeros({3, 4}, kFloat32, d), mesh, {Partial()});
  ops::op_embedding_out(eout, dt::distribute_tensor(table, mesh, {Shard(0)}),
                        dt::distribute_tensor(idx, mesh, {Replicate()}), -1, false, false);
  EXPECT_TRUE(matches(dt::full_tensor(eout), embedding(table, idx), true));
}

}  // namespace
}  // namespace kiln::test

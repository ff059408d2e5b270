// Op table: mm, bmm, addmm, matmul, linear, and the neural-net functions (layer_norm,
// rms_norm, embedding, nll_loss, cross_entropy, dropout, scaled_dot_product_attention,
// flash_attention and its backward).
//
// Products and norms use Tol::Accum: dot products over many terms are legitimately
// accumulated in a different order or blocking than ATen's (BLAS kernels block differently).
#include <cmath>

#include "tests/ops/op_test_util.h"

namespace kiln::test {
namespace {

constexpr auto C = Layout::Contig;
constexpr auto T = Layout::Transposed;
constexpr auto S = Layout::Strided;
constexpr auto E = Layout::Expanded;

// ---------------------------------------------------------------- gradcheck and error samples

// matmul, in the record of the op it lowers to (`op`: mm or bmm).
GradSamples matmul_grads(const std::string& op) {
  GradSamples cs;
  auto two = [](Dims a, Dims b) {
    return [a, b](GradGen& d) { return TensorList{d.var(a), d.var(b)}; };
  };
  const std::vector<std::tuple<const char*, Dims, Dims>> matmuls = {
      {"1d_1d", {4}, {4}},
      {"2d_1d", {3, 4}, {4}},
      {"1d_2d", {4}, {4, 3}},
      {"3d_2d", {2, 3, 4}, {4, 2}},
      {"3d_1d", {2, 3, 4}, {4}},
      {"1d_3d", {3}, {2, 3, 2}},
      {"batched", {2, 3, 2}, {2, 2, 3}},
      {"batch_bcast", {2, 1, 2, 3}, {3, 3, 2}}};
  for (const auto& [label, a, b] : matmuls) {
    std::vector<std::string> ops = {a.size() >= 3 && b.size() >= 3 ? "bmm" : "mm"};
    if (std::string(label) == "1d_3d" || std::string(label) == "batch_bcast") ops = {"bmm"};
    if (ops[0] != op) continue;
    cs.push_back({std::string("matmul_") + label, ops, two(a, b),
                  [](const TensorList& x) { return TensorList{matmul(x[0], x[1])}; }});
  }
  return cs;
}

// mm, and matmul and linear where they lower to mm.
GradSamples mm_grads() {
  GradSamples cs;
  auto two = [](Dims a, Dims b) {
    return [a, b](GradGen& d) { return TensorList{d.var(a), d.var(b)}; };
  };
  cs.push_back({"mm", {"mm"}, two({3, 4}, {4, 2}), [](const TensorList& x) {
                  return TensorList{mm(x[0], x[1])};
                }});
  cs.push_back(
      {"mm_transposed_input", {"mm", "transpose"}, two({4, 3}, {4, 2}), [](const TensorList& x) {
         return TensorList{mm(transpose(x[0], 0, 1), x[1])};
       }});
  cs.push_back(
      {"linear_no_bias", {"mm", "transpose"}, two({2, 3}, {4, 3}), [](const TensorList& x) {
         return TensorList{linear(x[0], x[1])};
       }});
  for (const GradSample& g : matmul_grads("mm")) cs.push_back(g);
  return cs;
}

GradSamples bmm_grads() {
  GradSamples cs;
  auto two = [](Dims a, Dims b) {
    return [a, b](GradGen& d) { return TensorList{d.var(a), d.var(b)}; };
  };
  cs.push_back({"bmm", {"bmm"}, two({2, 3, 4}, {2, 4, 2}), [](const TensorList& x) {
                  return TensorList{bmm(x[0], x[1])};
                }});
  for (const GradSample& g : matmul_grads("bmm")) cs.push_back(g);
  return cs;
}

// addmm, and linear with a bias.
GradSamples addmm_grads() {
  GradSamples cs;
  cs.push_back({"addmm_bias_row_beta_alpha",
                {"addmm"},
                [](GradGen& d) {
                  return TensorList{d.var({2}), d.var({3, 4}), d.var({4, 2})};
                },
                [](const TensorList& x) { return TensorList{addmm(x[0], x[1], x[2], 0.5, 2)}; }});
  cs.push_back({"addmm_full_self",
                {"addmm"},
                [](GradGen& d) {
                  return TensorList{d.var({3, 2}), d.var({3, 4}), d.var({4, 2})};
                },
                [](const TensorList& x) { return TensorList{addmm(x[0], x[1], x[2])}; }});
  cs.push_back({"addmm_beta0",
                {"addmm"},
                [](GradGen& d) {
                  return TensorList{d.var({3, 2}), d.var({3, 4}), d.var({4, 2})};
                },
                [](const TensorList& x) { return TensorList{addmm(x[0], x[1], x[2], 0, -1)}; }});
  cs.push_back({"linear_bias",
                {"addmm", "transpose"},
                [](GradGen& d) {
                  return TensorList{d.var({2, 3}), d.var({4, 3}), d.var({4})};
                },
                [](const TensorList& x) { return TensorList{linear(x[0], x[1], x[2])}; }});
  cs.push_back({"linear_3d_input",
                {"addmm", "view"},
                [](GradGen& d) {
                  return TensorList{d.var({2, 2, 3}), d.var({2, 3}), d.var({2})};
                },
                [](const TensorList& x) { return TensorList{linear(x[0], x[1], x[2])}; }});
  return cs;
}

GradSamples embedding_grads() {
  GradSamples cs;
  cs.push_back({"embedding_repeated_indices",
                {"embedding"},
                [](GradGen& d) {
                  return TensorList{d.var({5, 3}), grad_indices({1, 4, 1, 0, 4, 1}, {2, 3})};
                },
                [](const TensorList& x) { return TensorList{embedding(x[0], x[1])}; }});
  cs.push_back({"embedding_1d_indices",
                {"embedding"},
                [](GradGen& d) {
                  return TensorList{d.var({4, 2}), grad_indices({3, 3, 0}, {3})};
                },
                [](const TensorList& x) { return TensorList{embedding(x[0], x[1])}; }});
  return cs;
}

// nll_loss, and cross_entropy (log_softmax then nll_loss) in its record.
GradSamples nll_loss_grads() {
  GradSamples cs;
  cs.push_back({"nll_loss",
                {"nll_loss"},
                [](GradGen& d) {
                  return TensorList{d.var({4, 5}), grad_indices({1, 0, 4, 1}, {4})};
                },
                [](const TensorList& x) { return TensorList{nll_loss(x[0], x[1])}; }});
  cs.push_back({"nll_loss_ignore_index",
                {"nll_loss"},
                [](GradGen& d) {
                  return TensorList{d.var({4, 5}), grad_indices({1, -100, 4, 3}, {4})};
                },
                [](const TensorList& x) { return TensorList{nll_loss(x[0], x[1])}; }});
  cs.push_back({"nll_loss_custom_ignore_index",
                {"nll_loss"},
                [](GradGen& d) {
                  return TensorList{d.var({4, 5}), grad_indices({2, 2, 4, 3}, {4})};
                },
                [](const TensorList& x) { return TensorList{nll_loss(x[0], x[1], 2)}; }});
  cs.push_back({"nll_loss_1d",
                {"nll_loss"},
                [](GradGen& d) {
                  return TensorList{d.var({5}), grad_indices({3}, {})};
                },
                [](const TensorList& x) { return TensorList{nll_loss(x[0], x[1])}; }});
  cs.push_back({"cross_entropy",
                {"log_softmax", "nll_loss"},
                [](GradGen& d) {
                  return TensorList{d.var({4, 5}), grad_indices({1, 0, 4, 1}, {4})};
                },
                [](const TensorList& x) { return TensorList{cross_entropy(x[0], x[1])}; }});
  cs.push_back({"cross_entropy_ignore_index",
                {"log_softmax", "nll_loss"},
                [](GradGen& d) {
                  return TensorList{d.var({3, 4}), grad_indices({-1, 2, 0}, {3})};
                },
                [](const TensorList& x) { return TensorList{cross_entropy(x[0], x[1], -1)}; }});
  return cs;
}

GradSamples native_dropout_grads() {
  GradSamples cs;
  // The generator is reseeded on every call: the finite differences must see the same mask.
  cs.push_back({"dropout_p05",
                {"native_dropout"},
                [](GradGen& d) {
                  return TensorList{d.var({4, 6})};
                },
                [](const TensorList& x) {
                  static Generator gen;
                  gen.set_seed(1234);
                  return TensorList{dropout(x[0], 0.5, true, &gen)};
                }});
  cs.push_back({"native_dropout_mask_output",
                {"native_dropout"},
                [](GradGen& d) {
                  return TensorList{d.var({3, 4})};
                },
                [](const TensorList& x) {
                  static Generator gen;
                  gen.set_seed(99);
                  auto [out, mask] = ops::op_native_dropout(x[0], 0.25, &gen);
                  return TensorList{out, mask};
                }});
  return cs;
}

GradSamples flash_attention_grads() {
  GradSamples cs;
  auto qkv = [](GradGen& d) {
    return TensorList{d.var({2, 3, 2}), d.var({2, 4, 2}), d.var({2, 4, 2})};
  };
  // Note [Fused attention]: the backward kernel recomputes p from the saved logsumexp.
  cs.push_back({"flash_attention", {"flash_attention"}, qkv, [](const TensorList& x) {
                  return TensorList{std::get<0>(flash_attention(x[0], x[1], x[2]))};
                }});
  cs.push_back({"flash_attention_causal_l_gt_s",
                {"flash_attention"},
                [](GradGen& d) {
                  return TensorList{d.var({1, 2, 5, 3}), d.var({1, 2, 3, 3}), d.var({1, 2, 3, 3})};
                },
                [](const TensorList& x) {
                  return TensorList{std::get<0>(flash_attention(x[0], x[1], x[2], true, 0.8))};
                }});
  return cs;
}

// addmm_gelu, and linear_gelu (its wrapper).
GradSamples addmm_gelu_grads() {
  GradSamples cs;
  // Note [GELU epilogue]: both outputs (gelu_tanh(z), z) carry gradients.
  cs.push_back({"addmm_gelu_both_outputs",
                {"addmm_gelu"},
                [](GradGen& d) {
                  return TensorList{d.var({3}), d.var({4, 5}), d.var({5, 3})};
                },
                [](const TensorList& x) {
                  auto [out, z] = addmm_gelu(x[0], x[1], x[2]);
                  return TensorList{out, z};
                }});
  cs.push_back({"linear_gelu_3d_no_bias",
                {"addmm_gelu", "transpose", "view"},
                [](GradGen& d) {
                  return TensorList{d.var({2, 3, 4}), d.var({5, 4})};
                },
                [](const TensorList& x) { return TensorList{linear_gelu(x[0], x[1])}; }});
  return cs;
}

// layer_norm (`rms` false) or rms_norm over 1 and 2 trailing dims, with and without weight/bias.
GradSamples norm_grads(bool rms) {
  GradSamples cs;
  // Norms over 1 and 2 trailing dims, with and without weight/bias.
  struct Norm {
    const char* label;
    Dims x, normalized;
    bool weight, bias;
  };
  const std::vector<Norm> norms = {
      {"1d_affine", {3, 4}, {4}, true, true},       {"1d_plain", {3, 4}, {4}, false, false},
      {"1d_weight_only", {3, 4}, {4}, true, false}, {"1d_bias_only", {3, 4}, {4}, false, true},
      {"2d_affine", {2, 2, 3}, {2, 3}, true, true}, {"2d_plain", {2, 2, 3}, {2, 3}, false, false}};
  for (const Norm& n : norms) {
    if (!rms)
      cs.push_back({std::string("layer_norm_") + n.label,
                    {"layer_norm"},
                    [n](GradGen& d) {
                      return TensorList{d.var(n.x), n.weight ? d.var(n.normalized) : Tensor(),
                                        n.bias ? d.var(n.normalized) : Tensor()};
                    },
                    [n](const TensorList& x) {
                      return TensorList{layer_norm(x[0], n.normalized, x[1], x[2])};
                    }});
    if (!rms || (n.bias && !n.weight)) continue;
    cs.push_back(
        {std::string("rms_norm_") + n.label,
         {"rms_norm"},
         [n](GradGen& d) {
           return TensorList{d.var(n.x), n.weight ? d.var(n.normalized) : Tensor()};
         },
         [n](const TensorList& x) { return TensorList{rms_norm(x[0], n.normalized, x[1])}; }});
  }
  return cs;
}

// Small integers keep integer products exact and far from overflow.
Draw draw_small() { return draw_uniform(-3, 3); }
const std::vector<DType> kMatmulDTypes = kNumericDTypes;

MakeFn specs(std::vector<Spec> in) {
  std::vector<Draw> draws(in.size(), draw_small());
  return make_from(std::move(draws), std::move(in));
}

void add_mm(Cases& cs) {
  const std::vector<std::pair<const char*, std::vector<Spec>>> mm_configs = {
      {"contig", {{{3, 4}, C}, {{4, 5}, C}}},
      {"a_t", {{{3, 4}, T}, {{4, 5}, C}}},
      {"b_t", {{{3, 4}, C}, {{4, 5}, T}}},
      {"both_t", {{{3, 4}, T}, {{4, 5}, T}}},
      {"strided", {{{3, 4}, S}, {{4, 5}, S}}},
      {"expanded", {{{3, 4}, E}, {{4, 5}, C}}},
      {"outer", {{{4, 1}, C}, {{1, 5}, C}}},
      {"dot", {{{1, 7}, C}, {{7, 1}, C}}},
      {"zero_k", {{{3, 0}, C}, {{0, 5}, C}}},
      {"zero_m", {{{0, 4}, C}, {{4, 5}, C}}},
      {"zero_n", {{{3, 4}, C}, {{4, 0}, C}}},
      {"large", {{{128, 256}, C}, {{256, 96}, C}}},
      {"large_t", {{{128, 256}, T}, {{256, 96}, T}}},
  };
  for (const auto& [label, in] : mm_configs) {
    OpCase row{.name = std::string("mm_") + label,
               .ops = {"mm"},
               .dtypes = kMatmulDTypes,
               .make = specs(in),
               .kiln = [](const KArgs& x) { return KTensors{mm(x[0], x[1])}; },
               .aten = [](const AArgs& a) { return ATensors{at::mm(a[0], a[1])}; },
               .tol = Tol::Accum};
    cs.push_back(row);
    if (std::string(label) == "contig" || std::string(label) == "a_t") {
      auto kf = [](const KArgs& x) {
        Tensor out = x.out;
        mm_out(out, x[0], x[1]);
        return KTensors{out};
      };
      cs.push_back(out_variant(row, "mm_out", kf, std::string("_") + label));
      cs.push_back(out_variant(row, "mm_out", kf, std::string("_") + label + "_t", T));
    }
  }
  const std::vector<std::pair<const char*, std::vector<Spec>>> bmm_configs = {
      {"contig", {{{2, 3, 4}, C}, {{2, 4, 5}, C}}},
      {"a_t", {{{2, 3, 4}, T}, {{2, 4, 5}, C}}},
      {"b_strided", {{{2, 3, 4}, C}, {{2, 4, 5}, S}}},
      {"batch_expanded", {{{3, 3, 4}, E}, {{3, 4, 5}, C}}},
      {"zero_batch", {{{0, 3, 4}, C}, {{0, 4, 5}, C}}},
      {"zero_k", {{{2, 3, 0}, C}, {{2, 0, 5}, C}}},
      {"large", {{{8, 64, 128}, C}, {{8, 128, 32}, T}}},
  };
  for (const auto& [label, in] : bmm_configs) {
    OpCase row{.name = std::string("bmm_") + label,
               .ops = {"bmm"},
               .dtypes = kMatmulDTypes,
               .make = specs(in),
               .kiln = [](const KArgs& x) { return KTensors{bmm(x[0], x[1])}; },
               .aten = [](const AArgs& a) { return ATensors{at::bmm(a[0], a[1])}; },
               .tol = Tol::Accum};
    cs.push_back(row);
    if (std::string(label) == "contig")
      cs.push_back(out_variant(row, "bmm_out", [](const KArgs& x) {
        ops::op_bmm_out(x.out, x[0], x[1]);
        return KTensors{x.out};
      }));
  }

  struct AddmmConfig {
    const char* label;
    std::vector<Spec> in;  // self, a, b
    Scalar beta, alpha;
    std::vector<DType> dtypes;
  };
  const std::vector<AddmmConfig> addmm_configs = {
      {"contig", {{{3, 5}, C}, {{3, 4}, C}, {{4, 5}, C}}, 1, 1, kMatmulDTypes},
      {"bias_row", {{{5}, C}, {{3, 4}, T}, {{4, 5}, C}}, 1, 1, kMatmulDTypes},
      {"bias_col", {{{3, 1}, C}, {{3, 4}, C}, {{4, 5}, T}}, 1, 1, kMatmulDTypes},
      {"self_t", {{{3, 5}, T}, {{3, 4}, C}, {{4, 5}, C}}, 1, 1, kMatmulDTypes},
      {"int_scales", {{{3, 5}, C}, {{3, 4}, C}, {{4, 5}, C}}, 2, 3, kMatmulDTypes},
      {"float_scales", {{{5}, C}, {{3, 4}, C}, {{4, 5}, S}}, 0.5, -1.5, kFloatDTypes},
      {"zero_k", {{{3, 5}, C}, {{3, 0}, C}, {{0, 5}, C}}, 0.5, 2, kFloatDTypes},
      {"large", {{{96}, C}, {{128, 256}, C}, {{256, 96}, T}}, 1, 1, kFloatDTypes},
  };
  for (const AddmmConfig& c : addmm_configs) {
    Scalar beta = c.beta, alpha = c.alpha;
    auto at_scalar = [](const Scalar& s) {
      return s.is_floating() ? at::Scalar(s.to_double()) : at::Scalar(s.to_int());
    };
    at::Scalar abeta = at_scalar(beta), aalpha = at_scalar(alpha);
    OpCase row{
        .name = std::string("addmm_") + c.label,
        .ops = {"addmm"},
        .dtypes = c.dtypes,
        .make = specs(c.in),
        .kiln = [beta,
                 alpha](const KArgs& x) { return KTensors{addmm(x[0], x[1], x[2], beta, alpha)}; },
        .aten =
            [abeta, aalpha](const AArgs& a) {
              return ATensors{at::addmm(a[0], a[1], a[2], abeta, aalpha)};
            },
        .tol = Tol::Accum};
    cs.push_back(row);
    if (std::string(c.label) == "bias_row")
      cs.push_back(out_variant(row, "addmm_out", [](const KArgs& x) {
        ops::op_addmm_out(x.out, x[0], x[1], x[2], 1, 1);
        return KTensors{x.out};
      }));
  }
  // beta = 0 ignores self, NaNs included (BLAS semantics, as in PyTorch).
  cs.push_back({.name = "addmm_beta0_nan_self",
                .ops = {"addmm"},
                .dtypes = kFloatDTypes,
                .make =
                    [](Gen& g) {
                      return KTensors{g.values(std::vector<double>(15, NAN), {3, 5}),
                                      g.any({{3, 4}}), g.any({{4, 5}})};
                    },
                .kiln = [](const KArgs& x) { return KTensors{addmm(x[0], x[1], x[2], 0, 1)}; },
                .aten = [](const AArgs& a) { return ATensors{at::addmm(a[0], a[1], a[2], 0, 1)}; },
                .tol = Tol::Accum});
  // clang-format off
  OpCase& mm_record = head(cs, "mm");
  mm_record.grads = mm_grads();
  mm_record.errors = {
      {"mm_shape_mismatch", K::Value, "mm", {"[4, 3]", "[5, 2]"},
       [](const Watch&) { mm(f32({4, 3}), f32({5, 2})); }},
      {"mm_not_2d", K::Value, "mm", {"1-D"}, [](const Watch&) { mm(f32({4}), f32({4, 2})); }},
      {"mm_dtype_mismatch", K::Type, "mm", {"float32", "float64"},
       [](const Watch&) { mm(f32({2, 3}), ones({3, 2}, kFloat64)); }},
      {"mm_meta_cpu", K::Device, "mm", {"cpu", "meta"},
       [](const Watch&) { mm(empty({2, 3}, kFloat32, Device("meta")), f32({3, 2})); }},
      {"mm_out_wrong_shape", K::Value, "mm_out", {"[3, 3]", "[2, 4]"},
       [](const Watch& watch) {
         Tensor out = zeros({3, 3});
         watch(out);
         mm_out(out, f32({2, 3}), f32({3, 4}));
       }},
      {"mm_out_overlaps_input", K::Value, "mm_out", {"single memory location"},
       [](const Watch& watch) {
         Tensor a = from_vector<float>({1, 2, 3, 4, 5, 6, 7, 8, 9}, {3, 3});
         watch(a);
         Tensor out = as_strided(a, {3, 3}, {3, 1}, 0);
         mm_out(out, transpose(a, 0, 1), f32({3, 3}));
       }}};
  OpCase& bmm_record = head(cs, "bmm");
  bmm_record.grads = bmm_grads();
  bmm_record.errors = {{"bmm_batch_mismatch", K::Value, "bmm", {"[2, 3, 4]", "[3, 4, 5]"},
                        [](const Watch&) { bmm(f32({2, 3, 4}), f32({3, 4, 5})); }}};
  head(cs, "addmm").grads = addmm_grads();
  // clang-format on
}

void add_matmul_linear(Cases& cs) {
  struct MatmulConfig {
    const char* label;
    std::vector<Spec> in;
    const char* op;  // what it reduces to
  };
  const std::vector<MatmulConfig> configs = {
      {"1d_1d", {{{4}, C}, {{4}, C}}, "mm"},
      {"2d_1d", {{{3, 4}, T}, {{4}, S}}, "mm"},
      {"1d_2d", {{{4}, C}, {{4, 5}, C}}, "mm"},
      {"2d_2d", {{{3, 4}, C}, {{4, 5}, T}}, "mm"},
      {"3d_2d", {{{2, 3, 4}, C}, {{4, 5}, C}}, "mm"},
      {"3d_2d_noncontig", {{{2, 3, 4}, T}, {{4, 5}, T}}, "mm"},
      {"3d_1d", {{{2, 3, 4}, C}, {{4}, C}}, "mm"},
      {"1d_3d", {{{4}, C}, {{2, 4, 5}, C}}, "bmm"},
      {"2d_3d", {{{3, 4}, C}, {{2, 4, 5}, C}}, "bmm"},
      {"3d_3d", {{{2, 3, 4}, S}, {{2, 4, 5}, C}}, "bmm"},
      {"bcast_batch", {{{2, 1, 3, 4}, C}, {{5, 4, 2}, C}}, "bmm"},
      {"bcast_batch_expanded", {{{3, 2, 3, 4}, E}, {{1, 2, 4, 5}, C}}, "bmm"},
      {"zero_batch", {{{0, 3, 4}, C}, {{4, 5}, C}}, "mm"},
      {"zero_batch_3d", {{{0, 3, 4}, C}, {{0, 4, 5}, C}}, "bmm"},
  };
  for (const MatmulConfig& c : configs)
    cs.push_back({.name = std::string("matmul_") + c.label,
                  .ops = {c.op},
                  .dtypes = kMatmulDTypes,
                  .make = specs(c.in),
                  .kiln = [](const KArgs& x) { return KTensors{matmul(x[0], x[1])}; },
                  .aten = [](const AArgs& a) { return ATensors{at::matmul(a[0], a[1])}; },
                  .tol = Tol::Accum});

  struct LinearConfig {
    const char* label;
    std::vector<Spec> in;  // x, weight[, bias]
  };
  const std::vector<LinearConfig> linear_configs = {
      {"bias", {{{3, 4}, C}, {{5, 4}, C}, {{5}, C}}},
      {"no_bias", {{{3, 4}, C}, {{5, 4}, C}}},
      {"3d", {{{2, 3, 4}, C}, {{5, 4}, T}, {{5}, C}}},
      {"3d_noncontig", {{{2, 3, 4}, T}, {{5, 4}, C}}},
      {"1d", {{{4}, C}, {{5, 4}, C}, {{5}, C}}},
      {"zero_batch", {{{0, 4}, C}, {{5, 4}, C}, {{5}, C}}},
      {"large", {{{64, 512}, C}, {{256, 512}, C}, {{256}, C}}},
  };
  for (const LinearConfig& c : linear_configs) {
    bool bias = c.in.size() == 3;
    cs.push_back({.name = std::string("linear_") + c.label,
                  .ops = {bias ? "addmm" : "mm"},
                  .dtypes = kMatmulDTypes,
                  .make = specs(c.in),
                  .kiln =
                      [bias](const KArgs& x) {
                        return KTensors{linear(x[0], x[1], bias ? x[2] : Tensor())};
                      },
                  .aten =
                      [bias](const AArgs& a) {
                        return ATensors{at::linear(a[0], a[1], bias ? a[2] : at::Tensor())};
                      },
                  .tol = Tol::Accum});
  }
}

void add_norms(Cases& cs) {
  struct NormConfig {
    const char* label;
    Spec x;
    std::vector<int64_t> shape;  // normalized_shape
    bool affine;
  };
  const std::vector<NormConfig> configs = {
      {"affine", {{2, 3, 8}, C}, {8}, true},
      {"plain", {{2, 3, 8}, C}, {8}, false},
      {"two_dims", {{2, 3, 8}, C}, {3, 8}, true},
      {"noncontig", {{6, 8}, T}, {8}, true},
      {"strided", {{5, 8}, S}, {8}, true},
      {"1d", {{16}, C}, {16}, true},
      {"zero_batch", {{0, 8}, C}, {8}, true},
      {"large", {{64, 1024}, C}, {1024}, true},
      // Rows of 7: element-wide accesses on CUDA; rows past 4096: the kernel that re-reads them.
      {"odd", {{4, 7}, C}, {7}, true},
      {"wide", {{3, 5000}, C}, {5000}, true},
      // More row groups than one wave of CUDA blocks: layer_norm_fused_backward' blocks take
      // several.
      {"tall", {{6000, 40}, C}, {40}, true},
  };
  for (const NormConfig& c : configs) {
    std::vector<int64_t> ns = c.shape;
    bool affine = c.affine;
    Spec xs = c.x;
    MakeFn make = [xs, ns, affine](Gen& g) {
      KTensors in{g.any(xs)};
      if (affine) {
        in.push_back(g.uniform({ns}, 0.5, 1.5));
        in.push_back(g.any({ns}));
      }
      return in;
    };
    OpCase ln{
        .name = std::string("layer_norm_") + c.label,
        .ops = {"layer_norm"},
        .dtypes = kFloatDTypes,
        .make = make,
        .kiln =
            [ns, affine](const KArgs& x) {
              return KTensors{affine ? layer_norm(x[0], ns, x[1], x[2]) : layer_norm(x[0], ns)};
            },
        .aten =
            [ns, affine](const AArgs& a) {
              return ATensors{affine ? at::layer_norm(a[0], ns, a[1], a[2], 1e-5)
                                     : at::layer_norm(a[0], ns, {}, {}, 1e-5)};
            },
        .tol = Tol::Accum};
    cs.push_back(ln);
    // layer_norm_backward against ATen's native_layer_norm_backward (the input gradient).
    OpCase lnb{
        .name = std::string("layer_norm_backward_") + c.label,
        .ops = {"layer_norm_backward"},
        .dtypes = kFloatDTypes,
        .make =
            [xs, ns, affine](Gen& g) {
              KTensors in{g.any(xs), g.any(xs)};
              if (affine) in.push_back(g.uniform({ns}, 0.5, 1.5));
              return in;
            },
        .kiln =
            [ns, affine](const KArgs& x) {
              return KTensors{layer_norm_backward(x[0], x[1], ns, affine ? x[2] : Tensor(), 1e-5)};
            },
        .aten =
            [ns, affine](const AArgs& a) {
              at::Tensor w = affine ? a[2] : at::Tensor();
              auto fw = at::native_layer_norm(a[1], ns, w, at::Tensor(), 1e-5);
              auto bw =
                  at::native_layer_norm_backward(a[0], a[1], ns, std::get<1>(fw), std::get<2>(fw),
                                                 w, at::Tensor(), {true, false, false});
              return ATensors{std::get<0>(bw)};
            },
        .tol = Tol::Accum};
    cs.push_back(lnb);
    // layer_norm_fused_backward against native_layer_norm_backward's three gradients (ATen computes
    // the weight and bias gradients only for a given weight and bias: ones and zeros stand in), in
    // float64 and rounded once: ATen's float32 sums over the 6000 rows of "tall" drift by 1e-4.
    OpCase lng{.name = std::string("layer_norm_fused_backward_") + c.label,
               .ops = {"layer_norm_fused_backward"},
               .dtypes = kFloatDTypes,
               .make = lnb.make,
               .kiln =
                   [ns, affine](const KArgs& x) {
                     auto [gi, gw, gb] = layer_norm_fused_backward(
                         x[0], x[1], ns, affine ? x[2] : Tensor(), 1e-5, {1, 1, 1});
                     return KTensors{gi, gw, gb};
                   },
               .aten =
                   [ns, affine](const AArgs& a) {
                     const at::ScalarType dt = a[1].scalar_type();
                     at::Tensor g = a[0].to(at::kDouble), x = a[1].to(at::kDouble);
                     at::Tensor w = affine ? a[2].to(at::kDouble) : at::ones(ns, x.options());
                     at::Tensor b = at::zeros(ns, x.options());
                     auto fw = at::native_layer_norm(x, ns, w, b, 1e-5);
                     auto bw = at::native_layer_norm_backward(
                         g, x, ns, std::get<1>(fw), std::get<2>(fw), w, b, {true, true, true});
                     return ATensors{std::get<0>(bw).to(dt), std::get<1>(bw).to(dt),
                                     std::get<2>(bw).to(dt)};
                   },
               .tol = Tol::Accum};
    cs.push_back(lng);
    if (std::string(c.label) == "odd") {
      // eps 0: the CUDA kernel's padding rows (4 rows of 7 in a block of 8) have an infinite
      // rstd and must add nothing to the sums.
      OpCase eps0 = lng;
      eps0.name = "layer_norm_fused_backward_eps0";
      eps0.kiln = [ns](const KArgs& x) {
        auto [gi, gw, gb] = layer_norm_fused_backward(x[0], x[1], ns, x[2], 0.0, {1, 1, 1});
        return KTensors{gi, gw, gb};
      };
      eps0.aten = [ns](const AArgs& a) {
        at::Tensor g = a[0].to(at::kDouble), x = a[1].to(at::kDouble), w = a[2].to(at::kDouble);
        at::Tensor b = at::zeros(ns, x.options());
        auto fw = at::native_layer_norm(x, ns, w, b, 0.0);
        auto bw = at::native_layer_norm_backward(g, x, ns, std::get<1>(fw), std::get<2>(fw), w, b,
                                                 {true, true, true});
        const at::ScalarType dt = a[1].scalar_type();
        return ATensors{std::get<0>(bw).to(dt), std::get<1>(bw).to(dt), std::get<2>(bw).to(dt)};
      };
      cs.push_back(eps0);
    }
    // rms_norm: ATen 1.13 has none; the reference is x * rsqrt(mean(x^2) + eps) * w over the
    // normalized dims, computed in float32 for the 16-bit types and rounded once.
    OpCase rms{.name = std::string("rms_norm_") + c.label,
               .ops = {"rms_norm"},
               .dtypes = kFloatDTypes,
               .make = make,
               .kiln =
                   [ns, affine](const KArgs& x) {
                     return KTensors{affine ? rms_norm(x[0], ns, x[1], 1e-6) : rms_norm(x[0], ns)};
                   },
               .aten =
                   [ns, affine](const AArgs& a) {
                     at::ScalarType dt = a[0].scalar_type();
                     at::ScalarType acc = dt == at::kDouble ? at::kDouble : at::kFloat;
                     at::Tensor x = a[0].to(acc);
                     std::vector<int64_t> dims;
                     for (size_t i = 0; i < ns.size(); ++i) dims.push_back(x.dim() - 1 - i);
                     at::Tensor r = x * at::rsqrt(x.pow(2).mean(dims, true) + 1e-6);
                     if (affine) r = r * a[1].to(acc);
                     return ATensors{r.to(dt)};
                   },
               .tol = Tol::Accum};
    cs.push_back(rms);
    if (std::string(c.label) == "affine") {
      cs.push_back(out_variant(ln, "layer_norm_out", [ns](const KArgs& x) {
        ops::op_layer_norm_out(x.out, x[0], ns, x[1], x[2], 1e-5);
        return KTensors{x.out};
      }));
      cs.push_back(out_variant(lnb, "layer_norm_backward_out", [ns](const KArgs& x) {
        ops::op_layer_norm_backward_out(x.out, x[0], x[1], ns, x[2], 1e-5);
        return KTensors{x.out};
      }));
      // Only the weight's gradient: the others are not computed.
      OpCase only_w = lng;
      only_w.name = "layer_norm_fused_backward_weight_only";
      only_w.kiln = [ns](const KArgs& x) {
        auto [gi, gw, gb] = layer_norm_fused_backward(x[0], x[1], ns, x[2], 1e-5, {0, 1, 0});
        KILN_CHECK(!gi.defined() && !gb.defined(), "[test] unrequested gradients were computed");
        return KTensors{gw};
      };
      only_w.aten = [ns, aten = lng.aten](const AArgs& a) { return ATensors{aten(a)[1]}; };
      cs.push_back(only_w);
      cs.push_back(out_variant(rms, "rms_norm_out", [ns](const KArgs& x) {
        ops::op_rms_norm_out(x.out, x[0], ns, x[1], 1e-6);
        return KTensors{x.out};
      }));
    }
  }
  // clang-format off
  OpCase& ln_record = head(cs, "layer_norm");
  ln_record.grads = norm_grads(false);
  ln_record.errors = {{"layer_norm_shape", K::Value, "layer_norm", {"[2, 3]", "[4]"},
                       [](const Watch&) { layer_norm(f32({2, 3}), {4}); }}};
  head(cs, "layer_norm_backward").errors = {
      {"layer_norm_backward_shape", K::Value, "layer_norm_backward", {"[2, 4]", "[2, 3]"},
       [](const Watch&) { layer_norm_backward(f32({2, 4}), f32({2, 3}), {3}); }},
      {"layer_norm_backward_normalized_shape", K::Value, "layer_norm_backward", {"[4]"},
       [](const Watch&) { layer_norm_backward(f32({2, 3}), f32({2, 3}), {4}); }},
      {"layer_norm_backward_dtype", K::Type, "layer_norm_backward", {"float64", "float32"},
       [](const Watch&) { layer_norm_backward(ones({2, 3}, kFloat64), f32({2, 3}), {3}); }}};
  head(cs, "layer_norm_fused_backward").errors = {
      {"layer_norm_fused_backward_mask", K::Value, "layer_norm_fused_backward", {"output_mask", "3 flags"},
       [](const Watch&) { layer_norm_fused_backward(f32({2, 3}), f32({2, 3}), {3}, {}, 1e-5, {1, 1}); }},
      {"layer_norm_fused_backward_shape", K::Value, "layer_norm_fused_backward", {"[2, 4]", "[2, 3]"},
       [](const Watch&) { layer_norm_fused_backward(f32({2, 4}), f32({2, 3}), {3}, {}, 1e-5, {1, 1, 1}); }},
      {"layer_norm_fused_backward_weight", K::Value, "layer_norm_fused_backward", {"[4]", "[3]"},
       [](const Watch&) {
         layer_norm_fused_backward(f32({2, 3}), f32({2, 3}), {3}, f32({4}), 1e-5, {1, 1, 1});
       }}};
  head(cs, "rms_norm").grads = norm_grads(true);
  // clang-format on
}

void add_embedding_losses(Cases& cs) {
  struct EmbConfig {
    const char* label;
    Spec weight, index;
    DType index_dtype;
  };
  const std::vector<EmbConfig> configs = {
      {"2d_index", {{10, 4}, C}, {{2, 3}, C}, kInt64},
      {"int32_index", {{10, 4}, C}, {{7}, S}, kInt32},
      {"weight_t", {{10, 4}, T}, {{5}, C}, kInt64},
      {"0d_index", {{10, 4}, C}, {{}, C}, kInt64},
      {"zero_index", {{10, 4}, C}, {{0}, C}, kInt64},
      {"large", {{1000, 64}, C}, {{32, 40}, C}, kInt64},
  };
  for (const EmbConfig& c : configs) {
    EmbConfig cc = c;
    OpCase row{.name = std::string("embedding_") + c.label,
               .ops = {"embedding"},
               .dtypes = kAllDTypes,
               .make =
                   [cc](Gen& g) {
                     return KTensors{g.any(cc.weight),
                                     g.index(cc.index, cc.weight.shape[0], cc.index_dtype)};
                   },
               .kiln = [](const KArgs& x) { return KTensors{embedding(x[0], x[1])}; },
               .aten = [](const AArgs& a) { return ATensors{at::embedding(a[0], a[1])}; },
               .tol = Tol::Exact};
    cs.push_back(row);
    if (std::string(c.label) == "2d_index")
      cs.push_back(out_variant(row, "embedding_out", [](const KArgs& x) {
        ops::op_embedding_out(x.out, x[0], x[1], -1, false, false);
        return KTensors{x.out};
      }));
  }

  struct LossConfig {
    const char* label;
    Dims input;
    std::vector<int64_t> target;  // -100 is ignored by default
    int64_t ignore_index;
  };
  const std::vector<LossConfig> losses = {
      {"basic", {5, 4}, {0, 3, 1, 1, 2}, -100},
      {"ignored", {5, 4}, {0, -100, 3, -100, 2}, -100},
      {"ignore_2", {6, 3}, {2, 0, 2, 1, 2, 0}, 2},
      {"all_ignored", {3, 4}, {-100, -100, -100}, -100},
      {"1d", {4}, {2}, -100},
      {"large", {512, 100}, {}, -100},
  };
  for (const LossConfig& c : losses) {
    LossConfig lc = c;
    MakeFn make = [lc](Gen& g) {
      Tensor input = g.any({lc.input});
      if (lc.target.empty()) return KTensors{input, g.index({{lc.input[0]}}, lc.input[1])};
      std::vector<double> t(lc.target.begin(), lc.target.end());
      Dims ts = lc.input.size() == 1 ? Dims{} : Dims{static_cast<int64_t>(t.size())};
      return KTensors{input, g.values(t, ts, kInt64)};
    };
    int64_t ignore = c.ignore_index;
    OpCase nll{.name = std::string("nll_loss_") + c.label,
               .ops = {"nll_loss"},
               .dtypes = kFloatDTypes,
               .make = make,
               .kiln = [ignore](const KArgs& x) { return KTensors{nll_loss(x[0], x[1], ignore)}; },
               .aten =
                   [ignore](const AArgs& a) {
                     return ATensors{at::nll_loss(a[0], a[1], {}, at::Reduction::Mean, ignore)};
                   },
               .tol = Tol::Accum};
    cs.push_back(nll);
    if (std::string(c.label) == "ignored")
      cs.push_back(out_variant(nll, "nll_loss_out", [ignore](const KArgs& x) {
        ops::op_nll_loss_out(x.out, x[0], x[1], ignore);
        return KTensors{x.out};
      }));
    cs.push_back(
        {.name = std::string("cross_entropy_") + c.label,
         .ops = {"log_softmax", "nll_loss"},
         .dtypes = kFloatDTypes,
         .make = make,
         .kiln = [ignore](const KArgs& x) { return KTensors{cross_entropy(x[0], x[1], ignore)}; },
         // Kiln's composite rounds the log-probabilities to the input dtype.
         .aten =
             [ignore](const AArgs& a) {
               at::Tensor lp = round_to(at::log_softmax(a[0], -1), a.dtype);
               return ATensors{at::nll_loss(lp, a[1], {}, at::Reduction::Mean, ignore)};
             },
         .tol = Tol::Accum});
  }
  // clang-format off
  OpCase& emb_record = head(cs, "embedding");
  emb_record.grads = embedding_grads();
  emb_record.errors = {
      {"embedding_float_indices", K::Type, "embedding", {"float32"},
       [](const Watch&) { embedding(f32({10, 4}), f32({3})); }},
      {"embedding_index_value", K::Index, "embedding", {"10"},
       [](const Watch&) { embedding(f32({10, 4}), from_vector<int64_t>({3, 10})); }}};
  OpCase& nll_record = head(cs, "nll_loss");
  nll_record.grads = nll_loss_grads();
  nll_record.errors = {
      {"nll_loss_int32_target", K::Type, "nll_loss", {"int32"},
       [](const Watch&) { nll_loss(f32({4, 3}), zeros({4}, kInt32)); }},
      {"nll_loss_target_value", K::Index, "nll_loss", {"7"},
       [](const Watch&) { nll_loss(f32({2, 3}), from_vector<int64_t>({1, 7})); }}};
  // clang-format on
}

void add_dropout(Cases& cs) {
  // p = 0 and evaluation mode return the input; p = 1 zeroes everything.
  cs.push_back({.name = "dropout_p0",
                .ops = {},
                .dtypes = kFloatDTypes,
                .make = make_from({draw_any()}, {Spec{{4, 5}, T}}),
                .kiln = [](const KArgs& x) { return KTensors{dropout(x[0], 0.0)}; },
                .aten = [](const AArgs& a) { return ATensors{at::dropout(a[0], 0.0, true)}; },
                .tol = Tol::Exact});
  cs.push_back({.name = "dropout_eval",
                .ops = {},
                .dtypes = kFloatDTypes,
                .make = make_from({draw_any()}, {Spec{{4, 5}}}),
                .kiln = [](const KArgs& x) { return KTensors{dropout(x[0], 0.5, false)}; },
                .aten = [](const AArgs& a) { return ATensors{at::dropout(a[0], 0.5, false)}; },
                .tol = Tol::Exact});
  cs.push_back({.name = "dropout_p1",
                .ops = {"native_dropout"},
                .dtypes = kFloatDTypes,
                .make = make_from({draw_any()}, {Spec{{4, 5}, S}}),
                .kiln = [](const KArgs& x) { return KTensors{dropout(x[0], 1.0)}; },
                .aten = [](const AArgs& a) { return ATensors{at::dropout(a[0], 1.0, true)}; },
                .tol = Tol::Exact});
  // 0 < p < 1: every output is 0 or x / (1 - p), and about 1 - p of them are kept.
  for (double p : {0.1, 0.5, 0.8}) {
    cs.push_back({.name = fmt::format("dropout_frac{}", static_cast<int>(p * 100)),
                  .ops = {"native_dropout"},
                  .dtypes = kFloatDTypes,
                  .make = make_from({draw_positive()}, {Spec{{200, 500}, T}}),
                  .kiln =
                      [p](const KArgs& x) {
                        Generator gen(1234);
                        return KTensors{dropout(x[0], p, true, &gen)};
                      },
                  .check =
                      [p](const KArgs& x, const KTensors& got) {
                        ASSERT_EQ(got.size(), 1u);
                        ASSERT_EQ(got[0].dtype(), x[0].dtype());
                        ASSERT_EQ(vec(got[0].sizes()), vec(x[0].sizes()));
                        at::Tensor in = to_aten(x[0]).to(at::kDouble);
                        at::Tensor out = to_aten(got[0]).to(at::kDouble);
                        at::Tensor kept = out.ne(0);
                        // Kept values equal x / (1 - p) rounded to the dtype.
                        at::Tensor scaled = (in / (1 - p)).to(to_aten(x.dtype)).to(at::kDouble);
                        auto [rtol, atol] = tolerance(Tol::Default, x.dtype);
                        at::Tensor ok =
                            out.eq(0) | ((out - scaled).abs() <= atol + rtol * scaled.abs());
                        EXPECT_TRUE(ok.all().item<bool>())
                            << (~ok).sum().item<int64_t>() << " outputs are neither 0 nor x/(1-p)";
                        double frac = kept.to(at::kDouble).mean().item<double>();
                        EXPECT_NEAR(frac, 1 - p, 0.01) << "kept fraction";
                      }});
  }
  // Same generator state, same mask; a different seed, a different one.
  cs.push_back({.name = "dropout_seeded",
                .ops = {"native_dropout"},
                .dtypes = {kFloat32},
                .make = make_from({draw_positive()}, {Spec{{1000}}}),
                .kiln =
                    [](const KArgs& x) {
                      Generator a(7), b(7), c(8);
                      return KTensors{dropout(x[0], 0.5, true, &a), dropout(x[0], 0.5, true, &b),
                                      dropout(x[0], 0.5, true, &c)};
                    },
                .check =
                    [](const KArgs&, const KTensors& got) {
                      ASSERT_EQ(got.size(), 3u);
                      EXPECT_TRUE(compare(got[1], to_aten(got[0]), Tol::Exact)) << "same seed";
                      EXPECT_FALSE(at::equal(to_aten(got[0]), to_aten(got[2]))) << "other seed";
                    }});
  // dropout (the wrapper) checks p before native_dropout runs.
  head(cs, "native_dropout").grads = native_dropout_grads();
  head(cs, "native_dropout").errors = {
      {"dropout_bad_p", K::Value, "dropout", {"1.5"}, [](const Watch&) {
         dropout(f32({3}), 1.5);
       }}};
}

// softmax(q k^T * scale + mask) v, written out in ATen (1.13 has no fused attention op). Like
// Kiln's composite, each step's result has the inputs' dtype `dt` (see round_to).
at::Tensor sdpa_reference(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                          const at::Tensor& mask, bool causal, double scale, at::ScalarType dt) {
  at::Tensor s = round_to(at::matmul(q, k.transpose(-2, -1)), dt);
  s = round_to(s * round_to(scale, dt), dt);
  int64_t L = q.size(-2), S = k.size(-2);
  if (causal) {
    at::Tensor keep = at::ones({L, S}, at::kBool).tril();
    s = s.masked_fill(keep.logical_not(), -INFINITY);
  } else if (mask.defined()) {
    s = mask.scalar_type() == at::kBool ? s.masked_fill(mask.logical_not(), -INFINITY)
                                        : round_to(s + mask, dt);
  }
  return at::matmul(round_to(at::softmax(s, -1), dt), v);
}

void add_attention(Cases& cs) {
  struct SdpaConfig {
    const char* label;
    std::vector<Spec> in;  // q, k, v[, mask]
    bool causal;
    bool bool_mask;
    std::optional<double> scale;
  };
  const std::vector<SdpaConfig> configs = {
      {"basic", {{{2, 3, 4, 8}}, {{2, 3, 5, 8}}, {{2, 3, 5, 6}}}, false, false, {}},
      {"causal", {{{2, 2, 5, 8}}, {{2, 2, 5, 8}}, {{2, 2, 5, 4}}}, true, false, {}},
      {"causal_l_lt_s", {{{1, 2, 3, 8}}, {{1, 2, 5, 8}}, {{1, 2, 5, 8}}}, true, false, {}},
      {"bool_mask", {{{2, 3, 4, 8}}, {{2, 3, 5, 8}}, {{2, 3, 5, 6}}, {{4, 5}}}, false, true, {}},
      {"float_mask",
       {{{2, 3, 4, 8}}, {{2, 3, 5, 8}}, {{2, 3, 5, 6}}, {{2, 1, 4, 5}}},
       false,
       false,
       {}},
      {"scale", {{{2, 4, 8}}, {{2, 6, 8}}, {{2, 6, 8}}}, false, false, 0.5},
      {"noncontig", {{{2, 3, 4, 8}, T}, {{2, 3, 5, 8}, S}, {{2, 3, 5, 6}, T}}, true, false, {}},
      {"3d", {{{3, 4, 8}}, {{3, 4, 8}}, {{3, 4, 8}}}, false, false, {}},
      {"large", {{{2, 4, 128, 64}}, {{2, 4, 128, 64}}, {{2, 4, 128, 64}}}, true, false, {}},
  };
  for (const SdpaConfig& c : configs) {
    SdpaConfig sc = c;
    cs.push_back(
        {.name = std::string("sdpa_") + c.label,
         .ops = {"bmm", "softmax"},
         .dtypes = kFloatDTypes,
         .make =
             [sc](Gen& g) {
               KTensors in;
               for (size_t i = 0; i < 3; ++i) in.push_back(g.any(sc.in[i]));
               if (sc.in.size() == 4)
                 in.push_back(sc.bool_mask ? g.mask(sc.in[3]) : g.any(sc.in[3]));
               return in;
             },
         .kiln =
             [sc](const KArgs& x) {
               Tensor mask = x.in.size() == 4 ? x[3] : Tensor();
               return KTensors{
                   scaled_dot_product_attention(x[0], x[1], x[2], mask, sc.causal, sc.scale)};
             },
         .aten =
             [sc](const AArgs& a) {
               at::Tensor mask = a.in.size() == 4 ? a[3] : at::Tensor();
               double scale =
                   sc.scale.value_or(1.0 / std::sqrt(static_cast<double>(a[0].size(-1))));
               return ATensors{sdpa_reference(a[0], a[1], a[2], mask, sc.causal, scale, a.dtype)};
             },
         .tol = Tol::Intermediate16});
  }
}

// flash_attention's reference in float64 (its kernels sum in double and round once): the
// probabilities p, the output and the logsumexp of q k^T * scale, causal keys j > i masked.
struct AttentionRef {
  at::Tensor p, out, lse;
};
AttentionRef attention_reference(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                 bool causal, double scale) {
  at::Tensor s = at::matmul(q.to(at::kDouble), k.to(at::kDouble).transpose(-2, -1)) * scale;
  if (causal) {
    at::Tensor keep = at::ones({q.size(-2), k.size(-2)}, at::kBool).tril();
    s = s.masked_fill(keep.logical_not(), -INFINITY);
  }
  at::Tensor lse = at::logsumexp(s, {-1});
  at::Tensor p = at::exp(s - lse.unsqueeze(-1));
  return {p, at::matmul(p, v.to(at::kDouble)), lse};
}

void add_flash_attention(Cases& cs) {
  struct Config {
    const char* label;
    std::vector<Spec> in;  // q, k, v
    bool causal;
    std::optional<double> scale;
  };
  const std::vector<Config> configs = {
      {"basic", {{{2, 3, 4, 8}}, {{2, 3, 5, 8}}, {{2, 3, 5, 8}}}, false, {}},
      {"causal", {{{2, 2, 5, 8}}, {{2, 2, 5, 8}}, {{2, 2, 5, 8}}}, true, {}},
      {"causal_l_lt_s", {{{1, 2, 3, 8}}, {{1, 2, 5, 8}}, {{1, 2, 5, 8}}}, true, {}},
      {"causal_l_gt_s", {{{1, 2, 6, 8}}, {{1, 2, 4, 8}}, {{1, 2, 4, 8}}}, true, {}},
      {"2d", {{{4, 16}}, {{7, 16}}, {{7, 16}}}, false, 0.3},
      {"noncontig", {{{2, 3, 4, 8}, T}, {{2, 3, 5, 8}, S}, {{2, 3, 5, 8}, T}}, true, {}},
      {"tiles", {{{1, 2, 70, 40}}, {{1, 2, 70, 40}}, {{1, 2, 70, 40}}}, true, {}},
  };
  for (const Config& c : configs) {
    Config fc = c;
    auto scale_of = [fc](int64_t e) {
      return fc.scale.value_or(1.0 / std::sqrt(static_cast<double>(e)));
    };
    cs.push_back({.name = std::string("flash_attention_") + c.label,
                  .ops = {"flash_attention"},
                  .dtypes = kFloatDTypes,
                  .make =
                      [fc](Gen& g) {
                        return KTensors{g.any(fc.in[0]), g.any(fc.in[1]), g.any(fc.in[2])};
                      },
                  .kiln =
                      [fc](const KArgs& x) {
                        auto [out, lse] = flash_attention(x[0], x[1], x[2], fc.causal, fc.scale);
                        return KTensors{out, lse};
                      },
                  .aten =
                      [fc, scale_of](const AArgs& a) {
                        AttentionRef r = attention_reference(a[0], a[1], a[2], fc.causal,
                                                             scale_of(a[0].size(-1)));
                        at::ScalarType st =
                            a[0].scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
                        return ATensors{r.out.to(a[0].scalar_type()), r.lse.to(st)};
                      },
                  // 16-bit kernels (CUDA) round the probabilities before multiplying by v.
                  .tol = Tol::Intermediate16});
    // The backward from the forward's own (rounded) output, as autograd calls it.
    cs.push_back(
        {.name = std::string("flash_attention_backward_") + c.label,
         .ops = {"flash_attention_backward"},
         .dtypes = kFloatDTypes,
         .make =
             [fc](Gen& g) {
               return KTensors{g.any(fc.in[0]), g.any(fc.in[1]), g.any(fc.in[2]),
                               g.any({fc.in[0].shape})};
             },
         .kiln =
             [fc](const KArgs& x) {
               auto [out, lse] = flash_attention(x[0], x[1], x[2], fc.causal, fc.scale);
               auto [dq, dk, dv] =
                   flash_attention_backward(x[3], x[0], x[1], x[2], out, lse, fc.causal, fc.scale);
               return KTensors{dq, dk, dv};
             },
         .aten =
             [fc, scale_of](const AArgs& a) {
               double scale = scale_of(a[0].size(-1));
               AttentionRef r = attention_reference(a[0], a[1], a[2], fc.causal, scale);
               at::Tensor g = a[3].to(at::kDouble);
               at::Tensor q = a[0].to(at::kDouble), k = a[1].to(at::kDouble),
                          v = a[2].to(at::kDouble);
               // D from the output as the forward rounded it, as the kernels see it.
               at::Tensor o = round_to(r.out.to(a[0].scalar_type()), a.dtype).to(at::kDouble);
               at::Tensor ds = r.p * (at::matmul(g, v.transpose(-2, -1)) - (g * o).sum({-1}, true));
               at::ScalarType t = a[0].scalar_type();
               return ATensors{(at::matmul(ds, k) * scale).to(t),
                               (at::matmul(ds.transpose(-2, -1), q) * scale).to(t),
                               at::matmul(r.p.transpose(-2, -1), g).to(t)};
             },
         .tol = Tol::Intermediate16});
  }
  // clang-format off
  OpCase& fa_record = head(cs, "flash_attention");
  fa_record.grads = flash_attention_grads();
  fa_record.errors = {
      {"flash_attention_embedding_mismatch", K::Value, "flash_attention", {"8", "4"},
       [](const Watch&) { flash_attention(f32({2, 3, 8}), f32({2, 3, 4}), f32({2, 3, 4})); }},
      {"flash_attention_batch_mismatch", K::Value, "flash_attention", {"[2, 3, 8]", "[3, 3, 8]"},
       [](const Watch&) { flash_attention(f32({2, 3, 8}), f32({3, 3, 8}), f32({3, 3, 8})); }},
      {"flash_attention_dtype_mismatch", K::Type, "flash_attention", {"float32", "float64"},
       [](const Watch&) { flash_attention(f32({3, 8}), f32({3, 8}), ones({3, 8}, kFloat64)); }},
      {"flash_attention_int", K::Type, "flash_attention", {"int64"},
       [](const Watch&) { flash_attention(i64({3, 8}), i64({3, 8}), i64({3, 8})); }},
      {"flash_attention_no_keys", K::Value, "flash_attention", {"[0, 8]"},
       [](const Watch&) { flash_attention(f32({3, 8}), f32({0, 8}), f32({0, 8})); }},
      {"flash_attention_bad_scale", K::Value, "flash_attention", {"inf"},
       [](const Watch&) {
         flash_attention(f32({3, 8}), f32({3, 8}), f32({3, 8}), false, INFINITY);
       }}};
  head(cs, "flash_attention_backward").errors = {
      {"flash_attention_backward_lse_shape", K::Value, "flash_attention_backward", {"[3]", "[4]"},
       [](const Watch&) {
         flash_attention_backward(f32({3, 8}), f32({3, 8}), f32({3, 8}), f32({3, 8}),
                                  f32({3, 8}), f32({4}));
       }},
      {"flash_attention_backward_lse_dtype", K::Type, "flash_attention_backward",
       {"float32", "float64"},
       [](const Watch&) {
         flash_attention_backward(f32({3, 8}), f32({3, 8}), f32({3, 8}), f32({3, 8}),
                                  f32({3, 8}), ones({3}, kFloat64));
       }}};
  // clang-format on
}

}  // namespace

// Note [GELU epilogue]: (gelu_tanh(z), z) for z = mat1 @ mat2 + bias. For 16-bit rows the
// reference rounds z to the dtype before gelu, as the unfused path does; cuBLASLt's fused
// epilogue does not (Tol::Intermediate16).
void add_addmm_gelu(Cases& cs) {
  struct Config {
    const char* label;
    std::vector<Spec> in;  // mat1, mat2[, bias]
  };
  const std::vector<Config> configs = {
      {"bias", {{{3, 4}, C}, {{4, 5}, C}, {{5}, C}}},
      {"no_bias", {{{3, 4}, C}, {{4, 5}, C}}},
      {"weight_t", {{{6, 16}, S}, {{16, 24}, T}, {{24}, C}}},
      {"n8", {{{6, 16}, C}, {{16, 24}, C}, {{24}, S}}},
      {"large", {{{64, 256}, C}, {{256, 128}, T}, {{128}, C}}},
      {"zero_rows", {{{0, 4}, C}, {{4, 8}, C}, {{8}, C}}},
      {"zero_k", {{{3, 0}, C}, {{0, 8}, C}, {{8}, C}}},
  };
  auto reference = [](const at::Tensor& m1, const at::Tensor& m2, const at::Tensor& bias,
                      at::ScalarType dtype) {
    at::Tensor z = round_to(bias.defined() ? at::addmm(bias, m1, m2) : at::mm(m1, m2), dtype);
    return ATensors{at::gelu(z, "tanh"), z};
  };
  for (const Config& c : configs) {
    bool bias = c.in.size() == 3;
    cs.push_back({.name = std::string("addmm_gelu_") + c.label,
                  .ops = {"addmm_gelu"},
                  .dtypes = kFloatDTypes,
                  .make = specs(c.in),
                  .kiln =
                      [bias](const KArgs& x) {
                        auto [out, z] = addmm_gelu(bias ? x[2] : Tensor(), x[0], x[1]);
                        return KTensors{out, z};
                      },
                  .aten =
                      [bias, reference](const AArgs& a) {
                        return reference(a[0], a[1], bias ? a[2] : at::Tensor(), a.dtype);
                      },
                  .tol = Tol::Intermediate16});
  }
  // linear_gelu: x [..., in], weight [out, in].
  cs.push_back({.name = "linear_gelu_3d",
                .ops = {"addmm_gelu"},
                .dtypes = kFloatDTypes,
                .make = specs({{{2, 3, 16}, C}, {{8, 16}, C}, {{8}, C}}),
                .kiln = [](const KArgs& x) { return KTensors{linear_gelu(x[0], x[1], x[2])}; },
                .aten =
                    [reference](const AArgs& a) {
                      at::Tensor x2 = a[0].reshape({-1, 16});
                      at::Tensor y = reference(x2, a[1].t(), a[2], a.dtype)[0];
                      return ATensors{y.reshape({2, 3, 8})};
                    },
                .tol = Tol::Intermediate16});
  // clang-format off
  OpCase& record = head(cs, "addmm_gelu");
  record.grads = addmm_gelu_grads();
  record.errors = {
      {"addmm_gelu_inner_mismatch", K::Value, "addmm_gelu", {"[3, 4]", "[5, 6]"},
       [](const Watch&) { addmm_gelu(f32({6}), f32({3, 4}), f32({5, 6})); }},
      {"addmm_gelu_1d", K::Value, "addmm_gelu", {"[4]"},
       [](const Watch&) { addmm_gelu(Tensor(), f32({4}), f32({4, 6})); }},
      {"addmm_gelu_int", K::Type, "addmm_gelu", {"int64"},
       [](const Watch&) { addmm_gelu(Tensor(), i64({3, 4}), i64({4, 6})); }},
      {"addmm_gelu_bias_size", K::Value, "addmm_gelu", {"6", "[5]"},
       [](const Watch&) { addmm_gelu(f32({5}), f32({3, 4}), f32({4, 6})); }},
      {"addmm_gelu_bias_dtype", K::Type, "addmm_gelu", {"float32", "float64"},
       [](const Watch&) { addmm_gelu(ones({6}, kFloat64), f32({3, 4}), f32({4, 6})); }},
      // linear_gelu, its wrapper, checks its weight and bias under its own name.
      {"linear_gelu_weight_mismatch", K::Value, "linear_gelu", {"4", "[6, 5]"},
       [](const Watch&) { linear_gelu(f32({3, 4}), f32({6, 5})); }},
      {"linear_gelu_bias_size", K::Value, "linear_gelu", {"6", "[5]"},
       [](const Watch&) { linear_gelu(f32({3, 4}), f32({6, 4}), f32({5})); }}};
  // clang-format on
}

Cases linalg_nn_cases() {
  Cases cs;
  add_mm(cs);
  add_matmul_linear(cs);
  add_norms(cs);
  add_embedding_losses(cs);
  add_dropout(cs);
  add_attention(cs);
  add_flash_attention(cs);
  add_addmm_gelu(cs);
  add_convolution(cs);
  add_pooling(cs);
  add_pad_upsample(cs);
  add_norm(cs);
  return cs;
}

}  // namespace kiln::test

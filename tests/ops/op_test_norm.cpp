// Op table: batch norm (native_batch_norm_legit in training and eval, its no_stats and
// no_training forms, native_batch_norm_backward), native_group_norm, native_layer_norm and
// their backward ops, on 2-D to 5-D inputs with and without affine parameters, against
// at::native_batch_norm (libtorch 1.13 lacks _native_batch_norm_legit), at::native_group_norm
// and at::native_layer_norm and their backward ops. Running stats are compared after the call.
// Statistics sum in another order than ATen's: Tol::Accum (16-bit: Intermediate16).
#include "tests/ops/op_test_util.h"

namespace kiln::test {
namespace {

const std::vector<DType> kF32F64 = {kFloat32, kFloat64};
const std::vector<DType> k16 = {kFloat16, kBFloat16};

struct BnConfig {
  const char* label;
  Dims x;
  bool affine;
  Layout layout = Layout::Contig;
};
const std::vector<BnConfig>& bn_configs() {
  static const std::vector<BnConfig> c = {
      {"2d", {6, 3}, true},
      {"3d", {2, 3, 5}, false},
      {"4d", {3, 4, 3, 5}, true},
      {"4d_noaffine", {2, 3, 4, 4}, false},
      {"4d_transposed", {2, 3, 4, 5}, true, Layout::Transposed},
      {"5d", {2, 2, 3, 2, 3}, true},
  };
  return c;
}

constexpr double kMomentum = 0.3, kEps = 1e-4;

// Whether the case's dtype is a 16-bit float (the reference runs on float32 copies of the
// inputs, so the inputs' dtypes do not tell).
bool half(const AArgs& a) { return a.dtype == at::kHalf || a.dtype == at::kBFloat16; }

at::Tensor opt(const AArgs& a, size_t i, bool on) { return on ? a[i] : at::Tensor(); }
Tensor opt(const KArgs& x, size_t i, bool on) { return on ? x[i] : Tensor(); }

// Inputs: x, weight, bias, running_mean, running_var (params in `pdt`, or the row's dtype).
KTensors bn_inputs(Gen& g, const BnConfig& c, std::optional<DType> pdt = {}) {
  const Dims ch{c.x[1]};
  return {g.any({c.x, c.layout}), g.any({ch}, pdt), g.any({ch}, pdt), g.any({ch}, pdt),
          g.positive({ch}, pdt)};
}

// native_batch_norm_legit in training: out, save_mean, save_rstd, and the running stats after.
void add_batch_norm_rows(Cases& cs) {
  for (const BnConfig& c : bn_configs()) {
    const BnConfig fc = c;
    auto kiln_train = [fc](const KArgs& x, bool stats_out) {
      Tensor rm = clone(x[3]), rv = clone(x[4]);
      auto [out, sm, sr] = native_batch_norm_legit(x[0], opt(x, 1, fc.affine), opt(x, 2, fc.affine),
                                                   rm, rv, true, kMomentum, kEps);
      return stats_out ? KTensors{out, sm, sr, rm, rv} : KTensors{out, rm, rv};
    };
    auto aten_train = [fc](const AArgs& a, bool stats_out) {
      at::Tensor rm = a[3].clone(), rv = a[4].clone();
      auto [out, sm, sr] = at::native_batch_norm(a[0], opt(a, 1, fc.affine), opt(a, 2, fc.affine),
                                                 rm, rv, true, kMomentum, kEps);
      return stats_out ? ATensors{out, sm, sr, rm, rv} : ATensors{out, rm, rv};
    };
    cs.push_back({.name = std::string("native_batch_norm_legit_train_") + c.label,
                  .ops = {"native_batch_norm_legit"},
                  .dtypes = kF32F64,
                  .make = [fc](Gen& g) { return bn_inputs(g, fc); },
                  .kiln = [=](const KArgs& x) { return kiln_train(x, true); },
                  .aten = [=](const AArgs& a) { return aten_train(a, true); },
                  .tol = Tol::Accum});
    cs.push_back({.name = std::string("native_batch_norm_legit_train16_") + c.label,
                  .ops = {"native_batch_norm_legit"},
                  .dtypes = k16,
                  .make = [fc](Gen& g) { return bn_inputs(g, fc); },
                  .kiln = [=](const KArgs& x) { return kiln_train(x, false); },
                  .aten = [=](const AArgs& a) { return aten_train(a, false); },
                  .tol = Tol::Intermediate16});
    // Eval through the legit op (training false) and the no_training op: running stats read,
    // not written; save_mean and save_rstd empty.
    cs.push_back({.name = std::string("native_batch_norm_legit_eval_") + c.label,
                  .ops = {"native_batch_norm_legit", "native_batch_norm_legit_no_training"},
                  .dtypes = kFloatDTypes,
                  .make = [fc](Gen& g) { return bn_inputs(g, fc); },
                  .kiln =
                      [fc](const KArgs& x) {
                        auto [out, sm, sr] = native_batch_norm_legit(x[0], opt(x, 1, fc.affine),
                                                                     opt(x, 2, fc.affine), x[3],
                                                                     x[4], false, kMomentum, kEps);
                        auto [out2, sm2, sr2] = native_batch_norm_legit_no_training(
                            x[0], opt(x, 1, fc.affine), opt(x, 2, fc.affine), x[3], x[4], kMomentum,
                            kEps);
                        EXPECT_EQ(sm.numel(), 0);
                        EXPECT_EQ(sr2.numel(), 0);
                        return KTensors{out, out2, x[3], x[4]};
                      },
                  .aten =
                      [fc](const AArgs& a) {
                        at::Tensor out = std::get<0>(
                            at::native_batch_norm(a[0], opt(a, 1, fc.affine), opt(a, 2, fc.affine),
                                                  a[3], a[4], false, kMomentum, kEps));
                        return ATensors{out, out, a[3], a[4]};
                      },
                  .tol = Tol::Intermediate16});
  }
  // No running stats: the batch's statistics, nothing to update.
  cs.push_back({.name = "native_batch_norm_legit_no_stats_4d",
                .ops = {"native_batch_norm_legit_no_stats"},
                .dtypes = kF32F64,
                .make =
                    [](Gen& g) {
                      return KTensors{g.any({{3, 2, 4, 3}}), g.any({{2}}), g.any({{2}})};
                    },
                .kiln =
                    [](const KArgs& x) {
                      auto [out, sm, sr] =
                          native_batch_norm_legit(x[0], x[1], x[2], true, 0.1, 1e-5);
                      return KTensors{out, sm, sr};
                    },
                .aten =
                    [](const AArgs& a) {
                      auto [out, sm, sr] =
                          at::native_batch_norm(a[0], a[1], a[2], {}, {}, true, 0.1, 1e-5);
                      return ATensors{out, sm, sr};
                    },
                .tol = Tol::Accum});
  // Mixed dtype: a 16-bit input with float32 weight, bias and running stats (ATen's mixed
  // batch norm); the running stats stay float32.
  cs.push_back({.name = "native_batch_norm_legit_mixed",
                .ops = {"native_batch_norm_legit"},
                .dtypes = k16,
                .make =
                    [](Gen& g) {
                      return bn_inputs(g, {"", {4, 3, 5}, true}, kFloat32);
                    },
                .kiln =
                    [](const KArgs& x) {
                      Tensor rm = clone(x[3]), rv = clone(x[4]);
                      auto [out, sm, sr] =
                          native_batch_norm_legit(x[0], x[1], x[2], rm, rv, true, 0.1, 1e-5);
                      EXPECT_EQ(sm.dtype(), kFloat32);
                      EXPECT_EQ(rm.dtype(), kFloat32);
                      return KTensors{out};
                    },
                .aten =
                    [](const AArgs& a) {
                      at::Tensor x = a[0].to(at::kFloat), rm = a[3].clone(), rv = a[4].clone();
                      return ATensors{
                          std::get<0>(at::native_batch_norm(x, a[1], a[2], rm, rv, true, 0.1, 1e-5))
                              .to(a[0].scalar_type())};
                    },
                .tol = Tol::Intermediate16});
  // The functional form, as torch.nn.functional.batch_norm.
  cs.push_back({.name = "native_batch_norm_legit_functional",
                .ops = {"native_batch_norm_legit_no_training", "native_batch_norm_legit"},
                .dtypes = kF32F64,
                .make =
                    [](Gen& g) {
                      return bn_inputs(g, {"", {5, 3, 4}, true});
                    },
                .kiln =
                    [](const KArgs& x) {
                      Tensor rm = clone(x[3]), rv = clone(x[4]);
                      Tensor t = batch_norm(x[0], rm, rv, x[1], x[2], true, 0.2, 1e-3);
                      Tensor e = batch_norm(x[0], rm, rv, x[1], x[2], false, 0.2, 1e-3);
                      return KTensors{t, e, rm, rv};
                    },
                .aten =
                    [](const AArgs& a) {
                      at::Tensor rm = a[3].clone(), rv = a[4].clone();
                      at::Tensor t =
                          at::batch_norm(a[0], a[1], a[2], rm, rv, true, 0.2, 1e-3, false);
                      at::Tensor e =
                          at::batch_norm(a[0], a[1], a[2], rm, rv, false, 0.2, 1e-3, false);
                      return ATensors{t, e, rm, rv};
                    },
                .tol = Tol::Accum});

  // Backward, training (save_mean/save_invstd given) and eval (running stats given).
  for (bool train : {true, false}) {
    for (const BnConfig& c : bn_configs()) {
      const BnConfig fc = c;
      cs.push_back({.name = std::string("native_batch_norm_backward_") +
                            (train ? "train_" : "eval_") + c.label,
                    .ops = {"native_batch_norm_backward"},
                    .dtypes = kFloatDTypes,
                    .make =
                        [fc](Gen& g) {
                          const Dims ch{fc.x[1]};
                          const DType s = g.dtype == kFloat64 ? kFloat64 : kFloat32;
                          return KTensors{g.any({fc.x}), g.any({fc.x, fc.layout}), g.any({ch}, s),
                                          g.any({ch}, s), g.positive({ch}, s)};
                        },
                    .kiln =
                        [fc, train](const KArgs& x) {
                          auto [gi, gw, gb] = native_batch_norm_backward(
                              x[0], x[1], opt(x, 2, fc.affine), train ? Tensor() : x[3],
                              train ? Tensor() : x[4], train ? x[3] : Tensor(),
                              train ? x[4] : Tensor(), train, kEps, {1, fc.affine, fc.affine});
                          if (x[1].itemsize() == 2 || !fc.affine) return KTensors{gi};
                          return KTensors{gi, gw, gb};
                        },
                    .aten =
                        [fc, train](const AArgs& a) {
                          at::Tensor x = a[1].to(a[3].scalar_type()), g = a[0].to(x.scalar_type());
                          auto [gi, gw, gb] = at::native_batch_norm_backward(
                              g, x, opt(a, 2, fc.affine), train ? at::Tensor() : a[3],
                              train ? at::Tensor() : a[4], train ? a[3] : at::Tensor(),
                              train ? a[4] : at::Tensor(), train, kEps,
                              {true, fc.affine, fc.affine});
                          if (half(a) || !fc.affine) return ATensors{gi.to(a[1].scalar_type())};
                          return ATensors{gi.to(a[1].scalar_type()), gw, gb};
                        },
                    .tol = Tol::Intermediate16});
    }
  }
  cs.push_back({.name = "native_batch_norm_backward_mask",
                .ops = {"native_batch_norm_backward"},
                .dtypes = kF32F64,
                .make =
                    [](Gen& g) {
                      return KTensors{g.any({{4, 3, 5}}), g.any({{4, 3, 5}}), g.any({{3}}),
                                      g.any({{3}}), g.positive({{3}})};
                    },
                .kiln =
                    [](const KArgs& x) {
                      auto [gi, gw, gb] = native_batch_norm_backward(x[0], x[1], x[2], {}, {}, x[3],
                                                                     x[4], true, kEps, {0, 1, 0});
                      EXPECT_FALSE(gi.defined());
                      EXPECT_FALSE(gb.defined());
                      return KTensors{gw};
                    },
                .aten =
                    [](const AArgs& a) {
                      return ATensors{std::get<1>(at::native_batch_norm_backward(
                          a[0], a[1], a[2], {}, {}, a[3], a[4], true, kEps, {false, true, false}))};
                    },
                .tol = Tol::Accum});
}

struct GnConfig {
  const char* label;
  Dims x;
  int64_t groups;
  bool affine;
};
const std::vector<GnConfig>& gn_configs() {
  static const std::vector<GnConfig> c = {
      {"2d", {3, 6}, 3, true},          {"3d", {2, 4, 5}, 2, false},
      {"4d", {2, 6, 3, 4}, 3, true},    {"4d_one_group", {2, 4, 3, 3}, 1, true},
      {"5d", {2, 4, 2, 3, 2}, 4, true},
  };
  return c;
}
int64_t hw_of(const Dims& x) {
  int64_t n = 1;
  for (size_t i = 2; i < x.size(); ++i) n *= x[i];
  return n;
}

void add_group_norm_rows(Cases& cs) {
  for (const GnConfig& c : gn_configs()) {
    const GnConfig fc = c;
    const int64_t N = c.x[0], C = c.x[1], HW = hw_of(c.x);
    cs.push_back({.name = std::string("native_group_norm_") + c.label,
                  .ops = {"native_group_norm"},
                  .dtypes = kFloatDTypes,
                  .make =
                      [fc](Gen& g) {
                        return KTensors{g.any({fc.x}), g.any({{fc.x[1]}}), g.any({{fc.x[1]}})};
                      },
                  .kiln =
                      [=](const KArgs& x) {
                        auto [out, m, r] =
                            native_group_norm(x[0], opt(x, 1, fc.affine), opt(x, 2, fc.affine), N,
                                              C, HW, fc.groups, kEps);
                        return KTensors{out, m, r};
                      },
                  .aten =
                      [=](const AArgs& a) {
                        auto [out, m, r] =
                            at::native_group_norm(a[0], opt(a, 1, fc.affine), opt(a, 2, fc.affine),
                                                  N, C, HW, fc.groups, kEps);
                        // ATen's CPU kernel returns mean and rstd in the input's dtype.
                        if (half(a)) return ATensors{out, m.to(a.dtype), r.to(a.dtype)};
                        return ATensors{out, m, r};
                      },
                  .tol = Tol::Intermediate16});
    cs.push_back({.name = std::string("native_group_norm_backward_") + c.label,
                  .ops = {"native_group_norm_backward"},
                  .dtypes = kF32F64,
                  .make =
                      [fc](Gen& g) {
                        const Dims st{fc.x[0], fc.groups};
                        return KTensors{g.any({fc.x}), g.any({fc.x}), g.any({st}), g.positive({st}),
                                        g.any({{fc.x[1]}})};
                      },
                  .kiln =
                      [=](const KArgs& x) {
                        auto [gi, gw, gb] = native_group_norm_backward(
                            x[0], x[1], x[2], x[3], opt(x, 4, fc.affine), N, C, HW, fc.groups,
                            {1, fc.affine, fc.affine});
                        return fc.affine ? KTensors{gi, gw, gb} : KTensors{gi};
                      },
                  .aten =
                      [=](const AArgs& a) {
                        auto [gi, gw, gb] = at::native_group_norm_backward(
                            a[0], a[1], a[2], a[3], opt(a, 4, fc.affine), N, C, HW, fc.groups,
                            {true, fc.affine, fc.affine});
                        return fc.affine ? ATensors{gi, gw, gb} : ATensors{gi};
                      },
                  .tol = Tol::Accum});
  }
  cs.push_back(
      {.name = "native_group_norm_functional",
       .ops = {"native_group_norm"},
       .dtypes = kF32F64,
       .make =
           [](Gen& g) {
             return KTensors{g.any({{2, 6, 5}}), g.any({{6}}), g.any({{6}})};
           },
       .kiln = [](const KArgs& x) { return KTensors{group_norm(x[0], 2, x[1], x[2])}; },
       .aten = [](const AArgs& a) { return ATensors{at::group_norm(a[0], 2, a[1], a[2])}; },
       .tol = Tol::Accum});
}

struct LnConfig {
  const char* label;
  Dims x, shape;
  bool affine;
};
const std::vector<LnConfig>& ln_configs() {
  static const std::vector<LnConfig> c = {
      {"1d", {7}, {7}, true},
      {"2d", {4, 6}, {6}, true},
      {"3d_two_dims", {2, 3, 5}, {3, 5}, true},
      {"3d_noaffine", {3, 2, 8}, {8}, false},
  };
  return c;
}
Shape ln_stat(const LnConfig& c) {
  Shape s;
  for (size_t i = 0; i < c.x.size(); ++i) s.push_back(i < c.x.size() - c.shape.size() ? c.x[i] : 1);
  return s;
}

void add_layer_norm_rows(Cases& cs) {
  for (const LnConfig& c : ln_configs()) {
    const LnConfig fc = c;
    cs.push_back({.name = std::string("native_layer_norm_") + c.label,
                  .ops = {"native_layer_norm"},
                  .dtypes = kFloatDTypes,
                  .make =
                      [fc](Gen& g) {
                        return KTensors{g.any({fc.x}), g.any({fc.shape}), g.any({fc.shape})};
                      },
                  .kiln =
                      [fc](const KArgs& x) {
                        auto [out, m, r] = native_layer_norm(x[0], fc.shape, opt(x, 1, fc.affine),
                                                             opt(x, 2, fc.affine), kEps);
                        return KTensors{out, m, r};
                      },
                  .aten =
                      [fc](const AArgs& a) {
                        auto [out, m, r] = at::native_layer_norm(
                            a[0], fc.shape, opt(a, 1, fc.affine), opt(a, 2, fc.affine), kEps);
                        // ATen's CPU kernel returns mean and rstd in the input's dtype.
                        if (half(a)) return ATensors{out, m.to(a.dtype), r.to(a.dtype)};
                        return ATensors{out, m, r};
                      },
                  .tol = Tol::Intermediate16});
    if (!c.affine) continue;  // ATen's backward needs weight and bias for their gradients
    cs.push_back({.name = std::string("native_layer_norm_backward_") + c.label,
                  .ops = {"native_layer_norm_backward"},
                  .dtypes = kF32F64,
                  .make =
                      [fc](Gen& g) {
                        Shape st = ln_stat(fc);
                        Dims sd(st.begin(), st.end());
                        return KTensors{g.any({fc.x}),    g.any({fc.x}),     g.any({sd}),
                                        g.positive({sd}), g.any({fc.shape}), g.any({fc.shape})};
                      },
                  .kiln =
                      [fc](const KArgs& x) {
                        auto [gi, gw, gb] = native_layer_norm_backward(x[0], x[1], fc.shape, x[2],
                                                                       x[3], x[4], x[5], {1, 1, 1});
                        return KTensors{gi, gw, gb};
                      },
                  .aten =
                      [fc](const AArgs& a) {
                        auto [gi, gw, gb] = at::native_layer_norm_backward(
                            a[0], a[1], fc.shape, a[2], a[3], a[4], a[5], {true, true, true});
                        return ATensors{gi, gw, gb};
                      },
                  .tol = Tol::Accum});
  }
}

GradSamples norm_grads() {
  GradSamples gs;
  gs.push_back({"batch_norm_train_4d",
                {"native_batch_norm_legit"},
                [](GradGen& d) {
                  return TensorList{d.var({3, 2, 3, 2}), d.var({2}), d.var({2})};
                },
                [](const TensorList& x) {
                  Tensor rm = zeros({2}, kFloat64), rv = ones({2}, kFloat64);
                  return TensorList{std::get<0>(
                      native_batch_norm_legit(x[0], x[1], x[2], rm, rv, true, 0.1, 1e-5))};
                }});
  gs.push_back({"batch_norm_train_2d_noaffine",
                {"native_batch_norm_legit_no_stats"},
                [](GradGen& d) {
                  return TensorList{d.var({5, 3})};
                },
                [](const TensorList& x) {
                  return TensorList{
                      std::get<0>(native_batch_norm_legit(x[0], {}, {}, true, 0.1, 1e-5))};
                }});
  gs.push_back({"batch_norm_eval_3d",
                {"native_batch_norm_legit_no_training"},
                [](GradGen& d) {
                  return TensorList{d.var({2, 3, 4}), d.var({3}), d.var({3}), d.fixed({3})};
                },
                [](const TensorList& x) {
                  return TensorList{std::get<0>(native_batch_norm_legit_no_training(
                      x[0], x[1], x[2], x[3], full({3}, 1.7, kFloat64), 0.1, 1e-5))};
                }});
  gs.push_back({"batch_norm_eval_legit",
                {"native_batch_norm_legit"},
                [](GradGen& d) {
                  return TensorList{d.var({3, 2, 2}), d.var({2}), d.fixed({2})};
                },
                [](const TensorList& x) {
                  return TensorList{std::get<0>(native_batch_norm_legit(
                      x[0], x[1], {}, x[2], full({2}, 0.6, kFloat64), false, 0.1, 1e-5))};
                }});
  gs.push_back({"group_norm_4d",
                {"native_group_norm"},
                [](GradGen& d) {
                  return TensorList{d.var({2, 4, 2, 3}), d.var({4}), d.var({4})};
                },
                [](const TensorList& x) { return TensorList{group_norm(x[0], 2, x[1], x[2])}; }});
  gs.push_back({"group_norm_3d_noaffine",
                {"native_group_norm"},
                [](GradGen& d) {
                  return TensorList{d.var({3, 6, 2})};
                },
                [](const TensorList& x) { return TensorList{group_norm(x[0], 3)}; }});
  gs.push_back({"native_layer_norm_3d",
                {"native_layer_norm"},
                [](GradGen& d) {
                  return TensorList{d.var({2, 3, 4}), d.var({3, 4}), d.var({3, 4})};
                },
                [](const TensorList& x) {
                  return TensorList{std::get<0>(native_layer_norm(x[0], {3, 4}, x[1], x[2], 1e-5))};
                }});
  gs.push_back({"native_layer_norm_noaffine",
                {"native_layer_norm"},
                [](GradGen& d) {
                  return TensorList{d.var({4, 5})};
                },
                [](const TensorList& x) {
                  return TensorList{std::get<0>(native_layer_norm(x[0], {5}, {}, {}, 1e-5))};
                }});
  return gs;
}

}  // namespace

void add_norm(Cases& cs) {
  add_batch_norm_rows(cs);
  add_group_norm_rows(cs);
  add_layer_norm_rows(cs);

  // clang-format off
  OpCase& bn = head(cs, "native_batch_norm_legit");
  bn.grads = norm_grads();
  auto bn_call = [](const Tensor& x, const Tensor& w, const Tensor& rm, const Tensor& rv,
                    bool training = true) {
    native_batch_norm_legit(x, w, {}, rm, rv, training, 0.1, 1e-5);
  };
  bn.errors = {
      {"batch_norm_weight_channels", K::Value, "batch_norm", {"weight", "[3]", "[4]"},
       [=](const Watch& watch) {
         Tensor rm = zeros({3}), rv = ones({3});
         watch(rm); watch(rv);
         bn_call(f32({2, 3, 4}), f32({4}), rm, rv);
       }},
      {"batch_norm_running_mean_channels", K::Value, "batch_norm", {"running_mean", "[3]", "[2]"},
       [=](const Watch& watch) {
         Tensor rm = zeros({2}), rv = ones({3});
         watch(rm); watch(rv);
         bn_call(f32({2, 3, 4}), Tensor(), rm, rv);
       }},
      {"batch_norm_one_value_per_channel", K::Value, "batch_norm",
       {"Expected more than 1 value per channel when training", "[1, 3]"},
       [=](const Watch& watch) {
         Tensor rm = zeros({3}), rv = ones({3});
         watch(rm); watch(rv);
         bn_call(f32({1, 3}), Tensor(), rm, rv);
       }},
      {"batch_norm_one_value_per_channel_spatial", K::Value, "batch_norm",
       {"Expected more than 1 value per channel", "[1, 2, 1, 1]"},
       [=](const Watch&) { native_batch_norm_legit(f32({1, 2, 1, 1}), {}, {}, true, 0.1, 1e-5); }},
      {"batch_norm_weight_dtype", K::Type, "batch_norm", {"weight", "float32", "float64"},
       [=](const Watch& watch) {
         Tensor rm = zeros({3}), rv = ones({3});
         watch(rm); watch(rv);
         bn_call(f32({2, 3}), ones({3}, kFloat64), rm, rv);
       }},
      {"batch_norm_running_var_dtype", K::Type, "batch_norm", {"running_var", "float64"},
       [=](const Watch& watch) {
         Tensor rm = zeros({3});
         watch(rm);
         bn_call(f32({2, 3}), Tensor(), rm, ones({3}, kFloat64));
       }},
      {"batch_norm_int", K::Type, "batch_norm", {"floating", "int64"},
       [=](const Watch&) { bn_call(i64({2, 3}), Tensor(), zeros({3}), ones({3})); }},
      {"batch_norm_1d_input", K::Value, "batch_norm", {"at least 2 dims", "[5]"},
       [=](const Watch&) { bn_call(f32({5}), Tensor(), zeros({5}), ones({5})); }},
      {"batch_norm_no_stats_eval", K::Value, "batch_norm", {"eval", "running_mean"},
       [=](const Watch&) { native_batch_norm_legit(f32({2, 3}), {}, {}, false, 0.1, 1e-5); }},
      {"batch_norm_negative_eps", K::Value, "batch_norm", {"eps", "-1"},
       [=](const Watch&) { native_batch_norm_legit(f32({2, 3}), {}, {}, true, 0.1, -1.0); }},
      {"batch_norm_functional_half_stats", K::Value, "batch_norm", {"running_mean", "running_var"},
       [=](const Watch&) { batch_norm(f32({2, 3}), zeros({3}), Tensor()); }}};
  head(cs, "native_batch_norm_legit_no_training").errors = {
      {"batch_norm_no_training_channels", K::Value, "batch_norm", {"running_var", "[4]", "[3]"},
       [](const Watch&) {
         native_batch_norm_legit_no_training(f32({2, 4}), {}, {}, zeros({4}), ones({3}), 0.1, 1e-5);
       }}};
  head(cs, "native_batch_norm_backward").errors = {
      {"batch_norm_backward_grad_shape", K::Value, "native_batch_norm_backward", {"[2, 3]", "[2, 4]"},
       [](const Watch&) {
         native_batch_norm_backward(f32({2, 4}), f32({2, 3}), {}, {}, {}, f32({3}), f32({3}), true,
                                    1e-5, {1, 1, 1});
       }},
      {"batch_norm_backward_mask", K::Value, "native_batch_norm_backward", {"output_mask", "[1, 1]"},
       [](const Watch&) {
         native_batch_norm_backward(f32({2, 3}), f32({2, 3}), {}, {}, {}, f32({3}), f32({3}), true,
                                    1e-5, {1, 1});
       }},
      {"batch_norm_backward_save_missing", K::Value, "native_batch_norm_backward", {"save_mean"},
       [](const Watch&) {
         native_batch_norm_backward(f32({2, 3}), f32({2, 3}), {}, {}, {}, {}, {}, true, 1e-5,
                                    {1, 1, 1});
       }},
      {"batch_norm_backward_eval_stats_missing", K::Value, "native_batch_norm_backward",
       {"running_mean"},
       [](const Watch&) {
         native_batch_norm_backward(f32({2, 3}), f32({2, 3}), {}, {}, {}, f32({3}), f32({3}), false,
                                    1e-5, {1, 1, 1});
       }}};
  head(cs, "native_group_norm").errors = {
      {"group_norm_groups_divide", K::Value, "group_norm", {"divisible by num_groups", "[2, 6, 3]", "4"},
       [](const Watch&) { group_norm(f32({2, 6, 3}), 4); }},
      {"group_norm_groups_zero", K::Value, "group_norm", {"num_groups", "0"},
       [](const Watch&) { group_norm(f32({2, 6, 3}), 0); }},
      {"group_norm_sizes", K::Value, "group_norm", {"[2, 6, 3]", "N=2", "C=6", "HxW=4"},
       [](const Watch&) { native_group_norm(f32({2, 6, 3}), {}, {}, 2, 6, 4, 2, 1e-5); }},
      {"group_norm_weight", K::Value, "group_norm", {"weight", "[6]", "[3]"},
       [](const Watch&) { group_norm(f32({2, 6, 3}), 2, f32({3})); }},
      {"group_norm_int", K::Type, "group_norm", {"int64"},
       [](const Watch&) { group_norm(i64({2, 6, 3}), 2); }},
      {"group_norm_1d", K::Value, "group_norm", {"[6]"},
       [](const Watch&) { group_norm(f32({6}), 2); }}};
  head(cs, "native_group_norm_backward").errors = {
      {"group_norm_backward_mean_shape", K::Value, "native_group_norm_backward", {"mean", "[2, 3]", "[2, 2]"},
       [](const Watch&) {
         native_group_norm_backward(f32({2, 6, 3}), f32({2, 6, 3}), f32({2, 2}), f32({2, 3}), {},
                                    2, 6, 3, 3, {1, 1, 1});
       }}};
  head(cs, "native_layer_norm").errors = {
      {"native_layer_norm_shape", K::Value, "layer_norm", {"normalized_shape [4]", "[2, 3]"},
       [](const Watch&) { native_layer_norm(f32({2, 3}), {4}, {}, {}, 1e-5); }},
      {"native_layer_norm_weight", K::Value, "layer_norm", {"weight", "[3]", "[4]"},
       [](const Watch&) { native_layer_norm(f32({2, 3}), {3}, f32({4}), {}, 1e-5); }}};
  head(cs, "native_layer_norm_backward").errors = {
      {"native_layer_norm_backward_rstd", K::Value, "native_layer_norm_backward", {"rstd", "[2, 1]", "[2]"},
       [](const Watch&) {
         native_layer_norm_backward(f32({2, 3}), f32({2, 3}), {3}, f32({2, 1}), f32({2}), {}, {},
                                    {1, 0, 0});
       }}};
  // clang-format on
}

}  // namespace kiln::test

// Op table: factories (zeros, ones, full, empty, arange, linspace, rand, randn, randint),
// copies and fills, and the multi-tensor (foreach) updates.
#include <cmath>

#include "tests/ops/op_test_util.h"

namespace kiln::test {
namespace {

constexpr auto C = Layout::Contig;
constexpr auto T = Layout::Transposed;
constexpr auto S = Layout::Strided;

std::vector<DType> without_bool() { return kNumericDTypes; }

// ---------------------------------------------------------------- gradcheck and error samples

// copy_ into non-leaves: a broadcast source, into a slice, from a float32 source.
GradSamples copy_grads() {
  GradSamples cs;
  cs.push_back({"copy__bcast_src",
                {"copy_"},
                [](GradGen& d) {
                  return TensorList{d.var({2, 3}), d.var({3})};
                },
                [](const TensorList& x) {
                  Tensor self = nonleaf(x[0]);
                  self.copy_(x[1]);
                  return TensorList{self * 2.0};
                }});
  cs.push_back({"copy__into_slice",
                {"copy_", "slice"},
                [](GradGen& d) {
                  return TensorList{d.var({3, 4}), d.var({3, 2})};
                },
                [](const TensorList& x) {
                  Tensor self = nonleaf(x[0]);
                  slice(self, 1, 1, 3).copy_(x[1]);
                  return TensorList{self};
                }});
  cs.push_back({"copy__float32_src",
                {"copy_"},
                [](GradGen& d) {
                  return TensorList{d.var({2, 3}), d.fixed({2, 3})};
                },
                [](const TensorList& x) {
                  // A float32 source (no grad): self's old value gets a zero gradient.
                  Tensor self = nonleaf(x[0]);
                  self.copy_(x[1].to(kFloat32));
                  return TensorList{self};
                }});
  return cs;
}

// fill_ into non-leaves: a slice, the whole tensor.
GradSamples fill_grads() {
  GradSamples cs;
  cs.push_back({"fill__slice",
                {"fill_", "slice"},
                [](GradGen& d) {
                  return TensorList{d.var({3, 4})};
                },
                [](const TensorList& x) {
                  Tensor self = nonleaf(x[0]);
                  slice(self, 0, 1, 2).fill_(3.0);
                  return TensorList{self};
                }});
  cs.push_back({"fill__whole",
                {"fill_"},
                [](GradGen& d) {
                  return TensorList{d.var({2, 3}), d.var({2, 3})};
                },
                [](const TensorList& x) {
                  Tensor self = nonleaf(x[0]);
                  self.fill_(-1.0);
                  return TensorList{self * x[1]};
                }});
  return cs;
}

void add_fills(Cases& cs) {
  for (const auto& [label, dims] :
       {std::pair{"2d", Dims{2, 3}}, std::pair{"0d", Dims{}}, std::pair{"zero", Dims{0, 4}}}) {
    Dims d = dims;
    std::string l = label;
    cs.push_back({.name = "zeros_" + l,
                  .ops = {"full"},
                  .dtypes = kAllDTypes,
                  .make = [](Gen&) { return KTensors{}; },
                  .kiln = [d](const KArgs& x) { return KTensors{zeros(d, x.dtype, x.device)}; },
                  .aten = [d](const AArgs& a) { return ATensors{at::zeros(d, a.dtype)}; },
                  .tol = Tol::Exact});
    cs.push_back({.name = "ones_" + l,
                  .ops = {"full"},
                  .dtypes = kAllDTypes,
                  .make = [](Gen&) { return KTensors{}; },
                  .kiln = [d](const KArgs& x) { return KTensors{ones(d, x.dtype, x.device)}; },
                  .aten = [d](const AArgs& a) { return ATensors{at::ones(d, a.dtype)}; },
                  .tol = Tol::Exact});
    cs.push_back({.name = "empty_" + l,
                  .ops = {"empty"},
                  .dtypes = kAllDTypes,
                  .make = [](Gen&) { return KTensors{}; },
                  .kiln = [d](const KArgs& x) { return KTensors{empty(d, x.dtype, x.device)}; },
                  .aten = [d](const AArgs& a) { return ATensors{at::empty(d, a.dtype)}; },
                  .tol = Tol::ShapeOnly});
  }
  struct FullRow {
    const char* name;
    std::vector<DType> dtypes;  // empty: the dtype is inferred from the value
    Scalar value;
    at::Scalar avalue;
  };
  for (const FullRow& r : std::vector<FullRow>{{"full_float", kFloatDTypes, 2.5, 2.5},
                                               {"full_int", kAllDTypes, 3, 3},
                                               {"full_neg_int", {kInt32, kInt64}, -7, -7},
                                               {"full_bool", kAllDTypes, true, true},
                                               {"full_infer_float", {}, 2.5, 2.5},
                                               {"full_infer_int", {}, 3, 3},
                                               {"full_infer_bool", {}, false, false}}) {
    bool infer = r.dtypes.empty();
    Scalar v = r.value;
    at::Scalar av = r.avalue;
    cs.push_back(
        {.name = r.name,
         .ops = {"full"},
         .dtypes = r.dtypes,
         .make = [](Gen&) { return KTensors{}; },
         .kiln =
             [infer, v](const KArgs& x) {
               return KTensors{infer ? full({3, 2}, v, std::nullopt, x.device)
                                     : full({3, 2}, v, x.dtype, x.device)};
             },
         .aten =
             [infer, av](const AArgs& a) {
               return ATensors{infer ? at::full({3, 2}, av) : at::full({3, 2}, av, a.dtype)};
             },
         .tol = Tol::Exact});
  }
  // The *_like factories take the input's shape, dtype and device.
  cs.push_back(
      {.name = "likes",
       .ops = {"full"},
       .dtypes = kAllDTypes,
       .make = make_from({draw_any()}, {Spec{{3, 4}, T}}),
       .kiln =
           [](const KArgs& x) {
             return KTensors{zeros_like(x[0]), ones_like(x[0]), full_like(x[0], 1)};
           },
       .aten =
           [](const AArgs& a) {
             return ATensors{at::zeros_like(a[0]), at::ones_like(a[0]), at::full_like(a[0], 1)};
           },
       .tol = Tol::Exact});
  cs.push_back({.name = "empty_like",
                .ops = {"empty"},
                .dtypes = kAllDTypes,
                .make = make_from({draw_any()}, {Spec{{3, 4}, T}}),
                .kiln = [](const KArgs& x) { return KTensors{empty_like(x[0])}; },
                .aten = [](const AArgs& a) { return ATensors{at::empty_like(a[0])}; },
                .tol = Tol::ShapeOnly});

  // copy_ broadcasts and casts src into self; fill_ writes a value; both in place.
  cs.push_back({.name = "copy_bcast_cast",
                .ops = {"copy_"},
                .dtypes = kAllDTypes,
                .make =
                    [](Gen& g) {
                      return KTensors{g.any({{3, 5}, T}), g.uniform({{5}}, 0, 9, kFloat64)};
                    },
                .kiln =
                    [](const KArgs& x) {
                      Tensor self = x[0];
                      self.copy_(x[1]);
                      return KTensors{self};
                    },
                .aten = [](const AArgs& a) { return ATensors{a[1].expand(a[0].sizes())}; },
                .tol = Tol::Exact,
                .mode = Mode::InPlace});
  cs.push_back({.name = "copy_strided",
                .ops = {"copy_"},
                .dtypes = kAllDTypes,
                .make =
                    [](Gen& g) {
                      return KTensors{g.any({{4, 6}, S}), g.any({{4, 6}, T})};
                    },
                .kiln =
                    [](const KArgs& x) {
                      Tensor self = x[0];
                      self.copy_(x[1]);
                      return KTensors{self};
                    },
                .aten = [](const AArgs& a) { return ATensors{a[1]}; },
                .tol = Tol::Exact,
                .mode = Mode::InPlace});
  for (const auto& [label, spec] :
       {std::pair{"noncontig", Spec{{3, 5}, T}}, std::pair{"0d", Spec{{}, C}},
        std::pair{"zero", Spec{{0, 2}, C}}}) {
    cs.push_back({.name = std::string("fill__") + label,
                  .ops = {"fill_"},
                  .dtypes = kAllDTypes,
                  .make = make_from({draw_any()}, {spec}),
                  .kiln =
                      [](const KArgs& x) {
                        Tensor self = x[0];
                        self.fill_(2);
                        return KTensors{self};
                      },
                  .aten = [](const AArgs& a) { return ATensors{at::full_like(a[0], 2)}; },
                  .tol = Tol::Exact,
                  .mode = Mode::InPlace});
  }
  cs.push_back({.name = "to_same_dtype_copy",
                .ops = {"to_copy"},
                .dtypes = kAllDTypes,
                .make = make_from({draw_any()}, {Spec{{3, 4}, S}}),
                .kiln = [](const KArgs& x) { return KTensors{x[0].to(x[0].dtype(), true)}; },
                .aten = [](const AArgs& a) { return ATensors{a[0].clone()}; },
                .tol = Tol::Exact,
                .alias = Alias::Copy});
  // clang-format off
  OpCase& copy_record = head(cs, "copy_");
  copy_record.grads = copy_grads();
  copy_record.errors = {{"copy__not_broadcastable", K::Value, "copy_", {"[4]", "[2, 3]"},
                         [](const Watch& watch) {
                           Tensor self = f32({2, 3});
                           watch(self);
                           self.copy_(f32({4}));
                         }}};
  OpCase& fill_record = head(cs, "fill_");
  fill_record.grads = fill_grads();
  fill_record.errors = {{"fill__float_into_int", K::Type, "fill_", {"2.5", "int32"},
                         [](const Watch& watch) {
                           Tensor self = ones({3}, kInt32);
                           watch(self);
                           self.fill_(2.5);
                         }}};
  // clang-format on
}

void add_ranges(Cases& cs) {
  struct RangeRow {
    const char* name;
    std::vector<DType> dtypes;  // empty: inferred
    Scalar start, end, step;
    at::Scalar astart, aend, astep;
  };
  const std::vector<RangeRow> aranges = {
      {"arange_int", without_bool(), 0, 5, 1, 0, 5, 1},
      {"arange_int_step", without_bool(), 2, 11, 3, 2, 11, 3},
      {"arange_int_negative_step", {kInt32, kInt64, kFloat32, kFloat64}, 10, -2, -3, 10, -2, -3},
      {"arange_empty", without_bool(), 3, 3, 1, 3, 3, 1},
      {"arange_float_step", kFloatDTypes, 0, 1, 0.1, 0, 1, 0.1},
      {"arange_float_bounds", kFloatDTypes, -1.5, 1.5, 0.25, -1.5, 1.5, 0.25},
      {"arange_float_negative", {kFloat32, kFloat64}, 1.0, -2.0, -0.3, 1.0, -2.0, -0.3},
      {"arange_large", {kInt64, kFloat32, kFloat64}, 0, 100000, 3, 0, 100000, 3},
      {"arange_infer_int", {}, 0, 7, 2, 0, 7, 2},
      {"arange_infer_float", {}, 0, 2, 0.5, 0, 2, 0.5},
  };
  for (const RangeRow& r : aranges) {
    RangeRow rr = r;
    bool infer = r.dtypes.empty();
    cs.push_back({.name = r.name,
                  .ops = {"arange"},
                  .dtypes = r.dtypes,
                  .make = [](Gen&) { return KTensors{}; },
                  .kiln =
                      [rr, infer](const KArgs& x) {
                        std::optional<DType> dt;
                        if (!infer) dt = x.dtype;
                        return KTensors{arange(rr.start, rr.end, rr.step, dt, x.device)};
                      },
                  .aten =
                      [rr, infer](const AArgs& a) {
                        if (infer) return ATensors{at::arange(rr.astart, rr.aend, rr.astep)};
                        return ATensors{at::arange(rr.astart, rr.aend, rr.astep, a.dtype)};
                      },
                  // Not Exact: ATen's CPU kernel evaluates start + step * i as one fused
                  // multiply-add, which can differ in the last bit from a multiply then an
                  // add; integer results are still exact.
                  .tol = Tol::Default});
  }
  cs.push_back({.name = "arange_end_only",
                .ops = {"arange"},
                .make = [](Gen&) { return KTensors{}; },
                .kiln = [](const KArgs& x) { return KTensors{arange(6, std::nullopt, x.device)}; },
                .aten = [](const AArgs&) { return ATensors{at::arange(6)}; },
                .tol = Tol::Exact});

  struct LinspaceRow {
    const char* name;
    std::vector<DType> dtypes;
    double start, end;
    int64_t steps;
  };
  const std::vector<LinspaceRow> linspaces = {
      {"linspace_unit", kFloatDTypes, 0, 1, 5},
      {"linspace_odd", kFloatDTypes, -2, 3, 7},
      {"linspace_one", kNumericDTypes, 1, 10, 1},
      {"linspace_none", kNumericDTypes, 0, 1, 0},
      {"linspace_descending", kFloatDTypes, 10, 0, 11},
      {"linspace_fine", kFloatDTypes, -1, 1, 1001},
      {"linspace_int", {kUInt8, kInt32, kInt64}, 0, 10, 4},
      {"linspace_int_negative", {kInt32, kInt64}, -5, 5, 7},
  };
  for (const LinspaceRow& r : linspaces) {
    LinspaceRow lr = r;
    cs.push_back({.name = r.name,
                  .ops = {"linspace"},
                  .dtypes = r.dtypes,
                  .make = [](Gen&) { return KTensors{}; },
                  .kiln =
                      [lr](const KArgs& x) {
                        return KTensors{linspace(lr.start, lr.end, lr.steps, x.dtype, x.device)};
                      },
                  .aten =
                      [lr](const AArgs& a) {
                        // ATen 1.13 steps through 16-bit linspace in 16-bit arithmetic, drifting
                        // by many ulps over 1001 points; the reference is the float64 result
                        // rounded once, as for the other 16-bit ops (see op_test.cpp).
                        if (a.dtype == at::kHalf || a.dtype == at::kBFloat16)
                          return ATensors{
                              at::linspace(lr.start, lr.end, lr.steps, at::kDouble).to(a.dtype)};
                        return ATensors{at::linspace(lr.start, lr.end, lr.steps, a.dtype)};
                      },
                  // Not Exact for floats: ATen evaluates linspace in vector-width chunks (and
                  // the 16-bit types in 16-bit arithmetic), so the last bit can differ from
                  // Kiln's per-element fused multiply-add; integer results are still exact.
                  .tol = Tol::Default});
  }
  // clang-format off
  head(cs, "arange").errors = {
      {"arange_zero_step", K::Value, "arange", {"step"}, [](const Watch&) { arange(0, 5, 0); }},
      {"arange_wrong_sign", K::Value, "arange", {"5", "-1"},
       [](const Watch&) { arange(0, 5, -1); }}};
  head(cs, "linspace").errors = {{"linspace_negative_steps", K::Value, "linspace", {"-1"},
                                  [](const Watch&) { linspace(0, 1, -1); }}};
  // clang-format on
}

// Random factories have no oracle: their rows check ranges and moments over 100k samples,
// and determinism (same seed and offset, same values; another offset, other values).
void add_random(Cases& cs) {
  const Dims big{400, 250};
  auto stats = [](const Tensor& t) {
    at::Tensor a = to_aten(t).to(at::kDouble);
    return std::tuple{a.min().item<double>(), a.max().item<double>(), a.mean().item<double>(),
                      a.std().item<double>()};
  };
  auto check_shape = [](const Tensor& t, DType dt, const Dims& d) {
    EXPECT_EQ(t.dtype(), dt);
    EXPECT_EQ(vec(t.sizes()), d);
  };
  cs.push_back({.name = "rand",
                .ops = {"rand"},
                .dtypes = kFloatDTypes,
                .make = [](Gen&) { return KTensors{}; },
                .kiln =
                    [big](const KArgs& x) {
                      Generator g(11);
                      return KTensors{rand(big, &g, x.dtype, x.device)};
                    },
                .check =
                    [=](const KArgs& x, const KTensors& got) {
                      check_shape(got[0], x.dtype, big);
                      auto [lo, hi, mean, sd] = stats(got[0]);
                      EXPECT_GE(lo, 0.0);
                      EXPECT_LT(hi, 1.0);
                      EXPECT_NEAR(mean, 0.5, 0.01);
                      EXPECT_NEAR(sd, std::sqrt(1.0 / 12), 0.01);
                    }});
  cs.push_back({.name = "randn",
                .ops = {"randn"},
                .dtypes = kFloatDTypes,
                .make = [](Gen&) { return KTensors{}; },
                .kiln =
                    [big](const KArgs& x) {
                      Generator g(12);
                      return KTensors{randn(big, &g, x.dtype, x.device)};
                    },
                .check =
                    [=](const KArgs& x, const KTensors& got) {
                      check_shape(got[0], x.dtype, big);
                      auto [lo, hi, mean, sd] = stats(got[0]);
                      EXPECT_NEAR(mean, 0.0, 0.02);
                      EXPECT_NEAR(sd, 1.0, 0.02);
                      EXPECT_LT(lo, -3.5);
                      EXPECT_GT(hi, 3.5);
                    }});
  cs.push_back({.name = "randint",
                .ops = {"randint"},
                .dtypes = without_bool(),
                .make = [](Gen&) { return KTensors{}; },
                .kiln =
                    [big](const KArgs& x) {
                      Generator g(13);
                      return KTensors{randint(2, 9, big, &g, x.dtype, x.device)};
                    },
                .check =
                    [=](const KArgs& x, const KTensors& got) {
                      check_shape(got[0], x.dtype, big);
                      at::Tensor a = to_aten(got[0]).to(at::kLong);
                      at::Tensor counts = at::bincount(a.flatten(), {}, 9);
                      EXPECT_EQ(counts.slice(0, 0, 2).sum().item<int64_t>(), 0) << "values < 2";
                      EXPECT_EQ(a.max().item<int64_t>(), 8);
                      double expect = static_cast<double>(a.numel()) / 7;
                      for (int64_t v = 2; v < 9; ++v)
                        EXPECT_NEAR(counts[v].item<double>(), expect, 0.05 * expect)
                            << "value " << v;
                    }});
  cs.push_back({.name = "randint_default_dtype",
                .ops = {"randint"},
                .make = [](Gen&) { return KTensors{}; },
                .kiln =
                    [](const KArgs& x) {
                      Generator g(14);
                      return KTensors{randint(-3, 3, {1000}, &g, std::nullopt, x.device)};
                    },
                .check =
                    [=](const KArgs&, const KTensors& got) {
                      check_shape(got[0], kInt64, {1000});
                      at::Tensor a = to_aten(got[0]);
                      EXPECT_EQ(a.min().item<int64_t>(), -3);
                      EXPECT_EQ(a.max().item<int64_t>(), 2);
                    }});
  cs.push_back({.name = "random_like",
                .ops = {"rand", "randn"},
                .dtypes = kFloatDTypes,
                .make = make_from({draw_any()}, {Spec{{30, 20}, T}}),
                .kiln =
                    [](const KArgs& x) {
                      Generator g(15);
                      return KTensors{rand_like(x[0], &g), randn_like(x[0], &g)};
                    },
                .check =
                    [=](const KArgs& x, const KTensors& got) {
                      check_shape(got[0], x.dtype, vec(x[0].sizes()));
                      check_shape(got[1], x.dtype, vec(x[0].sizes()));
                    }});
  // (seed, offset) determines a draw; the default generator obeys manual_seed.
  for (const char* op : {"rand", "randn", "randint"}) {
    std::string o = op;
    auto draw = [o](Generator* g, Device d) {
      if (o == "rand") return rand({1000}, g, kFloat32, d);
      if (o == "randn") return randn({1000}, g, kFloat32, d);
      return randint(0, 1000000, {1000}, g, kInt64, d);
    };
    cs.push_back({.name = o + "_determinism",
                  .ops = {o},
                  .make = [](Gen&) { return KTensors{}; },
                  .kiln =
                      [draw](const KArgs& x) {
                        Generator a(42), b(42), c(42), d(43);
                        c.set_offset(1000);
                        KTensors r{draw(&a, x.device), draw(&b, x.device), draw(&c, x.device),
                                   draw(&d, x.device)};
                        manual_seed(7);
                        r.push_back(draw(nullptr, x.device));
                        manual_seed(7);
                        r.push_back(draw(nullptr, x.device));
                        r.push_back(draw(nullptr, x.device));
                        return r;
                      },
                  .check =
                      [](const KArgs&, const KTensors& got) {
                        ASSERT_EQ(got.size(), 7u);
                        auto same = [&](size_t i, size_t j) {
                          return at::equal(to_aten(got[i]), to_aten(got[j]));
                        };
                        EXPECT_TRUE(same(0, 1)) << "same seed and offset";
                        EXPECT_FALSE(same(0, 2)) << "another offset";
                        EXPECT_FALSE(same(0, 3)) << "another seed";
                        EXPECT_TRUE(same(4, 5)) << "manual_seed";
                        EXPECT_FALSE(same(5, 6)) << "the default generator advances";
                      }});
  }
  head(cs, "randint").errors = {
      {"randint_empty_range", K::Value, "randint", {"5", "2"}, [](const Watch&) {
         randint(5, 2, {3});
       }}};
}

// foreach: list inputs are concatenated in KArgs::in (self, then each other list); the self
// list comes back as the outputs (Mode::InPlace: output i is input i).
const std::vector<Spec>& list_specs() {
  static const std::vector<Spec> s = {{{3, 4}, T}, {{5}, C}, {{}, C}, {{0, 3}, C}, {{300, 129}, S}};
  return s;
}
MakeFn make_lists(std::vector<Draw> per_list) {
  return [per_list](Gen& g) {
    KTensors in;
    for (const Draw& d : per_list)
      for (const Spec& s : list_specs()) in.push_back(d(g, s));
    return in;
  };
}
TensorList list(const KArgs& x, size_t which, size_t lists) {
  size_t n = x.in.size() / lists;
  return TensorList(x.in.begin() + which * n, x.in.begin() + (which + 1) * n);
}

// foreach_adamw_'s rows: clones of a case's params, exp_avg and exp_avg_sq lists (so the row is
// functional), step counts at 2 (the call is step 3), and the three lists as the row's outputs.
struct AdamwState {
  TensorList p, m, v, steps;
  TensorList outputs() const {
    TensorList out = p;
    out.insert(out.end(), m.begin(), m.end());
    out.insert(out.end(), v.begin(), v.end());
    return out;
  }
  void check_steps(double want, const char* what) const {
    for (const Tensor& s : steps)
      KILN_CHECK(s.device().is_meta() || s.item<double>() == want, "{}", what);
  }
};
AdamwState adamw_state(const KArgs& x) {
  auto clones = [](TensorList l) {
    for (Tensor& t : l) t = t.clone();
    return l;
  };
  AdamwState st{clones(list(x, 0, 4)), clones(list(x, 2, 4)), clones(list(x, 3, 4)), {}};
  for (const Tensor& t : st.p) st.steps.push_back(full({}, 2.0, kFloat64, t.device()));
  return st;
}
using ARef = std::function<at::Tensor(const AArgs&, size_t i, size_t n)>;
AtenFn per_tensor(size_t lists, ARef f) {
  return [lists, f](const AArgs& a) {
    size_t n = a.in.size() / lists;
    ATensors out;
    for (size_t i = 0; i < n; ++i) out.push_back(f(a, i, n));
    return out;
  };
}

void add_foreach(Cases& cs) {
  auto inplace = [&](const std::string& name, const std::string& op, std::vector<DType> dtypes,
                     std::vector<Draw> draws, std::function<void(const KArgs&)> kf, ARef af) {
    size_t lists = draws.size();
    cs.push_back({.name = name,
                  .ops = {op},
                  .dtypes = std::move(dtypes),
                  .make = make_lists(draws),
                  .kiln =
                      [kf, lists](const KArgs& x) {
                        kf(x);
                        return list(x, 0, lists);
                      },
                  .aten = per_tensor(lists, af),
                  .mode = Mode::InPlace});
  };
  inplace(
      "foreach_add_", "foreach_add_", kNumericDTypes, {draw_any(), draw_any()},
      [](const KArgs& x) { foreach_add_(list(x, 0, 2), list(x, 1, 2), 2); },
      [](const AArgs& a, size_t i, size_t n) { return at::add(a[i], a[n + i], 2); });
  inplace(
      "foreach_add__float_alpha", "foreach_add_", kFloatDTypes, {draw_any(), draw_any()},
      [](const KArgs& x) { foreach_add_(list(x, 0, 2), list(x, 1, 2), -0.5); },
      [](const AArgs& a, size_t i, size_t n) { return at::add(a[i], a[n + i], -0.5); });
  inplace(
      "foreach_mul__scalar", "foreach_mul_", kNumericDTypes, {draw_any()},
      [](const KArgs& x) { foreach_mul_(list(x, 0, 1), 3); },
      [](const AArgs& a, size_t i, size_t) { return at::mul(a[i], 3); });
  inplace(
      "foreach_mul__float_scalar", "foreach_mul_", kFloatDTypes, {draw_any()},
      [](const KArgs& x) { foreach_mul_(list(x, 0, 1), 0.3); },
      [](const AArgs& a, size_t i, size_t) { return at::mul(a[i], 0.3); });
  inplace(
      "foreach_mul__list", "foreach_mul_list_", kAllDTypes, {draw_any(), draw_any()},
      [](const KArgs& x) { foreach_mul_(list(x, 0, 2), list(x, 1, 2)); },
      [](const AArgs& a, size_t i, size_t n) { return at::mul(a[i], a[n + i]); });
  inplace(
      "foreach_lerp_", "foreach_lerp_", kFloatDTypes, {draw_any(), draw_any()},
      [](const KArgs& x) { foreach_lerp_(list(x, 0, 2), list(x, 1, 2), 0.25); },
      [](const AArgs& a, size_t i, size_t n) { return at::lerp(a[i], a[n + i], 0.25); });
  inplace(
      "foreach_addcmul_", "foreach_addcmul_", kNumericDTypes, {draw_any(), draw_any(), draw_any()},
      [](const KArgs& x) { foreach_addcmul_(list(x, 0, 3), list(x, 1, 3), list(x, 2, 3), 2); },
      [](const AArgs& a, size_t i, size_t n) {
        return at::addcmul(a[i], a[n + i], a[2 * n + i], 2);
      });
  inplace(
      "foreach_addcmul__float_value", "foreach_addcmul_", kFloatDTypes,
      {draw_any(), draw_any(), draw_any()},
      [](const KArgs& x) { foreach_addcmul_(list(x, 0, 3), list(x, 1, 3), list(x, 2, 3), -0.5); },
      [](const AArgs& a, size_t i, size_t n) {
        return at::addcmul(a[i], a[n + i], a[2 * n + i], -0.5);
      });
  inplace(
      "foreach_addcdiv_", "foreach_addcdiv_", kFloatDTypes,
      {draw_any(), draw_any(), draw_positive()},
      [](const KArgs& x) { foreach_addcdiv_(list(x, 0, 3), list(x, 1, 3), list(x, 2, 3), 0.5); },
      [](const AArgs& a, size_t i, size_t n) {
        return at::addcdiv(a[i], a[n + i], a[2 * n + i], 0.5);
      });
  inplace(
      "foreach_sqrt_", "foreach_sqrt_", kFloatDTypes, {draw_positive()},
      [](const KArgs& x) { foreach_sqrt_(list(x, 0, 1)); },
      [](const AArgs& a, size_t i, size_t) { return at::sqrt(a[i]); });
  // AdamW step 3 with weight decay on clones (so the row is functional); p, m and v are all
  // compared. The ATen side is PyTorch's AdamW formula.
  cs.push_back(
      {.name = "foreach_adamw_",
       .ops = {"foreach_adamw_"},
       .dtypes = kFloatDTypes,
       .make = make_lists({draw_any(), draw_any(), draw_any(), draw_positive()}),
       .kiln =
           [](const KArgs& x) {
             AdamwState st = adamw_state(x);
             Tensor lr = full({}, 0.01, kFloat64, st.p[0].device());
             foreach_adamw_(st.p, list(x, 1, 4), st.m, st.v, st.steps, lr, 0.9, 0.99, 1e-8, 0.1);
             st.check_steps(3.0, "steps not incremented");
             return st.outputs();
           },
       .aten =
           [](const AArgs& a) {
             size_t n = a.in.size() / 4;
             double bc1 = 1 - std::pow(0.9, 3), bc2 = 1 - std::pow(0.99, 3);
             ATensors ps, ms, vs;
             for (size_t i = 0; i < n; ++i) {
               const at::Tensor &p = a[i], &g = a[n + i], &m = a[2 * n + i], &v = a[3 * n + i];
               at::Tensor m1 = at::lerp(m, g, 0.1);
               at::Tensor v1 = v * 0.99 + 0.01 * g * g;
               at::Tensor denom = at::sqrt(v1) / std::sqrt(bc2) + 1e-8;
               ps.push_back(p * (1 - 0.01 * 0.1) - (0.01 / bc1) * m1 / denom);
               ms.push_back(m1);
               vs.push_back(v1);
             }
             ps.insert(ps.end(), ms.begin(), ms.end());
             ps.insert(ps.end(), vs.begin(), vs.end());
             return ps;
           }});
  // A skipped step (a GradScaler's found_inf is 1): nothing is written, steps included.
  cs.push_back({.name = "foreach_adamw__skipped",
                .ops = {"foreach_adamw_"},
                .dtypes = kFloatDTypes,
                .make = make_lists({draw_any(), draw_any(), draw_any(), draw_positive()}),
                .kiln =
                    [](const KArgs& x) {
                      AdamwState st = adamw_state(x);
                      const Device d = st.p[0].device();
                      foreach_adamw_(st.p, list(x, 1, 4), st.m, st.v, st.steps,
                                     full({}, 0.01, kFloat64, d), 0.9, 0.99, 1e-8, 0.1,
                                     ones({}, kFloat32, d));
                      st.check_steps(2.0, "steps incremented");
                      return st.outputs();
                    },
                .aten =
                    [](const AArgs& a) {
                      size_t n = a.in.size() / 4;
                      ATensors out;
                      for (size_t l : {0, 2, 3})
                        for (size_t i = 0; i < n; ++i) out.push_back(a[l * n + i]);
                      return out;
                    }});
  // Loss scaling: gradients times 1 / scale, found_inf 0 on finite values and 1 (never reset)
  // when one tensor holds an inf or a NaN (tensor 0 below, whose values are then not compared).
  auto unscale_row = [&](const std::string& name, float poison) {
    cs.push_back({.name = name,
                  .ops = {"amp_non_finite_check_and_unscale_"},
                  .dtypes = kFloatDTypes,
                  .make = make_lists({draw_any()}),
                  .kiln =
                      [poison](const KArgs& x) {
                        TensorList g = x.in;
                        for (Tensor& t : g) t = t.clone();
                        const bool poisoned = poison != 0;
                        if (poisoned) g[0].fill_(poison);
                        const Device d = g[0].device();
                        Tensor found = zeros({}, kFloat32, d);
                        amp_non_finite_check_and_unscale_(g, found, full({}, 0.25, kFloat32, d));
                        KILN_CHECK(d.is_meta() || found.item<float>() == (poisoned ? 1.f : 0.f),
                                   "found_inf is {}", found.item<float>());
                        if (!poisoned) return g;
                        // Already 1: stays 1 on finite values.
                        amp_non_finite_check_and_unscale_({g[1]}, found, ones({}, kFloat32, d));
                        KILN_CHECK(d.is_meta() || found.item<float>() == 1.f,
                                   "found_inf was reset");
                        return TensorList(g.begin() + 1, g.end());
                      },
                  .aten =
                      [poison](const AArgs& a) {
                        ATensors out;
                        for (size_t i = poison != 0 ? 1 : 0; i < a.in.size(); ++i)
                          out.push_back(at::mul(a[i], 0.25));
                        return out;
                      }});
  };
  unscale_row("amp_non_finite_check_and_unscale_", 0);
  unscale_row("amp_non_finite_check_and_unscale__inf", -INFINITY);
  unscale_row("amp_non_finite_check_and_unscale__nan", NAN);
  // The scale's update: (found_inf, tracker before, interval) -> scale factor, tracker after.
  struct UpdateCase {
    const char* name;
    float found;
    int tracker;
    int64_t interval;
    double factor;
    int tracker_after;
  };
  for (const UpdateCase& u : {UpdateCase{"amp_update_scale_", 0, 1, 3, 1.0, 2},
                              UpdateCase{"amp_update_scale__grow", 0, 2, 3, 2.0, 0},
                              UpdateCase{"amp_update_scale__backoff", 1, 2, 3, 0.5, 0}}) {
    cs.push_back({.name = u.name,
                  .ops = {"amp_update_scale_"},
                  .dtypes = {kFloat32},
                  .make = [](Gen& g) { return KTensors{g.positive({{}}, kFloat32)}; },
                  .kiln =
                      [u](const KArgs& x) {
                        Tensor scale = x.in[0].clone();
                        const Device d = scale.device();
                        Tensor tracker = full({}, u.tracker, kInt32, d);
                        amp_update_scale_(scale, tracker, full({}, u.found, kFloat32, d), 2.0, 0.5,
                                          u.interval);
                        KILN_CHECK(d.is_meta() || tracker.item<int64_t>() == u.tracker_after,
                                   "tracker is {}", tracker.item<int64_t>());
                        return TensorList{scale};
                      },
                  .aten = [u](const AArgs& a) { return ATensors{a[0] * u.factor}; }});
  }
  // A grown scale that would overflow float32 is not kept (the tracker still resets).
  cs.push_back({.name = "amp_update_scale__no_overflow",
                .ops = {"amp_update_scale_"},
                .dtypes = {kFloat32},
                .make = [](Gen&) { return KTensors{full({}, 3e38, kFloat32)}; },
                .kiln =
                    [](const KArgs& x) {
                      Tensor scale = x.in[0].clone();
                      const Device d = scale.device();
                      Tensor tracker = zeros({}, kInt32, d);
                      amp_update_scale_(scale, tracker, zeros({}, kFloat32, d), 2.0, 0.5, 1);
                      KILN_CHECK(d.is_meta() || tracker.item<int64_t>() == 0, "tracker is {}",
                                 tracker.item<int64_t>());
                      return TensorList{scale};
                    },
                .aten = [](const AArgs& a) { return ATensors{a[0].clone()}; }});
  cs.push_back(
      {.name = "foreach_sqrt",
       .ops = {"foreach_sqrt"},
       .dtypes = kAllDTypes,
       .make = make_lists({draw_positive()}),
       .kiln = [](const KArgs& x) { return foreach_sqrt(x.in); },
       .aten = per_tensor(1, [](const AArgs& a, size_t i, size_t) { return at::sqrt(a[i]); })});
  // Lists of mixed dtypes: each tensor keeps its own.
  cs.push_back({.name = "foreach_add__mixed_dtypes",
                .ops = {"foreach_add_"},
                .make =
                    [](Gen& g) {
                      return KTensors{g.any({{3}}, kFloat32),    g.any({{2, 2}}, kFloat16),
                                      g.any({{4}}, kInt64),      g.any({{3}}, kFloat32),
                                      g.any({{2, 2}}, kFloat16), g.any({{4}}, kInt32)};
                    },
                .kiln =
                    [](const KArgs& x) {
                      foreach_add_(list(x, 0, 2), list(x, 1, 2));
                      return list(x, 0, 2);
                    },
                .aten = per_tensor(
                    2, [](const AArgs& a, size_t i, size_t n) { return at::add(a[i], a[n + i]); }),
                .mode = Mode::InPlace});
  // clang-format off
  head(cs, "foreach_add_").errors = {
      {"foreach_length_mismatch", K::Value, "foreach_add_", {"2", "3"},
       [](const Watch& watch) {
         TensorList a{f32({2}), f32({3})};
         for (const Tensor& t : a) watch(t);
         foreach_add_(a, {f32({2}), f32({3}), f32({4})});
       }},
      {"foreach_add__float_into_int", K::Type, "foreach_add_", {"float32", "int64"},
       [](const Watch& watch) {
         TensorList self{i64({2}), i64({3})};
         for (const Tensor& t : self) watch(t);
         foreach_add_(self, {i64({2}), f32({3})});
       }}};
  head(cs, "foreach_mul_list_").errors = {
      {"foreach_shape_mismatch", K::Value, "foreach_mul_list_", {"[3]", "[2]"},
       [](const Watch& watch) {
         TensorList a{f32({2}), f32({3})};
         for (const Tensor& t : a) watch(t);
         foreach_mul_(a, {f32({2}), f32({2})});
       }}};
  // foreach_adamw_: everything is checked before any parameter, moment or step is written.
  head(cs, "foreach_adamw_").errors = {
      {"adamw_lr_not_a_0d_float64", K::Type, "foreach_adamw_", {"lr", "[] float32"},
       [](const Watch& watch) {
         TensorList p{f32({2})}, g{f32({2})}, m{f32({2})}, v{f32({2})},
             s{zeros({}, kFloat64)};
         for (const TensorList* l : {&p, &m, &v, &s}) watch((*l)[0]);
         foreach_adamw_(p, g, m, v, s, f32({}), 0.9, 0.999, 1e-8, 0.0);
       }},
      {"adamw_step_count", K::Value, "foreach_adamw_", {"1 step tensors", "2 parameters"},
       [](const Watch& watch) {
         TensorList p{f32({2}), f32({3})}, g{f32({2}), f32({3})}, m{f32({2}), f32({3})},
             v{f32({2}), f32({3})}, s{zeros({}, kFloat64)};
         for (const Tensor& t : p) watch(t);
         foreach_adamw_(p, g, m, v, s, zeros({}, kFloat64), 0.9, 0.999, 1e-8, 0.0);
       }},
      {"adamw_negative_lr", K::Value, "foreach_adamw_", {"lr", "-1"},
       [](const Watch& watch) {
         TensorList p{f32({2})}, g{f32({2})}, m{f32({2})}, v{f32({2})},
             s{zeros({}, kFloat64)};
         for (const TensorList* l : {&p, &m, &v, &s}) watch((*l)[0]);
         foreach_adamw_(p, g, m, v, s, full({}, -1.0, kFloat64), 0.9, 0.999, 1e-8, 0.0);
       }},
      {"adamw_fractional_step", K::Value, "foreach_adamw_", {"steps[0]", "1.5"},
       [](const Watch& watch) {
         TensorList p{f32({2})}, g{f32({2})}, m{f32({2})}, v{f32({2})},
             s{full({}, 1.5, kFloat64)};
         for (const TensorList* l : {&p, &m, &v, &s}) watch((*l)[0]);
         foreach_adamw_(p, g, m, v, s, zeros({}, kFloat64), 0.9, 0.999, 1e-8, 0.0);
       }},
      {"adamw_shared_step_tensor", K::Value, "foreach_adamw_", {"steps[0]", "steps[1]"},
       [](const Watch& watch) {
         Tensor step = zeros({}, kFloat64);
         TensorList p{f32({2}), f32({3})}, g{f32({2}), f32({3})}, m{f32({2}), f32({3})},
             v{f32({2}), f32({3})}, s{step, step};
         for (const Tensor& t : p) watch(t);
         watch(step);
         foreach_adamw_(p, g, m, v, s, zeros({}, kFloat64), 0.9, 0.999, 1e-8, 0.0);
       }},
      {"adamw_found_inf_not_0d_float32", K::Type, "foreach_adamw_", {"found_inf", "[1] float32"},
       [](const Watch& watch) {
         TensorList p{f32({2})}, g{f32({2})}, m{f32({2})}, v{f32({2})},
             s{zeros({}, kFloat64)};
         for (const TensorList* l : {&p, &m, &v, &s}) watch((*l)[0]);
         foreach_adamw_(p, g, m, v, s, zeros({}, kFloat64), 0.9, 0.999, 1e-8, 0.0, f32({1}));
       }}};
  head(cs, "amp_non_finite_check_and_unscale_").errors = {
      {"unscale_inv_scale_float64", K::Type, "amp_non_finite_check_and_unscale_",
       {"inv_scale", "[] float64"},
       [](const Watch& watch) {
         TensorList g{f32({2})};
         Tensor found = zeros({});
         watch(g[0]);
         watch(found);
         amp_non_finite_check_and_unscale_(g, found, ones({}, kFloat64));
       }},
      {"unscale_found_inf_not_0d", K::Type, "amp_non_finite_check_and_unscale_",
       {"found_inf", "[1] float32"},
       [](const Watch& watch) {
         TensorList g{f32({2})};
         watch(g[0]);
         amp_non_finite_check_and_unscale_(g, zeros({1}), ones({}));
       }},
      {"unscale_integer_tensor", K::Type, "amp_non_finite_check_and_unscale_",
       {"self[1]", "int64"},
       [](const Watch& watch) {
         TensorList g{f32({2}), i64({2})};
         Tensor found = zeros({});
         for (const Tensor& t : g) watch(t);
         watch(found);
         amp_non_finite_check_and_unscale_(g, found, ones({}));
       }}};
  head(cs, "amp_update_scale_").errors = {
      {"update_scale_tracker_int64", K::Type, "amp_update_scale_", {"growth_tracker", "int64"},
       [](const Watch& watch) {
         Tensor scale = ones({});
         watch(scale);
         amp_update_scale_(scale, zeros({}, kInt64), zeros({}), 2.0, 0.5, 10);
       }},
      {"update_scale_interval_0", K::Value, "amp_update_scale_", {"growth_interval", "0"},
       [](const Watch& watch) {
         Tensor scale = ones({}), tracker = zeros({}, kInt32);
         watch(scale);
         watch(tracker);
         amp_update_scale_(scale, tracker, zeros({}), 2.0, 0.5, 0);
       }},
      {"update_scale_negative_backoff", K::Value, "amp_update_scale_",
       {"backoff_factor", "-0.5"},
       [](const Watch& watch) {
         Tensor scale = ones({}), tracker = zeros({}, kInt32);
         watch(scale);
         watch(tracker);
         amp_update_scale_(scale, tracker, ones({}), 2.0, -0.5, 10);
       }}};
  // clang-format on
}

}  // namespace

Cases factory_foreach_cases() {
  Cases cs;
  add_fills(cs);
  add_ranges(cs);
  add_random(cs);
  add_foreach(cs);
  return cs;
}

}  // namespace kiln::test

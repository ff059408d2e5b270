// Op table: sort and topk, cumsum and prod, flip and repeat, the views diagonal and
// squeeze.dims, and elu with its backward.
#include "tests/ops/op_test_util.h"

namespace kiln::test {
namespace {

constexpr auto C = Layout::Contig;
constexpr auto T = Layout::Transposed;
constexpr auto S = Layout::Strided;

// Whether a row's input has elements (empty rows are not gradchecked).
bool nonempty(const Spec& s) {
  return std::all_of(s.shape.begin(), s.shape.end(), [](int64_t n) { return n > 0; });
}

// ---------------------------------------------------------------- sort, topk

// Rows with ties (small integers, bools) compare indices too: Kiln's sort is stable, like
// at::sort(stable=true). NaN, infinities and signed zeros come from special_values().
void add_sort(Cases& cs) {
  struct Config {
    const char* label;
    Spec in;
    int64_t dim;
    bool descending;
    std::vector<DType> dtypes;
  };
  const std::vector<Config> configs = {
      {"last", {{4, 7}, C}, -1, false, kAllDTypes},
      {"dim0_desc", {{5, 3, 4}, T}, 0, true, kAllDTypes},
      {"mid", {{3, 6, 4}, S}, 1, false, kAllDTypes},
      {"1d_desc", {{37}, C}, 0, true, kAllDTypes},
      {"0d", {{}, C}, 0, false, kAllDTypes},
      {"zero", {{0, 5}, C}, 1, false, kAllDTypes},
      {"zero_dim_desc", {{3, 0}, C}, -1, true, kAllDTypes},
      {"large", {{64, 600}, C}, -1, false, {kInt32, kFloat32}},
      {"large_dim0_desc", {{600, 64}, C}, 0, true, {kFloat64}},
  };
  for (const Config& c : configs) {
    int64_t d = c.dim;
    bool desc = c.descending;
    cs.push_back({.name = std::string("sort_") + c.label,
                  .ops = {"sort"},
                  .dtypes = c.dtypes,
                  .make = make_from({draw_any()}, {c.in}),
                  .kiln =
                      [d, desc](const KArgs& x) {
                        auto [v, i] = sort(x[0], d, desc);
                        return KTensors{v, i};
                      },
                  .aten =
                      [d, desc](const AArgs& a) {
                        auto [v, i] = at::sort(a[0], true, d, desc);
                        return ATensors{v, i};
                      },
                  .tol = Tol::Exact});
  }
  for (bool desc : {false, true}) {
    Dims shape{2, static_cast<int64_t>(special_values().size())};
    cs.push_back({.name = desc ? "sort_special_desc" : "sort_special",
                  .ops = {"sort"},
                  .dtypes = kFloatDTypes,
                  .make =
                      [shape](Gen& g) {
                        std::vector<double> v = special_values(), w = v;
                        std::shuffle(v.begin(), v.end(), g.rng);
                        std::shuffle(w.begin(), w.end(), g.rng);
                        v.insert(v.end(), w.begin(), w.end());
                        return KTensors{g.values(v, shape)};
                      },
                  .kiln =
                      [desc](const KArgs& x) {
                        auto [v, i] = sort(x[0], -1, desc);
                        return KTensors{v, i};
                      },
                  .aten =
                      [desc](const AArgs& a) {
                        auto [v, i] = at::sort(a[0], true, -1, desc);
                        return ATensors{v, i};
                      },
                  .tol = Tol::Exact});
  }
  head(cs, "sort").grads = {
      {"sort_last",
       {"sort"},
       [](GradGen& d) {
         return TensorList{d.var({3, 5})};
       },
       [](const TensorList& x) {
         auto [v, i] = sort(x[0]);
         return TensorList{v};
       }},
      {"sort_dim0_desc",
       {"sort"},
       [](GradGen& d) {
         return TensorList{d.var({4, 2, 3})};
       },
       [](const TensorList& x) {
         auto [v, i] = sort(x[0], 0, true);
         return TensorList{v};
       }},
  };
  head(cs, "sort").errors = {
      {"sort_dim_out_of_range",
       K::Index,
       "sort",
       {"[-2, 1]", "3"},
       [](const Watch&) {
         sort(f32({2, 3}), 3);
       }},
      {"sort_undefined",
       K::Value,
       "sort",
       {"no tensor argument"},
       [](const Watch&) { sort(Tensor()); }},
  };
}

// Distinct values (ties may pick other indices than ATen's), and for sorted=false both results
// sorted before comparing (ATen leaves the order unspecified).
void add_topk(Cases& cs) {
  struct Config {
    const char* label;
    Spec in;
    int64_t k, dim;
    bool largest, sorted;
  };
  const std::vector<Config> configs = {
      {"last", {{4, 9}, C}, 3, -1, true, true},
      {"dim0_smallest", {{6, 5, 4}, T}, 2, 0, false, true},
      {"k_all", {{5, 8}, S}, 8, 1, true, true},
      {"k0", {{4, 6}, C}, 0, 1, true, true},
      {"0d", {{}, C}, 1, 0, true, true},
      {"zero", {{0, 6}, C}, 2, 1, false, true},
      {"zero_k0", {{3, 0}, C}, 0, 1, true, true},
      {"unsorted", {{3, 20}, C}, 5, -1, true, false},
      {"unsorted_smallest", {{20, 3}, T}, 4, 0, false, false},
  };
  auto kiln_fn = [](int64_t k, int64_t d, bool largest, bool sorted) {
    return [=](const KArgs& x) {
      auto [v, i] = topk(x[0], k, d, largest, sorted);
      if (!sorted) {
        auto [sv, p] = sort(v, d, largest);
        return KTensors{sv, gather(i, d, p)};
      }
      return KTensors{v, i};
    };
  };
  auto aten_fn = [](int64_t k, int64_t d, bool largest, bool sorted) {
    return [=](const AArgs& a) {
      auto [v, i] = at::topk(a[0], k, d, largest, sorted);
      if (!sorted) {
        auto [sv, p] = at::sort(v, true, d, largest);
        return ATensors{sv, i.gather(d, p)};
      }
      return ATensors{v, i};
    };
  };
  for (const Config& c : configs) {
    cs.push_back({.name = std::string("topk_") + c.label,
                  .ops = c.sorted ? std::vector<std::string>{"topk"}
                                  : std::vector<std::string>{"topk", "sort", "gather"},
                  .dtypes = kNumericDTypes,
                  .make = [spec = c.in](Gen& g) { return KTensors{g.distinct(spec)}; },
                  .kiln = kiln_fn(c.k, c.dim, c.largest, c.sorted),
                  .aten = aten_fn(c.k, c.dim, c.largest, c.sorted),
                  .tol = Tol::Exact});
  }
  cs.push_back({.name = "topk_large",
                .ops = {"topk"},
                .dtypes = {kFloat32, kFloat64},
                .make = make_from({draw_any()}, {Spec{{16, 700}, C}}),
                .kiln = kiln_fn(7, -1, true, true),
                .aten = aten_fn(7, -1, true, true),
                .tol = Tol::Exact});
  // NaN is the largest value; values only (the special values repeat, so indices may tie).
  for (bool largest : {true, false}) {
    Dims shape{static_cast<int64_t>(special_values().size())};
    cs.push_back(
        {.name = largest ? "topk_special" : "topk_special_smallest",
         .ops = {"topk"},
         .dtypes = kFloatDTypes,
         .make =
             [shape](Gen& g) {
               std::vector<double> v = special_values();
               std::shuffle(v.begin(), v.end(), g.rng);
               return KTensors{g.values(v, shape)};
             },
         .kiln =
             [largest](const KArgs& x) { return KTensors{std::get<0>(topk(x[0], 4, 0, largest))}; },
         .aten =
             [largest](const AArgs& a) {
               return ATensors{std::get<0>(at::topk(a[0], 4, 0, largest))};
             }});
  }
  head(cs, "topk").grads = {
      {"topk_last",
       {"topk"},
       [](GradGen& d) {
         return TensorList{d.var({3, 6})};
       },
       [](const TensorList& x) { return TensorList{std::get<0>(topk(x[0], 2))}; }},
      {"topk_dim0_smallest",
       {"topk"},
       [](GradGen& d) {
         return TensorList{d.var({5, 2, 2})};
       },
       [](const TensorList& x) { return TensorList{std::get<0>(topk(x[0], 3, 0, false))}; }},
  };
  head(cs, "topk").errors = {
      {"topk_k_too_large",
       K::Index,
       "topk",
       {"k (4)", "size 3"},
       [](const Watch&) {
         topk(f32({2, 3}), 4);
       }},
      {"topk_k_negative",
       K::Index,
       "topk",
       {"k (-1)"},
       [](const Watch&) {
         topk(f32({2, 3}), -1);
       }},
      {"topk_0d_k0", K::Index, "topk", {"k (0)", "0-d"}, [](const Watch&) { topk(f32({}), 0); }},
      {"topk_dim_out_of_range",
       K::Index,
       "topk",
       {"[-2, 1]", "-3"},
       [](const Watch&) {
         topk(f32({2, 3}), 1, -3);
       }},
  };
}

// ---------------------------------------------------------------- cumsum, prod

void add_cumsum(Cases& cs) {
  struct Config {
    const char* label;
    Spec in;
    int64_t dim;
    bool grad;
  };
  const std::vector<Config> configs = {
      {"last", {{4, 5}, C}, 1, true},
      {"dim0", {{3, 4, 5}, T}, 0, true},
      {"neg", {{3, 4, 5}, S}, -1, false},
      {"1d", {{37}, C}, 0, true},
      {"0d", {{}, C}, 0, true},
      {"zero", {{0, 3}, C}, 1, false},
      {"zero_dim", {{3, 0}, C}, 1, false},
      {"large", {{50, 700}, C}, 1, false},
      {"large_dim0", {{700, 50}, T}, 0, false},
  };
  for (const Config& c : configs) {
    int64_t d = c.dim;
    OpCase row{.name = std::string("cumsum_") + c.label,
               .ops = {"cumsum"},
               .dtypes = kAllDTypes,
               .make = make_from({draw_any()}, {c.in}),
               .kiln = [d](const KArgs& x) { return KTensors{cumsum(x[0], d)}; },
               .aten = [d](const AArgs& a) { return ATensors{at::cumsum(a[0], d)}; },
               .tol = Tol::Accum,
               .grad = c.grad};
    cs.push_back(row);
    if (std::string(c.label) == "dim0")
      cs.push_back(out_variant(
          row, "cumsum_out",
          [d](const KArgs& x) {
            ops::op_cumsum_out(x.out, x[0], d, std::nullopt);
            return KTensors{x.out};
          },
          "", T));
  }
  for (DType to : {kFloat64, kFloat32, kInt32}) {
    cs.push_back(
        {.name = std::string("cumsum_dtype_") + std::string(name(to)),
         .ops = {"cumsum"},
         .dtypes = {kInt64, kFloat32, kBool},
         .make = make_from({draw_any()}, {Spec{{3, 6}, T}}),
         .kiln = [to](const KArgs& x) { return KTensors{cumsum(x[0], 1, to)}; },
         .aten = [to](const AArgs& a) { return ATensors{at::cumsum(a[0], 1, to_aten(to))}; },
         .tol = Tol::Accum});
  }
  head(cs, "cumsum").grads = {
      {"cumsum_dim1_to_float64",
       {"cumsum"},
       [](GradGen& d) {
         return TensorList{d.var({3, 4})};
       },
       [](const TensorList& x) { return TensorList{cumsum(x[0], -1, kFloat64)}; }},
  };
  head(cs, "cumsum").errors = {
      {"cumsum_dim_out_of_range",
       K::Index,
       "cumsum",
       {"[-2, 1]", "2"},
       [](const Watch&) {
         cumsum(f32({2, 3}), 2);
       }},
      {"cumsum_bool_dtype",
       K::Type,
       "cumsum",
       {"bool"},
       [](const Watch&) {
         cumsum(f32({2, 3}), 0, kBool);
       }},
  };
}

void add_prod(Cases& cs) {
  struct Config {
    const char* label;
    Spec in;
    std::optional<int64_t> dim;
    bool keepdim;
  };
  const std::vector<Config> configs = {
      {"all", {{3, 4}, C}, std::nullopt, false},
      {"all_strided", {{2, 5}, S}, std::nullopt, false},
      {"dim1", {{3, 4, 2}, C}, 1, false},
      {"dim0_keep", {{4, 3}, T}, 0, true},
      {"neg_keep", {{2, 3, 4}, T}, -1, true},
      {"0d", {{}, C}, std::nullopt, false},
      {"0d_dim", {{}, C}, 0, true},
      {"empty_all", {{0, 3}, C}, std::nullopt, false},
      {"empty_dim", {{2, 0, 3}, C}, 1, false},
      {"zero_kept", {{0, 3}, C}, 1, true},
  };
  for (const Config& c : configs) {
    std::optional<int64_t> d = c.dim;
    bool keep = c.keepdim;
    OpCase row{.name = std::string("prod_") + c.label,
               .ops = {"prod"},
               .dtypes = kAllDTypes,
               .make = make_from({draw_any()}, {c.in}),
               .kiln = [d, keep](const KArgs& x) { return KTensors{prod(x[0], d, keep)}; },
               .aten =
                   [d, keep](const AArgs& a) {
                     return ATensors{d ? at::prod(a[0], *d, keep) : at::prod(a[0])};
                   },
               .tol = Tol::Accum,
               .grad = nonempty(c.in)};
    cs.push_back(row);
    if (std::string(c.label) == "dim0_keep")
      cs.push_back(out_variant(
          row, "prod_out",
          [d, keep](const KArgs& x) {
            ops::op_prod_out(x.out, x[0], d, keep, std::nullopt);
            return KTensors{x.out};
          },
          "", T));
  }
  cs.push_back({.name = "prod_large",
                .ops = {"prod"},
                .dtypes = {kFloat32, kFloat64},
                .make = make_from({draw_uniform(0.9, 1.1)}, {Spec{{40, 300}, C}}),
                .kiln = [](const KArgs& x) { return KTensors{prod(x[0], 1)}; },
                .aten = [](const AArgs& a) { return ATensors{at::prod(a[0], 1)}; },
                .tol = Tol::Accum});
  cs.push_back(
      {.name = "prod_dtype_float64",
       .ops = {"prod"},
       .dtypes = {kInt32, kFloat32},
       .make = make_from({draw_any()}, {Spec{{3, 5}, C}}),
       .kiln = [](const KArgs& x) { return KTensors{prod(x[0], 1, false, kFloat64)}; },
       .aten = [](const AArgs& a) { return ATensors{at::prod(a[0], 1, false, at::kDouble)}; },
       .tol = Tol::Accum});
  // Note [prod backward with zeros] in kiln/autograd/formulas.cpp: no zero, one zero, two zeros.
  auto with_zeros = [](std::vector<double> v, Dims shape) {
    return [v, shape](GradGen&) { return TensorList{grad_values(v, shape)}; };
  };
  head(cs, "prod").grads = {
      {"prod_one_zero_dim1",
       {"prod"},
       with_zeros({1.5, 0, -2, 0.5, 0, 0, 3, 1, 2, -1, 0.25, 4}, {3, 4}),
       [](const TensorList& x) { return TensorList{prod(x[0], 1)}; }},
      {"prod_one_zero_all",
       {"prod"},
       with_zeros({1.5, 0.5, -2, 0.75, 0, 1.25}, {2, 3}),
       [](const TensorList& x) { return TensorList{prod(x[0])}; }},
      {"prod_two_zeros_all",
       {"prod"},
       with_zeros({1.5, 0, -2, 0.75, 0, 1.25}, {2, 3}),
       [](const TensorList& x) { return TensorList{prod(x[0])}; }},
      {"prod_zeros_dim0_keep",
       {"prod"},
       with_zeros({0, 1.5, 0, 2, -1, 0, 0.5, 3, 0}, {3, 3}),
       [](const TensorList& x) { return TensorList{prod(x[0], 0, true)}; }},
  };
  head(cs, "prod").errors = {
      {"prod_dim_out_of_range",
       K::Index,
       "prod",
       {"[-2, 1]", "2"},
       [](const Watch&) {
         prod(f32({2, 3}), 2);
       }},
      {"prod_bool_dtype",
       K::Type,
       "prod",
       {"bool"},
       [](const Watch&) {
         prod(f32({2, 3}), std::nullopt, false, kBool);
       }},
  };
}

// ---------------------------------------------------------------- flip, repeat

void add_flip_repeat(Cases& cs) {
  struct FlipConfig {
    const char* label;
    Spec in;
    std::vector<int64_t> dims;
  };
  for (const FlipConfig& c : std::vector<FlipConfig>{
           {"dim0", {{3, 4}, C}, {0}},
           {"dims02", {{3, 4, 5}, T}, {0, -1}},
           {"all", {{2, 3, 4}, S}, {0, 1, 2}},
           {"none", {{4, 5}, C}, {}},
           {"1d", {{9}, S}, {0}},
           {"0d", {{}, C}, {0}},
           {"zero", {{0, 4}, C}, {1}},
       }) {
    std::vector<int64_t> dims = c.dims;
    OpCase row{.name = std::string("flip_") + c.label,
               .ops = {"flip"},
               .dtypes = kAllDTypes,
               .make = make_from({draw_any()}, {c.in}),
               .kiln = [dims](const KArgs& x) { return KTensors{flip(x[0], dims)}; },
               .aten = [dims](const AArgs& a) { return ATensors{at::flip(a[0], dims)}; },
               .tol = Tol::Exact,
               .alias = Alias::Copy,
               .grad = nonempty(c.in)};
    cs.push_back(row);
    if (std::string(c.label) == "dims02")
      cs.push_back(out_variant(
          row, "flip_out",
          [dims](const KArgs& x) {
            ops::op_flip_out(x.out, x[0], dims);
            return KTensors{x.out};
          },
          "", T));
  }
  head(cs, "flip").errors = {
      {"flip_repeated_dim",
       K::Value,
       "flip",
       {"multiple times"},
       [](const Watch&) {
         flip(f32({2, 3}), {1, -1});
       }},
      {"flip_dim_out_of_range",
       K::Index,
       "flip",
       {"[-2, 1]", "2"},
       [](const Watch&) {
         flip(f32({2, 3}), {2});
       }},
  };

  struct RepeatConfig {
    const char* label;
    Spec in;
    std::vector<int64_t> repeats;
  };
  for (const RepeatConfig& c : std::vector<RepeatConfig>{
           {"2d", {{2, 3}, C}, {2, 1}},
           {"lead", {{2, 3}, T}, {2, 1, 3}},
           {"1d", {{3}, S}, {2, 2}},
           {"0d", {{}, C}, {3}},
           {"0d_none", {{}, C}, {}},
           {"zero_repeat", {{2, 3}, C}, {0, 2}},
           {"zero", {{0, 2}, C}, {2, 2}},
       }) {
    std::vector<int64_t> r = c.repeats;
    OpCase row{.name = std::string("repeat_") + c.label,
               .ops = {"repeat"},
               .dtypes = kAllDTypes,
               .make = make_from({draw_any()}, {c.in}),
               .kiln = [r](const KArgs& x) { return KTensors{repeat(x[0], r)}; },
               .aten = [r](const AArgs& a) { return ATensors{a[0].repeat(r)}; },
               .tol = Tol::Exact,
               .alias = Alias::Copy,
               .grad = nonempty(c.in) && std::string(c.label) != "zero_repeat"};
    cs.push_back(row);
    if (std::string(c.label) == "lead")
      cs.push_back(out_variant(
          row, "repeat_out",
          [r](const KArgs& x) {
            ops::op_repeat_out(x.out, x[0], r);
            return KTensors{x.out};
          },
          "", T));
  }
  head(cs, "repeat").errors = {
      {"repeat_too_few",
       K::Value,
       "repeat",
       {"(1)", "(2)"},
       [](const Watch&) {
         repeat(f32({2, 3}), {2});
       }},
      {"repeat_negative",
       K::Value,
       "repeat",
       {"-1"},
       [](const Watch&) {
         repeat(f32({2, 3}), {1, -1});
       }},
  };
}

// ---------------------------------------------------------------- diagonal, squeeze.dims

void add_views(Cases& cs) {
  struct DiagConfig {
    const char* label;
    Spec in;
    int64_t offset, dim1, dim2;
  };
  for (const DiagConfig& c : std::vector<DiagConfig>{
           {"main", {{4, 5}, C}, 0, 0, 1},
           {"above", {{4, 5}, T}, 1, 0, 1},
           {"below", {{5, 4}, S}, -2, 0, 1},
           {"batched", {{2, 3, 4}, C}, 0, 2, 0},
           {"neg_dims", {{3, 2, 4}, T}, 1, -1, -3},
           {"beyond", {{3, 3}, C}, 5, 0, 1},
           {"zero", {{0, 3}, C}, 0, 0, 1},
       }) {
    int64_t o = c.offset, d1 = c.dim1, d2 = c.dim2;
    cs.push_back(
        {.name = std::string("diagonal_") + c.label,
         .ops = {"diagonal"},
         .dtypes = kAllDTypes,
         .make = make_from({draw_any()}, {c.in}),
         .kiln = [o, d1, d2](const KArgs& x) { return KTensors{diagonal(x[0], o, d1, d2)}; },
         .aten = [o, d1, d2](const AArgs& a) { return ATensors{at::diagonal(a[0], o, d1, d2)}; },
         .tol = Tol::Exact,
         .alias = Alias::View,
         .grad = nonempty(c.in) && std::string(c.label) != "beyond"});
  }
  head(cs, "diagonal").errors = {
      {"diagonal_same_dims",
       K::Value,
       "diagonal",
       {"identical", "1, -1"},
       [](const Watch&) {
         diagonal(f32({2, 3}), 0, 1, -1);
       }},
      {"diagonal_1d",
       K::Index,
       "diagonal",
       {"at least 2", "1"},
       [](const Watch&) { diagonal(f32({3})); }},
  };

  struct SqueezeConfig {
    const char* label;
    Spec in;
    std::vector<int64_t> dims;
  };
  for (const SqueezeConfig& c : std::vector<SqueezeConfig>{
           {"two", {{1, 3, 1, 4}, C}, {0, 2}},
           {"neg", {{1, 3, 1}, T}, {-1}},
           {"not_one", {{2, 3}, C}, {0, 1}},
           {"mixed", {{1, 4, 1}, S}, {0, 1}},
           {"0d", {{}, C}, {0}},
           {"none", {{1, 1}, C}, {}},
           {"zero", {{0, 1}, C}, {0, 1}},
       }) {
    std::vector<int64_t> dims = c.dims;
    cs.push_back({.name = std::string("squeeze_dims_") + c.label,
                  .ops = {"squeeze_dims"},
                  .dtypes = kAllDTypes,
                  .make = make_from({draw_any()}, {c.in}),
                  .kiln = [dims](const KArgs& x) { return KTensors{squeeze(x[0], dims)}; },
                  .aten =
                      [dims](const AArgs& a) {
                        // libtorch 1.13 has no squeeze.dims: one dim at a time, last first.
                        std::vector<int64_t> w;
                        for (int64_t d : dims) w.push_back(d < 0 ? d + a[0].dim() : d);
                        std::sort(w.rbegin(), w.rend());
                        at::Tensor t = a[0];
                        for (int64_t d : w) t = at::squeeze(t, d);
                        return ATensors{t};
                      },
                  .tol = Tol::Exact,
                  .alias = Alias::View,
                  .grad = nonempty(c.in)});
  }
  head(cs, "squeeze_dims").errors = {
      {"squeeze_dims_out_of_range",
       K::Index,
       "squeeze",
       {"[-2, 1]", "2"},
       [](const Watch&) {
         squeeze(f32({1, 3}), IntArrayRef({0, 2}));
       }},
      {"squeeze_dims_repeated",
       K::Value,
       "squeeze",
       {"multiple times"},
       [](const Watch&) {
         squeeze(f32({1, 3}), IntArrayRef({0, -2}));
       }},
  };
}

// ---------------------------------------------------------------- elu, elu_backward

void add_elu(Cases& cs) {
  add_pointwise(
      cs,
      {.name = "elu",
       .dtypes = kFloatDTypes,
       .draws = {draw_any()},
       .result = ResultKind::Float,
       .special = true,
       .grad = true,
       .errors = {{"elu_int",
                   K::Type,
                   "elu",
                   {"floating", "int64"},
                   [](const Watch&) { elu(i64({3})); }}}},
      ops::op_elu, ops::op_elu_, ops::op_elu_out,
      [](auto call, const KArgs& x) { return call(x[0], 1.5, 0.5, 2.0); },
      [](const AArgs& a) { return ATensors{at::elu(a[0], 1.5, 0.5, 2.0)}; });
  add_pointwise(
      cs, {.name = "elu", .dtypes = {kFloat32, kFloat64}, .draws = {draw_any()}, .tag = "defaults"},
      ops::op_elu, ops::op_elu_, ops::op_elu_out,
      [](auto call, const KArgs& x) { return call(x[0], 1, 1, 1); },
      [](const AArgs& a) { return ATensors{at::elu(a[0])}; });

  for (bool is_result : {false, true}) {
    OpCase row{.name = is_result ? "elu_backward_result" : "elu_backward",
               .ops = {"elu_backward"},
               .dtypes = kFloatDTypes,
               .make = make_from({draw_any(), draw_any()}, {Spec{{3, 5}, C}, Spec{{3, 5}, T}}),
               .kiln =
                   [is_result](const KArgs& x) {
                     return KTensors{elu_backward(x[0], 1.5, 0.5, 2.0, is_result, x[1])};
                   },
               .aten =
                   [is_result](const AArgs& a) {
                     return ATensors{at::elu_backward(a[0], 1.5, 0.5, 2.0, is_result, a[1])};
                   }};
    cs.push_back(row);
    if (!is_result)
      cs.push_back(out_variant(row, "elu_backward_out", [](const KArgs& x) {
        ops::op_elu_backward_out(x.out, x[0], 1.5, 0.5, 2.0, false, x[1]);
        return KTensors{x.out};
      }));
  }
  head(cs, "elu_backward").errors = {
      {"elu_backward_shapes",
       K::Value,
       "elu_backward",
       {"[2, 3]", "[3, 2]"},
       [](const Watch&) {
         elu_backward(f32({2, 3}), 1, 1, 1, false, f32({3, 2}));
       }},
      {"elu_backward_negative_alpha_result",
       K::Value,
       "elu_backward",
       {"alpha >= 0", "-1"},
       [](const Watch&) { elu_backward(f32({2}), -1, 1, 1, true, f32({2})); }},
  };
}

}  // namespace

Cases sort_scan_cases() {
  Cases cs;
  add_sort(cs);
  add_topk(cs);
  add_cumsum(cs);
  add_prod(cs);
  add_flip_repeat(cs);
  add_views(cs);
  add_elu(cs);
  return cs;
}

}  // namespace kiln::test

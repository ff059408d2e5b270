// Op table: reductions (sum, mean, var, amax/amin, max/min with indices, argmax/argmin,
// all/any) and softmax/log_softmax.
//
// Reductions use Tol::Accum: summing many terms in a different order or blocking than ATen
// legitimately moves float32 results by more than the default 1.3e-6.
#include "tests/ops/op_test_util.h"

namespace kiln::test {
namespace {

constexpr auto C = Layout::Contig;
constexpr auto T = Layout::Transposed;
constexpr auto S = Layout::Strided;
constexpr auto E = Layout::Expanded;

// ---------------------------------------------------------------- gradcheck and error samples

// Gradchecks of sum, mean, amax, amin and var (`op`) over all dims, some dims, keepdim and 0-d
// inputs (not amax, amin and var). amax/amin draw continuous values: no ties (ties are
// checked against ATen instead).
GradSamples reduction_grads(const std::string& op) {
  struct Red {
    const char* label;
    Dims shape, dims;
    bool keepdim;
  };
  const std::vector<Red> reds = {{"all", {2, 3}, {}, false},
                                 {"all_keepdim", {2, 3}, {}, true},
                                 {"dim0", {2, 3, 4}, {0}, false},
                                 {"dim_neg", {2, 3, 4}, {-1}, false},
                                 {"dims02_keepdim", {2, 3, 4}, {0, 2}, true},
                                 {"dims12", {2, 3, 4}, {1, 2}, false},
                                 {"0d", {}, {}, false}};
  GradSamples cs;
  for (const Red& r : reds) {
    auto in = [r](GradGen& d) { return TensorList{d.var(r.shape)}; };
    auto push = [&](const std::string& name, std::function<Tensor(const Tensor&)> f) {
      cs.push_back({name, {op}, in, [f](const TensorList& x) { return TensorList{f(x[0])}; }});
    };
    if (op == "sum")
      push(std::string("sum_") + r.label,
           [r](const Tensor& x) { return sum(x, r.dims, r.keepdim); });
    if (op == "mean")
      push(std::string("mean_") + r.label,
           [r](const Tensor& x) { return mean(x, r.dims, r.keepdim); });
    if (r.shape.empty()) continue;
    if (op == "amax")
      push(std::string("amax_") + r.label,
           [r](const Tensor& x) { return amax(x, r.dims, r.keepdim); });
    if (op == "amin")
      push(std::string("amin_") + r.label,
           [r](const Tensor& x) { return amin(x, r.dims, r.keepdim); });
    if (op == "var")
      for (int64_t correction : {0, 1})
        push(std::string("var_c") + std::to_string(correction) + "_" + r.label,
             [r, correction](const Tensor& x) { return var(x, r.dims, correction, r.keepdim); });
  }
  if (op == "sum")
    cs.push_back({"sum_dtype_float32_input",
                  {"sum"},
                  [](GradGen& d) {
                    return TensorList{d.var({2, 3})};
                  },
                  [](const TensorList& x) { return TensorList{sum(x[0], {1}, false, kFloat64)}; }});
  return cs;
}

// Gradchecks of max(dim) / min(dim): the values (the indices are not differentiable).
GradSamples max_min_dim_grads(bool is_max) {
  GradSamples cs;
  for (auto [dim, keepdim] : {std::pair<int64_t, bool>{0, false}, {1, true}, {-1, false}}) {
    std::string s = std::to_string(dim < 0 ? 9 : dim) + (keepdim ? "_keepdim" : "");
    cs.push_back({(is_max ? "max_dim" : "min_dim") + s,
                  {is_max ? "max_dim" : "min_dim"},
                  [](GradGen& d) {
                    return TensorList{d.var({3, 4})};
                  },
                  [dim, keepdim, is_max](const TensorList& x) {
                    auto [v, i] = is_max ? max(x[0], dim, keepdim) : min(x[0], dim, keepdim);
                    return TensorList{v, i};
                  }});
  }
  return cs;
}

// Gradchecks of softmax or log_softmax along each dim.
GradSamples softmax_grads(bool log) {
  GradSamples cs;
  for (int64_t dim : {0, 1, 2, -1}) {
    std::string s = dim < 0 ? "neg1" : std::to_string(dim);
    cs.push_back({(log ? "log_softmax_dim" : "softmax_dim") + s,
                  {log ? "log_softmax" : "softmax"},
                  [](GradGen& d) {
                    return TensorList{d.var({2, 3, 4})};
                  },
                  [dim, log](const TensorList& x) {
                    return TensorList{log ? log_softmax(x[0], dim) : softmax(x[0], dim)};
                  }});
  }
  return cs;
}

struct ReduceConfig {
  std::string label;
  Spec in;
  std::vector<int64_t> dims;  // empty: all dims
  bool keepdim = false;
};

// Single dims, several dims, keepdim, all dims, 0-d and 1-d inputs, non-contiguous inputs,
// zero-size dims, and sizes large enough for the parallel path.
const std::vector<ReduceConfig>& reduce_configs() {
  static const std::vector<ReduceConfig> c = {
      {"dim1", {{3, 4, 5}, C}, {1}, false},
      {"dims02", {{3, 4, 5}, C}, {0, 2}, false},
      {"dims_neg_keep", {{3, 4, 5}, T}, {-1, 0}, true},
      {"last_keep", {{3, 4, 5}, T}, {-1}, true},
      {"all", {{3, 4, 5}, S}, {}, false},
      {"all_keep", {{3, 4, 5}, C}, {}, true},
      {"expanded", {{4, 5}, E}, {0}, false},
      {"1d", {{37}, C}, {}, false},
      {"0d", {{}, C}, {}, false},
      {"0d_dim", {{}, C}, {0}, true},
      {"zero_kept", {{0, 3}, C}, {1}, false},
      {"zero_reduced", {{0, 3}, C}, {0}, false},
      {"large_rows", {{64, 1100}, C}, {1}, false},
      {"large_cols", {{1100, 64}, C}, {0}, false},
      // Columns read 16 bytes a lane on CUDA (a tile of 32 loads a row; the last one partial).
      {"wide_cols", {{300, 1040}, C}, {0}, false},
      {"wide_cols_batched", {{3, 50, 264}, C}, {1}, false},
      {"large_all", {{300, 129}, T}, {}, false},
  };
  return c;
}
// The configs of ops without an identity (amax, argmax, ...): reducing a size-0 dim is an
// error there (see the error table).
std::vector<ReduceConfig> nonempty_configs(bool small_only) {
  std::vector<ReduceConfig> out;
  for (const ReduceConfig& c : reduce_configs())
    if (c.label != "zero_reduced" && !(small_only && c.label.starts_with("large")))
      out.push_back(c);
  return out;
}

using AtenReduce = std::function<at::Tensor(const at::Tensor&, std::vector<int64_t>, bool)>;

// Adds a reduction's functional rows, one per config, and out= rows for three configs.
template <class F, class O, class Body>
void add_reduction(Cases& cs, const std::string& name, F& f, O& o, std::vector<DType> dtypes,
                   Draw draw, const std::vector<ReduceConfig>& configs, Body body, AtenReduce aten,
                   const std::string& tag = "") {
  std::string base = tag.empty() ? name : name + "_" + tag;
  for (const ReduceConfig& c : configs) {
    std::vector<int64_t> dims = c.dims;
    bool keep = c.keepdim;
    OpCase row{.name = base + "_" + c.label,
               .ops = {name},
               .dtypes = dtypes,
               .make = make_from({draw}, {c.in}),
               .kiln =
                   [fp = &f, body, dims, keep](const KArgs& x) {
                     return KTensors{body(CallFunctional<F>{*fp}, x[0], dims, keep)};
                   },
               .aten =
                   [aten, dims, keep](const AArgs& a) {
                     return ATensors{aten(a[0], dims_or_all(dims, a[0].dim()), keep)};
                   },
               .tol = Tol::Accum};
    cs.push_back(row);
    if (c.label == "dim1" || c.label == "last_keep" || c.label == "all") {
      Layout out_layout = c.label == "last_keep" ? Layout::Transposed : Layout::Contig;
      cs.push_back(out_variant(
          row, name + "_out",
          [op = &o, body, dims, keep](const KArgs& x) {
            return KTensors{body(CallOut<O>{*op, x.out}, x[0], dims, keep)};
          },
          "_" + c.label, out_layout));
    }
  }
}

// ATen's all/any take one dim at a time.
at::Tensor aten_all_any(bool is_all, const at::Tensor& x, std::vector<int64_t> dims, bool keep) {
  if (dims.empty() || static_cast<int64_t>(dims.size()) == x.dim()) {
    if (!keep) return is_all ? at::all(x) : at::any(x);
    if (x.dim() == 0) dims = {};
  }
  for (int64_t& d : dims) d = at::maybe_wrap_dim(d, x.dim());
  std::sort(dims.rbegin(), dims.rend());
  at::Tensor r = x;
  for (int64_t d : dims) r = is_all ? at::all(r, d, keep) : at::any(r, d, keep);
  return r;
}

void add_reductions(Cases& cs) {
  const auto all = reduce_configs();
  const auto nonempty = nonempty_configs(false);
  const auto small = nonempty_configs(true);
  add_reduction(
      cs, "sum", ops::op_sum, ops::op_sum_out, kAllDTypes, draw_any(), all,
      [](auto call, const Tensor& x, IntArrayRef d, bool k) { return call(x, d, k, OptDType{}); },
      [](const at::Tensor& x, std::vector<int64_t> d, bool k) { return at::sum(x, d, k); });
  add_reduction(
      cs, "sum", ops::op_sum, ops::op_sum_out, kAllDTypes, draw_any(), small,
      [](auto call, const Tensor& x, IntArrayRef d, bool k) {
        return call(x, d, k, OptDType{kFloat64});
      },
      [](const at::Tensor& x, std::vector<int64_t> d, bool k) {
        return at::sum(x, d, k, at::kDouble);
      },
      "to_f64");
  add_reduction(
      cs, "mean", ops::op_mean, ops::op_mean_out, kFloatDTypes, draw_any(), all,
      [](auto call, const Tensor& x, IntArrayRef d, bool k) { return call(x, d, k, OptDType{}); },
      [](const at::Tensor& x, std::vector<int64_t> d, bool k) { return at::mean(x, d, k); });
  add_reduction(
      cs, "mean", ops::op_mean, ops::op_mean_out, kAllDTypes, draw_any(), small,
      [](auto call, const Tensor& x, IntArrayRef d, bool k) {
        return call(x, d, k, OptDType{kFloat32});
      },
      [](const at::Tensor& x, std::vector<int64_t> d, bool k) {
        return at::mean(x, d, k, at::kFloat);
      },
      "to_f32");
  for (int64_t corr : {0, 1, 2}) {
    add_reduction(
        cs, "var", ops::op_var, ops::op_var_out, kFloatDTypes, draw_any(), corr == 1 ? all : small,
        [corr](auto call, const Tensor& x, IntArrayRef d, bool k) { return call(x, d, corr, k); },
        [corr](const at::Tensor& x, std::vector<int64_t> d, bool k) {
          return at::var(x, at::OptionalIntArrayRef(d), c10::optional<int64_t>(corr), k);
        },
        "corr" + std::to_string(corr));
  }
  add_reduction(
      cs, "amax", ops::op_amax, ops::op_amax_out, kAllDTypes, draw_any(), nonempty,
      [](auto call, const Tensor& x, IntArrayRef d, bool k) { return call(x, d, k); },
      [](const at::Tensor& x, std::vector<int64_t> d, bool k) { return at::amax(x, d, k); });
  add_reduction(
      cs, "amin", ops::op_amin, ops::op_amin_out, kAllDTypes, draw_any(), nonempty,
      [](auto call, const Tensor& x, IntArrayRef d, bool k) { return call(x, d, k); },
      [](const at::Tensor& x, std::vector<int64_t> d, bool k) { return at::amin(x, d, k); });
  add_reduction(
      cs, "all", ops::op_all, ops::op_all_out, kAllDTypes, draw_sparse(), all,
      [](auto call, const Tensor& x, IntArrayRef d, bool k) { return call(x, d, k); },
      [](const at::Tensor& x, std::vector<int64_t> d, bool k) {
        return aten_all_any(true, x, d, k);
      });
  add_reduction(
      cs, "any", ops::op_any, ops::op_any_out, kAllDTypes, draw_sparse(), all,
      [](auto call, const Tensor& x, IntArrayRef d, bool k) { return call(x, d, k); },
      [](const at::Tensor& x, std::vector<int64_t> d, bool k) {
        return aten_all_any(false, x, d, k);
      });

  // NaN propagates through amax and sum.
  for (const char* op : {"amax", "amin", "sum"}) {
    std::string o = op;
    cs.push_back({.name = o + "_special",
                  .ops = {o},
                  .dtypes = kFloatDTypes,
                  .make =
                      [](Gen& g) {
                        std::vector<double> v = special_values();
                        v.resize(20);
                        std::shuffle(v.begin(), v.end(), g.rng);
                        return KTensors{g.values(v, {4, 5})};
                      },
                  .kiln =
                      [o](const KArgs& x) {
                        if (o == "amax") return KTensors{amax(x[0], {1})};
                        if (o == "amin") return KTensors{amin(x[0], {1})};
                        return KTensors{sum(x[0], {1})};
                      },
                  .aten =
                      [o](const AArgs& a) {
                        if (o == "amax") return ATensors{at::amax(a[0], {1})};
                        if (o == "amin") return ATensors{at::amin(a[0], {1})};
                        return ATensors{at::sum(a[0], {1})};
                      },
                  .tol = Tol::Accum});
  }
  // max()/min() over everything are amax/amin.
  cs.push_back({.name = "max_all",
                .ops = {"amax"},
                .dtypes = kNumericDTypes,
                .make = make_from({draw_any()}, {Spec{{5, 6}, T}}),
                .kiln = [](const KArgs& x) { return KTensors{max(x[0])}; },
                .aten = [](const AArgs& a) { return ATensors{at::max(a[0])}; }});
  cs.push_back({.name = "min_all",
                .ops = {"amin"},
                .dtypes = kNumericDTypes,
                .make = make_from({draw_any()}, {Spec{{5, 6}, S}}),
                .kiln = [](const KArgs& x) { return KTensors{min(x[0])}; },
                .aten = [](const AArgs& a) { return ATensors{at::min(a[0])}; }});
  // clang-format off
  OpCase& sum_record = head(cs, "sum");
  sum_record.grads = reduction_grads("sum");
  sum_record.errors = {
      {"sum_dim_out_of_range", K::Index, "sum", {"5", "[-2, 1]"},
       [](const Watch&) { sum(f32({2, 3}), {5}); }},
      {"sum_dim_repeated", K::Value, "sum", {"1", "[1, -1]"},
       [](const Watch&) { sum(f32({2, 3}), {1, -1}); }},
      {"sum_out_overlaps_input", K::Value, "sum_out", {"single memory location"},
       [](const Watch& watch) {
         Tensor a = arange(0, 12, 1, kFloat32).view({3, 4});
         watch(a);
         Tensor out = select(a, 0, 1);
         sum_out(out, a, {0});
       }},
      {"sum_out_wrong_dtype", K::Type, "sum_out", {"float32", "int32"},
       [](const Watch& watch) {
         Tensor out = zeros({4}, kInt32);
         watch(out);
         sum_out(out, f32({3, 4}), {0});
       }}};
  OpCase& mean_record = head(cs, "mean");
  mean_record.grads = reduction_grads("mean");
  mean_record.errors = {{"mean_of_int", K::Type, "mean", {"int64"},
                         [](const Watch&) { mean(ones({3, 4}, kInt64)); }}};
  OpCase& var_record = head(cs, "var");
  var_record.grads = reduction_grads("var");
  var_record.errors = {
      {"var_of_int", K::Type, "var", {"int32"}, [](const Watch&) { var(ones({3}, kInt32)); }},
      {"var_negative_correction", K::Value, "var", {"-1"},
       [](const Watch&) { var(f32({3}), {}, -1); }}};
  OpCase& amax_record = head(cs, "amax");
  amax_record.grads = reduction_grads("amax");
  amax_record.errors = {
      {"amax_of_empty", K::Index, "amax", {"size 0"}, [](const Watch&) { amax(f32({0, 3}), {0}); }},
      {"amax_all_of_empty", K::Index, "amax", {"size 0"}, [](const Watch&) { max(f32({0})); }}};
  head(cs, "amin").grads = reduction_grads("amin");
  // clang-format on
}

// max/min along a dim (values and indices) and argmax/argmin: inputs are pairwise distinct,
// so the indices are unique and compared exactly.
void add_index_reductions(Cases& cs) {
  struct DimConfig {
    const char* label;
    Spec in;
    std::optional<int64_t> dim;
    bool keepdim;
  };
  const std::vector<DimConfig> configs = {
      {"dim1", {{3, 4, 5}, C}, 1, false},  {"dim0_keep", {{3, 4, 5}, T}, 0, true},
      {"last", {{6, 7}, S}, -1, false},    {"1d", {{50}, C}, 0, false},
      {"0d", {{}, C}, 0, false},           {"zero_kept", {{0, 3}, C}, 1, false},
      {"flat", {{3, 4, 5}, T}, {}, false}, {"flat_keep", {{3, 4, 5}, C}, {}, true},
  };
  auto distinct = [](Gen& g, const Spec& s) { return g.distinct(s); };
  for (const DimConfig& c : configs) {
    std::optional<int64_t> dim = c.dim;
    bool keep = c.keepdim;
    std::string label = c.label;
    MakeFn make = make_from({distinct}, {c.in});
    if (dim) {
      int64_t d = *dim;
      cs.push_back({.name = "max_dim_" + label,
                    .ops = {"max_dim"},
                    .dtypes = kNumericDTypes,
                    .make = make,
                    .kiln =
                        [d, keep](const KArgs& x) {
                          auto [v, i] = max(x[0], d, keep);
                          return KTensors{v, i};
                        },
                    .aten =
                        [d, keep](const AArgs& a) {
                          auto [v, i] = at::max(a[0], d, keep);
                          return ATensors{v, i};
                        }});
      cs.push_back({.name = "min_dim_" + label,
                    .ops = {"min_dim"},
                    .dtypes = kNumericDTypes,
                    .make = make,
                    .kiln =
                        [d, keep](const KArgs& x) {
                          auto [v, i] = min(x[0], d, keep);
                          return KTensors{v, i};
                        },
                    .aten =
                        [d, keep](const AArgs& a) {
                          auto [v, i] = at::min(a[0], d, keep);
                          return ATensors{v, i};
                        }});
    }
    OpCase am{.name = "argmax_" + label,
              .ops = {"argmax"},
              .dtypes = kNumericDTypes,
              .make = make,
              .kiln = [dim, keep](const KArgs& x) { return KTensors{argmax(x[0], dim, keep)}; },
              .aten =
                  [dim, keep](const AArgs& a) {
                    return ATensors{
                        at::argmax(a[0], dim ? c10::optional<int64_t>(*dim) : c10::nullopt, keep)};
                  }};
    cs.push_back(am);
    OpCase an{.name = "argmin_" + label,
              .ops = {"argmin"},
              .dtypes = kNumericDTypes,
              .make = make,
              .kiln = [dim, keep](const KArgs& x) { return KTensors{argmin(x[0], dim, keep)}; },
              .aten =
                  [dim, keep](const AArgs& a) {
                    return ATensors{
                        at::argmin(a[0], dim ? c10::optional<int64_t>(*dim) : c10::nullopt, keep)};
                  }};
    cs.push_back(an);
    if (label == "dim1" || label == "flat") {
      cs.push_back(out_variant(am, "argmax_out", [dim, keep](const KArgs& x) {
        ops::op_argmax_out(x.out, x[0], dim, keep);
        return KTensors{x.out};
      }));
      cs.push_back(out_variant(an, "argmin_out", [dim, keep](const KArgs& x) {
        ops::op_argmin_out(x.out, x[0], dim, keep);
        return KTensors{x.out};
      }));
    }
  }
  // Large inputs: continuous random values (ties are vanishingly unlikely in float32/64).
  for (auto [label, spec, dim] : {std::tuple{"large_rows", Spec{{64, 1100}, C}, 1},
                                  std::tuple{"large_cols", Spec{{1100, 64}, T}, 0},
                                  std::tuple{"wide_cols", Spec{{40, 1040}, C}, 0}}) {
    int64_t d = dim;
    cs.push_back({.name = std::string("max_dim_") + label,
                  .ops = {"max_dim"},
                  .dtypes = {kFloat32, kFloat64},
                  .make = make_from({draw_any()}, {spec}),
                  .kiln =
                      [d](const KArgs& x) {
                        auto [v, i] = max(x[0], d);
                        return KTensors{v, i};
                      },
                  .aten =
                      [d](const AArgs& a) {
                        auto [v, i] = at::max(a[0], d);
                        return ATensors{v, i};
                      }});
    cs.push_back({.name = std::string("argmin_") + label,
                  .ops = {"argmin"},
                  .dtypes = {kFloat32, kFloat64},
                  .make = make_from({draw_any()}, {spec}),
                  .kiln = [d](const KArgs& x) { return KTensors{argmin(x[0], d)}; },
                  .aten = [d](const AArgs& a) { return ATensors{at::argmin(a[0], d)}; }});
  }
  head(cs, "max_dim").grads = max_min_dim_grads(true);
  head(cs, "max_dim").errors = {{"max_dim_of_empty", K::Index, "max", {"size 0"}, [](const Watch&) {
                                   max(f32({2, 0}), 1);
                                 }}};
  head(cs, "min_dim").grads = max_min_dim_grads(false);
  head(cs, "argmax").errors = {{"argmax_of_empty", K::Index, "argmax", {"empty"}, [](const Watch&) {
                                  argmax(f32({0, 3}));
                                }}};
}

// softmax and log_softmax. Tol::Accum: the normalising sum is accumulated differently.
void add_softmax(Cases& cs) {
  struct SmConfig {
    const char* label;
    Spec in;
    int64_t dim;
  };
  const std::vector<SmConfig> configs = {
      {"last", {{3, 4, 5}, C}, -1},
      {"dim0", {{3, 4, 5}, C}, 0},
      {"dim1_noncontig", {{3, 4, 5}, T}, 1},
      {"last_strided", {{6, 7}, S}, -1},
      {"expanded", {{4, 5}, E}, 1},
      {"1d", {{9}, C}, 0},
      {"0d", {{}, C}, 0},
      {"zero", {{0, 4}, C}, -1},
      {"zero_dim", {{4, 0}, C}, -1},
      {"large_last", {{16, 3000}, C}, -1},
      {"large_first", {{3000, 16}, C}, 0},
  };
  for (bool log : {false, true}) {
    std::string op = log ? "log_softmax" : "softmax";
    for (const SmConfig& c : configs) {
      int64_t d = c.dim;
      OpCase row{.name = op + "_" + c.label,
                 .ops = {op},
                 .dtypes = kFloatDTypes,
                 .make = make_from({draw_uniform(-8, 8)}, {c.in}),
                 .kiln =
                     [log, d](const KArgs& x) {
                       return KTensors{log ? log_softmax(x[0], d) : softmax(x[0], d)};
                     },
                 .aten =
                     [log, d](const AArgs& a) {
                       return ATensors{log ? at::log_softmax(a[0], d) : at::softmax(a[0], d)};
                     },
                 .tol = Tol::Accum};
      cs.push_back(row);
      if (std::string(c.label) == "last" || std::string(c.label) == "dim1_noncontig")
        cs.push_back(out_variant(
            row, op + "_out",
            [log, d](const KArgs& x) {
              if (log)
                ops::op_log_softmax_out(x.out, x[0], d);
              else
                ops::op_softmax_out(x.out, x[0], d);
              return KTensors{x.out};
            },
            std::string("_") + c.label, c.in.layout));
    }
    // -inf entries (masked scores), a row that is entirely -inf (NaN), +inf and NaN.
    cs.push_back({.name = op + "_special",
                  .ops = {op},
                  .dtypes = kFloatDTypes,
                  .make =
                      [](Gen& g) {
                        const double inf = std::numeric_limits<double>::infinity();
                        return KTensors{g.values({0.5,  -inf, 2,    -inf,  //
                                                  -inf, -inf, -inf, -inf,  //
                                                  1,    inf,  3,    -1,    //
                                                  NAN,  0,    1,    2,     //
                                                  -100, 100,  0,    0},
                                                 {5, 4})};
                      },
                  .kiln =
                      [log](const KArgs& x) {
                        return KTensors{log ? log_softmax(x[0], 1) : softmax(x[0], 1)};
                      },
                  .aten =
                      [log](const AArgs& a) {
                        return ATensors{log ? at::log_softmax(a[0], 1) : at::softmax(a[0], 1)};
                      },
                  .tol = Tol::Accum});
  }
  head(cs, "softmax").grads = softmax_grads(false);
  head(cs, "softmax").errors = {{"softmax_of_int",
                                 K::Type,
                                 "softmax",
                                 {"int64"},
                                 [](const Watch&) { softmax(ones({3}, kInt64), 0); }},
                                {"softmax_dim", K::Index, "softmax", {"2"}, [](const Watch&) {
                                   softmax(f32({3, 4}), 2);
                                 }}};
  head(cs, "log_softmax").grads = softmax_grads(true);
}

// The public sum_out writes into a transposed out.
void add_public_out(Cases& cs) {
  cs.push_back({.name = "sum_out_public",
                .ops = {"sum_out"},
                .dtypes = kNumericDTypes,
                .make = make_from({draw_any()}, {Spec{{3, 4, 5}, T}}),
                .kiln =
                    [](const KArgs& x) {
                      Tensor out = x.out;
                      sum_out(out, x[0], {1});
                      return KTensors{out};
                    },
                .aten = [](const AArgs& a) { return ATensors{at::sum(a[0], {1})}; },
                .tol = Tol::Accum,
                .mode = Mode::Out,
                .out_layout = Layout::Transposed});
  cs.push_back({.name = "sum_out_public_wider",
                .ops = {"sum_out"},
                .dtypes = {kFloat16, kBFloat16, kFloat32},
                .make = make_from({draw_any()}, {Spec{{3, 4, 5}}}),
                .kiln =
                    [](const KArgs& x) {
                      Tensor out = x.out;
                      sum_out(out, x[0], {0, 2}, true);
                      return KTensors{out};
                    },
                // As in PyTorch, a reduction accumulates in the dtype of the out= tensor.
                .aten =
                    [](const AArgs& a) {
                      auto wide = a[0].scalar_type() == at::kFloat ? at::kDouble : at::kFloat;
                      at::Tensor out = at::empty({0}, wide);
                      at::sum_out(out, a[0], at::IntArrayRef{0, 2}, true);
                      return ATensors{out};
                    },
                .tol = Tol::Accum,
                .mode = Mode::Out});
}

}  // namespace

Cases reduce_cases() {
  Cases cs;
  add_reductions(cs);
  add_index_reductions(cs);
  add_softmax(cs);
  add_public_out(cs);
  return cs;
}

}  // namespace kiln::test

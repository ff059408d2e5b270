// Op table: views and shape ops (checked to share storage: a write through the view lands in
// the base), cat/stack/split/chunk, and indexing (index_select, gather, scatter_add,
// index_add, triu/tril, one_hot).
#include "tests/ops/op_test_util.h"

namespace kiln::test {
namespace {

constexpr auto C = Layout::Contig;
constexpr auto T = Layout::Transposed;
constexpr auto S = Layout::Strided;

using KOne = std::function<KTensors(const Tensor&)>;
using AOne = std::function<ATensors(const at::Tensor&)>;

struct ShapeRow {
  std::string name;
  std::vector<std::string> ops;
  Spec in;
  KOne kiln;
  AOne aten;
  Alias alias = Alias::View;
};

ShapeRow row(std::string name, std::vector<std::string> ops, Spec in, KOne kiln, AOne aten,
             Alias alias = Alias::View) {
  return {std::move(name), std::move(ops), std::move(in), std::move(kiln), std::move(aten), alias};
}

void add_shape_rows(Cases& cs, const std::vector<ShapeRow>& rows) {
  for (const ShapeRow& r : rows) {
    KOne kf = r.kiln;
    AOne af = r.aten;
    cs.push_back({.name = r.name,
                  .ops = r.ops,
                  .dtypes = kAllDTypes,
                  .make = make_from({draw_any()}, {r.in}),
                  .kiln = [kf](const KArgs& x) { return kf(x[0]); },
                  .aten = [af](const AArgs& a) { return af(a[0]); },
                  .tol = Tol::Exact,
                  .alias = r.alias});
  }
}

KTensors one(Tensor t) { return {std::move(t)}; }
ATensors one(at::Tensor t) { return {std::move(t)}; }

void add_views(Cases& cs) {
  using K = const Tensor&;
  using A = const at::Tensor&;
  // One row per case; clang-format would put every argument of a row on its own line.
  // clang-format off
  const std::vector<ShapeRow> rows = {
      row("view_flat", {"view"}, {{3, 4, 5}, C},
          [](K t) { return one(view(t, {-1})); },
          [](A t) { return one(t.view({-1})); }),
      row("view_split", {"view"}, {{12}, C},
          [](K t) { return one(t.view({3, -1})); },
          [](A t) { return one(t.view({3, -1})); }),
      row("view_strided", {"view"}, {{4, 6}, S},
          [](K t) { return one(view(t, {4, 2, 3})); },
          [](A t) { return one(t.view({4, 2, 3})); }),
      row("view_to_0d", {"view"}, {{1}, C},
          [](K t) { return one(view(t, {})); },
          [](A t) { return one(t.view(at::IntArrayRef{})); }),
      row("view_from_0d", {"view"}, {{}, C},
          [](K t) { return one(view(t, {1, 1})); },
          [](A t) { return one(t.view({1, 1})); }),
      row("view_zero", {"view"}, {{0, 3}, C},
          [](K t) { return one(view(t, {3, 1, 0})); },
          [](A t) { return one(t.view({3, 1, 0})); }),
      row("reshape_view", {"view"}, {{3, 4, 5}, C},
          [](K t) { return one(reshape(t, {5, -1})); },
          [](A t) { return one(t.reshape({5, -1})); }),
      row("reshape_copy", {"to_copy", "view"}, {{3, 4}, T},
          [](K t) { return one(reshape(t, {12})); },
          [](A t) { return one(t.reshape({12})); }, Alias::Copy),
      row("permute", {"permute"}, {{2, 3, 4}, C},
          [](K t) { return one(permute(t, {2, 0, 1})); },
          [](A t) { return one(t.permute({2, 0, 1})); }),
      row("permute_neg", {"permute"}, {{2, 3, 4}, T},
          [](K t) { return one(permute(t, {-1, 0, 1})); },
          [](A t) { return one(t.permute({-1, 0, 1})); }),
      row("permute_0d", {"permute"}, {{}, C},
          [](K t) { return one(permute(t, {})); },
          [](A t) { return one(t.permute({})); }),
      row("transpose", {"transpose"}, {{2, 3, 4}, C},
          [](K t) { return one(transpose(t, 0, 2)); },
          [](A t) { return one(t.transpose(0, 2)); }),
      row("transpose_neg", {"transpose"}, {{2, 3, 4}, S},
          [](K t) { return one(transpose(t, -1, -2)); },
          [](A t) { return one(t.transpose(-1, -2)); }),
      row("t_2d", {"transpose"}, {{3, 4}, T},
          [](K t) { return one(kiln::t(t)); },
          [](A t) { return one(t.t()); }),
      row("t_1d", {"alias"}, {{5}, C},
          [](K t) { return one(kiln::t(t)); },
          [](A t) { return one(t.t()); }),
      row("t_0d", {"alias"}, {{}, C},
          [](K t) { return one(kiln::t(t)); },
          [](A t) { return one(t.t()); }),
      row("narrow", {"slice"}, {{5, 6}, C},
          [](K t) { return one(narrow(t, 1, 2, 3)); },
          [](A t) { return one(t.narrow(1, 2, 3)); }),
      row("narrow_neg_start", {"slice"}, {{5, 6}, T},
          [](K t) { return one(narrow(t, 0, -2, 2)); },
          [](A t) { return one(t.narrow(0, -2, 2)); }),
      row("narrow_empty", {"slice"}, {{5, 6}, C},
          [](K t) { return one(narrow(t, 1, 6, 0)); },
          [](A t) { return one(t.narrow(1, 6, 0)); }),
      row("slice_step", {"slice"}, {{6, 5}, C},
          [](K t) { return one(slice(t, 0, 1, 5, 2)); },
          [](A t) { return one(t.slice(0, 1, 5, 2)); }),
      row("slice_clamped", {"slice"}, {{6, 5}, S},
          [](K t) { return one(slice(t, -1, -3, 100)); },
          [](A t) { return one(t.slice(-1, -3, 100)); }),
      row("slice_start_after_end", {"slice"}, {{6, 5}, C},
          [](K t) { return one(slice(t, 0, 4, 2)); },
          [](A t) { return one(t.slice(0, 4, 2)); }),
      row("select", {"select"}, {{3, 4, 5}, C},
          [](K t) { return one(select(t, 1, 2)); },
          [](A t) { return one(t.select(1, 2)); }),
      row("select_neg", {"select"}, {{3, 4, 5}, T},
          [](K t) { return one(select(t, 0, -1)); },
          [](A t) { return one(t.select(0, -1)); }),
      row("select_1d", {"select"}, {{7}, S},
          [](K t) { return one(select(t, 0, 3)); },
          [](A t) { return one(t.select(0, 3)); }),
      row("expand", {"expand"}, {{3, 1}, C},
          [](K t) { return one(expand(t, {2, 3, 4})); },
          [](A t) { return one(t.expand({2, 3, 4})); }),
      row("expand_keep", {"expand"}, {{3, 1}, C},
          [](K t) { return one(expand(t, {-1, 4})); },
          [](A t) { return one(t.expand({-1, 4})); }),
      row("expand_0d", {"expand"}, {{}, C},
          [](K t) { return one(expand(t, {2, 3})); },
          [](A t) { return one(t.expand({2, 3})); }),
      row("expand_to_zero", {"expand"}, {{1, 3}, C},
          [](K t) { return one(expand(t, {0, 3})); },
          [](A t) { return one(t.expand({0, 3})); }),
      row("expand_as", {"expand"}, {{4, 1}, T},
          [](K t) { return one(expand_as(t, zeros({2, 4, 3}, kFloat32, t.device()))); },
          [](A t) { return one(t.expand({2, 4, 3})); }),
      row("squeeze_all", {"squeeze"}, {{3, 1, 4, 1}, C},
          [](K t) { return one(squeeze(t)); },
          [](A t) { return one(t.squeeze()); }),
      row("squeeze_dim", {"squeeze"}, {{3, 1, 4, 1}, T},
          [](K t) { return one(squeeze(t, 1)); },
          [](A t) { return one(t.squeeze(1)); }),
      row("squeeze_noop", {"squeeze"}, {{3, 1, 4}, C},
          [](K t) { return one(squeeze(t, 0)); },
          [](A t) { return one(t.squeeze(0)); }),
      row("squeeze_0d", {"squeeze"}, {{}, C},
          [](K t) { return one(squeeze(t)); },
          [](A t) { return one(t.squeeze()); }),
      row("unsqueeze_front", {"unsqueeze"}, {{3, 4}, C},
          [](K t) { return one(unsqueeze(t, 0)); },
          [](A t) { return one(t.unsqueeze(0)); }),
      row("unsqueeze_back", {"unsqueeze"}, {{3, 4}, T},
          [](K t) { return one(unsqueeze(t, -1)); },
          [](A t) { return one(t.unsqueeze(-1)); }),
      row("unsqueeze_mid", {"unsqueeze"}, {{3, 4}, S},
          [](K t) { return one(unsqueeze(t, 1)); },
          [](A t) { return one(t.unsqueeze(1)); }),
      row("unsqueeze_0d", {"unsqueeze"}, {{}, C},
          [](K t) { return one(unsqueeze(t, 0)); },
          [](A t) { return one(t.unsqueeze(0)); }),
      row("flatten_all", {"view"}, {{2, 3, 4}, C},
          [](K t) { return one(flatten(t)); },
          [](A t) { return one(t.flatten()); }),
      row("flatten_tail", {"view"}, {{2, 3, 4}, C},
          [](K t) { return one(flatten(t, 1)); },
          [](A t) { return one(t.flatten(1)); }),
      row("flatten_head", {"view"}, {{2, 3, 4}, S},
          [](K t) { return one(flatten(t, 0, 1)); },
          [](A t) { return one(t.flatten(0, 1)); }),
      row("flatten_copy", {"to_copy", "view"}, {{2, 3, 4}, T},
          [](K t) { return one(flatten(t)); },
          [](A t) { return one(t.flatten()); }, Alias::Copy),
      row("flatten_0d", {"view"}, {{}, C},
          [](K t) { return one(flatten(t)); },
          [](A t) { return one(t.flatten()); }),
      row("as_strided", {"as_strided"}, {{4, 5}, C},
          [](K t) { return one(as_strided(t, {3, 3}, {5, 1}, 2)); },
          [](A t) { return one(t.as_strided({3, 3}, {5, 1}, 2)); }),
      row("as_strided_overlap", {"as_strided"}, {{4, 5}, C},
          [](K t) { return one(as_strided(t, {3, 4}, {1, 2})); },
          [](A t) { return one(t.as_strided({3, 4}, {1, 2})); }),
      row("as_strided_zero", {"as_strided"}, {{4, 5}, C},
          [](K t) { return one(as_strided(t, {0, 4}, {1, 1}, 19)); },
          [](A t) { return one(t.as_strided({0, 4}, {1, 1}, 19)); }),
      row("detach", {"detach"}, {{3, 4}, S},
          [](K t) { return one(detach(t)); },
          [](A t) { return one(t.detach()); }),
      row("detach_method", {"detach"}, {{3, 4}, T},
          [](K t) { return one(t.detach()); },
          [](A t) { return one(t.detach()); }),
      row("contiguous_copy", {"to_copy"}, {{3, 4}, T},
          [](K t) { return one(contiguous(t)); },
          [](A t) { return one(t.contiguous()); }, Alias::Copy),
      row("clone", {"to_copy"}, {{3, 4}, S},
          [](K t) { return one(clone(t)); },
          [](A t) { return one(t.clone()); }, Alias::Copy),
      row("split", {"slice"}, {{7, 4}, C},
          [](K t) { return split(t, 3); },
          [](A t) { return t.split(3); }),
      row("split_dim1", {"slice"}, {{7, 4}, T},
          [](K t) { return split(t, 3, 1); },
          [](A t) { return t.split(3, 1); }),
      row("split_sizes", {"slice"}, {{7, 4}, C},
          [](K t) { return split(t, {2, 0, 5}); },
          [](A t) { return t.split_with_sizes({2, 0, 5}); }),
      row("split_zero", {"slice"}, {{0, 4}, C},
          [](K t) { return split(t, 2); },
          [](A t) { return t.split(2); }),
      row("chunk", {"slice"}, {{7, 4}, C},
          [](K t) { return chunk(t, 3); },
          [](A t) { return t.chunk(3); }),
      row("chunk_uneven", {"slice"}, {{7, 4}, S},
          [](K t) { return chunk(t, 5); },
          [](A t) { return t.chunk(5); }),
      row("chunk_dim1", {"slice"}, {{3, 4}, T},
          [](K t) { return chunk(t, 2, -1); },
          [](A t) { return t.chunk(2, -1); }),
    };
  add_shape_rows(cs, rows);
}

void add_cat_stack(Cases& cs) {
  struct CatConfig {
    const char* label;
    std::vector<Spec> in;
    std::vector<std::optional<DType>> dtypes;  // per input; nullopt: the case's dtype
    int64_t dim;
  };
  // clang-format on
  const std::vector<CatConfig> configs = {
      {"dim0", {{{2, 3}, C}, {{4, 3}, C}}, {{}, {}}, 0},
      {"dim1_noncontig", {{{3, 2}, T}, {{3, 4}, S}, {{3, 1}, C}}, {{}, {}, {}}, 1},
      {"neg_dim", {{{2, 3, 2}, C}, {{2, 3, 5}, T}}, {{}, {}}, -1},
      {"single", {{{2, 3}, T}}, {{}}, 0},
      {"zero_size", {{{0, 3}, C}, {{2, 3}, C}}, {{}, {}}, 0},
      {"legacy_empty_1d", {{{0}, C}, {{2, 3}, C}}, {{}, {}}, 1},
      {"promote", {{{2, 3}, C}, {{1, 3}, C}}, {{}, kInt64}, 0},
      {"promote_float", {{{2, 3}, C}, {{1, 3}, C}}, {{}, kFloat64}, 0},
      {"many", std::vector<Spec>(9, Spec{{1, 5}, C}), std::vector<std::optional<DType>>(9), 0},
      {"large", {{{300, 64}, C}, {{300, 100}, T}}, {{}, {}}, 1},
  };
  for (const CatConfig& c : configs) {
    CatConfig cc = c;
    int64_t dim = c.dim;
    OpCase row{.name = std::string("cat_") + c.label,
               .ops = {"cat"},
               .dtypes = kAllDTypes,
               .make =
                   [cc](Gen& g) {
                     KTensors in;
                     for (size_t i = 0; i < cc.in.size(); ++i)
                       in.push_back(g.any(cc.in[i], cc.dtypes[i]));
                     return in;
                   },
               .kiln = [dim](const KArgs& x) { return KTensors{cat(x.in, dim)}; },
               .aten = [dim](const AArgs& a) { return ATensors{at::cat(a.in, dim)}; },
               .tol = Tol::Exact};
    cs.push_back(row);
    if (std::string(c.label) == "dim0" || std::string(c.label) == "dim1_noncontig")
      cs.push_back(out_variant(
          row, "cat_out",
          [dim](const KArgs& x) {
            ops::op_cat_out(x.out, x.in, dim);
            return KTensors{x.out};
          },
          std::string("_") + c.label, std::string(c.label) == "dim0" ? C : T));
  }
  for (auto [label, spec, dim] :
       {std::tuple{"dim0", Spec{{2, 3}, C}, 0}, std::tuple{"last", Spec{{2, 3}, T}, -1},
        std::tuple{"mid", Spec{{2, 3}, S}, 1}, std::tuple{"0d", Spec{{}, C}, 0}}) {
    int64_t d = dim;
    cs.push_back({.name = std::string("stack_") + label,
                  .ops = {"unsqueeze", "cat"},
                  .dtypes = kAllDTypes,
                  .make = make_from({draw_any(), draw_any(), draw_any()}, {spec, spec, spec}),
                  .kiln = [d](const KArgs& x) { return KTensors{stack(x.in, d)}; },
                  .aten = [d](const AArgs& a) { return ATensors{at::stack(a.in, d)}; },
                  .tol = Tol::Exact});
  }
}

void add_indexing(Cases& cs) {
  struct SelectConfig {
    const char* label;
    Spec self, index;
    int64_t dim, hi;
    DType index_dtype;
  };
  const std::vector<SelectConfig> selects = {
      {"dim0", {{5, 4}, C}, {{6}, C}, 0, 5, kInt64},
      {"dim1_int32", {{5, 4}, T}, {{3}, S}, 1, 4, kInt32},
      {"1d", {{6}, C}, {{8}, C}, 0, 6, kInt64},
      {"0d_index", {{5, 4}, C}, {{}, C}, 1, 4, kInt64},
      {"zero_index", {{5, 4}, C}, {{0}, C}, 0, 5, kInt64},
      {"large", {{1000, 64}, C}, {{500}, C}, 0, 1000, kInt64},
  };
  for (const SelectConfig& c : selects) {
    SelectConfig sc = c;
    int64_t dim = c.dim;
    OpCase row{
        .name = std::string("index_select_") + c.label,
        .ops = {"index_select"},
        .dtypes = kAllDTypes,
        .make =
            [sc](Gen& g) {
              return KTensors{g.any(sc.self), g.index(sc.index, sc.hi, sc.index_dtype)};
            },
        .kiln = [dim](const KArgs& x) { return KTensors{index_select(x[0], dim, x[1])}; },
        .aten = [dim](const AArgs& a) { return ATensors{at::index_select(a[0], dim, a[1])}; },
        .tol = Tol::Exact};
    cs.push_back(row);
    if (std::string(c.label) == "dim0")
      cs.push_back(out_variant(row, "index_select_out", [dim](const KArgs& x) {
        ops::op_index_select_out(x.out, x[0], dim, x[1]);
        return KTensors{x.out};
      }));
  }

  // gather/scatter_add: index values in [0, self.size(dim)).
  struct ScatterConfig {
    const char* label;
    Spec self, index, src;
    int64_t dim;
  };
  const std::vector<ScatterConfig> scatters = {
      {"dim1", {{4, 5}, C}, {{4, 3}, C}, {{4, 3}, C}, 1},
      {"dim0", {{4, 5}, T}, {{6, 5}, C}, {{6, 5}, T}, 0},
      {"small_index", {{4, 5}, C}, {{2, 2}, S}, {{3, 4}, C}, 1},
      {"1d", {{7}, C}, {{12}, C}, {{12}, C}, 0},
      {"zero_index", {{4, 5}, C}, {{0, 5}, C}, {{0, 5}, C}, 0},
      {"large", {{200, 64}, C}, {{400, 64}, C}, {{400, 64}, C}, 0},
  };
  for (const ScatterConfig& c : scatters) {
    ScatterConfig sc = c;
    int64_t dim = c.dim;
    MakeFn make = [sc](Gen& g) {
      int64_t hi = sc.self.shape[static_cast<size_t>(sc.dim)];
      return KTensors{g.any(sc.self), g.index(sc.index, hi), g.any(sc.src)};
    };
    OpCase gather_row{
        .name = std::string("gather_") + c.label,
        .ops = {"gather"},
        .dtypes = kAllDTypes,
        .make =
            [make](Gen& g) {
              KTensors in = make(g);
              return KTensors{in[0], in[1]};
            },
        .kiln = [dim](const KArgs& x) { return KTensors{gather(x[0], dim, x[1])}; },
        .aten = [dim](const AArgs& a) { return ATensors{at::gather(a[0], dim, a[1])}; },
        .tol = Tol::Exact};
    cs.push_back(gather_row);
    // Accumulation order over duplicate indices may differ from ATen's (Tol::Accum).
    OpCase scatter{
        .name = std::string("scatter_add_") + c.label,
        .ops = {"scatter_add"},
        .dtypes = kNumericDTypes,
        .make = make,
        .kiln = [dim](const KArgs& x) { return KTensors{scatter_add(x[0], dim, x[1], x[2])}; },
        .aten = [dim](const AArgs& a) { return ATensors{at::scatter_add(a[0], dim, a[1], a[2])}; },
        .tol = Tol::Accum,
        .native_16bit = true};
    cs.push_back(scatter);
    OpCase inplace = scatter;
    inplace.name = std::string("scatter_add__") + c.label;
    inplace.ops = {"scatter_add_out"};
    inplace.mode = Mode::InPlace;
    inplace.kiln = [dim](const KArgs& x) {
      Tensor self = x[0];
      scatter_add_(self, dim, x[1], x[2]);
      return KTensors{self};
    };
    cs.push_back(inplace);
    if (std::string(c.label) == "dim1") {
      cs.push_back(out_variant(gather_row, "gather_out", [dim](const KArgs& x) {
        ops::op_gather_out(x.out, x[0], dim, x[1]);
        return KTensors{x.out};
      }));
      cs.push_back(out_variant(scatter, "scatter_add_out", [dim](const KArgs& x) {
        ops::op_scatter_add_out(x.out, x[0], dim, x[1], x[2]);
        return KTensors{x.out};
      }));
    }
  }
  struct IndexAddConfig {
    const char* label;
    Spec self, index, source;
    int64_t dim;
    DType index_dtype;
  };
  const std::vector<IndexAddConfig> index_adds = {
      {"dim0", {{5, 4}, C}, {{6}, C}, {{6, 4}, C}, 0, kInt64},
      {"dim1_int32", {{5, 4}, T}, {{3}, C}, {{5, 3}, S}, 1, kInt32},
      {"1d", {{6}, C}, {{9}, C}, {{9}, C}, 0, kInt64},
      {"zero_index", {{5, 4}, C}, {{0}, C}, {{0, 4}, C}, 0, kInt64},
  };
  for (const IndexAddConfig& c : index_adds) {
    IndexAddConfig ic = c;
    int64_t dim = c.dim;
    MakeFn make = [ic](Gen& g) {
      int64_t hi = ic.self.shape[static_cast<size_t>(ic.dim)];
      return KTensors{g.any(ic.self), g.index(ic.index, hi, ic.index_dtype), g.any(ic.source)};
    };
    // alpha 2 for every dtype (a float alpha is only allowed for floating tensors).
    OpCase row{
        .name = std::string("index_add_") + c.label,
        .ops = {"index_add"},
        .dtypes = kNumericDTypes,
        .make = make,
        .kiln = [dim](const KArgs& x) { return KTensors{index_add(x[0], dim, x[1], x[2], 2)}; },
        .aten = [dim](const AArgs& a) { return ATensors{at::index_add(a[0], dim, a[1], a[2], 2)}; },
        .tol = Tol::Accum,
        .native_16bit = true};
    cs.push_back(row);
    OpCase inplace = row;
    inplace.name = std::string("index_add__") + c.label;
    inplace.ops = {"index_add_out"};
    inplace.mode = Mode::InPlace;
    inplace.dtypes = kFloatDTypes;
    inplace.kiln = [dim](const KArgs& x) {
      Tensor self = x[0];
      index_add_(self, dim, x[1], x[2], 0.5);
      return KTensors{self};
    };
    inplace.aten = [dim](const AArgs& a) {
      return ATensors{at::index_add(a[0], dim, a[1], a[2], 0.5)};
    };
    cs.push_back(inplace);
  }

  for (bool upper : {true, false}) {
    std::string op = upper ? "triu" : "tril";
    for (auto [label, spec, diag] :
         {std::tuple{"diag0", Spec{{4, 5}, C}, 0}, std::tuple{"diag1", Spec{{4, 5}, T}, 1},
          std::tuple{"diag_neg1", Spec{{5, 4}, S}, -1}, std::tuple{"beyond", Spec{{4, 5}, C}, 7},
          std::tuple{"below", Spec{{4, 5}, C}, -6}, std::tuple{"batched", Spec{{2, 3, 4}, T}, 0},
          std::tuple{"zero", Spec{{0, 3}, C}, 0}, std::tuple{"large", Spec{{300, 200}, C}, 3}}) {
      int64_t d = diag;
      OpCase row{
          .name = op + "_" + label,
          .ops = {op},
          .dtypes = kAllDTypes,
          .make = make_from({draw_any()}, {spec}),
          .kiln = [upper,
                   d](const KArgs& x) { return KTensors{upper ? triu(x[0], d) : tril(x[0], d)}; },
          .aten =
              [upper, d](const AArgs& a) {
                return ATensors{upper ? at::triu(a[0], d) : at::tril(a[0], d)};
              },
          .tol = Tol::Exact};
      cs.push_back(row);
      if (std::string(label) == "diag1")
        cs.push_back(out_variant(
            row, op + "_out",
            [upper, d](const KArgs& x) {
              if (upper)
                ops::op_triu_out(x.out, x[0], d);
              else
                ops::op_tril_out(x.out, x[0], d);
              return KTensors{x.out};
            },
            "", T));
    }
  }

  for (auto [label, spec, classes] :
       {std::tuple{"1d", Spec{{5}, C}, int64_t{6}}, std::tuple{"2d", Spec{{2, 3}, T}, int64_t{4}},
        std::tuple{"0d", Spec{{}, C}, int64_t{3}}, std::tuple{"zero", Spec{{0}, C}, int64_t{3}},
        std::tuple{"inferred", Spec{{7}, S}, int64_t{-1}}}) {
    int64_t n = classes;
    OpCase row{.name = std::string("one_hot_") + label,
               .ops = {"one_hot"},
               .make = [spec](Gen& g) { return KTensors{g.index(spec, 3)}; },
               .kiln = [n](const KArgs& x) { return KTensors{one_hot(x[0], n)}; },
               .aten = [n](const AArgs& a) { return ATensors{at::one_hot(a[0], n)}; },
               .tol = Tol::Exact};
    if (n == -1) {
      row.ops = {"amax", "one_hot"};
      row.meta = MetaMode::HostRead;  // the class count is read from the data
    }
    cs.push_back(row);
    if (std::string(label) == "2d")
      cs.push_back(out_variant(row, "one_hot_out", [n](const KArgs& x) {
        ops::op_one_hot_out(x.out, x[0], n);
        return KTensors{x.out};
      }));
  }
}

}  // namespace

Cases shape_index_cases() {
  Cases cs;
  add_views(cs);
  add_cat_stack(cs);
  add_indexing(cs);
  return cs;
}

}  // namespace kiln::test

// Records of advanced indexing: index (index.Tensor), index_put (functional, in place, out=),
// nonzero, scatter (src and value), select_scatter, slice_scatter, masked_scatter, and the C++
// indexing API (Tensor::index / index_put_ with TensorIndex, against
// libtorch's at::indexing). See Note [Advanced indexing] in kiln/ops/index_meta.cpp.
#include <ATen/TensorIndexing.h>

#include "kiln/ops/indexing.h"
#include "tests/ops/op_test_util.h"

namespace kiln::test {
namespace {

constexpr auto C = Layout::Contig;
constexpr auto T = Layout::Transposed;
constexpr auto S = Layout::Strided;

// One entry of an index list: None (keeps the dim), int values in [-hi, hi) (negative ones and
// repeats included), or a bool mask.
struct Entry {
  enum Kind { None, Int, Mask } kind = None;
  Spec spec = {};
  int64_t hi = 0;
  DType dtype = kInt64;
};
Entry none() { return {}; }
Entry ints(Spec s, int64_t hi, DType dt = kInt64) { return {Entry::Int, std::move(s), hi, dt}; }
Entry mask(Spec s) { return {Entry::Mask, std::move(s), 0, kBool}; }

struct IndexConfig {
  const char* label;
  Spec self;
  std::vector<Entry> idx;
  Spec values;  // index_put's values (the indexed shape, or one that broadcasts to it)
};

// self, then the tensor entries in order.
KTensors draw(Gen& g, const IndexConfig& c) {
  KTensors in{g.any(c.self)};
  for (const Entry& e : c.idx) {
    if (e.kind == Entry::Int)
      in.push_back(g.uniform(e.spec, -double(e.hi), double(e.hi - 1), e.dtype));
    if (e.kind == Entry::Mask) in.push_back(g.mask(e.spec));
  }
  return in;
}
TensorList kiln_list(const IndexConfig& c, const KTensors& in) {
  TensorList l;
  size_t j = 1;
  for (const Entry& e : c.idx) l.push_back(e.kind == Entry::None ? Tensor() : in[j++]);
  return l;
}
c10::List<c10::optional<at::Tensor>> aten_list(const IndexConfig& c, const ATensors& in) {
  c10::List<c10::optional<at::Tensor>> l;
  size_t j = 1;
  for (const Entry& e : c.idx) {
    if (e.kind == Entry::None)
      l.push_back(c10::nullopt);
    else  // libtorch 1.13 takes int64 indices only
      l.push_back(e.kind == Entry::Int ? in[j++].to(at::kLong) : in[j++]);
  }
  return l;
}
bool has_mask(const IndexConfig& c) {
  for (const Entry& e : c.idx)
    if (e.kind == Entry::Mask) return true;
  return false;
}

const std::vector<IndexConfig>& configs() {
  static const std::vector<IndexConfig> cs = {
      {"dim0", {{5, 4}, C}, {ints({{6}, C}, 5)}, {{6, 4}, C}},
      {"adjacent",
       {{3, 4, 5}, C},
       {none(), ints({{2, 3}, C}, 4), ints({{3}, C}, 5)},
       {{3, 2, 3}, C}},
      {"separated", {{3, 4, 5}, T}, {ints({{2}, C}, 3), none(), ints({{2}, C}, 5)}, {{2, 4}, C}},
      {"int32", {{4, 5}, T}, {ints({{3}, S}, 4, kInt32)}, {{5}, C}},
      {"index_2d", {{6, 3}, C}, {ints({{2, 3}, C}, 6)}, {{2, 3, 3}, C}},
      {"empty", {{4, 3}, C}, {ints({{0}, C}, 4)}, {{0, 3}, C}},
      {"strided_last", {{4, 5, 6}, S}, {none(), none(), ints({{7}, C}, 6)}, {{4, 5, 7}, C}},
      {"scalar_index", {{4, 5}, C}, {ints({{}, C}, 4)}, {{}, C}},
      {"all_dims", {{3, 4}, C}, {ints({{5}, C}, 3), ints({{1}, C}, 4)}, {{5}, C}},
      {"mask", {{3, 4}, C}, {mask({{3, 4}, C})}, {{}, C}},
      {"mask_dim1", {{3, 4, 2}, C}, {none(), mask({{4}, C})}, {{2}, C}},
      {"large", {{300, 64}, C}, {ints({{500}, C}, 300)}, {{500, 64}, C}},
  };
  return cs;
}

void add_index(Cases& cs) {
  for (const IndexConfig& c : configs()) {
    IndexConfig ic = c;
    OpCase row{
        .name = std::string("index_") + c.label,
        .ops = {"index"},
        .dtypes = kAllDTypes,
        .make = [ic](Gen& g) { return draw(g, ic); },
        .kiln = [ic](const KArgs& x) { return KTensors{index(x[0], kiln_list(ic, x.in))}; },
        .aten = [ic](const AArgs& a) { return ATensors{at::index(a[0], aten_list(ic, a.in))}; },
        .tol = Tol::Exact,
        .meta = has_mask(c) ? MetaMode::HostRead : MetaMode::Same};
    if (has_mask(c)) row.ops.push_back("nonzero");
    cs.push_back(row);
    if (std::string(c.label) == "adjacent")
      cs.push_back(out_variant(
          row, "index_out",
          [ic](const KArgs& x) {
            ops::op_index_out(x.out, x[0], kiln_list(ic, x.in));
            return KTensors{x.out};
          },
          "", Layout::Transposed));
  }
}

void add_index_put(Cases& cs) {
  for (const IndexConfig& c : configs()) {
    IndexConfig ic = c;
    MakeFn make = [ic](Gen& g) {
      KTensors in = draw(g, ic);
      in.push_back(g.any(ic.values));
      return in;
    };
    // Accumulate: every duplicate adds (in a device's atomic order, Tol::Unordered16).
    OpCase acc{.name = std::string("index_put_acc_") + c.label,
               .ops = {"index_put"},
               .dtypes = kNumericDTypes,
               .make = make,
               .kiln =
                   [ic](const KArgs& x) {
                     return KTensors{index_put(x[0], kiln_list(ic, x.in), x.in.back(), true)};
                   },
               .aten =
                   [ic](const AArgs& a) {
                     return ATensors{at::index_put(a[0], aten_list(ic, a.in), a.in.back(), true)};
                   },
               .tol = Tol::Unordered16,
               .meta = has_mask(c) ? MetaMode::HostRead : MetaMode::Same};
    if (has_mask(c)) acc.ops.push_back("nonzero");
    cs.push_back(acc);
    OpCase inplace = acc;
    inplace.name = std::string("index_put__acc_") + c.label;
    inplace.ops = {"index_put_out"};
    if (has_mask(c)) inplace.ops.push_back("nonzero");
    inplace.mode = Mode::InPlace;
    inplace.kiln = [ic](const KArgs& x) {
      Tensor self = x[0];
      index_put_(self, kiln_list(ic, x.in), x.in.back(), true);
      return KTensors{self};
    };
    cs.push_back(inplace);
    if (std::string(c.label) == "adjacent")
      cs.push_back(out_variant(acc, "index_put_out", [ic](const KArgs& x) {
        ops::op_index_put_out(x.out, x[0], kiln_list(ic, x.in), x.in.back(), true);
        return KTensors{x.out};
      }));
  }
  // Without accumulate: positions without repeats (a repeated one keeps an unspecified value).
  struct Put {
    const char* label;
    Dims self;
    std::vector<std::vector<double>> idx;  // each 1-d, over dims 0, 1, ...
    Dims values;
  };
  const std::vector<Put> puts = {
      {"dim0", {5, 3}, {{4, -5, 2}}, {3, 3}},
      {"pairs", {4, 5}, {{0, 3, -1}, {4, 0, 2}}, {3}},
      {"broadcast_values", {4, 5}, {{1, 2}}, {5}},
      {"scalar_values", {4, 5}, {{0, 2}, {1, 1}}, {}},
  };
  for (const Put& p : puts) {
    Put pc = p;
    OpCase row{.name = std::string("index_put_") + p.label,
               .ops = {"index_put"},
               .dtypes = kAllDTypes,
               .make =
                   [pc](Gen& g) {
                     KTensors in{g.any({pc.self, C})};
                     for (const auto& v : pc.idx)
                       in.push_back(g.values(v, {int64_t(v.size())}, kInt64));
                     in.push_back(g.any({pc.values, C}));
                     return in;
                   },
               .kiln =
                   [](const KArgs& x) {
                     TensorList l(x.in.begin() + 1, x.in.end() - 1);
                     return KTensors{index_put(x[0], l, x.in.back())};
                   },
               .aten =
                   [](const AArgs& a) {
                     c10::List<c10::optional<at::Tensor>> l;
                     for (size_t j = 1; j + 1 < a.in.size(); ++j) l.push_back(a.in[j]);
                     return ATensors{at::index_put(a[0], l, a.in.back())};
                   },
               .tol = Tol::Exact};
    cs.push_back(row);
    OpCase inplace = row;
    inplace.name = std::string("index_put__") + p.label;
    inplace.ops = {"index_put_out"};
    inplace.mode = Mode::InPlace;
    inplace.kiln = [](const KArgs& x) {
      Tensor self = x[0];
      TensorList l(x.in.begin() + 1, x.in.end() - 1);
      index_put_(self, l, x.in.back());
      return KTensors{self};
    };
    cs.push_back(inplace);
  }
}

void add_nonzero(Cases& cs) {
  const std::vector<Spec> shapes = {{{5}, C}, {{4, 6}, T}, {{2, 3, 4}, S}, {{}, C}, {{0, 3}, C}};
  for (size_t i = 0; i < shapes.size(); ++i) {
    Spec s = shapes[i];
    cs.push_back({.name = "nonzero_" + std::to_string(i),
                  .ops = {"nonzero"},
                  .dtypes = kAllDTypes,
                  .make = [s](Gen& g) { return KTensors{g.sparse(s)}; },
                  .kiln = [](const KArgs& x) { return KTensors{nonzero(x[0])}; },
                  .aten = [](const AArgs& a) { return ATensors{at::nonzero(a[0])}; },
                  .tol = Tol::Exact,
                  .meta = MetaMode::HostRead});
  }
}

// ---------------------------------------------------------------- C++ indexing API

using namespace kiln::indexing;
namespace ai = at::indexing;

// One case of x.index({...}) against libtorch's: `k` and `a` build the same index list from
// the case's inputs (x, then an int64 index in [0, 3), then a [4]-long bool mask).
struct ApiCase {
  const char* label;
  std::vector<std::string> ops;
  std::function<std::vector<TensorIndex>(const KTensors&)> k;
  std::function<std::vector<ai::TensorIndex>(const ATensors&)> a;
};

// libtorch 1.13's TensorIndex copies an uninitialised bool member (UBSan: "load of value 128,
// which is not a valid value for type 'bool'"), so the index lists are built in place, never
// copied element by element.
template <class... A>
std::vector<ai::TensorIndex> aidx(A&&... a) {
  std::vector<ai::TensorIndex> v;
  v.reserve(sizeof...(A));
  (v.emplace_back(std::forward<A>(a)), ...);
  return v;
}

void add_tensor_index_api(Cases& cs) {
  const std::vector<ApiCase> cases = {
      {"int",
       {"select"},
       [](const KTensors&) { return std::vector<TensorIndex>{1}; },
       [](const ATensors&) { return aidx(1); }},
      {"negative_int_slice",
       {"select", "slice"},
       [](const KTensors&) {
         return std::vector<TensorIndex>{-1, Slice(1, 3)};
       },
       [](const ATensors&) { return aidx(-1, ai::Slice(1, 3)); }},
      {"slice_step_open",
       {"slice"},
       [](const KTensors&) {
         return std::vector<TensorIndex>{Slice(None, None, 2), Slice(1)};
       },
       [](const ATensors&) { return aidx(ai::Slice(ai::None, ai::None, 2), ai::Slice(1)); }},
      {"slice_negative_clamped",
       {"slice"},
       [](const KTensors&) {
         return std::vector<TensorIndex>{Slice(-2, 100), Slice(-9, -1)};
       },
       [](const ATensors&) { return aidx(ai::Slice(-2, 100), ai::Slice(-9, -1)); }},
      {"none_ellipsis",
       {"unsqueeze"},
       [](const KTensors&) {
         return std::vector<TensorIndex>{None, Ellipsis, None};
       },
       [](const ATensors&) { return aidx(ai::None, ai::Ellipsis, ai::None); }},
      {"ellipsis_int",
       {"select"},
       [](const KTensors&) {
         return std::vector<TensorIndex>{Ellipsis, 2};
       },
       [](const ATensors&) { return aidx(ai::Ellipsis, 2); }},
      {"tensor_slice_none",
       {"index", "slice", "unsqueeze"},
       [](const KTensors& x) {
         return std::vector<TensorIndex>{Slice(1, 3), x[1], None};
       },
       [](const ATensors& x) { return aidx(ai::Slice(1, 3), x[1], ai::None); }},
      {"tensor_ellipsis_tensor",
       {"index"},
       [](const KTensors& x) {
         return std::vector<TensorIndex>{x[1], Ellipsis, x[1]};
       },
       [](const ATensors& x) { return aidx(x[1], ai::Ellipsis, x[1]); }},
      {"int_tensor_separated",
       {"index", "select"},
       [](const KTensors& x) {
         return std::vector<TensorIndex>{x[1], 0, Slice(), x[1]};
       },
       [](const ATensors& x) { return aidx(x[1], 0, ai::Slice(), x[1]); }},
      {"mask",
       {"index", "nonzero"},
       [](const KTensors& x) {
         return std::vector<TensorIndex>{Slice(), x[2]};
       },
       [](const ATensors& x) { return aidx(ai::Slice(), x[2]); }},
      {"bools",
       {"index", "unsqueeze"},
       [](const KTensors&) {
         return std::vector<TensorIndex>{true, Slice(0, 2), false};
       },
       [](const ATensors&) { return aidx(true, ai::Slice(0, 2), false); }},
  };
  for (const ApiCase& c : cases) {
    ApiCase ac = c;
    bool mask = std::find(c.ops.begin(), c.ops.end(), "nonzero") != c.ops.end();
    MakeFn make = [](Gen& g) {
      return KTensors{g.any({{3, 4, 5, 6}, C}), g.index({{2}, C}, 3), g.mask({{4}, C})};
    };
    cs.push_back({.name = std::string("tensor_index_") + c.label,
                  .ops = c.ops,
                  .dtypes = {kFloat32, kInt64},
                  .make = make,
                  .kiln = [ac](const KArgs& x) { return KTensors{x[0].index(ac.k(x.in))}; },
                  .aten = [ac](const AArgs& a) { return ATensors{a[0].index(ac.a(a.in))}; },
                  .tol = Tol::Exact,
                  .meta = mask ? MetaMode::HostRead : MetaMode::Same});
    // x.index_put_({...}, 7): repeated positions all get the same value.
    const bool adv = std::find(c.ops.begin(), c.ops.end(), "index") != c.ops.end();
    std::vector<std::string> put_ops{adv ? "index_put_out" : "copy_"};
    if (mask) put_ops.push_back("nonzero");
    cs.push_back({.name = std::string("tensor_index_put_") + c.label,
                  .ops = put_ops,
                  .dtypes = {kFloat32, kInt64},
                  .make = make,
                  .kiln =
                      [ac](const KArgs& x) {
                        Tensor self = x[0].clone();
                        indexing::set_item(self, ac.k(x.in), full({}, 7, self.dtype()));
                        return KTensors{self};
                      },
                  .aten =
                      [ac](const AArgs& a) {
                        at::Tensor self = a[0].clone();
                        self.index_put_(ac.a(a.in), 7);
                        return ATensors{self};
                      },
                  .tol = Tol::Exact,
                  .meta = mask ? MetaMode::HostRead : MetaMode::Same});
  }
}

// ---------------------------------------------------------------- gradchecks and errors

GradSamples index_grads() {
  GradSamples gs;
  gs.push_back({"index_repeats",
                {"index", "index_put"},
                [](GradGen& d) {
                  return TensorList{d.var({4, 3}), grad_indices({3, -1, 0, 3}, {4})};
                },
                [](const TensorList& x) { return TensorList{index(x[0], TensorList{x[1]})}; }});
  gs.push_back({"index_separated",
                {"index", "index_put"},
                [](GradGen& d) {
                  return TensorList{d.var({3, 2, 4}), grad_indices({0, 2, 2}, {3}),
                                    grad_indices({1, 3, 1}, {3})};
                },
                [](const TensorList& x) {
                  return TensorList{index(x[0], TensorList{x[1], Tensor(), x[2]})};
                }});
  gs.push_back({"index_mask",
                {"index", "index_put", "nonzero"},
                [](GradGen& d) {
                  return TensorList{d.var({3, 4}), d.mask({3, 4})};
                },
                [](const TensorList& x) { return TensorList{index(x[0], TensorList{x[1]})}; }});
  return gs;
}

GradSamples index_put_grads() {
  GradSamples gs;
  gs.push_back({"index_put_accumulate",
                {"index_put", "index"},
                [](GradGen& d) {
                  return TensorList{d.var({4, 3}), grad_indices({1, 1, -1}, {3}), d.var({3, 3})};
                },
                [](const TensorList& x) {
                  return TensorList{index_put(x[0], TensorList{x[1]}, x[2], true)};
                }});
  gs.push_back({"index_put_assign",
                {"index_put", "index"},
                [](GradGen& d) {
                  return TensorList{d.var({4, 3}), grad_indices({0, 2}, {2}),
                                    grad_indices({1, -1}, {2}), d.var({2})};
                },
                [](const TensorList& x) {
                  return TensorList{index_put(x[0], TensorList{x[1], x[2]}, x[3])};
                }});
  gs.push_back(
      {"index_put_broadcast_values",
       {"index_put", "index"},
       [](GradGen& d) {
         return TensorList{d.var({4, 3}), grad_indices({0, 3}, {2}), d.var({3})};
       },
       [](const TensorList& x) { return TensorList{index_put(x[0], TensorList{x[1]}, x[2])}; }});
  return gs;
}

std::vector<ErrorCase> index_errors() {
  return {
      {"index_out_of_bounds",
       K::Index,
       "index",
       {"index 5 is out of bounds for dimension 0 with size 4"},
       [](const Watch&) {
         index(f32({4, 3}), TensorList{from_vector<int64_t>({1, 5}, {2})});
       }},
      {"index_negative_out_of_bounds",
       K::Index,
       "index",
       {"index -4 is out of bounds for dimension 1 with size 3"},
       [](const Watch&) {
         index(f32({4, 3}), TensorList{Tensor(), from_vector<int64_t>({-4}, {1})});
       }},
      {"index_too_many",
       K::Index,
       "index",
       {"too many indices for tensor of dimension 2", "3"},
       [](const Watch&) {
         index(f32({4, 3}), TensorList{i64({1}), i64({1}), i64({1})});
       }},
      {"index_float_index",
       K::Type,
       "index",
       {"int64 or int32", "float32"},
       [](const Watch&) {
         index(f32({4, 3}), TensorList{f32({2})});
       }},
      {"index_not_broadcastable",
       K::Value,
       "index",
       {"[2]", "[3]"},
       [](const Watch&) {
         index(f32({4, 3}), TensorList{i64({2}), i64({3})});
       }},
      {"index_mask_shape",
       K::Index,
       "index",
       {"The shape of the mask [3] at index 0 does not match", "[4, 3]"},
       [](const Watch&) {
         index(f32({4, 3}), TensorList{ones({3}, kBool)});
       }},
      {"index_api_too_many",
       K::Index,
       "index",
       {"too many indices for tensor of dimension 1"},
       [](const Watch&) {
         f32({4}).index({0, Slice()});
       }},
      {"index_api_out_of_bounds",
       K::Index,
       "index",
       {"index 4 is out of bounds for dimension 0 with size 4"},
       [](const Watch&) { f32({4}).index({4}); }},
  };
}

std::vector<ErrorCase> index_put_errors() {
  return {
      {"index_put_out_of_bounds",
       K::Index,
       "index_put",
       {"index -5 is out of bounds for dimension 0 with size 4"},
       [](const Watch& w) {
         Tensor self = f32({4, 3});
         w(self);
         index_put_(self, TensorList{from_vector<int64_t>({0, -5}, {2})}, f32({3}), true);
       }},
      {"index_put_dtype",
       K::Type,
       "index_put",
       {"float64", "float32"},
       [](const Watch& w) {
         Tensor self = f32({4, 3});
         w(self);
         index_put_(self, TensorList{i64({1})}, ones({3}, kFloat64));
       }},
      {"index_put_values_shape",
       K::Value,
       "index_put",
       {"not broadcastable", "[2]", "[1, 3]"},
       [](const Watch& w) {
         Tensor self = f32({4, 3});
         w(self);
         index_put_(self, TensorList{i64({1})}, f32({2}));
       }},
      {"index_put_api_out_of_bounds",
       K::Index,
       "index_put",
       {"index 9 is out of bounds for dimension 1 with size 3"},
       [](const Watch& w) {
         Tensor self = f32({4, 3});
         w(self);
         self.index_put_({Slice(), from_vector<int64_t>({0, 9}, {2})}, 1.0);
       }},
  };
}

// ---------------------------------------------------------------- scatters

void add_scatters(Cases& cs) {
  // scatter: index values without repeats along dim (each row a permutation's prefix), so the
  // result does not depend on which repeated write lands last.
  struct ScatterConfig {
    const char* label;
    Dims self, index, src;
    int64_t dim;
    Layout layout;
  };
  const std::vector<ScatterConfig> scatters = {
      {"dim1", {4, 5}, {4, 3}, {4, 3}, 1, C},        {"dim0", {5, 4}, {3, 4}, {3, 4}, 0, T},
      {"src_larger", {4, 5}, {2, 2}, {3, 4}, 1, C},  {"1d", {7}, {5}, {6}, 0, C},
      {"empty_index", {4, 5}, {0, 5}, {0, 5}, 0, C},
  };
  for (const ScatterConfig& c : scatters) {
    ScatterConfig sc = c;
    MakeFn make = [sc](Gen& g) {
      // Distinct positions along dim for each line of the other dims: a shuffled arange.
      const int64_t n = sc.self[static_cast<size_t>(sc.dim)];
      Tensor idx = empty(sc.index, kInt64);
      std::vector<int64_t> vals(static_cast<size_t>(idx.numel()));
      const int64_t k = sc.index[static_cast<size_t>(sc.dim)];
      const int64_t lines = k == 0 ? 0 : idx.numel() / k;
      for (int64_t l = 0; l < lines; ++l) {
        std::vector<int64_t> perm(static_cast<size_t>(n));
        for (int64_t i = 0; i < n; ++i) perm[i] = i;
        std::shuffle(perm.begin(), perm.end(), g.rng);
        for (int64_t j = 0; j < k; ++j) vals[static_cast<size_t>(l * k + j)] = perm[j];
      }
      // vals is laid out with dim innermost; move it to its place.
      Dims moved = sc.index;
      std::swap(moved[static_cast<size_t>(sc.dim)], moved.back());
      Tensor t = from_vector<int64_t>(vals, moved);
      idx = contiguous(transpose(t, sc.dim, -1));
      return KTensors{g.any({sc.self, sc.layout}), idx, g.any({sc.src, C})};
    };
    const int64_t dim = c.dim;
    OpCase row{
        .name = std::string("scatter_") + c.label,
        .ops = {"scatter"},
        .dtypes = kAllDTypes,
        .make = make,
        .kiln = [dim](const KArgs& x) { return KTensors{scatter(x[0], dim, x[1], x[2])}; },
        .aten = [dim](const AArgs& a) { return ATensors{at::scatter(a[0], dim, a[1], a[2])}; },
        .tol = Tol::Exact};
    cs.push_back(row);
    OpCase value = row;
    value.name = std::string("scatter_value_") + c.label;
    value.kiln = [dim](const KArgs& x) { return KTensors{scatter(x[0], dim, x[1], Scalar(1))}; };
    value.aten = [dim](const AArgs& a) { return ATensors{at::scatter(a[0], dim, a[1], 1)}; };
    cs.push_back(value);
    OpCase inplace = row;
    inplace.name = std::string("scatter__") + c.label;
    inplace.ops = {"scatter_out"};
    inplace.mode = Mode::InPlace;
    inplace.kiln = [dim](const KArgs& x) {
      Tensor self = x[0];
      scatter_(self, dim, x[1], x[2]);
      return KTensors{self};
    };
    cs.push_back(inplace);
    if (std::string(c.label) == "dim1")
      cs.push_back(out_variant(row, "scatter_out", [dim](const KArgs& x) {
        ops::op_scatter_out(x.out, x[0], dim, x[1], x[2]);
        return KTensors{x.out};
      }));
  }

  struct SelectConfig {
    const char* label;
    Dims self;
    int64_t dim, index;
    Layout layout;
  };
  for (const SelectConfig& c : std::vector<SelectConfig>{{"dim0", {4, 3}, 0, 2, C},
                                                         {"dim1_negative", {3, 4, 2}, 1, -1, T},
                                                         {"1d", {5}, 0, 4, C}}) {
    SelectConfig sc = c;
    cs.push_back({.name = std::string("select_scatter_") + c.label,
                  .ops = {"select_scatter"},
                  .dtypes = kAllDTypes,
                  .make =
                      [sc](Gen& g) {
                        Dims v = sc.self;
                        v.erase(v.begin() + sc.dim);
                        return KTensors{g.any({sc.self, sc.layout}), g.any({v, S})};
                      },
                  .kiln =
                      [sc](const KArgs& x) {
                        return KTensors{select_scatter(x[0], x[1], sc.dim, sc.index)};
                      },
                  .aten =
                      [sc](const AArgs& a) {
                        return ATensors{at::select_scatter(a[0], a[1], sc.dim, sc.index)};
                      },
                  .tol = Tol::Exact});
    if (std::string(c.label) == "dim0")
      cs.push_back(out_variant(cs.back(), "select_scatter_out", [sc](const KArgs& x) {
        ops::op_select_scatter_out(x.out, x[0], x[1], sc.dim, sc.index);
        return KTensors{x.out};
      }));
  }
  struct SliceConfig {
    const char* label;
    Dims self;
    int64_t dim;
    OptInt start, end;
    int64_t step;
    Dims src;
  };
  for (const SliceConfig& c :
       std::vector<SliceConfig>{{"dim0", {6, 3}, 0, 1, 4, 1, {3, 3}},
                                {"step2_open", {4, 7}, 1, std::nullopt, std::nullopt, 2, {4, 4}},
                                {"negative_clamped", {5, 4}, 0, -3, 100, 1, {3, 4}},
                                {"empty", {5, 4}, 1, 3, 2, 1, {5, 0}}}) {
    SliceConfig sc = c;
    cs.push_back(
        {.name = std::string("slice_scatter_") + c.label,
         .ops = {"slice_scatter"},
         .dtypes = kAllDTypes,
         .make =
             [sc](Gen& g) {
               return KTensors{g.any({sc.self, T}), g.any({sc.src, C})};
             },
         .kiln =
             [sc](const KArgs& x) {
               return KTensors{slice_scatter(x[0], x[1], sc.dim, sc.start, sc.end, sc.step)};
             },
         .aten =
             [sc](const AArgs& a) {
               auto o = [](OptInt v) { return v ? c10::optional<int64_t>(*v) : c10::nullopt; };
               return ATensors{
                   at::slice_scatter(a[0], a[1], sc.dim, o(sc.start), o(sc.end), sc.step)};
             },
         .tol = Tol::Exact});
    if (std::string(c.label) == "dim0")
      cs.push_back(out_variant(cs.back(), "slice_scatter_out", [sc](const KArgs& x) {
        ops::op_slice_scatter_out(x.out, x[0], x[1], sc.dim, sc.start, sc.end, sc.step);
        return KTensors{x.out};
      }));
  }
  // masked_scatter (a composite: cumsum, index_select, where).
  for (const auto& [label, self, mask] : std::vector<std::tuple<std::string, Dims, Dims>>{
           {"same", {3, 4}, {3, 4}}, {"broadcast_mask", {3, 4}, {4}}}) {
    Dims sd = self, md = mask;
    cs.push_back(
        {.name = "masked_scatter_" + label,
         .ops = {"cumsum", "index_select", "where"},
         .dtypes = kAllDTypes,
         .make =
             [sd, md](Gen& g) {
               return KTensors{g.any({sd, C}), g.mask({md, C}), g.any({{15}, C})};
             },
         .kiln = [](const KArgs& x) { return KTensors{masked_scatter(x[0], x[1], x[2])}; },
         .aten = [](const AArgs& a) { return ATensors{at::masked_scatter(a[0], a[1], a[2])}; },
         .tol = Tol::Exact});
  }
  // An empty source with a mask that is all false: self as it is.
  cs.push_back(
      {.name = "masked_scatter_empty_source",
       .ops = {"cat", "index_select", "where"},
       .dtypes = kAllDTypes,
       .make =
           [](Gen& g) {
             return KTensors{g.any({{3, 4}, C}), zeros({3, 4}, kBool), g.any({{0}, C})};
           },
       .kiln = [](const KArgs& x) { return KTensors{masked_scatter(x[0], x[1], x[2])}; },
       .aten = [](const AArgs& a) { return ATensors{at::masked_scatter(a[0], a[1], a[2])}; },
       .tol = Tol::Exact});
}

GradSamples scatter_grads() {
  GradSamples gs;
  gs.push_back(
      {"scatter_self_and_src",
       {"scatter", "gather"},
       [](GradGen& d) {
         return TensorList{d.var({3, 4}), grad_indices({2, 0, 3, 1, 0, 2}, {3, 2}), d.var({3, 3})};
       },
       [](const TensorList& x) { return TensorList{scatter(x[0], 1, x[1], x[2])}; }});
  gs.push_back({"select_scatter_grad",
                {"select_scatter", "select"},
                [](GradGen& d) {
                  return TensorList{d.var({3, 4}), d.var({3})};
                },
                [](const TensorList& x) { return TensorList{select_scatter(x[0], x[1], 1, -2)}; }});
  gs.push_back({"slice_scatter_grad",
                {"slice_scatter", "slice"},
                [](GradGen& d) {
                  return TensorList{d.var({5, 3}), d.var({2, 3})};
                },
                [](const TensorList& x) {
                  return TensorList{slice_scatter(x[0], x[1], 0, 1, std::nullopt, 2)};
                }});
  gs.push_back({"masked_scatter_grad",
                {"cumsum", "index_select", "where"},
                [](GradGen& d) {
                  return TensorList{d.var({3, 4}), d.mask({3, 4}), d.var({12})};
                },
                [](const TensorList& x) { return TensorList{masked_scatter(x[0], x[1], x[2])}; }});
  return gs;
}

std::vector<ErrorCase> scatter_errors() {
  return {
      {"scatter_out_of_range",
       K::Index,
       "scatter",
       {"index 5", "4"},
       [](const Watch& w) {
         Tensor self = f32({4, 3});
         w(self);
         scatter_(self, 0, from_vector<int64_t>({1, 5, 0}, {1, 3}), f32({1, 3}));
       }},
      {"scatter_index_dtype",
       K::Type,
       "scatter",
       {"int64", "int32"},
       [](const Watch&) {
         scatter(f32({4, 3}), 0, ones({1, 3}, kInt32), f32({1, 3}));
       }},
      {"scatter_src_dtype",
       K::Type,
       "scatter",
       {"float64", "float32"},
       [](const Watch&) {
         scatter(f32({4, 3}), 0, i64({1, 3}), ones({1, 3}, kFloat64));
       }},
      {"scatter_index_larger_than_src",
       K::Value,
       "scatter",
       {"index size 3 exceeds src size 2"},
       [](const Watch&) {
         scatter(f32({4, 3}), 0, i64({1, 3}), f32({1, 2}));
       }},
      {"select_scatter_index",
       K::Index,
       "select_scatter",
       {"index 4 is out of bounds for dimension 0 with size 4"},
       [](const Watch&) {
         select_scatter(f32({4, 3}), f32({3}), 0, 4);
       }},
      {"select_scatter_src_shape",
       K::Value,
       "select_scatter",
       {"src size = [4]", "slice size = [3]"},
       [](const Watch&) {
         select_scatter(f32({4, 3}), f32({4}), 0, 1);
       }},
      {"slice_scatter_src_shape",
       K::Value,
       "slice_scatter",
       {"src size = [3, 3]", "slice size = [2, 3]"},
       [](const Watch&) {
         slice_scatter(f32({4, 3}), f32({3, 3}), 0, 1, 3);
       }},
      {"slice_scatter_step",
       K::Value,
       "slice_scatter",
       {"step must be positive", "0"},
       [](const Watch&) {
         slice_scatter(f32({4, 3}), f32({4, 3}), 0, std::nullopt, std::nullopt, 0);
       }},
      {"masked_scatter_mask_dtype",
       K::Type,
       "masked_scatter",
       {"bool", "float32"},
       [](const Watch&) { masked_scatter(f32({4}), f32({4}), f32({4})); }},
      {"masked_scatter_empty_source_true_mask",
       K::Index,
       "index_select",
       {"index 1 is out of range"},
       [](const Watch&) {
         masked_scatter(f32({4}), from_vector<bool>({false, true, false, false}), f32({0}));
       }},
  };
}

}  // namespace

void add_advanced_indexing(Cases& cs) {
  add_index(cs);
  head(cs, "index").grads = index_grads();
  head(cs, "index").errors = index_errors();
  add_index_put(cs);
  head(cs, "index_put").grads = index_put_grads();
  head(cs, "index_put").errors = index_put_errors();
  add_nonzero(cs);
  head(cs, "nonzero").errors = {
      {"nonzero_undefined", K::Value, "nonzero", {"self"}, [](const Watch&) {
         nonzero(Tensor());
       }}};
  add_tensor_index_api(cs);
  add_scatters(cs);
  head(cs, "scatter").grads = scatter_grads();
  head(cs, "scatter").errors = scatter_errors();
}

}  // namespace kiln::test

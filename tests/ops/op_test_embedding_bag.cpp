// Records of embedding's padding_idx and scale_grad_by_freq, embedding_dense_backward,
// scatter_reduce (scatter_reduce.two) and embedding_bag (ATen's _embedding_bag), against ATen.
// See Note [Embedding gradients] and Note [embedding_bag] in kiln/ops/embedding_meta.cpp and
// Note [scatter_reduce] in kiln/ops/scatter_meta.cpp. Part of misc_core_cases().
#include "tests/ops/op_test_util.h"

namespace kiln::test {
namespace {

constexpr auto C = Layout::Contig;
constexpr auto T = Layout::Transposed;

std::vector<double> as_doubles(const std::vector<int64_t>& v) { return {v.begin(), v.end()}; }

// ---------------------------------------------------------------- embedding, dense backward

// Index values with repeats and, where a config names one, its padding_idx.
struct EmbConfig {
  const char* label;
  int64_t num_weights, dim;
  std::vector<int64_t> indices;
  Dims index_shape;
  int64_t padding_idx;
  bool scale;
  DType index_dtype;
};
const std::vector<EmbConfig>& emb_configs() {
  static const std::vector<EmbConfig> c = {
      {"plain", 6, 3, {1, 4, 1, 0, 5, 1}, {2, 3}, -1, false, kInt64},
      {"padding", 6, 3, {1, 4, 1, 0, 4, 2}, {2, 3}, 4, false, kInt64},
      {"scale", 6, 3, {1, 4, 1, 0, 4, 1, 1}, {7}, -1, true, kInt64},
      {"padding_scale_int32", 5, 4, {0, 3, 0, 2, 3, 3}, {3, 2}, 0, true, kInt32},
      {"negative_padding", 4, 2, {3, 3, 1}, {3}, -2, false, kInt64},
      {"no_indices", 4, 2, {}, {0}, 1, true, kInt64},
  };
  return c;
}

void add_embedding_rows(Cases& cs) {
  for (const EmbConfig& c : emb_configs()) {
    EmbConfig ec = c;
    MakeFn make = [ec](Gen& g) {
      return KTensors{g.any({{ec.num_weights, ec.dim}, T}),
                      g.values(as_doubles(ec.indices), ec.index_shape, ec.index_dtype)};
    };
    // The forward ignores padding_idx and scale_grad_by_freq (they shape the gradient).
    cs.push_back({.name = std::string("embedding_args_") + c.label,
                  .ops = {"embedding"},
                  .dtypes = kAllDTypes,
                  .make = make,
                  .kiln =
                      [ec](const KArgs& x) {
                        return KTensors{embedding(x[0], x[1], ec.padding_idx, ec.scale)};
                      },
                  .aten =
                      [ec](const AArgs& a) {
                        return ATensors{at::embedding(a[0], a[1], ec.padding_idx, ec.scale)};
                      },
                  .tol = Tol::Exact});
  }
}

void add_dense_backward_rows(Cases& cs) {
  for (const EmbConfig& c : emb_configs()) {
    EmbConfig ec = c;
    MakeFn make = [ec](Gen& g) {
      Dims gs = ec.index_shape;
      gs.push_back(ec.dim);
      return KTensors{g.any({gs, gs.size() >= 2 ? T : C}),
                      g.values(as_doubles(ec.indices), ec.index_shape, ec.index_dtype)};
    };
    OpCase row{.name = std::string("embedding_dense_backward_") + c.label,
               .ops = {"embedding_dense_backward"},
               .dtypes = kFloatDTypes,
               .make = make,
               .kiln =
                   [ec](const KArgs& x) {
                     return KTensors{embedding_dense_backward(x[0], x[1], ec.num_weights,
                                                              ec.padding_idx, ec.scale)};
                   },
               .aten =
                   [ec](const AArgs& a) {
                     return ATensors{at::embedding_dense_backward(a[0], a[1], ec.num_weights,
                                                                  ec.padding_idx, ec.scale)};
                   },
               .tol = Tol::Unordered16};
    cs.push_back(row);
    if (std::string(c.label) == "padding_scale_int32")
      cs.push_back(out_variant(row, "embedding_dense_backward_out", [ec](const KArgs& x) {
        ops::op_embedding_dense_backward_out(x.out, x[0], x[1], ec.num_weights, ec.padding_idx,
                                             ec.scale);
        return KTensors{x.out};
      }));
  }
  // A larger table, many repeats: the CUDA kernel's atomics.
  cs.push_back({.name = "embedding_dense_backward_large",
                .ops = {"embedding_dense_backward"},
                .dtypes = kFloatDTypes,
                .make =
                    [](Gen& g) {
                      return KTensors{g.any({{32, 40, 64}}), g.index({{32, 40}}, 100)};
                    },
                .kiln =
                    [](const KArgs& x) {
                      return KTensors{embedding_dense_backward(x[0], x[1], 100, 7, true)};
                    },
                .aten =
                    [](const AArgs& a) {
                      return ATensors{at::embedding_dense_backward(a[0], a[1], 100, 7, true)};
                    },
                .tol = Tol::Unordered16});
}

GradSamples embedding_grads() {
  GradSamples gs;
  // padding_idx and scale_grad_by_freq make the gradient differ from the derivative on purpose,
  // so gradcheck covers the defaults; the other cases are the dense backward rows against ATen
  // and EmbeddingModuleTest's gradients against torch::nn::Embedding.
  gs.push_back({"embedding_defaults_through_dense_backward",
                {"embedding", "embedding_dense_backward"},
                [](GradGen& d) {
                  return TensorList{d.var({5, 3}), grad_indices({1, 4, 1, 0, 4, 1}, {3, 2})};
                },
                [](const TensorList& x) { return TensorList{embedding(x[0], x[1], -1, false)}; }});
  return gs;
}

std::vector<ErrorCase> embedding_errors() {
  // clang-format off
  return {
      {"embedding_sparse", K::Value, "embedding", {"sparse=true", "no sparse tensors"},
       [](const Watch&) { embedding(f32({4, 3}), i64({2}), -1, false, true); }},
      {"embedding_dense_backward_grad_shape", K::Value, "embedding_dense_backward",
       {"[2, 3]", "[2, 4, 5]"},
       [](const Watch&) { embedding_dense_backward(f32({2, 4, 5}), i64({2, 3}), 4); }},
      {"embedding_dense_backward_num_weights", K::Value, "embedding_dense_backward",
       {"num_weights", "-1"},
       [](const Watch&) { embedding_dense_backward(f32({2, 5}), i64({2}), -1); }},
      {"embedding_dense_backward_index", K::Index, "embedding_dense_backward",
       {"index 4", "size 4"},
       [](const Watch&) {
         embedding_dense_backward(f32({2, 5}), from_vector<int64_t>({1, 4}, {2}), 4);
       }},
      {"embedding_dense_backward_int_grad", K::Type, "embedding_dense_backward", {"int64"},
       [](const Watch&) { embedding_dense_backward(i64({2, 5}), i64({2}), 4); }},
      {"embedding_dense_backward_index_dtype", K::Type, "embedding_dense_backward",
       {"int64 or int32", "float32"},
       [](const Watch&) { embedding_dense_backward(f32({2, 5}), f32({2}), 4); }},
  };
  // clang-format on
}

// ---------------------------------------------------------------- scatter_reduce

const char* const kReduceNames[] = {"sum", "prod", "mean", "amax", "amin"};

void add_scatter_reduce_rows(Cases& cs) {
  struct Config {
    const char* label;
    Dims self, index, src;
    int64_t dim;
    Layout layout;
  };
  // Repeated positions along dim (values drawn in [0, size)), a transposed self, src larger
  // than the index, 1-D, an empty index.
  const std::vector<Config> configs = {
      {"dim1", {4, 5}, {4, 7}, {4, 7}, 1, C},        {"dim0", {3, 4}, {6, 4}, {6, 4}, 0, T},
      {"src_larger", {4, 5}, {2, 3}, {3, 6}, 1, C},  {"1d", {5}, {9}, {11}, 0, C},
      {"empty_index", {4, 5}, {0, 5}, {0, 5}, 0, C},
  };
  for (const Config& c : configs)
    for (int64_t r = 0; r < 5; ++r)
      for (bool include_self : {true, false}) {
        Config sc = c;
        const std::string reduce = kReduceNames[r];
        MakeFn make = [sc](Gen& g) {
          return KTensors{g.any({sc.self, sc.layout}),
                          g.index({sc.index}, sc.self[static_cast<size_t>(sc.dim)]),
                          g.any({sc.src})};
        };
        OpCase row{
            .name = std::string("scatter_reduce_") + reduce + "_" + c.label +
                    (include_self ? "" : "_exclude_self"),
            .ops = {"scatter_reduce"},
            .dtypes = kNumericDTypes,
            .make = make,
            .kiln =
                [sc, reduce, include_self](const KArgs& x) {
                  return KTensors{scatter_reduce(x[0], sc.dim, x[1], x[2], reduce, include_self)};
                },
            .aten =
                [sc, reduce, include_self](const AArgs& a) {
                  return ATensors{
                      at::scatter_reduce(a[0], sc.dim, a[1], a[2], reduce, include_self)};
                },
            .tol = Tol::Unordered16};
        cs.push_back(row);
        if (std::string(c.label) == "dim1" && include_self) {
          OpCase inplace = row;
          inplace.name = std::string("scatter_reduce__") + reduce;
          inplace.ops = {"scatter_reduce_out"};
          inplace.mode = Mode::InPlace;
          inplace.kiln = [sc, reduce](const KArgs& x) {
            Tensor self = x[0];
            scatter_reduce_(self, sc.dim, x[1], x[2], reduce);
            return KTensors{self};
          };
          cs.push_back(inplace);
          const int64_t code = r;
          cs.push_back(out_variant(row, "scatter_reduce_out", [sc, code](const KArgs& x) {
            ops::op_scatter_reduce_out(x.out, x[0], sc.dim, x[1], x[2], code, true);
            return KTensors{x.out};
          }));
        }
      }
}

GradSamples scatter_reduce_grads() {
  GradSamples gs;
  for (int64_t r = 0; r < 5; ++r)
    for (bool include_self : {true, false}) {
      const std::string reduce = kReduceNames[r];
      gs.push_back({std::string("scatter_reduce_") + reduce + (include_self ? "" : "_exclude_self"),
                    {"scatter_reduce", "gather"},
                    [](GradGen& d) {
                      // Row 0 repeats position 1; row 2 leaves positions 0 and 3 unwritten. src
                      // is larger than the index. Values are distinct (no amax/amin ties).
                      return TensorList{d.var({3, 4}),
                                        grad_indices({1, 1, 2, 0, 3, 0, 1, 1, 2}, {3, 3}),
                                        d.var({3, 5})};
                    },
                    [reduce, include_self](const TensorList& x) {
                      return TensorList{scatter_reduce(x[0], 1, x[1], x[2], reduce, include_self)};
                    }});
    }
  // prod with one zero in a position's sources: the product of the others.
  gs.push_back({"scatter_reduce_prod_one_zero",
                {"scatter_reduce", "gather"},
                [](GradGen&) {
                  return TensorList{grad_values({1.5, -0.5, 2.0, 0.75}, {4}),
                                    grad_indices({0, 0, 2, 0}, {4}),
                                    grad_values({0.0, 1.25, -1.5, 0.5}, {4})};
                },
                [](const TensorList& x) {
                  return TensorList{scatter_reduce(x[0], 0, x[1], x[2], "prod")};
                }});
  return gs;
}

std::vector<ErrorCase> scatter_reduce_errors() {
  // clang-format off
  return {
      {"scatter_reduce_name", K::Value, "scatter_reduce", {"sum, prod, mean, amax or amin", "'max'"},
       [](const Watch&) { scatter_reduce(f32({4, 3}), 0, i64({1, 3}), f32({1, 3}), "max"); }},
      {"scatter_reduce_code", K::Value, "scatter_reduce", {"0-4", "7"},
       [](const Watch&) { ops::op_scatter_reduce(f32({4, 3}), 0, i64({1, 3}), f32({1, 3}), 7, true); }},
      {"scatter_reduce_bool", K::Type, "scatter_reduce", {"bool"},
       [](const Watch&) {
         scatter_reduce(ones({4, 3}, kBool), 0, i64({1, 3}), ones({1, 3}, kBool), "amax");
       }},
      {"scatter_reduce_out_of_range", K::Index, "scatter_reduce", {"index 5", "4"},
       [](const Watch& w) {
         Tensor self = f32({4, 3});
         w(self);
         scatter_reduce_(self, 0, from_vector<int64_t>({1, 5, 0}, {1, 3}), f32({1, 3}), "sum");
       }},
      {"scatter_reduce_index_dtype", K::Type, "scatter_reduce", {"int64", "int32"},
       [](const Watch&) { scatter_reduce(f32({4, 3}), 0, ones({1, 3}, kInt32), f32({1, 3}), "sum"); }},
      {"scatter_reduce_src_dtype", K::Type, "scatter_reduce", {"float64", "float32"},
       [](const Watch&) { scatter_reduce(f32({4, 3}), 0, i64({1, 3}), ones({1, 3}, kFloat64), "mean"); }},
      {"scatter_reduce_index_larger_than_self", K::Value, "scatter_reduce",
       {"index size 4 exceeds self size 3 at dim 1"},
       [](const Watch&) { scatter_reduce(f32({4, 3}), 0, i64({1, 4}), f32({1, 4}), "prod"); }},
  };
  // clang-format on
}

// ---------------------------------------------------------------- embedding_bag

struct BagConfig {
  std::string label;
  int64_t num_weights, dim;
  std::vector<int64_t> indices, offsets;
  int64_t mode;
  bool per_sample_weights, include_last_offset;
  int64_t padding_idx;
  bool scale;
  DType index_dtype;
};
const std::vector<BagConfig>& bag_configs() {
  // An empty bag (equal offsets), a bag of only padding, repeats.
  static const std::vector<BagConfig> c = [] {
    std::vector<BagConfig> v;
    const std::vector<int64_t> idx = {2, 5, 2, 0, 7, 3, 3, 1, 6, 2};
    const std::vector<int64_t> offs = {0, 3, 3, 6, 8};
    const char* modes[] = {"sum", "mean", "max"};
    for (int64_t m = 0; m < 3; ++m) {
      auto name = [&](const char* s) { return std::string(modes[m]) + "_" + s; };
      v.push_back({name("plain"), 8, 4, idx, offs, m, false, false, -1, false, kInt64});
      v.push_back({name("padding"), 8, 4, idx, offs, m, false, false, 3, false, kInt64});
      v.push_back({name("last_offset_int32"),
                   8,
                   5,
                   idx,
                   {0, 3, 3, 6, 8, 10},
                   m,
                   false,
                   true,
                   2,
                   m != 2,
                   kInt32});
      v.push_back({name("one_bag"), 8, 3, idx, {0}, m, false, false, -1, false, kInt64});
    }
    v.push_back({"sum_weighted", 8, 4, idx, offs, 0, true, false, -1, false, kInt64});
    v.push_back({"sum_weighted_padding", 8, 4, idx, offs, 0, true, true, 6, true, kInt64});
    v.back().offsets = {0, 3, 3, 6, 8, 10};
    v.push_back({"mean_no_indices", 4, 3, {}, {0, 0}, 1, false, false, -1, false, kInt64});
    return v;
  }();
  return c;
}

void add_embedding_bag_rows(Cases& cs) {
  for (const BagConfig& c : bag_configs()) {
    BagConfig bc = c;
    const auto n = static_cast<int64_t>(c.indices.size());
    MakeFn make = [bc, n](Gen& g) {
      KTensors t{g.any({{bc.num_weights, bc.dim}, T}),
                 g.values(as_doubles(bc.indices), {n}, bc.index_dtype),
                 g.values(as_doubles(bc.offsets), {static_cast<int64_t>(bc.offsets.size())},
                          bc.index_dtype)};
      if (bc.per_sample_weights) t.push_back(g.any({{n}}));
      return t;
    };
    // offset2bag and bag_size are compared for mean and max: in mode sum ATen's CPU kernel
    // leaves offset2bag empty and bag_size zero on its fast path (its backward reads neither).
    // max_indices only for max: ATen leaves the other modes' uninitialised.
    const bool aux = c.mode != 0, maxi = c.mode == 2;
    auto pick = [aux, maxi](auto out, auto offset2bag, auto bag_size, auto max_indices) {
      std::vector<decltype(out)> r{out};
      if (aux) r.insert(r.end(), {offset2bag, bag_size});
      if (maxi) r.push_back(max_indices);
      return r;
    };
    cs.push_back({.name = "embedding_bag_" + c.label,
                  .ops = {"embedding_bag"},
                  .dtypes = kFloatDTypes,
                  .make = make,
                  .kiln =
                      [bc, pick](const KArgs& x) {
                        auto [out, o2b, bs, mi] =
                            ops::op_embedding_bag(x[0], x[1], x[2], bc.scale, bc.mode, false,
                                                  bc.per_sample_weights ? x[3] : Tensor(),
                                                  bc.include_last_offset, bc.padding_idx);
                        return pick(out, o2b, bs, mi);
                      },
                  .aten =
                      [bc, pick](const AArgs& a) {
                        auto [out, o2b, bs, mi] = at::_embedding_bag(
                            a[0], a[1], a[2], bc.scale, bc.mode, false,
                            bc.per_sample_weights ? c10::optional<at::Tensor>(a[3]) : c10::nullopt,
                            bc.include_last_offset, bc.padding_idx);
                        return pick(out, o2b, bs, mi);
                      },
                  .tol = Tol::Accum});
  }
  // Bags of a 2-D input (torch.nn.functional.embedding_bag's fixed-length bags).
  cs.push_back(
      {.name = "embedding_bag_functional_2d",
       .ops = {"embedding_bag"},
       .dtypes = kFloatDTypes,
       .make =
           [](Gen& g) {
             return KTensors{g.any({{10, 6}}), g.index({{4, 3}}, 10)};
           },
       .kiln =
           [](const KArgs& x) { return KTensors{embedding_bag(x[1], x[0], {}, false, "mean")}; },
       .aten =
           [](const AArgs& a) {
             return ATensors{std::get<0>(at::embedding_bag(
                 a[0], a[1].reshape({-1}), at::arange(0, 12, 3, a[1].options()), false, 1))};
           },
       .tol = Tol::Accum});
}

GradSamples embedding_bag_grads() {
  GradSamples gs;
  const char* modes[] = {"sum", "mean", "max"};
  for (int64_t m = 0; m < 3; ++m)
    gs.push_back({std::string("embedding_bag_") + modes[m],
                  {"embedding_bag", m == 2 ? "scatter_add" : "embedding_dense_backward"},
                  [](GradGen& d) {
                    return TensorList{d.var({6, 3}), grad_indices({2, 5, 2, 0, 4, 3, 3, 1}, {8}),
                                      grad_indices({0, 3, 3, 6}, {4})};
                  },
                  [m](const TensorList& x) {
                    return TensorList{std::get<0>(ops::op_embedding_bag(
                        x[0], x[1], x[2], false, m, false, Tensor(), false, -1))};
                  }});
  gs.push_back({"embedding_bag_per_sample_weights",
                {"embedding_bag", "embedding_dense_backward", "embedding"},
                [](GradGen& d) {
                  return TensorList{d.var({6, 3}), grad_indices({2, 5, 2, 0, 4, 3, 3, 1}, {8}),
                                    grad_indices({0, 3, 3, 6, 8}, {5}), d.var({8})};
                },
                [](const TensorList& x) {
                  return TensorList{std::get<0>(
                      ops::op_embedding_bag(x[0], x[1], x[2], false, 0, false, x[3], true, -1))};
                }});
  return gs;
}

std::vector<ErrorCase> embedding_bag_errors() {
  auto idx = [] { return from_vector<int64_t>({1, 2, 0, 3}, {4}); };
  auto offs = [](std::vector<int64_t> v) {
    const auto n = static_cast<int64_t>(v.size());
    return from_vector<int64_t>(v, {n});
  };
  // clang-format off
  return {
      {"embedding_bag_mode", K::Value, "embedding_bag", {"mode", "3"},
       [=](const Watch&) { ops::op_embedding_bag(f32({5, 2}), idx(), offs({0, 2}), false, 3, false, {}, false, -1); }},
      {"embedding_bag_mode_name", K::Value, "embedding_bag", {"'avg'"},
       [=](const Watch&) { embedding_bag(idx(), f32({5, 2}), offs({0, 2}), false, "avg"); }},
      {"embedding_bag_first_offset", K::Value, "embedding_bag", {"offsets[0] must be 0", "1"},
       [=](const Watch&) { ops::op_embedding_bag(f32({5, 2}), idx(), offs({1, 2}), false, 0, false, {}, false, -1); }},
      {"embedding_bag_decreasing_offsets", K::Value, "embedding_bag", {"offsets[2] = 1 after 3"},
       [=](const Watch&) { ops::op_embedding_bag(f32({5, 2}), idx(), offs({0, 3, 1}), false, 0, false, {}, false, -1); }},
      {"embedding_bag_offset_past_end", K::Value, "embedding_bag", {"offsets[-1] = 6", "4"},
       [=](const Watch&) { ops::op_embedding_bag(f32({5, 2}), idx(), offs({0, 6}), false, 0, false, {}, false, -1); }},
      {"embedding_bag_last_offset", K::Value, "embedding_bag", {"include_last_offset", "4", "3"},
       [=](const Watch&) { ops::op_embedding_bag(f32({5, 2}), idx(), offs({0, 3}), false, 0, false, {}, true, -1); }},
      {"embedding_bag_index", K::Index, "embedding_bag", {"index 5", "size 5"},
       [=](const Watch&) { ops::op_embedding_bag(f32({5, 2}), from_vector<int64_t>({5}, {1}), offs({0}), false, 0, false, {}, false, -1); }},
      {"embedding_bag_2d_indices", K::Value, "embedding_bag", {"indices must be 1-D", "[2, 2]"},
       [=](const Watch&) { ops::op_embedding_bag(f32({5, 2}), i64({2, 2}), offs({0}), false, 0, false, {}, false, -1); }},
      {"embedding_bag_offsets_dtype", K::Type, "embedding_bag", {"one dtype", "int64", "int32"},
       [=](const Watch&) { ops::op_embedding_bag(f32({5, 2}), idx(), ones({2}, kInt32), false, 0, false, {}, false, -1); }},
      {"embedding_bag_weights_with_mean", K::Value, "embedding_bag", {"per_sample_weights", "mode 1"},
       [=](const Watch&) { ops::op_embedding_bag(f32({5, 2}), idx(), offs({0, 2}), false, 1, false, f32({4}), false, -1); }},
      {"embedding_bag_weights_shape", K::Value, "embedding_bag", {"per_sample_weights", "[4]", "[3]"},
       [=](const Watch&) { ops::op_embedding_bag(f32({5, 2}), idx(), offs({0, 2}), false, 0, false, f32({3}), false, -1); }},
      {"embedding_bag_sparse", K::Value, "embedding_bag", {"sparse=true", "no sparse tensors"},
       [=](const Watch&) { ops::op_embedding_bag(f32({5, 2}), idx(), offs({0, 2}), false, 0, true, {}, false, -1); }},
      {"embedding_bag_scale_max", K::Value, "embedding_bag", {"scale_grad_by_freq", "max"},
       [=](const Watch&) { ops::op_embedding_bag(f32({5, 2}), idx(), offs({0, 2}), true, 2, false, {}, false, -1); }},
      {"embedding_bag_int_weight", K::Type, "embedding_bag", {"floating-point", "int64"},
       [=](const Watch&) { ops::op_embedding_bag(i64({5, 2}), idx(), offs({0, 2}), false, 0, false, {}, false, -1); }},
      {"embedding_bag_padding_range", K::Value, "embedding_bag", {"padding_idx", "[-5, 5)", "5"},
       [=](const Watch&) { embedding_bag(idx(), f32({5, 2}), offs({0, 2}), false, "sum", {}, false, 5); }},
  };
  // clang-format on
}

}  // namespace

void add_embedding_scatter_reduce(Cases& cs) {
  add_embedding_rows(cs);
  head(cs, "embedding").grads = embedding_grads();
  head(cs, "embedding").errors = embedding_errors();
  add_dense_backward_rows(cs);
  add_scatter_reduce_rows(cs);
  head(cs, "scatter_reduce").grads = scatter_reduce_grads();
  head(cs, "scatter_reduce").errors = scatter_reduce_errors();
  add_embedding_bag_rows(cs);
  head(cs, "embedding_bag").grads = embedding_bag_grads();
  head(cs, "embedding_bag").errors = embedding_bag_errors();
}

}  // namespace kiln::test

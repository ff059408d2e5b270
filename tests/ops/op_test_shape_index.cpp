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

// ---------------------------------------------------------------- gradcheck and error samples

Tensor idx(std::vector<int64_t> v) { return from_vector(v); }

// A gradcheck of `f` on one input of `shape`; outputs are views of the input, or are multiplied
// by a fixed tensor where a plain view would hide a wrong layout of the gradient.
GradSample view_grad(const std::string& name, std::vector<std::string> ops, Dims shape,
                     std::function<Tensor(const Tensor&)> f) {
  return {name, std::move(ops), [shape](GradGen& d) { return TensorList{d.var(shape)}; },
          [f](const TensorList& x) { return TensorList{f(x[0])}; }};
}

// cat, and stack (unsqueeze then cat).
GradSamples cat_grads() {
  GradSamples cs;
  cs.push_back({"cat_dim0_three",
                {"cat"},
                [](GradGen& d) {
                  return TensorList{d.var({2, 3}), d.var({1, 3}), d.var({3, 3})};
                },
                [](const TensorList& x) {
                  return TensorList{cat({x[0], x[1], x[2]}, 0)};
                }});
  cs.push_back({"cat_dim1_mixed_grad",
                {"cat"},
                [](GradGen& d) {
                  return TensorList{d.var({2, 2}), d.fixed({2, 1}), d.var({2, 3})};
                },
                [](const TensorList& x) {
                  return TensorList{cat({x[0], x[1], x[2]}, -1)};
                }});
  cs.push_back({"cat_same_input_twice",
                {"cat"},
                [](GradGen& d) {
                  return TensorList{d.var({2, 3})};
                },
                [](const TensorList& x) {
                  return TensorList{cat({x[0], x[0]}, 1)};
                }});
  cs.push_back({"cat_skips_legacy_empty",
                {"cat"},
                [](GradGen& d) {
                  return TensorList{d.var({2, 3}), d.var({1, 3})};
                },
                [](const TensorList& x) {
                  return TensorList{cat({x[0], zeros({0}, kFloat64), x[1]}, 0)};
                }});
  cs.push_back({"stack_dim0",
                {"cat", "unsqueeze"},
                [](GradGen& d) {
                  return TensorList{d.var({2, 3}), d.var({2, 3})};
                },
                [](const TensorList& x) {
                  return TensorList{stack({x[0], x[1]}, 0)};
                }});
  cs.push_back({"stack_dim_last",
                {"cat", "unsqueeze"},
                [](GradGen& d) {
                  return TensorList{d.var({3}), d.var({3}), d.var({3})};
                },
                [](const TensorList& x) {
                  return TensorList{stack({x[0], x[1], x[2]}, -1)};
                }});
  return cs;
}

// slice, and split, chunk and narrow, which slice.
GradSamples slice_grads() {
  GradSamples cs;
  cs.push_back({"split_sizes",
                {"slice"},
                [](GradGen& d) {
                  return TensorList{d.var({5, 2})};
                },
                [](const TensorList& x) {
                  return split(x[0], IntArrayRef({2, 3}), 0);
                }});
  cs.push_back({"split_uneven_dim1",
                {"slice"},
                [](GradGen& d) {
                  return TensorList{d.var({2, 5})};
                },
                [](const TensorList& x) { return split(x[0], 2, 1); }});
  cs.push_back({"chunk_partly_used",
                {"slice", "mul"},
                [](GradGen& d) {
                  return TensorList{d.var({6, 2})};
                },
                [](const TensorList& x) {
                  TensorList c = chunk(x[0], 3, 0);
                  return TensorList{c[0] * c[2]};  // chunk 1 unused: its gradient is 0
                }});
  cs.push_back(view_grad("slice_step2", {"slice"}, {5, 3},
                         [](const Tensor& x) { return slice(x, 0, 0, 5, 2); }));
  cs.push_back(view_grad("slice_dim1_offset", {"slice"}, {2, 5},
                         [](const Tensor& x) { return slice(x, 1, 1, 4, 1); }));
  cs.push_back(
      view_grad("narrow", {"slice"}, {4, 3}, [](const Tensor& x) { return narrow(x, 0, 1, 2); }));
  return cs;
}

GradSamples index_select_grads() {
  GradSamples cs;
  cs.push_back({"index_select_dim0_repeats",
                {"index_select"},
                [](GradGen& d) {
                  return TensorList{d.var({4, 3}), grad_indices({3, 0, 3, 3, 1}, {5})};
                },
                [](const TensorList& x) { return TensorList{index_select(x[0], 0, x[1])}; }});
  cs.push_back({"index_select_dim1",
                {"index_select"},
                [](GradGen& d) {
                  return TensorList{d.var({2, 4}), grad_indices({2, 1}, {2})};
                },
                [](const TensorList& x) { return TensorList{index_select(x[0], 1, x[1])}; }});
  return cs;
}

GradSamples gather_grads() {
  GradSamples cs;
  cs.push_back(
      {"gather_dim1",
       {"gather"},
       [](GradGen& d) {
         return TensorList{d.var({3, 4}), grad_indices({0, 0, 3, 1, 2, 1, 3, 3, 3}, {3, 3})};
       },
       [](const TensorList& x) { return TensorList{gather(x[0], 1, x[1])}; }});
  cs.push_back({"gather_dim0_smaller_index",
                {"gather"},
                [](GradGen& d) {
                  return TensorList{d.var({3, 4}), grad_indices({2, 0, 2, 1, 1, 2}, {2, 3})};
                },
                [](const TensorList& x) { return TensorList{gather(x[0], 0, x[1])}; }});
  return cs;
}

GradSamples scatter_add_grads() {
  GradSamples cs;
  cs.push_back(
      {"scatter_add_self_and_src",
       {"scatter_add"},
       [](GradGen& d) {
         return TensorList{d.var({3, 4}), grad_indices({0, 2, 2, 1, 0, 0}, {2, 3}), d.var({2, 3})};
       },
       [](const TensorList& x) { return TensorList{scatter_add(x[0], 0, x[1], x[2])}; }});
  cs.push_back(
      {"scatter_add_src_larger_than_index",
       {"scatter_add"},
       [](GradGen& d) {
         return TensorList{d.var({3, 4}), grad_indices({3, 3, 1, 0}, {2, 2}), d.var({3, 3})};
       },
       [](const TensorList& x) { return TensorList{scatter_add(x[0], 1, x[1], x[2])}; }});
  cs.push_back(
      {"scatter_add__inplace",
       {"scatter_add", "copy_"},
       [](GradGen& d) {
         return TensorList{d.var({3, 4}), grad_indices({1, 1, 2, 0}, {1, 4}), d.var({1, 4})};
       },
       [](const TensorList& x) {
         Tensor self = nonleaf(x[0]);
         scatter_add_(self, 0, x[1], x[2]);
         return TensorList{self};
       }});
  return cs;
}

GradSamples index_add_grads() {
  GradSamples cs;
  cs.push_back(
      {"index_add_alpha",
       {"index_add"},
       [](GradGen& d) {
         return TensorList{d.var({4, 3}), grad_indices({3, 0, 3}, {3}), d.var({3, 3})};
       },
       [](const TensorList& x) { return TensorList{index_add(x[0], 0, x[1], x[2], 2.5)}; }});
  cs.push_back({"index_add_dim1",
                {"index_add"},
                [](GradGen& d) {
                  return TensorList{d.var({2, 4}), grad_indices({1, 1}, {2}), d.var({2, 2})};
                },
                [](const TensorList& x) { return TensorList{index_add(x[0], 1, x[1], x[2])}; }});
  cs.push_back({"index_add__inplace",
                {"index_add", "copy_"},
                [](GradGen& d) {
                  return TensorList{d.var({4, 3}), grad_indices({2, 2}, {2}), d.var({2, 3})};
                },
                [](const TensorList& x) {
                  Tensor self = nonleaf(x[0]);
                  index_add_(self, 0, x[1], x[2], -0.5);
                  return TensorList{self};
                }});
  return cs;
}

// triu (`upper`) or tril below, on and above the diagonal.
GradSamples tri_grads(bool upper) {
  GradSamples cs;
  for (int64_t diag : {-1, 0, 1}) {
    std::string s = diag < 0 ? "m1" : std::to_string(diag);
    if (upper)
      cs.push_back({"triu_" + s,
                    {"triu"},
                    [](GradGen& d) {
                      return TensorList{d.var({3, 4})};
                    },
                    [diag](const TensorList& x) { return TensorList{triu(x[0], diag)}; }});
    if (!upper)
      cs.push_back({"tril_" + s,
                    {"tril"},
                    [](GradGen& d) {
                      return TensorList{d.var({2, 3, 3})};
                    },
                    [diag](const TensorList& x) { return TensorList{tril(x[0], diag)}; }});
  }
  return cs;
}

GradSamples view_grads() {
  GradSamples cs;
  cs.push_back(view_grad("view", {"view"}, {2, 6}, [](const Tensor& x) {
    return view(x, {3, 4});
  }));
  cs.push_back(view_grad("view_infer", {"view"}, {2, 3, 2}, [](const Tensor& x) {
    return view(x, {-1, 2});
  }));
  cs.push_back(
      view_grad("flatten", {"view"}, {2, 3, 2}, [](const Tensor& x) { return flatten(x, 1); }));
  cs.push_back(view_grad("reshape_of_transposed", {"transpose", "to_copy", "view"}, {2, 3},
                         [](const Tensor& x) { return reshape(transpose(x, 0, 1), {6}); }));
  return cs;
}

GradSamples as_strided_grads() {
  GradSamples cs;
  cs.push_back(view_grad("as_strided", {"as_strided"}, {12}, [](const Tensor& x) {
    return as_strided(x, {2, 3}, {4, 1}, 1);
  }));
  cs.push_back(view_grad("as_strided_overlapping", {"as_strided"}, {6}, [](const Tensor& x) {
    return as_strided(x, {3, 3}, {1, 1}, 0);
  }));
  return cs;
}

GradSamples permute_grads() {
  GradSamples cs;
  cs.push_back(view_grad("permute", {"permute"}, {2, 3, 4}, [](const Tensor& x) {
    return permute(x, {2, 0, 1});
  }));
  return cs;
}

GradSamples select_grads() {
  GradSamples cs;
  cs.push_back(
      view_grad("select", {"select"}, {3, 4}, [](const Tensor& x) { return select(x, 1, 2); }));
  cs.push_back(view_grad("select_neg", {"select"}, {3, 4},
                         [](const Tensor& x) { return select(x, 0, -1); }));
  return cs;
}

GradSamples expand_grads() {
  GradSamples cs;
  cs.push_back(view_grad("expand", {"expand"}, {3, 1}, [](const Tensor& x) {
    return expand(x, {2, 3, 4});
  }));
  cs.push_back(view_grad("expand_0d", {"expand"}, {}, [](const Tensor& x) {
    return expand(x, {2, 3});
  }));
  return cs;
}

GradSamples squeeze_grads() {
  GradSamples cs;
  cs.push_back(view_grad("squeeze_all", {"squeeze"}, {1, 3, 1, 2},
                         [](const Tensor& x) { return squeeze(x); }));
  cs.push_back(view_grad("squeeze_dim", {"squeeze"}, {3, 1, 2},
                         [](const Tensor& x) { return squeeze(x, 1); }));
  return cs;
}

GradSamples unsqueeze_grads() {
  GradSamples cs;
  cs.push_back(view_grad("unsqueeze", {"unsqueeze"}, {3, 2},
                         [](const Tensor& x) { return unsqueeze(x, -1); }));
  return cs;
}

GradSamples alias_grads() {
  GradSamples cs;
  cs.push_back(view_grad("alias_t_1d", {"alias"}, {4}, [](const Tensor& x) { return t(x); }));
  return cs;
}

GradSamples to_copy_grads() {
  GradSamples cs;
  cs.push_back(view_grad("clone", {"to_copy"}, {2, 3}, [](const Tensor& x) { return clone(x); }));
  cs.push_back(
      view_grad("contiguous_of_permuted", {"permute", "to_copy"}, {2, 3, 2}, [](const Tensor& x) {
        return contiguous(permute(x, {1, 2, 0}));
      }));
  return cs;
}

GradSamples transpose_grads() {
  GradSamples cs;
  cs.push_back(view_grad("transpose", {"transpose"}, {2, 3, 4},
                         [](const Tensor& x) { return transpose(x, 0, -1); }));
  cs.push_back(view_grad("t_2d", {"transpose"}, {2, 3}, [](const Tensor& x) { return t(x); }));
  // A view used in arithmetic (a wrongly laid out gradient would not cancel).
  cs.push_back({"transpose_times_fixed",
                {"transpose", "mul"},
                [](GradGen& d) {
                  return TensorList{d.var({2, 3}), d.fixed({3, 2})};
                },
                [](const TensorList& x) { return TensorList{transpose(x[0], 0, 1) * x[1]}; }});
  return cs;
}

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
  // clang-format off
  const std::vector<std::pair<const char*, GradSamples>> grads = {
      {"view", view_grads()},           {"as_strided", as_strided_grads()},
      {"permute", permute_grads()},     {"transpose", transpose_grads()},
      {"select", select_grads()},       {"expand", expand_grads()},
      {"squeeze", squeeze_grads()},     {"unsqueeze", unsqueeze_grads()},
      {"alias", alias_grads()},         {"to_copy", to_copy_grads()},
      {"slice", slice_grads()}};
  for (const auto& [op, g] : grads) head(cs, op).grads = g;
  head(cs, "view").errors = {
      {"view_incompatible", ErrorKind::Value, "view", {"[12]", "reshape"},
       [](const Watch&) { view(transpose(f32({3, 4}), 0, 1), {12}); }},
      // reshape, which views or copies, checks the element count under its own name.
      {"reshape_bad_numel", ErrorKind::Value, "reshape", {"[5, 5]", "12"},
       [](const Watch&) { reshape(f32({3, 4}), {5, 5}); }}};
  head(cs, "as_strided").errors = {
      {"as_strided_beyond_storage", ErrorKind::Index, "as_strided", {"12"},
       [](const Watch&) { as_strided(f32({3, 4}), {4, 4}, {4, 1}); }}};
  head(cs, "permute").errors = {
      {"permute_repeated_dim", ErrorKind::Value, "permute", {"[0, 0, 1]"},
       [](const Watch&) { permute(f32({2, 3, 4}), {0, 0, 1}); }}};
  head(cs, "transpose").errors = {
      {"transpose_dim", ErrorKind::Index, "transpose", {"2"},
       [](const Watch&) { transpose(f32({3, 4}), 0, 2); }}};
  head(cs, "select").errors = {
      {"select_index_out_of_range", ErrorKind::Index, "select", {"10", "3"},
       [](const Watch&) { select(f32({3, 4}), 0, 10); }}};
  head(cs, "expand").errors = {
      {"expand_bad_size", ErrorKind::Value, "expand", {"3", "4"},
       [](const Watch&) { expand(f32({3, 1}), {4, 2}); }}};
  head(cs, "squeeze").errors = {
      {"squeeze_dim", ErrorKind::Index, "squeeze", {"-3"},
       [](const Watch&) { squeeze(f32({3, 1}), -3); }}};
  // split, chunk and narrow slice, and check their arguments under their own names.
  head(cs, "slice").errors = {
      {"split_sizes_sum", ErrorKind::Value, "split", {"[2, 2]", "5"},
       [](const Watch&) { split(f32({5, 2}), {2, 2}); }},
      {"chunk_zero", ErrorKind::Value, "chunk", {"0"}, [](const Watch&) { chunk(f32({5}), 0); }},
      {"narrow_beyond_end", ErrorKind::Index, "narrow", {"2", "5", "4"},
       [](const Watch&) { narrow(f32({3, 4}), 1, 2, 5); }}};
  // clang-format on
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
  // clang-format off
  OpCase& record = head(cs, "cat");
  record.grads = cat_grads();
  record.errors = {
      {"cat_size_mismatch", ErrorKind::Value, "cat", {"dimension 0", "3", "4"},
       [](const Watch&) { cat({f32({2, 3}), f32({2, 4})}, 0); }},
      {"cat_cpu_meta", ErrorKind::Device, "cat", {"cpu", "meta"},
       [](const Watch&) { cat({f32({2}), empty({2}, kFloat32, Device("meta"))}); }},
      // stack (unsqueeze then cat) checks the sizes under its own name.
      {"stack_size_mismatch", ErrorKind::Value, "stack", {"[2, 3]", "[3, 2]"},
       [](const Watch&) { stack({f32({2, 3}), f32({3, 2})}); }}};
  // clang-format on
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
    // Accumulation order over duplicate indices may differ from ATen's (Tol::Accum). In the
    // 16-bit dtypes the reference is the sum in float32 rounded once (libtorch 1.13's CPU
    // kernel and 2.11's round differently); Kiln rounds after every addition, a few ulps of
    // the partial sums from it (Tol::Unordered16), while a lost or misplaced term is off by
    // about 1.
    OpCase scatter{
        .name = std::string("scatter_add_") + c.label,
        .ops = {"scatter_add"},
        .dtypes = kNumericDTypes,
        .make = make,
        .kiln = [dim](const KArgs& x) { return KTensors{scatter_add(x[0], dim, x[1], x[2])}; },
        .aten = [dim](const AArgs& a) { return ATensors{at::scatter_add(a[0], dim, a[1], a[2])}; },
        .tol = Tol::Unordered16};
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
  // clang-format off
  OpCase& is_record = head(cs, "index_select");
  is_record.grads = index_select_grads();
  is_record.errors = {
      {"index_select_bad_dim", ErrorKind::Index, "index_select", {"3"},
       [](const Watch&) { index_select(f32({3, 4}), 3, idx({0})); }},
      {"index_select_index_value", ErrorKind::Index, "index_select", {"9"},
       [](const Watch&) { index_select(f32({3, 4}), 0, idx({0, 9})); }}};
  OpCase& gather_record = head(cs, "gather");
  gather_record.grads = gather_grads();
  gather_record.errors = {
      {"gather_int32_index", ErrorKind::Type, "gather", {"int32"},
       [](const Watch&) { gather(f32({3, 4}), 1, zeros({3, 2}, kInt32)); }},
      {"gather_index_value", ErrorKind::Index, "gather", {"7"},
       [](const Watch&) { gather(f32({3, 4}), 1, from_vector<int64_t>({0, 7, 1}, {3, 1})); }}};
  OpCase& sa_record = head(cs, "scatter_add");
  sa_record.grads = scatter_add_grads();
  sa_record.errors = {{"scatter_add__index_value", ErrorKind::Index, "scatter_add", {"7"},
                       [](const Watch& watch) {
                         Tensor self = zeros({2, 5});
                         watch(self);
                         scatter_add_(self, 1, from_vector<int64_t>({0, 7, 1, 2}, {2, 2}),
                                      f32({2, 2}));
                       }},
                      // scatter's checks (meta::check_scatter_args), then one rank to the letter:
                      // a 0-d index among 1-d operands, which scatter takes, is refused.
                      {"scatter_add_0d_index_with_1d_self", ErrorKind::Value, "scatter_add",
                       {"0, 1 and 1"},
                       [](const Watch&) { scatter_add(zeros({3}), 0, zeros({}, kInt64), f32({3})); }},
                      {"scatter_add_index_larger_than_src", ErrorKind::Value, "scatter_add",
                       {"3", "2"},
                       [](const Watch&) { scatter_add(zeros({4}), 0, zeros({3}, kInt64), f32({2})); }}};
  OpCase& ia_record = head(cs, "index_add");
  ia_record.grads = index_add_grads();
  ia_record.errors = {{"index_add__index_value", ErrorKind::Index, "index_add", {"5"},
                       [](const Watch& watch) {
                         Tensor self = zeros({5, 2});
                         watch(self);
                         index_add_(self, 0, idx({1, 5}), f32({2, 2}));
                       }}};
  head(cs, "triu").grads = tri_grads(true);
  head(cs, "tril").grads = tri_grads(false);
  head(cs, "one_hot").errors = {
      {"one_hot_float", ErrorKind::Type, "one_hot", {"float32"},
       [](const Watch&) { one_hot(f32({3}), 4); }},
      {"one_hot_infer_empty", ErrorKind::Value, "one_hot", {"empty"},
       [](const Watch&) { one_hot(i64({0})); }}};
  // clang-format on
}

}  // namespace

Cases shape_index_cases() {
  Cases cs;
  add_views(cs);
  add_cat_stack(cs);
  add_indexing(cs);
  add_advanced_indexing(cs);
  return cs;
}

}  // namespace kiln::test

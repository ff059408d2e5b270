// Op table: issue 16's remaining Core ATen ops: randperm and empty_strided (property checks: no
// oracle draws Kiln's numbers or owns its memory), and cdist/pdist with their backward ops
// against at::_cdist_forward, at::_cdist_backward, at::_pdist_forward and at::_pdist_backward
// (every p kind, batch broadcasting, non-contiguous inputs); im2col and col2im (with unfold and
// fold) against at::im2col and at::col2im; grid_sampler_2d and its backward op (grid_sample)
// against at::grid_sampler_2d(_backward) in every mode; gradchecks in float64; error rows.
#include <cmath>
#include <limits>

#include "tests/ops/op_test_util.h"

namespace kiln::test {
namespace {

constexpr auto C = Layout::Contig;
constexpr auto T = Layout::Transposed;
constexpr double kInf = std::numeric_limits<double>::infinity();

std::string p_label(double p) {
  if (std::isinf(p)) return "inf";
  if (p == 0.5) return "half";
  if (p == 1.5) return "1_5";
  return std::to_string(static_cast<int>(p));
}
at::IntArrayRef ar(const Dims& d) { return at::IntArrayRef(d.data(), d.size()); }

// ---------------------------------------------------------------- randperm

void add_randperm(Cases& cs) {
  // A permutation of 0..n-1 in the dtype, the same as the CPU's for the same generator state.
  struct Row {
    const char* name;
    int64_t n;
    std::vector<DType> dtypes;
  };
  for (const Row& r : std::vector<Row>{{"randperm", 200, kNumericDTypes},
                                       {"randperm_large", 100000, {kInt64, kInt32, kFloat32}},
                                       {"randperm_one", 1, {kInt64}},
                                       {"randperm_empty", 0, {kInt64}}}) {
    const int64_t n = r.n;
    cs.push_back({.name = r.name,
                  .ops = {"randperm"},
                  .dtypes = r.dtypes,
                  .make = [](Gen&) { return KTensors{}; },
                  .kiln =
                      [n](const KArgs& x) {
                        Generator g(21);
                        return KTensors{randperm(n, &g, x.dtype, x.device)};
                      },
                  .check =
                      [n](const KArgs& x, const KTensors& got) {
                        EXPECT_EQ(got[0].dtype(), x.dtype);
                        EXPECT_EQ(vec(got[0].sizes()), Dims{n});
                        at::Tensor a = to_aten(got[0]).to(at::kLong);
                        EXPECT_TRUE(at::equal(std::get<0>(a.sort()), at::arange(n, at::kLong)))
                            << "not a permutation";
                        if (n > 10) {
                          EXPECT_FALSE(at::equal(a, at::arange(n, at::kLong))) << "identity";
                        }
                        Generator g(21);
                        EXPECT_TRUE(at::equal(a, to_aten(randperm(n, &g, kInt64, Device(kCPU)))))
                            << "differs from the CPU's permutation for the same generator";
                      }});
  }
  // (seed, offset) determines a permutation; the generator advances by randint's ceil(n / 2)
  // blocks; the default generator obeys manual_seed.
  cs.push_back(
      {.name = "randperm_determinism",
       .ops = {"randperm"},
       .make = [](Gen&) { return KTensors{}; },
       .kiln =
           [](const KArgs& x) {
             Generator a(42), b(42), c(42), d(43);
             c.set_offset(1000);
             KTensors r{randperm(1001, &a, {}, x.device), randperm(1001, &b, {}, x.device),
                        randperm(1001, &c, {}, x.device), randperm(1001, &d, {}, x.device)};
             manual_seed(7);
             r.push_back(randperm(1001, nullptr, {}, x.device));
             manual_seed(7);
             r.push_back(randperm(1001, nullptr, {}, x.device));
             r.push_back(randperm(1001, nullptr, {}, x.device));
             const int64_t offset = static_cast<int64_t>(a.offset());
             r.push_back(to_device(from_vector(std::vector<int64_t>{offset}, {}), x.device));
             return r;
           },
       .check =
           [](const KArgs&, const KTensors& got) {
             ASSERT_EQ(got.size(), 8u);
             auto same = [&](size_t i, size_t j) {
               return at::equal(to_aten(got[i]), to_aten(got[j]));
             };
             EXPECT_TRUE(same(0, 1)) << "same seed and offset";
             EXPECT_FALSE(same(0, 2)) << "another offset";
             EXPECT_FALSE(same(0, 3)) << "another seed";
             EXPECT_TRUE(same(4, 5)) << "manual_seed";
             EXPECT_FALSE(same(5, 6)) << "the default generator advances";
             EXPECT_EQ(to_aten(got[7]).item<int64_t>(), 501) << "blocks drawn";
           }});
  // clang-format off
  head(cs, "randperm").errors = {
      {"randperm_negative", K::Value, "randperm", {"non-negative", "-1"},
       [](const Watch&) { randperm(-1); }},
      {"randperm_bool", K::Type, "randperm", {"bool"},
       [](const Watch&) { randperm(3, nullptr, kBool); }},
      {"randperm_float16_too_large", K::Value, "randperm", {"3000", "float16", "2048"},
       [](const Watch&) { randperm(3000, nullptr, kFloat16); }},
      {"randperm_uint8_too_large", K::Value, "randperm", {"257", "uint8"},
       [](const Watch&) { randperm(257, nullptr, kUInt8); }}};
  // clang-format on
}

// ---------------------------------------------------------------- empty_strided

void add_empty_strided(Cases& cs) {
  struct Row {
    const char* name;
    Dims sizes, strides;
  };
  for (const Row& r : std::vector<Row>{{"empty_strided_contig", {2, 3}, {3, 1}},
                                       {"empty_strided_column_major", {2, 3}, {1, 2}},
                                       {"empty_strided_gaps", {3, 4}, {8, 2}},
                                       {"empty_strided_stride0", {2, 3}, {0, 1}},
                                       {"empty_strided_empty", {0, 5}, {5, 1}},
                                       {"empty_strided_0d", {}, {}},
                                       {"empty_strided_3d", {2, 1, 4}, {1, 7, 2}}}) {
    Dims sizes = r.sizes, strides = r.strides;
    cs.push_back(
        {.name = r.name,
         .ops = {"empty_strided"},
         .dtypes = kAllDTypes,
         .make = [](Gen&) { return KTensors{}; },
         .kiln =
             [sizes, strides](const KArgs& x) {
               Tensor t = empty_strided(sizes, strides, x.dtype, x.device);
               // The geometry: storage elements, the strides, the offset, the dtype and the
               // sizes. Only these come back: the values are uninitialised (read as bool they
               // would be undefined behaviour).
               std::vector<int64_t> geo{
                   static_cast<int64_t>(t.impl()->storage()->nbytes() / itemsize(t.dtype()))};
               for (int64_t s : t.strides()) geo.push_back(s);
               geo.push_back(t.impl()->storage_offset());
               geo.push_back(static_cast<int64_t>(t.dtype()));
               for (int64_t s : t.sizes()) geo.push_back(s);
               return KTensors{to_device(from_vector(geo, {}), x.device)};
             },
         .check =
             [sizes, strides](const KArgs& x, const KTensors& got) {
               at::Tensor want = at::empty_strided(ar(sizes), ar(strides), to_aten(x.dtype));
               std::vector<int64_t> geo{
                   static_cast<int64_t>(want.storage().nbytes() / want.element_size())};
               for (int64_t s : want.strides()) geo.push_back(s);
               geo.push_back(0);
               geo.push_back(static_cast<int64_t>(x.dtype));
               for (int64_t s : want.sizes()) geo.push_back(s);
               at::Tensor g = to_aten(got[0]);
               EXPECT_EQ(
                   std::vector<int64_t>(g.data_ptr<int64_t>(), g.data_ptr<int64_t>() + g.numel()),
                   geo)
                   << "storage elements, strides, offset, dtype, sizes";
             },
         .tol = Tol::ShapeOnly});
  }
  // clang-format off
  head(cs, "empty_strided").errors = {
      {"empty_strided_negative_size", K::Value, "empty_strided", {"negative dimension", "[2, -1]"},
       [](const Watch&) { empty_strided({2, -1}, {1, 1}); }},
      {"empty_strided_negative_stride", K::Value, "empty_strided", {"negative stride", "[-1, 1]"},
       [](const Watch&) { empty_strided({2, 3}, {-1, 1}); }},
      {"empty_strided_length", K::Value, "empty_strided", {"2 sizes", "1 strides"},
       [](const Watch&) { empty_strided({2, 3}, {1}); }},
      {"empty_strided_overflow", K::Value, "empty_strided", {"overflows"},
       [](const Watch&) { empty_strided({3, 3}, {int64_t{1} << 62, 1}); }}};
  // clang-format on
}

// ---------------------------------------------------------------- cdist and pdist

const std::vector<double>& all_p() {
  static const std::vector<double> p = {0, 1, 2, kInf, 0.5, 1.5, 3};
  return p;
}
// The p whose gradients gradcheck can take (0.5's derivative blows up near a zero difference).
bool smooth(double p) { return p != 0.5; }

struct DistConfig {
  const char* label;
  Spec x1, x2;
};

void add_cdist(Cases& cs) {
  const std::vector<DistConfig> configs = {
      {"2d", {{5, 4}}, {{6, 4}}},
      {"batched", {{2, 4, 3}}, {{2, 5, 3}}},
      {"broadcast", {{2, 1, 4, 3}}, {{3, 5, 3}}},
      {"noncontig", {{5, 4}, T}, {{3, 4}, T}},
  };
  for (double p : all_p()) {
    for (const DistConfig& c : configs) {
      const bool grad = smooth(p) && std::string(c.label) != "noncontig";
      cs.push_back({.name = "cdist_forward_" + std::string(c.label) + "_p" + p_label(p),
                    .ops = {"cdist_forward"},
                    .dtypes = kFloatDTypes,
                    .make = make_from({draw_any(), draw_any()}, {c.x1, c.x2}),
                    .kiln = [p](const KArgs& x) { return KTensors{cdist(x[0], x[1], p)}; },
                    .aten =
                        [p](const AArgs& a) {
                          return ATensors{at::_cdist_forward(a[0].contiguous(), a[1].contiguous(),
                                                             p, c10::nullopt)};
                        },
                    .tol = Tol::Accum,
                    .grad = grad});
      cs.push_back({.name = "cdist_backward_" + std::string(c.label) + "_p" + p_label(p),
                    .ops = {"cdist_backward", "cdist_forward"},
                    .dtypes = {kFloat32, kFloat64},
                    .make =
                        [c](Gen& g) {
                          Tensor x1 = g.any(c.x1), x2 = g.any(c.x2);
                          Tensor d = cdist(x1, x2);
                          return KTensors{g.any({vec(d.sizes())}), x1, x2};
                        },
                    .kiln =
                        [p](const KArgs& x) {
                          Tensor d = cdist(x[1], x[2], p);
                          return KTensors{ops::op_cdist_backward(x[0], x[1], x[2], p, d)};
                        },
                    .aten =
                        [p](const AArgs& a) {
                          at::Tensor x1 = a[1].contiguous(), x2 = a[2].contiguous();
                          at::Tensor d = at::_cdist_forward(x1, x2, p, c10::nullopt);
                          return ATensors{at::_cdist_backward(a[0].contiguous(), x1, x2, p, d)};
                        },
                    .tol = Tol::Accum});
    }
  }
  // p = 2 with more than 25 rows: ATen's default takes the matrix-product form; Kiln sums the
  // differences directly (Note [cdist and pdist]), within the product form's rounding.
  for (auto [label, mode] : std::vector<std::pair<const char*, c10::optional<int64_t>>>{
           {"default", c10::nullopt}, {"mm", 1}, {"direct", 2}}) {
    c10::optional<int64_t> m = mode;
    cs.push_back(
        {.name = "cdist_forward_many_rows_" + std::string(label),
         .ops = {"cdist_forward"},
         .dtypes = {kFloat32, kFloat64},
         .make = make_from({draw_any(), draw_any()}, {Spec{{40, 6}}, Spec{{30, 6}}}),
         .kiln =
             [m](const KArgs& x) {
               std::optional<int64_t> km;
               if (m) km = *m;
               return KTensors{cdist(x[0], x[1], 2, km)};
             },
         .aten = [m](const AArgs& a) { return ATensors{at::_cdist_forward(a[0], a[1], 2, m)}; },
         .tol = Tol::Intermediate16});
  }
  cs.push_back(
      {.name = "cdist_forward_empty",
       .ops = {"cdist_forward"},
       .dtypes = {kFloat32},
       .make = make_from({draw_any(), draw_any()}, {Spec{{0, 3}}, Spec{{4, 3}}}),
       .kiln = [](const KArgs& x) { return KTensors{cdist(x[0], x[1], 2)}; },
       .aten =
           [](const AArgs& a) { return ATensors{at::_cdist_forward(a[0], a[1], 2, c10::nullopt)}; },
       .tol = Tol::Accum});
  cs.push_back(
      {.name = "cdist_forward_ties_p0",
       .ops = {"cdist_forward"},
       .dtypes = kFloatDTypes,
       .make = make_from({draw_uniform(-2, 2), draw_uniform(-2, 2)}, {Spec{{6, 5}}, Spec{{7, 5}}}),
       .kiln =
           [](const KArgs& x) {
             // Rounded to integers, so differences are often exactly zero.
             return KTensors{cdist(round(x[0]), round(x[1]), 0)};
           },
       .aten =
           [](const AArgs& a) {
             return ATensors{at::_cdist_forward(a[0].round(), a[1].round(), 0, c10::nullopt)};
           },
       .tol = Tol::Exact});
  // clang-format off
  head(cs, "cdist_forward").errors = {
      {"cdist_1d", K::Value, "cdist_forward", {"at least 2 dimensions", "[4]"},
       [](const Watch&) { cdist(f32({4}), f32({3, 4})); }},
      {"cdist_columns", K::Value, "cdist_forward", {"same number of columns", "3", "4"},
       [](const Watch&) { cdist(f32({2, 3}), f32({3, 4})); }},
      {"cdist_int", K::Type, "cdist_forward", {"floating-point", "int64"},
       [](const Watch&) { cdist(i64({2, 3}), i64({3, 3})); }},
      {"cdist_dtypes", K::Type, "cdist_forward", {"same dtype", "float32", "float64"},
       [](const Watch&) { cdist(f32({2, 3}), ones({3, 3}, kFloat64)); }},
      {"cdist_negative_p", K::Value, "cdist_forward", {"non-negative p", "-1"},
       [](const Watch&) { cdist(f32({2, 3}), f32({3, 3}), -1); }},
      {"cdist_mode", K::Value, "cdist_forward", {"possible modes", "3"},
       [](const Watch&) { cdist(f32({2, 3}), f32({3, 3}), 2, 3); }},
      {"cdist_batch", K::Value, "cdist_forward", {"[2]", "[3]"},
       [](const Watch&) { cdist(f32({2, 2, 3}), f32({3, 3, 3})); }}};
  head(cs, "cdist_backward").errors = {
      {"cdist_backward_grad_shape", K::Value, "cdist_backward", {"grad", "[2, 3]", "[3, 2]"},
       [](const Watch&) {
         ops::op_cdist_backward(f32({3, 2}), f32({2, 4}), f32({3, 4}), 2, f32({2, 3}));
       }},
      {"cdist_backward_cdist_dtype", K::Type, "cdist_backward", {"cdist", "float32", "float64"},
       [](const Watch&) {
         ops::op_cdist_backward(f32({2, 3}), f32({2, 4}), f32({3, 4}), 2, ones({2, 3}, kFloat64));
       }}};
  // clang-format on
}

void add_pdist(Cases& cs) {
  const std::vector<std::pair<const char*, Spec>> configs = {
      {"7x5", Spec{{7, 5}}}, {"noncontig", Spec{{6, 4}, T}}, {"one_row", Spec{{1, 3}}}};
  for (double p : all_p()) {
    for (const auto& [label, spec] : configs) {
      Spec s = spec;
      const bool grad = smooth(p) && std::string(label) == "7x5";
      cs.push_back(
          {.name = "pdist_forward_" + std::string(label) + "_p" + p_label(p),
           .ops = {"pdist_forward"},
           .dtypes = kFloatDTypes,
           .make = make_from({draw_any()}, {s}),
           .kiln = [p](const KArgs& x) { return KTensors{pdist(x[0], p)}; },
           .aten =
               [p](const AArgs& a) { return ATensors{at::_pdist_forward(a[0].contiguous(), p)}; },
           .tol = Tol::Accum,
           .grad = grad});
      cs.push_back({.name = "pdist_backward_" + std::string(label) + "_p" + p_label(p),
                    .ops = {"pdist_backward", "pdist_forward"},
                    .dtypes = {kFloat32, kFloat64},
                    .make =
                        [s](Gen& g) {
                          Tensor x = g.any(s);
                          return KTensors{g.any({vec(pdist(x).sizes())}), x};
                        },
                    .kiln =
                        [p](const KArgs& x) {
                          return KTensors{ops::op_pdist_backward(x[0], x[1], p, pdist(x[1], p))};
                        },
                    .aten =
                        [p](const AArgs& a) {
                          at::Tensor x = a[1].contiguous();
                          return ATensors{at::_pdist_backward(a[0].contiguous(), x, p,
                                                              at::_pdist_forward(x, p))};
                        },
                    .tol = Tol::Accum});
    }
  }
  // clang-format off
  head(cs, "pdist_forward").errors = {
      {"pdist_3d", K::Value, "pdist_forward", {"2-D", "3-D", "[2, 3, 4]"},
       [](const Watch&) { pdist(f32({2, 3, 4})); }},
      {"pdist_int", K::Type, "pdist_forward", {"floating-point", "int64"},
       [](const Watch&) { pdist(i64({3, 4})); }},
      {"pdist_negative_p", K::Value, "pdist_forward", {"non-negative p", "-0.5"},
       [](const Watch&) { pdist(f32({3, 4}), -0.5); }}};
  head(cs, "pdist_backward").errors = {
      {"pdist_backward_grad_shape", K::Value, "pdist_backward", {"grad", "[3]", "[4]"},
       [](const Watch&) { ops::op_pdist_backward(f32({4}), f32({3, 4}), 2, f32({3})); }}};
  // clang-format on
}

// ---------------------------------------------------------------- im2col and col2im

struct FoldConfig {
  const char* label;
  Dims image;  // [N, C, H, W] or [C, H, W]
  Dims k, d, p, s;
  Layout layout = C;
};

// The columns' shape of im2col(image) under a config.
Dims cols_shape(const FoldConfig& c) {
  auto blocks = [&](size_t i) {
    const int64_t in = c.image[c.image.size() - 2 + i];
    return (in + 2 * c.p[i] - c.d[i] * (c.k[i] - 1) - 1) / c.s[i] + 1;
  };
  Dims out;
  if (c.image.size() == 4) out.push_back(c.image[0]);
  out.push_back(c.image[c.image.size() - 3] * c.k[0] * c.k[1]);
  out.push_back(blocks(0) * blocks(1));
  return out;
}

void add_fold(Cases& cs) {
  const std::vector<FoldConfig> configs = {
      {"basic", {2, 3, 5, 6}, {2, 3}, {1, 1}, {0, 0}, {1, 1}},
      {"all_args", {2, 2, 7, 8}, {3, 2}, {2, 1}, {1, 2}, {2, 3}},
      {"overlap", {1, 2, 6, 6}, {3, 3}, {1, 1}, {1, 1}, {2, 2}},
      {"gaps", {1, 1, 7, 7}, {2, 2}, {1, 1}, {0, 0}, {3, 3}},
      {"unbatched", {3, 5, 5}, {2, 2}, {1, 1}, {0, 0}, {1, 1}},
      {"kernel_1x1", {2, 2, 3, 4}, {1, 1}, {1, 1}, {0, 0}, {1, 1}},
      {"empty_batch", {0, 2, 4, 4}, {2, 2}, {1, 1}, {0, 0}, {1, 1}},
      {"noncontig", {2, 3, 5, 6}, {2, 3}, {1, 2}, {1, 0}, {1, 2}, T},
  };
  for (const FoldConfig& c : configs) {
    const bool grad = std::string(c.label) != "empty_batch" && std::string(c.label) != "noncontig";
    Dims k = c.k, d = c.d, p = c.p, s = c.s;
    Dims hw{c.image[c.image.size() - 2], c.image[c.image.size() - 1]};
    cs.push_back(
        {.name = "im2col_" + std::string(c.label),
         .ops = {"im2col"},
         .dtypes = kFloatDTypes,
         .make = make_from({draw_any()}, {Spec{c.image, c.layout}}),
         .kiln = [=](const KArgs& x) { return KTensors{ops::op_im2col(x[0], k, d, p, s)}; },
         .aten =
             [=](const AArgs& a) { return ATensors{at::im2col(a[0], ar(k), ar(d), ar(p), ar(s))}; },
         .tol = Tol::Exact,
         .grad = grad});
    cs.push_back(
        {.name = "col2im_" + std::string(c.label),
         .ops = {"col2im"},
         .dtypes = kFloatDTypes,
         .make = make_from({draw_any()}, {Spec{cols_shape(c), c.layout}}),
         .kiln = [=](const KArgs& x) { return KTensors{ops::op_col2im(x[0], hw, k, d, p, s)}; },
         .aten =
             [=](const AArgs& a) {
               return ATensors{at::col2im(a[0], ar(hw), ar(k), ar(d), ar(p), ar(s))};
             },
         .tol = Tol::Accum,
         .grad = grad});
  }
  // The public unfold and fold (torch.nn.functional's), one value for both dims.
  cs.push_back({.name = "unfold_scalar_sizes",
                .ops = {"im2col"},
                .dtypes = {kFloat32, kFloat64},
                .make = make_from({draw_any()}, {Spec{{2, 3, 6, 7}}}),
                .kiln = [](const KArgs& x) { return KTensors{unfold(x[0], {3}, {1}, {1}, {2})}; },
                .aten =
                    [](const AArgs& a) {
                      return ATensors{at::im2col(a[0], {3, 3}, {1, 1}, {1, 1}, {2, 2})};
                    },
                .tol = Tol::Exact});
  cs.push_back({.name = "fold_scalar_sizes",
                .ops = {"col2im"},
                .dtypes = {kFloat32, kFloat64},
                .make = make_from({draw_any()}, {Spec{{2, 12, 6}}}),
                .kiln =
                    [](const KArgs& x) {
                      return KTensors{fold(x[0], {4, 5}, {2}, {1}, {0}, {1, 2})};
                    },
                .aten =
                    [](const AArgs& a) {
                      return ATensors{at::col2im(a[0], {4, 5}, {2, 2}, {1, 1}, {0, 0}, {1, 2})};
                    },
                .tol = Tol::Accum});
  // fold(unfold(x)) multiplies each pixel by the number of blocks covering it.
  cs.push_back(
      {.name = "fold_of_unfold",
       .ops = {"im2col", "col2im"},
       .dtypes = {kFloat32, kFloat64},
       .make = make_from({draw_any()}, {Spec{{2, 2, 5, 5}}}),
       .kiln =
           [](const KArgs& x) {
             return KTensors{fold(unfold(x[0], {3}, {1}, {1}, {1}), {5, 5}, {3}, {1}, {1}, {1})};
           },
       .aten =
           [](const AArgs& a) {
             at::Tensor cols = at::im2col(a[0], {3, 3}, {1, 1}, {1, 1}, {1, 1});
             return ATensors{at::col2im(cols, {5, 5}, {3, 3}, {1, 1}, {1, 1}, {1, 1})};
           },
       .tol = Tol::Accum,
       .grad = true});
  // clang-format off
  head(cs, "im2col").errors = {
      {"im2col_kernel_length", K::Value, "im2col", {"kernel_size", "2 elements", "[2, 2, 2]"},
       [](const Watch&) { ops::op_im2col(f32({1, 1, 4, 4}), {2, 2, 2}, {1, 1}, {0, 0}, {1, 1}); }},
      {"im2col_kernel_zero", K::Value, "im2col", {"kernel size", "greater than zero", "[0, 2]"},
       [](const Watch&) { ops::op_im2col(f32({1, 1, 4, 4}), {0, 2}, {1, 1}, {0, 0}, {1, 1}); }},
      {"im2col_dilation_zero", K::Value, "im2col", {"dilation", "[1, 0]"},
       [](const Watch&) { ops::op_im2col(f32({1, 1, 4, 4}), {2, 2}, {1, 0}, {0, 0}, {1, 1}); }},
      {"im2col_padding_negative", K::Value, "im2col", {"padding", "non-negative", "[-1, 0]"},
       [](const Watch&) { ops::op_im2col(f32({1, 1, 4, 4}), {2, 2}, {1, 1}, {-1, 0}, {1, 1}); }},
      {"im2col_stride_zero", K::Value, "im2col", {"stride", "[0, 1]"},
       [](const Watch&) { ops::op_im2col(f32({1, 1, 4, 4}), {2, 2}, {1, 1}, {0, 0}, {0, 1}); }},
      {"im2col_2d", K::Value, "im2col", {"3-D or 4-D", "[4, 4]"},
       [](const Watch&) { ops::op_im2col(f32({4, 4}), {2, 2}, {1, 1}, {0, 0}, {1, 1}); }},
      {"im2col_empty_channels", K::Value, "im2col", {"non-zero", "[2, 0, 4, 4]"},
       [](const Watch&) { ops::op_im2col(f32({2, 0, 4, 4}), {2, 2}, {1, 1}, {0, 0}, {1, 1}); }},
      {"im2col_int", K::Type, "im2col", {"floating-point", "int64"},
       [](const Watch&) { ops::op_im2col(i64({1, 1, 4, 4}), {2, 2}, {1, 1}, {0, 0}, {1, 1}); }},
      {"im2col_too_small", K::Value, "im2col", {"(3, 4)", "kernel_size=[4, 2]", "(0, 3)"},
       [](const Watch&) { ops::op_im2col(f32({1, 1, 3, 4}), {4, 2}, {1, 1}, {0, 0}, {1, 1}); }},
      {"unfold_length", K::Value, "im2col", {"stride", "[1, 1, 1]"},
       [](const Watch&) { unfold(f32({1, 1, 4, 4}), {2}, {1}, {0}, {1, 1, 1}); }}};
  head(cs, "col2im").errors = {
      {"col2im_output_size_length", K::Value, "col2im", {"output_size", "2 elements", "[4]"},
       [](const Watch&) { ops::op_col2im(f32({1, 4, 9}), {4}, {2, 2}, {1, 1}, {0, 0}, {1, 1}); }},
      {"col2im_output_size_zero", K::Value, "col2im", {"output_size", "positive", "[0, 4]"},
       [](const Watch&) { ops::op_col2im(f32({1, 4, 9}), {0, 4}, {2, 2}, {1, 1}, {0, 0}, {1, 1}); }},
      {"col2im_kernel_zero", K::Value, "col2im", {"kernel size", "[2, 0]"},
       [](const Watch&) { ops::op_col2im(f32({1, 4, 9}), {4, 4}, {2, 0}, {1, 1}, {0, 0}, {1, 1}); }},
      {"col2im_4d", K::Value, "col2im", {"2-D or 3-D", "[1, 1, 4, 9]"},
       [](const Watch&) { ops::op_col2im(f32({1, 1, 4, 9}), {4, 4}, {2, 2}, {1, 1}, {0, 0}, {1, 1}); }},
      {"col2im_int", K::Type, "col2im", {"floating-point", "int64"},
       [](const Watch&) { ops::op_col2im(i64({1, 4, 9}), {4, 4}, {2, 2}, {1, 1}, {0, 0}, {1, 1}); }},
      {"col2im_divisible", K::Value, "col2im", {"divisible", "6", "kernel_size=[2, 2]"},
       [](const Watch&) { ops::op_col2im(f32({1, 6, 9}), {4, 4}, {2, 2}, {1, 1}, {0, 0}, {1, 1}); }},
      {"col2im_blocks", K::Value, "col2im", {"3 * 3 = 9", "got 8"},
       [](const Watch&) { ops::op_col2im(f32({1, 4, 8}), {4, 4}, {2, 2}, {1, 1}, {0, 0}, {1, 1}); }},
      {"col2im_too_small", K::Value, "col2im", {"(2, 4)", "kernel_size=[3, 3]"},
       [](const Watch&) { ops::op_col2im(f32({1, 9, 2}), {2, 4}, {3, 3}, {1, 1}, {0, 0}, {1, 1}); }}};
  // clang-format on
}

// ---------------------------------------------------------------- grid_sampler_2d

const char* interp_name(int64_t m) {
  static const char* names[] = {"bilinear", "nearest", "bicubic"};
  return names[m];
}
const char* pad_name(int64_t m) {
  static const char* names[] = {"zeros", "border", "reflection"};
  return names[m];
}

void add_grid_sampler(Cases& cs) {
  // Grid points reach past [-1, 1] so every padding mode shows (reflection flips more than once).
  const Draw grid_draw = draw_uniform(-2.5, 2.5);
  for (int64_t interp = 0; interp < 3; ++interp)
    for (int64_t pad = 0; pad < 3; ++pad)
      for (bool align : {false, true}) {
        const std::string tag =
            std::string(interp_name(interp)) + "_" + pad_name(pad) + (align ? "_align" : "");
        cs.push_back(
            {.name = "grid_sampler_2d_" + tag,
             .ops = {"grid_sampler_2d"},
             .dtypes = kFloatDTypes,
             .make = make_from({draw_any(), grid_draw}, {Spec{{2, 3, 5, 6}}, Spec{{2, 4, 7, 2}}}),
             .kiln =
                 [=](const KArgs& x) {
                   return KTensors{ops::op_grid_sampler_2d(x[0], x[1], interp, pad, align)};
                 },
             .aten =
                 [=](const AArgs& a) {
                   return ATensors{at::grid_sampler_2d(a[0], a[1], interp, pad, align)};
                 },
             .tol = Tol::Accum,
             .grad = true});
        cs.push_back(
            {.name = "grid_sampler_2d_backward_" + tag,
             .ops = {"grid_sampler_2d_backward"},
             .dtypes = {kFloat32, kFloat64},
             .make = make_from({draw_any(), draw_any(), grid_draw},
                               {Spec{{2, 3, 4, 7}}, Spec{{2, 3, 5, 6}}, Spec{{2, 4, 7, 2}}}),
             .kiln =
                 [=](const KArgs& x) {
                   auto [gi, gg] = ops::op_grid_sampler_2d_backward(x[0], x[1], x[2], interp, pad,
                                                                    align, {1, 1});
                   return KTensors{gi, gg};
                 },
             .aten =
                 [=](const AArgs& a) {
                   auto [gi, gg] = at::grid_sampler_2d_backward(a[0], a[1], a[2], interp, pad,
                                                                align, {true, true});
                   return ATensors{gi, gg};
                 },
             .tol = Tol::Accum});
      }
  // Non-contiguous operands, a larger output than input, an empty batch, an output_mask of one.
  cs.push_back(
      {.name = "grid_sampler_2d_noncontig",
       .ops = {"grid_sampler_2d"},
       .dtypes = kFloatDTypes,
       .make = make_from({draw_any(), draw_uniform(-1.2, 1.2)},
                         {Spec{{2, 3, 5, 6}, T}, Spec{{2, 9, 2, 2}, T}}),
       .kiln = [](const KArgs& x) { return KTensors{grid_sample(x[0], x[1])}; },
       .aten =
           [](const AArgs& a) { return ATensors{at::grid_sampler_2d(a[0], a[1], 0, 0, false)}; },
       .tol = Tol::Accum});
  cs.push_back(
      {.name = "grid_sampler_2d_empty_batch",
       .ops = {"grid_sampler_2d"},
       .dtypes = {kFloat32},
       .make = make_from({draw_any(), draw_any()}, {Spec{{0, 3, 5, 6}}, Spec{{0, 4, 7, 2}}}),
       .kiln = [](const KArgs& x) { return KTensors{grid_sample(x[0], x[1], "bicubic")}; },
       .aten =
           [](const AArgs& a) { return ATensors{at::grid_sampler_2d(a[0], a[1], 2, 0, false)}; },
       .tol = Tol::Accum});
  for (auto [mode, interp] : std::vector<std::pair<const char*, int64_t>>{
           {"bilinear", 0}, {"nearest", 1}, {"bicubic", 2}}) {
    const std::string m = mode;
    const int64_t i = interp;
    cs.push_back(
        {.name = "grid_sample_" + m + "_reflection_align",
         .ops = {"grid_sampler_2d"},
         .dtypes = {kFloat32, kFloat64},
         .make = make_from({draw_any(), draw_uniform(-1.5, 1.5)},
                           {Spec{{1, 2, 8, 9}}, Spec{{1, 12, 10, 2}}}),
         .kiln =
             [m](const KArgs& x) {
               return KTensors{grid_sample(x[0], x[1], m, "reflection", true)};
             },
         .aten =
             [i](const AArgs& a) { return ATensors{at::grid_sampler_2d(a[0], a[1], i, 2, true)}; },
         .tol = Tol::Accum});
  }
  for (auto [label, mask] : std::vector<std::pair<const char*, std::array<bool, 2>>>{
           {"input_only", {true, false}}, {"grid_only", {false, true}}}) {
    const std::array<bool, 2> mk = mask;
    cs.push_back({.name = "grid_sampler_2d_backward_" + std::string(label),
                  .ops = {"grid_sampler_2d_backward"},
                  .dtypes = {kFloat32, kFloat64},
                  .make = make_from({draw_any(), draw_any(), draw_uniform(-1.2, 1.2)},
                                    {Spec{{2, 3, 4, 7}}, Spec{{2, 3, 5, 6}}, Spec{{2, 4, 7, 2}}}),
                  .kiln =
                      [mk](const KArgs& x) {
                        auto [gi, gg] = ops::op_grid_sampler_2d_backward(
                            x[0], x[1], x[2], 0, 1, false, {mk[0] ? 1 : 0, mk[1] ? 1 : 0});
                        EXPECT_EQ(gi.defined(), mk[0]);
                        EXPECT_EQ(gg.defined(), mk[1]);
                        return KTensors{mk[0] ? gi : gg};
                      },
                  .aten =
                      [mk](const AArgs& a) {
                        auto [gi, gg] =
                            at::grid_sampler_2d_backward(a[0], a[1], a[2], 0, 1, false, mk);
                        return ATensors{mk[0] ? gi : gg};
                      },
                  .tol = Tol::Accum});
  }
  // clang-format off
  head(cs, "grid_sampler_2d").errors = {
      {"grid_sampler_3d_input", K::Value, "grid_sampler_2d", {"4-D", "[3, 5, 5]", "[1, 4, 4, 2]"},
       [](const Watch&) { grid_sample(f32({3, 5, 5}), f32({1, 4, 4, 2})); }},
      {"grid_sampler_batch", K::Value, "grid_sampler_2d", {"same batch size", "[2, 1, 4, 4]", "[3, 2, 2, 2]"},
       [](const Watch&) { grid_sample(f32({2, 1, 4, 4}), f32({3, 2, 2, 2})); }},
      {"grid_sampler_last_dim", K::Value, "grid_sampler_2d", {"size 2", "[1, 2, 2, 3]"},
       [](const Watch&) { grid_sample(f32({1, 1, 4, 4}), f32({1, 2, 2, 3})); }},
      {"grid_sampler_empty_spatial", K::Value, "grid_sampler_2d", {"non-empty", "[1, 1, 0, 4]"},
       [](const Watch&) { grid_sample(f32({1, 1, 0, 4}), f32({1, 2, 2, 2})); }},
      {"grid_sampler_int", K::Type, "grid_sampler_2d", {"floating-point", "int64"},
       [](const Watch&) { grid_sample(i64({1, 1, 4, 4}), i64({1, 2, 2, 2})); }},
      {"grid_sampler_dtypes", K::Type, "grid_sampler_2d", {"same dtype", "float32", "float64"},
       [](const Watch&) { grid_sample(f32({1, 1, 4, 4}), ones({1, 2, 2, 2}, kFloat64)); }},
      {"grid_sampler_interp", K::Value, "grid_sampler_2d", {"interpolation_mode", "3"},
       [](const Watch&) { ops::op_grid_sampler_2d(f32({1, 1, 4, 4}), f32({1, 2, 2, 2}), 3, 0, false); }},
      {"grid_sampler_padding", K::Value, "grid_sampler_2d", {"padding_mode", "-1"},
       [](const Watch&) { ops::op_grid_sampler_2d(f32({1, 1, 4, 4}), f32({1, 2, 2, 2}), 0, -1, false); }},
      {"grid_sample_mode", K::Value, "grid_sample", {"mode", "'area'"},
       [](const Watch&) { grid_sample(f32({1, 1, 4, 4}), f32({1, 2, 2, 2}), "area"); }},
      {"grid_sample_padding_mode", K::Value, "grid_sample", {"padding_mode", "'circular'"},
       [](const Watch&) { grid_sample(f32({1, 1, 4, 4}), f32({1, 2, 2, 2}), "bilinear", "circular"); }}};
  head(cs, "grid_sampler_2d_backward").errors = {
      {"grid_sampler_backward_grad_shape", K::Value, "grid_sampler_2d_backward", {"grad_output", "[1, 1, 2, 2]", "[1, 1, 2, 3]"},
       [](const Watch&) {
         ops::op_grid_sampler_2d_backward(f32({1, 1, 2, 3}), f32({1, 1, 4, 4}), f32({1, 2, 2, 2}), 0, 0, false, {1, 1});
       }},
      {"grid_sampler_backward_mask", K::Value, "grid_sampler_2d_backward", {"output_mask", "[1, 1, 1]"},
       [](const Watch&) {
         ops::op_grid_sampler_2d_backward(f32({1, 1, 2, 2}), f32({1, 1, 4, 4}), f32({1, 2, 2, 2}), 0, 0, false, {1, 1, 1});
       }}};
  // clang-format on
}

}  // namespace

// embedding's padding_idx and scale_grad_by_freq, embedding_dense_backward, scatter_reduce and
// embedding_bag (op_test_embedding_bag.cpp).
void add_embedding_scatter_reduce(Cases& cs);

Cases misc_core_cases() {
  Cases cs;
  add_randperm(cs);
  add_empty_strided(cs);
  add_cdist(cs);
  add_pdist(cs);
  add_fold(cs);
  add_grid_sampler(cs);
  add_embedding_scatter_reduce(cs);
  return cs;
}

}  // namespace kiln::test

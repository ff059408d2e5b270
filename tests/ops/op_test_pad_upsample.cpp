// Op table: the padding and upsampling ops (constant_pad_nd, reflection_pad1d/2d/3d,
// replication_pad1d/2d/3d, upsample_nearest2d, upsample_bilinear2d) and their backward ops,
// against ATen's (at::constant_pad_nd, at::reflection_pad2d, at::upsample_bilinear2d, ...):
// positive, negative (cropping) and large pads, batched and unbatched, non-contiguous inputs,
// up- and downsampling with and without scales and align_corners, the .vec overloads, and the
// composites pad (every mode, against at::pad) and interpolate; gradchecks in float64; error
// rows. Pads copy elements: Tol::Exact; the backward ops and bilinear sums: Tol::Accum.
#include "tests/ops/op_test_util.h"

namespace kiln::test {
namespace {

constexpr auto C = Layout::Contig;
constexpr auto T = Layout::Transposed;

at::IntArrayRef ar(const Dims& d) { return at::IntArrayRef(d.data(), d.size()); }
c10::optional<double> aopt(std::optional<double> v) {
  return v ? c10::optional<double>(*v) : c10::nullopt;
}

// A grad_output of y's shape.
Tensor grad_like(Gen& g, const Tensor& y) {
  return g.any({Dims(y.sizes().begin(), y.sizes().end())});
}

// ---------------------------------------------------------------- reflection / replication

struct PadConfig {
  const char* label;
  bool reflect;
  int64_t nd;
  Dims x;    // [N, C, *spatial] or [C, *spatial]
  Dims pad;  // 2 nd values, from the last dim
  Layout layout = C;
};

const std::vector<PadConfig>& pad_configs() {
  static const std::vector<PadConfig> c = {
      {"reflect1d", true, 1, {2, 3, 8}, {2, 3}},
      {"reflect1d_unbatched", true, 1, {3, 7}, {3, 1}},
      {"reflect1d_crop", true, 1, {2, 3, 8}, {-2, 3}},
      {"reflect2d", true, 2, {2, 3, 6, 7}, {1, 2, 3, 0}},
      {"reflect2d_unbatched", true, 2, {3, 5, 6}, {2, 2, 1, 4}},
      {"reflect2d_noncontig", true, 2, {2, 3, 6, 7}, {2, 1, 1, 2}, T},
      {"reflect2d_crop", true, 2, {1, 2, 6, 6}, {-1, 2, 2, -2}},
      {"reflect3d", true, 3, {1, 2, 4, 5, 6}, {1, 2, 0, 3, 2, 1}},
      {"reflect3d_unbatched", true, 3, {2, 4, 4, 5}, {1, 1, 2, 2, 3, 0}},
      {"replicate1d", false, 1, {2, 3, 5}, {4, 7}},
      {"replicate1d_unbatched", false, 1, {3, 1}, {2, 3}},
      {"replicate2d", false, 2, {2, 3, 4, 5}, {6, 1, 0, 7}},
      {"replicate2d_unbatched", false, 2, {3, 5, 6}, {2, 2, 1, 1}},
      {"replicate2d_noncontig", false, 2, {2, 3, 6, 7}, {3, 1, 1, 2}, T},
      {"replicate2d_crop", false, 2, {1, 2, 6, 6}, {-2, 3, 1, -3}},
      {"replicate3d", false, 3, {1, 2, 3, 4, 5}, {1, 2, 3, 0, 2, 4}},
      {"replicate3d_unbatched", false, 3, {2, 4, 4, 5}, {1, 1, 2, 2, 3, 0}},
  };
  return c;
}

std::string pad_op(const PadConfig& c, bool backward) {
  std::string n =
      std::string(c.reflect ? "reflection" : "replication") + "_pad" + std::to_string(c.nd) + "d";
  return backward ? n + "_backward" : n;
}

Tensor kpad(const PadConfig& c, const Tensor& x) {
  switch (c.nd) {
    case 1:
      return c.reflect ? reflection_pad1d(x, c.pad) : replication_pad1d(x, c.pad);
    case 2:
      return c.reflect ? reflection_pad2d(x, c.pad) : replication_pad2d(x, c.pad);
    default:
      return c.reflect ? reflection_pad3d(x, c.pad) : replication_pad3d(x, c.pad);
  }
}
at::Tensor apad(const PadConfig& c, const at::Tensor& x) {
  switch (c.nd) {
    case 1:
      return c.reflect ? at::reflection_pad1d(x, ar(c.pad)) : at::replication_pad1d(x, ar(c.pad));
    case 2:
      return c.reflect ? at::reflection_pad2d(x, ar(c.pad)) : at::replication_pad2d(x, ar(c.pad));
    default:
      return c.reflect ? at::reflection_pad3d(x, ar(c.pad)) : at::replication_pad3d(x, ar(c.pad));
  }
}
Tensor kpad_backward(const PadConfig& c, const Tensor& gy, const Tensor& x) {
  switch (c.nd) {
    case 1:
      return c.reflect ? reflection_pad1d_backward(gy, x, c.pad)
                       : replication_pad1d_backward(gy, x, c.pad);
    case 2:
      return c.reflect ? reflection_pad2d_backward(gy, x, c.pad)
                       : replication_pad2d_backward(gy, x, c.pad);
    default:
      return c.reflect ? reflection_pad3d_backward(gy, x, c.pad)
                       : replication_pad3d_backward(gy, x, c.pad);
  }
}
at::Tensor apad_backward(const PadConfig& c, const at::Tensor& gy, const at::Tensor& x) {
  switch (c.nd) {
    case 1:
      return c.reflect ? at::reflection_pad1d_backward(gy, x, ar(c.pad))
                       : at::replication_pad1d_backward(gy, x, ar(c.pad));
    case 2:
      return c.reflect ? at::reflection_pad2d_backward(gy, x, ar(c.pad))
                       : at::replication_pad2d_backward(gy, x, ar(c.pad));
    default:
      return c.reflect ? at::reflection_pad3d_backward(gy, x, ar(c.pad))
                       : at::replication_pad3d_backward(gy, x, ar(c.pad));
  }
}

void add_pads(Cases& cs, GradSamples& grads) {
  for (const PadConfig& c : pad_configs()) {
    PadConfig fc = c;
    cs.push_back({.name = std::string("pad_") + c.label,
                  .ops = {pad_op(c, false)},
                  .dtypes = kFloatDTypes,
                  .make =
                      [fc](Gen& g) {
                        return KTensors{g.any({fc.x, fc.layout})};
                      },
                  .kiln = [fc](const KArgs& x) { return KTensors{kpad(fc, x[0])}; },
                  .aten = [fc](const AArgs& a) { return ATensors{apad(fc, a[0])}; },
                  .tol = Tol::Exact});
    cs.push_back({.name = std::string("pad_backward_") + c.label,
                  .ops = {pad_op(c, true)},
                  .dtypes = kFloatDTypes,
                  .make =
                      [fc](Gen& g) {
                        Tensor x = g.any({fc.x, fc.layout});
                        return KTensors{grad_like(g, kpad(fc, x)), x};
                      },
                  .kiln = [fc](const KArgs& x) { return KTensors{kpad_backward(fc, x[0], x[1])}; },
                  .aten = [fc](const AArgs& a) { return ATensors{apad_backward(fc, a[0], a[1])}; },
                  .tol = Tol::Accum});
    if (c.layout == C)
      grads.push_back({std::string("pad_") + c.label,
                       {pad_op(c, false)},
                       [fc](GradGen& d) { return KTensors{d.var(fc.x)}; },
                       [fc](const KTensors& x) { return KTensors{kpad(fc, x[0])}; }});
  }
}

// ---------------------------------------------------------------- constant_pad_nd and pad

struct ConstantConfig {
  const char* label;
  Dims x, pad;
  double value;
  std::vector<DType> dtypes;
  Layout layout = C;
};

void add_constant(Cases& cs, GradSamples& grads) {
  const std::vector<ConstantConfig> configs = {
      {"last_dim", {2, 3, 4, 5}, {1, 2}, 0, kAllDTypes},
      {"three_dims", {2, 3, 4, 5}, {1, 2, 0, 3, 1, 1}, 2, kAllDTypes},
      {"every_dim", {3, 4}, {2, 1, 1, 3}, 1, kAllDTypes},
      {"crop", {2, 6, 7}, {-1, 2, 1, -2, -1, 0}, -1.5, kFloatDTypes},
      {"crop_to_empty", {2, 3, 4}, {-2, -2}, 3, kFloatDTypes},
      {"noncontig", {2, 3, 6, 7}, {2, 1, 1, 2}, 0.5, kFloatDTypes, T},
      {"no_pad", {2, 3}, {}, 0, kFloatDTypes},
  };
  for (const ConstantConfig& c : configs) {
    ConstantConfig fc = c;
    cs.push_back(
        {.name = std::string("constant_pad_nd_") + c.label,
         .ops = {"constant_pad_nd"},
         .dtypes = c.dtypes,
         .make =
             [fc](Gen& g) {
               return KTensors{g.any({fc.x, fc.layout})};
             },
         .kiln = [fc](const KArgs& x) { return KTensors{constant_pad_nd(x[0], fc.pad, fc.value)}; },
         .aten =
             [fc](const AArgs& a) {
               return ATensors{at::constant_pad_nd(a[0], ar(fc.pad), fc.value)};
             },
         .tol = Tol::Exact});
    if (c.layout == C)
      grads.push_back(
          {std::string("constant_pad_nd_") + c.label,
           {"constant_pad_nd"},
           [fc](GradGen& d) { return KTensors{d.var(fc.x)}; },
           [fc](const KTensors& x) { return KTensors{constant_pad_nd(x[0], fc.pad, fc.value)}; }});
  }
  // torch.nn.functional.pad in each mode, against at::pad.
  struct PadCall {
    const char* label;
    const char* op;
    Dims x, pad;
    const char* mode;
    std::optional<double> value;
  };
  const std::vector<PadCall> calls = {
      {"constant", "constant_pad_nd", {2, 3, 4}, {1, 2, 3, 0}, "constant", 1.25},
      {"constant_default", "constant_pad_nd", {2, 3, 4}, {1, 2}, "constant", std::nullopt},
      {"reflect", "reflection_pad2d", {2, 3, 5, 6}, {1, 2, 3, 0}, "reflect", std::nullopt},
      {"reflect_1d", "reflection_pad1d", {3, 6}, {2, 1}, "reflect", std::nullopt},
      {"replicate_3d",
       "replication_pad3d",
       {1, 2, 3, 4, 5},
       {1, 2, 0, 1, 3, 1},
       "replicate",
       std::nullopt},
      {"circular", "cat", {2, 3, 5, 6}, {1, 2, 3, 0}, "circular", std::nullopt},
      {"circular_crop", "cat", {2, 3, 5, 6}, {-1, 2, 3, -2}, "circular", std::nullopt},
  };
  for (const PadCall& c : calls) {
    PadCall fc = c;
    cs.push_back(
        {.name = std::string("pad_fn_") + c.label,
         .ops = {c.op},
         .dtypes = {kFloat32, kFloat64},
         .make = [fc](Gen& g) { return KTensors{g.any({fc.x})}; },
         .kiln = [fc](const KArgs& x) { return KTensors{pad(x[0], fc.pad, fc.mode, fc.value)}; },
         .aten =
             [fc](const AArgs& a) {
               return ATensors{at::pad(a[0], ar(fc.pad), fc.mode, aopt(fc.value))};
             },
         .tol = Tol::Exact});
    // pad's circular mode is a composite over slice and cat: its rows gradcheck themselves.
    if (std::string(c.mode) == "circular")
      cs.back().grads.push_back(
          {std::string("pad_fn_") + c.label,
           {"cat"},
           [fc](GradGen& d) { return KTensors{d.var(fc.x)}; },
           [fc](const KTensors& x) { return KTensors{pad(x[0], fc.pad, fc.mode, fc.value)}; }});
  }
}

// ---------------------------------------------------------------- upsampling

struct UpConfig {
  const char* label;
  bool bilinear;
  Dims x, out;
  bool align_corners = false;
  std::optional<double> sh = {}, sw = {};
  Layout layout = C;
};

const std::vector<UpConfig>& up_configs() {
  static const std::vector<UpConfig> c = {
      {"nearest_double", false, {2, 3, 4, 5}, {8, 10}},
      {"nearest_down", false, {2, 3, 5, 7}, {3, 4}},
      {"nearest_up", false, {1, 2, 3, 4}, {5, 9}},
      {"nearest_scales", false, {1, 2, 4, 5}, {6, 7}, false, 1.5, 1.4},
      {"nearest_one_scale", false, {2, 2, 3, 4}, {7, 6}, false, 2.5, std::nullopt},
      {"nearest_noncontig", false, {2, 3, 6, 7}, {9, 4}, false, {}, {}, T},
      {"bilinear_up", true, {2, 3, 4, 5}, {7, 9}},
      {"bilinear_up_align", true, {2, 3, 4, 5}, {7, 9}, true},
      {"bilinear_down", true, {1, 2, 7, 9}, {3, 4}},
      {"bilinear_down_align", true, {1, 2, 7, 9}, {3, 4}, true},
      {"bilinear_to_one", true, {1, 2, 4, 5}, {1, 1}, true},
      {"bilinear_scales", true, {1, 2, 4, 5}, {6, 7}, false, 1.5, 1.4},
      {"bilinear_same_size", true, {2, 2, 3, 4}, {3, 8}},
      {"bilinear_noncontig", true, {2, 3, 6, 7}, {9, 4}, false, {}, {}, T},
  };
  return c;
}

Tensor kup(const UpConfig& c, const Tensor& x) {
  return c.bilinear ? upsample_bilinear2d(x, c.out, c.align_corners, c.sh, c.sw)
                    : upsample_nearest2d(x, c.out, c.sh, c.sw);
}
at::Tensor aup(const UpConfig& c, const at::Tensor& x) {
  return c.bilinear ? at::upsample_bilinear2d(x, ar(c.out), c.align_corners, aopt(c.sh), aopt(c.sw))
                    : at::upsample_nearest2d(x, ar(c.out), aopt(c.sh), aopt(c.sw));
}

void add_upsample(Cases& cs, GradSamples& grads) {
  for (const UpConfig& c : up_configs()) {
    UpConfig fc = c;
    const std::string op = c.bilinear ? "upsample_bilinear2d" : "upsample_nearest2d";
    cs.push_back({.name = std::string("upsample_") + c.label,
                  .ops = {op},
                  .dtypes = kFloatDTypes,
                  .make =
                      [fc](Gen& g) {
                        return KTensors{g.any({fc.x, fc.layout})};
                      },
                  .kiln = [fc](const KArgs& x) { return KTensors{kup(fc, x[0])}; },
                  .aten = [fc](const AArgs& a) { return ATensors{aup(fc, a[0])}; },
                  .tol = c.bilinear ? Tol::Accum : Tol::Exact});
    cs.push_back(
        {.name = std::string("upsample_backward_") + c.label,
         .ops = {op + "_backward"},
         .dtypes = kFloatDTypes,
         .make =
             [fc](Gen& g) {
               Dims y = {fc.x[0], fc.x[1], fc.out[0], fc.out[1]};
               return KTensors{g.any({y, fc.layout})};
             },
         .kiln =
             [fc](const KArgs& x) {
               return KTensors{fc.bilinear
                                   ? upsample_bilinear2d_backward(x[0], fc.out, fc.x,
                                                                  fc.align_corners, fc.sh, fc.sw)
                                   : upsample_nearest2d_backward(x[0], fc.out, fc.x, fc.sh, fc.sw)};
             },
         .aten =
             [fc](const AArgs& a) {
               return ATensors{fc.bilinear
                                   ? at::upsample_bilinear2d_backward(a[0], ar(fc.out), ar(fc.x),
                                                                      fc.align_corners, aopt(fc.sh),
                                                                      aopt(fc.sw))
                                   : at::upsample_nearest2d_backward(a[0], ar(fc.out), ar(fc.x),
                                                                     aopt(fc.sh), aopt(fc.sw))};
             },
         .tol = Tol::Accum});
    if (c.layout == C)
      grads.push_back({std::string("upsample_") + c.label,
                       {op},
                       [fc](GradGen& d) { return KTensors{d.var(fc.x)}; },
                       [fc](const KTensors& x) { return KTensors{kup(fc, x[0])}; }});
  }
  // The .vec overloads (scale_factors give the size and the scales) and interpolate.
  struct VecCall {
    const char* label;
    const char* op;
    Dims x;
    std::function<Tensor(const Tensor&)> k;
    std::function<at::Tensor(const at::Tensor&)> a;
  };
  const std::vector<VecCall> calls = {
      {"nearest_vec_size",
       "upsample_nearest2d",
       {2, 3, 4, 5},
       [](const Tensor& x) {
         return upsample_nearest2d_vec(x, std::vector<int64_t>{7, 3}, {});
       },
       [](const at::Tensor& x) {
         return at::upsample_nearest2d(x, at::IntArrayRef{7, 3}, c10::nullopt);
       }},
      {"nearest_vec_factors",
       "upsample_nearest2d",
       {2, 3, 4, 5},
       [](const Tensor& x) {
         return upsample_nearest2d_vec(x, {}, std::vector<double>{2.5, 1.7});
       },
       [](const at::Tensor& x) {
         std::vector<double> f{2.5, 1.7};
         return at::upsample_nearest2d(x, c10::nullopt, at::ArrayRef<double>(f));
       }},
      {"bilinear_vec_factors",
       "upsample_bilinear2d",
       {2, 3, 4, 5},
       [](const Tensor& x) {
         return upsample_bilinear2d_vec(x, {}, false, std::vector<double>{1.5, 0.6});
       },
       [](const at::Tensor& x) {
         std::vector<double> f{1.5, 0.6};
         return at::upsample_bilinear2d(x, c10::nullopt, false, at::ArrayRef<double>(f));
       }},
      {"bilinear_vec_factors_align",
       "upsample_bilinear2d",
       {2, 3, 4, 5},
       [](const Tensor& x) {
         return upsample_bilinear2d_vec(x, {}, true, std::vector<double>{2.0, 3.0});
       },
       [](const at::Tensor& x) {
         std::vector<double> f{2.0, 3.0};
         return at::upsample_bilinear2d(x, c10::nullopt, true, at::ArrayRef<double>(f));
       }},
      {"interpolate_nearest_scale",
       "upsample_nearest2d",
       {2, 3, 4, 5},
       [](const Tensor& x) { return interpolate(x, {}, std::vector<double>{2.0}); },
       [](const at::Tensor& x) {
         return at::upsample_nearest2d(x, {8, 10}, 2.0, 2.0);
       }},
      {"interpolate_bilinear_size",
       "upsample_bilinear2d",
       {2, 3, 4, 5},
       [](const Tensor& x) {
         return interpolate(x, std::vector<int64_t>{6, 3}, {}, "bilinear", true);
       },
       [](const at::Tensor& x) {
         return at::upsample_bilinear2d(x, {6, 3}, true);
       }},
      {"interpolate_nearest_1d",
       "upsample_nearest2d",
       {2, 3, 5},
       [](const Tensor& x) { return interpolate(x, std::vector<int64_t>{8}); },
       [](const at::Tensor& x) { return at::upsample_nearest1d(x, {8}); }},
      {"interpolate_linear_1d",
       "upsample_bilinear2d",
       {2, 3, 5},
       [](const Tensor& x) { return interpolate(x, {}, std::vector<double>{1.6}, "linear"); },
       [](const at::Tensor& x) {
         return at::upsample_linear1d(x, at::IntArrayRef{8}, false, c10::optional<double>(1.6));
       }},
  };
  for (const VecCall& c : calls) {
    VecCall fc = c;
    cs.push_back({.name = std::string("upsample_") + c.label,
                  .ops = {c.op},
                  .dtypes = {kFloat32, kFloat64},
                  .make = [fc](Gen& g) { return KTensors{g.any({fc.x})}; },
                  .kiln = [fc](const KArgs& x) { return KTensors{fc.k(x[0])}; },
                  .aten = [fc](const AArgs& a) { return ATensors{fc.a(a[0])}; },
                  .tol = Tol::Accum});
    grads.push_back({std::string("upsample_") + c.label,
                     {c.op},
                     [fc](GradGen& d) { return KTensors{d.var(fc.x)}; },
                     [fc](const KTensors& x) { return KTensors{fc.k(x[0])}; }});
  }
}

}  // namespace

void add_pad_upsample(Cases& cs) {
  GradSamples pad_grads, constant_grads, up_grads;
  add_pads(cs, pad_grads);
  add_constant(cs, constant_grads);
  add_upsample(cs, up_grads);
  auto split = [](const GradSamples& all, const std::string& op) {
    GradSamples r;
    for (const GradSample& s : all)
      if (s.ops[0] == op) r.push_back(s);
    return r;
  };
  for (const char* op : {"reflection_pad1d", "reflection_pad2d", "reflection_pad3d",
                         "replication_pad1d", "replication_pad2d", "replication_pad3d"})
    head(cs, op).grads = split(pad_grads, op);
  head(cs, "constant_pad_nd").grads = split(constant_grads, "constant_pad_nd");
  for (const char* op : {"upsample_nearest2d", "upsample_bilinear2d"})
    head(cs, op).grads = split(up_grads, op);

  // clang-format off
  head(cs, "constant_pad_nd").errors = {
      {"constant_pad_odd", K::Value, "constant_pad_nd", {"even", "[1, 2, 3]"},
       [](const Watch&) { constant_pad_nd(f32({2, 3}), {1, 2, 3}); }},
      {"constant_pad_too_long", K::Value, "constant_pad_nd", {"twice", "[1, 1, 1, 1, 1, 1]", "2 dims"},
       [](const Watch&) { constant_pad_nd(f32({2, 3}), {1, 1, 1, 1, 1, 1}); }},
      {"constant_pad_negative_size", K::Value, "constant_pad_nd", {"negative output size", "input size 3", "-2 and -2"},
       [](const Watch&) { constant_pad_nd(f32({2, 3}), {-2, -2}); }},
      {"pad_mode", K::Value, "pad", {"unknown padding mode", "wrap"},
       [](const Watch&) { pad(f32({2, 3, 4}), {1, 1}, "wrap"); }},
      {"pad_value_reflect", K::Value, "pad", {"reflect", "value"},
       [](const Watch&) { pad(f32({2, 3, 4}), {1, 1}, "reflect", 1.0); }},
      {"pad_odd", K::Value, "pad", {"divisible by 2", "[1]"},
       [](const Watch&) { pad(f32({2, 3, 4}), {1}); }},
      {"pad_reflect_rank", K::Value, "pad", {"reflect", "3 dims", "4-D or 5-D", "[2, 3, 4]"},
       [](const Watch&) { pad(f32({2, 3, 4}), {1, 1, 1, 1, 1, 1}, "reflect"); }},
      {"pad_circular_wrap", K::Value, "pad", {"wraps around more than once", "[5, 0]"},
       [](const Watch&) { pad(f32({2, 3, 4}), {5, 0}, "circular"); }}};
  head(cs, "reflection_pad2d").errors = {
      {"reflection_pad2d_too_wide", K::Value, "reflection_pad2d", {"less than the corresponding input dimension", "padding (3, 1)", "dimension 3", "[1, 2, 4, 3]"},
       [](const Watch&) { reflection_pad2d(f32({1, 2, 4, 3}), {3, 1, 0, 0}); }},
      {"reflection_pad2d_height", K::Value, "reflection_pad2d", {"padding (0, 4)", "dimension 2"},
       [](const Watch&) { reflection_pad2d(f32({1, 2, 4, 5}), {0, 0, 0, 4}); }},
      {"reflection_pad2d_len", K::Value, "reflection_pad2d", {"padding must have 4 elements", "[1, 1]"},
       [](const Watch&) { reflection_pad2d(f32({1, 2, 4, 5}), {1, 1}); }},
      {"reflection_pad2d_rank", K::Value, "reflection_pad2d", {"3-D or 4-D", "[4, 5]"},
       [](const Watch&) { reflection_pad2d(f32({4, 5}), {1, 1, 1, 1}); }},
      {"reflection_pad2d_empty_plane", K::Value, "reflection_pad2d", {"non-zero", "[1, 0, 4, 5]"},
       [](const Watch&) { reflection_pad2d(f32({1, 0, 4, 5}), {1, 1, 1, 1}); }},
      {"reflection_pad2d_crop_all", K::Value, "reflection_pad2d", {"too small", "[1, 2, 4, 5]"},
       [](const Watch&) { reflection_pad2d(f32({1, 2, 4, 5}), {-3, -2, 0, 0}); }},
      {"reflection_pad2d_int", K::Type, "reflection_pad2d", {"floating", "int64"},
       [](const Watch&) { reflection_pad2d(i64({1, 2, 4, 5}), {1, 1, 1, 1}); }}};
  head(cs, "reflection_pad1d").errors = {
      {"reflection_pad1d_too_wide", K::Value, "reflection_pad1d", {"padding (1, 3)", "dimension 2", "[2, 3, 3]"},
       [](const Watch&) { reflection_pad1d(f32({2, 3, 3}), {1, 3}); }}};
  head(cs, "reflection_pad3d").errors = {
      {"reflection_pad3d_too_wide", K::Value, "reflection_pad3d", {"padding (2, 0)", "dimension 2", "[1, 1, 2, 4, 4]"},
       [](const Watch&) { reflection_pad3d(f32({1, 1, 2, 4, 4}), {0, 0, 0, 0, 2, 0}); }}};
  head(cs, "replication_pad2d").errors = {
      {"replication_pad2d_len", K::Value, "replication_pad2d", {"padding must have 4 elements", "[1, 1, 1, 1, 1, 1]"},
       [](const Watch&) { replication_pad2d(f32({1, 2, 4, 5}), {1, 1, 1, 1, 1, 1}); }},
      {"replication_pad2d_crop_all", K::Value, "replication_pad2d", {"too small", "[-3, -3, 0, 0]"},
       [](const Watch&) { replication_pad2d(f32({1, 2, 4, 5}), {-3, -3, 0, 0}); }}};
  head(cs, "replication_pad3d").errors = {
      {"replication_pad3d_rank", K::Value, "replication_pad3d", {"4-D or 5-D", "[4, 5]"},
       [](const Watch&) { replication_pad3d(f32({4, 5}), {1, 1, 1, 1, 1, 1}); }}};
  head(cs, "reflection_pad2d_backward").errors = {
      {"reflection_pad2d_backward_shape", K::Value, "reflection_pad2d_backward", {"grad_output", "[1, 2, 6, 7]", "[1, 2, 6, 6]"},
       [](const Watch&) { reflection_pad2d_backward(f32({1, 2, 6, 6}), f32({1, 2, 4, 5}), {1, 1, 1, 1}); }},
      {"reflection_pad2d_backward_dtype", K::Type, "reflection_pad2d_backward", {"grad_output", "float32", "float64"},
       [](const Watch&) { reflection_pad2d_backward(ones({1, 2, 6, 7}, kFloat64), f32({1, 2, 4, 5}), {1, 1, 1, 1}); }}};
  head(cs, "replication_pad1d_backward").errors = {
      {"replication_pad1d_backward_shape", K::Value, "replication_pad1d_backward", {"grad_output", "[2, 3, 7]", "[2, 3, 6]"},
       [](const Watch&) { replication_pad1d_backward(f32({2, 3, 6}), f32({2, 3, 4}), {1, 2}); }}};
  head(cs, "upsample_nearest2d").errors = {
      {"upsample_nearest2d_rank", K::Value, "upsample_nearest2d", {"4-D", "[2, 3, 4]"},
       [](const Watch&) { upsample_nearest2d(f32({2, 3, 4}), {4, 4}); }},
      {"upsample_nearest2d_output_len", K::Value, "upsample_nearest2d", {"output_size must have 2 elements", "[4]"},
       [](const Watch&) { upsample_nearest2d(f32({1, 2, 3, 4}), {4}); }},
      {"upsample_nearest2d_output_zero", K::Value, "upsample_nearest2d", {"greater than 0", "output (H: 0, W: 4)"},
       [](const Watch&) { upsample_nearest2d(f32({1, 2, 3, 4}), {0, 4}); }},
      {"upsample_nearest2d_empty", K::Value, "upsample_nearest2d", {"non-empty 4-D", "[1, 0, 3, 4]"},
       [](const Watch&) { upsample_nearest2d(f32({1, 0, 3, 4}), {4, 4}); }},
      {"upsample_nearest2d_int", K::Type, "upsample_nearest2d", {"floating", "int64"},
       [](const Watch&) { upsample_nearest2d(i64({1, 2, 3, 4}), {4, 4}); }},
      {"upsample_nearest2d_vec_both", K::Value, "upsample_nearest2d", {"exactly one of output_size and scale_factors"},
       [](const Watch&) { upsample_nearest2d_vec(f32({1, 2, 3, 4}), std::vector<int64_t>{4, 4}, std::vector<double>{2, 2}); }},
      {"interpolate_align_nearest", K::Value, "interpolate", {"align_corners", "nearest"},
       [](const Watch&) { interpolate(f32({1, 2, 3, 4}), std::vector<int64_t>{4, 4}, {}, "nearest", true); }},
      {"interpolate_linear_4d", K::Value, "interpolate", {"4D input", "linear mode needs 3D input"},
       [](const Watch&) { interpolate(f32({1, 2, 3, 4}), std::vector<int64_t>{4, 4}, {}, "linear"); }},
      {"interpolate_neither", K::Value, "interpolate", {"either size or scale_factor"},
       [](const Watch&) { interpolate(f32({1, 2, 3, 4})); }},
      {"interpolate_size_len", K::Value, "interpolate", {"same number of spatial dimensions", "[4, 4, 4]"},
       [](const Watch&) { interpolate(f32({1, 2, 3, 4}), std::vector<int64_t>{4, 4, 4}); }},
      {"interpolate_mode", K::Value, "interpolate", {"bicubic", "not supported"},
       [](const Watch&) { interpolate(f32({1, 2, 3, 4}), std::vector<int64_t>{4, 4}, {}, "bicubic"); }}};
  head(cs, "upsample_bilinear2d").errors = {
      {"upsample_bilinear2d_rank", K::Value, "upsample_bilinear2d", {"4-D", "[1, 2, 3, 4, 5]"},
       [](const Watch&) { upsample_bilinear2d(f32({1, 2, 3, 4, 5}), {4, 4}, false); }}};
  head(cs, "upsample_nearest2d_backward").errors = {
      {"upsample_nearest2d_backward_shape", K::Value, "upsample_nearest2d_backward", {"grad_output", "[1, 2, 6, 8]", "[1, 2, 6, 7]"},
       [](const Watch&) { upsample_nearest2d_backward(f32({1, 2, 6, 7}), {6, 8}, {1, 2, 3, 4}); }},
      {"upsample_nearest2d_backward_input_len", K::Value, "upsample_nearest2d_backward", {"input_size must have 4 elements", "[3, 4]"},
       [](const Watch&) { upsample_nearest2d_backward(f32({1, 2, 6, 8}), {6, 8}, {3, 4}); }}};
  head(cs, "upsample_bilinear2d_backward").errors = {
      {"upsample_bilinear2d_backward_dtype", K::Type, "upsample_bilinear2d_backward", {"floating", "int64"},
       [](const Watch&) { upsample_bilinear2d_backward(i64({1, 2, 6, 8}), {6, 8}, {1, 2, 3, 4}, false); }}};
  // clang-format on
}

}  // namespace kiln::test

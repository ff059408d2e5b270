// Op table: convolution and convolution_backward (1-3 spatial dims, groups, stride, padding,
// dilation, transposed with output_padding, with and without bias), and the public wrappers
// over them (conv1d/2d/3d with numeric and "same" padding, conv_transpose1d/2d/3d), against
// at::convolution and at::convolution_backward. Products over channels and kernel taps sum in
// another order than ATen's: Tol::Accum (16-bit: Searched16; the CPU computes in float32 and
// rounds once, cuDNN's fastest algorithm may round partial sums).
#include "tests/ops/op_test_util.h"

namespace kiln::test {
namespace {

constexpr auto C = Layout::Contig;
constexpr auto T = Layout::Transposed;

struct ConvConfig {
  const char* label;
  Dims x, w;  // input [N, C, *spatial], weight
  bool bias;
  Dims stride, padding, dilation;
  bool transposed;
  Dims output_padding;
  int64_t groups;
  Layout layout = C;  // the input's
};

const std::vector<ConvConfig>& configs() {
  static const std::vector<ConvConfig> c = {
      {"1d", {2, 4, 9}, {6, 4, 3}, true, {1}, {0}, {1}, false, {0}, 1},
      {"1d_dilated_strided", {2, 3, 11}, {4, 3, 3}, false, {2}, {2}, {2}, false, {0}, 1},
      {"2d_stride_pad", {2, 3, 7, 8}, {4, 3, 3, 3}, true, {2, 2}, {1, 1}, {1, 1}, false, {0, 0}, 1},
      {"2d_groups_dilation",
       {2, 4, 9, 9},
       {6, 2, 3, 3},
       false,
       {1, 1},
       {0, 1},
       {2, 1},
       false,
       {0, 0},
       2},
      {"2d_depthwise", {1, 4, 6, 6}, {4, 1, 3, 3}, true, {1, 1}, {1, 1}, {1, 1}, false, {0, 0}, 4},
      {"2d_noncontig",
       {2, 3, 6, 7},
       {5, 3, 2, 3},
       true,
       {1, 2},
       {0, 1},
       {1, 1},
       false,
       {0, 0},
       1,
       T},
      {"3d",
       {1, 2, 5, 6, 5},
       {3, 2, 2, 3, 2},
       true,
       {1, 2, 1},
       {1, 0, 1},
       {1, 1, 1},
       false,
       {0, 0, 0},
       1},
      {"transposed_2d", {2, 4, 5, 5}, {4, 3, 3, 3}, true, {2, 2}, {1, 1}, {1, 1}, true, {1, 1}, 1},
      {"transposed_1d_groups", {2, 4, 7}, {4, 3, 3}, false, {3}, {1}, {1}, true, {2}, 2},
      {"transposed_3d",
       {1, 2, 3, 3, 3},
       {2, 2, 2, 2, 2},
       true,
       {2, 2, 2},
       {0, 0, 0},
       {1, 1, 1},
       true,
       {1, 0, 1},
       1},
      // output_padding >= stride (allowed below the dilation): the CPU's float64 loops.
      {"transposed_output_padding_dilation",
       {1, 2, 5},
       {2, 2, 3},
       true,
       {1},
       {0},
       {2},
       true,
       {1},
       1},
  };
  return c;
}

at::IntArrayRef ar(const Dims& d) { return at::IntArrayRef(d.data(), d.size()); }

// The reference for 16-bit inputs in float32 (ATen's CPU bfloat16 convolution goes through
// mkldnn, which lacks some of these shapes), rounded to the dtype once.
at::Tensor f32_ref(const at::Tensor& t) {
  return t.defined() && (t.scalar_type() == at::kHalf || t.scalar_type() == at::kBFloat16)
             ? t.to(at::kFloat)
             : t;
}

// Output shape of a config, for grad_output.
Dims out_shape(const ConvConfig& c) {
  Dims o{c.x[0], c.transposed ? c.w[1] * c.groups : c.w[0]};
  for (size_t i = 2; i < c.x.size(); ++i) {
    int64_t in = c.x[i], k = c.w[i], s = c.stride[i - 2], p = c.padding[i - 2],
            d = c.dilation[i - 2];
    o.push_back(c.transposed ? (in - 1) * s - 2 * p + d * (k - 1) + c.output_padding[i - 2] + 1
                             : (in + 2 * p - d * (k - 1) - 1) / s + 1);
  }
  return o;
}

Dims bias_shape(const ConvConfig& c) { return {c.transposed ? c.w[1] * c.groups : c.w[0]}; }

Tensor kconv(const ConvConfig& c, const KTensors& x) {
  return convolution(x[0], x[1], c.bias ? x[2] : Tensor(), c.stride, c.padding, c.dilation,
                     c.transposed, c.output_padding, c.groups);
}

GradSamples conv_grads() {
  GradSamples gs;
  for (const ConvConfig& c : configs()) {
    if (c.layout != C) continue;
    ConvConfig fc = c;
    gs.push_back({std::string("convolution_") + c.label,
                  {"convolution"},
                  [fc](GradGen& d) {
                    TensorList in{d.var(fc.x), d.var(fc.w)};
                    if (fc.bias) in.push_back(d.var(bias_shape(fc)));
                    return in;
                  },
                  [fc](const TensorList& x) { return TensorList{kconv(fc, x)}; }});
  }
  // Only some inputs requiring grad: output_mask leaves the others out.
  gs.push_back({"convolution_weight_only",
                {"convolution"},
                [](GradGen& d) {
                  return TensorList{d.fixed({2, 3, 5, 5}), d.var({4, 3, 3, 3})};
                },
                [](const TensorList& x) { return TensorList{conv2d(x[0], x[1])}; }});
  gs.push_back(
      {"conv2d_same_odd",
       {"convolution"},
       [](GradGen& d) {
         return TensorList{d.var({1, 2, 5, 5}), d.var({3, 2, 3, 3}), d.var({3})};
       },
       [](const TensorList& x) { return TensorList{conv2d(x[0], x[1], x[2], {1}, "same")}; }});
  return gs;
}

}  // namespace

void add_convolution(Cases& cs) {
  for (const ConvConfig& c : configs()) {
    ConvConfig fc = c;
    cs.push_back({.name = std::string("convolution_") + c.label,
                  .ops = {"convolution"},
                  .dtypes = kFloatDTypes,
                  .make =
                      [fc](Gen& g) {
                        KTensors in{g.any({fc.x, fc.layout}), g.any({fc.w})};
                        if (fc.bias) in.push_back(g.any({bias_shape(fc)}));
                        return in;
                      },
                  .kiln = [fc](const KArgs& x) { return KTensors{kconv(fc, x.in)}; },
                  .aten =
                      [fc](const AArgs& a) {
                        return ATensors{at::convolution(f32_ref(a[0]), f32_ref(a[1]),
                                                        fc.bias ? f32_ref(a[2]) : at::Tensor(),
                                                        ar(fc.stride), ar(fc.padding),
                                                        ar(fc.dilation), fc.transposed,
                                                        ar(fc.output_padding), fc.groups)
                                            .to(a[0].scalar_type())};
                      },
                  .tol = Tol::Searched16});
    cs.push_back(
        {.name = std::string("convolution_backward_") + c.label,
         .ops = {"convolution_backward"},
         .dtypes = kFloatDTypes,
         .make =
             [fc](Gen& g) {
               return KTensors{g.any({out_shape(fc)}), g.any({fc.x, fc.layout}), g.any({fc.w})};
             },
         .kiln =
             [fc](const KArgs& x) {
               Dims bs = fc.bias ? bias_shape(fc) : Dims{};
               auto [gi, gw, gb] =
                   convolution_backward(x[0], x[1], x[2], bs, fc.stride, fc.padding, fc.dilation,
                                        fc.transposed, fc.output_padding, fc.groups, {1, 1, 1});
               EXPECT_EQ(gb.defined(), fc.bias);
               return fc.bias ? KTensors{gi, gw, gb} : KTensors{gi, gw};
             },
         .aten =
             [fc](const AArgs& a) {
               Dims bs = bias_shape(fc);
               auto [gi, gw, gb] = at::convolution_backward(
                   f32_ref(a[0]), f32_ref(a[1]), f32_ref(a[2]),
                   fc.bias ? at::OptionalIntArrayRef(ar(bs)) : at::OptionalIntArrayRef(),
                   ar(fc.stride), ar(fc.padding), ar(fc.dilation), fc.transposed,
                   ar(fc.output_padding), fc.groups, {true, true, fc.bias});
               at::ScalarType t = a[0].scalar_type();
               return fc.bias ? ATensors{gi.to(t), gw.to(t), gb.to(t)}
                              : ATensors{gi.to(t), gw.to(t)};
             },
         .tol = Tol::Searched16});
  }
  // output_mask: only grad_weight; the others undefined.
  cs.push_back(
      {.name = "convolution_backward_weight_only",
       .ops = {"convolution_backward"},
       .dtypes = {kFloat32, kFloat64},
       .make =
           [](Gen& g) {
             return KTensors{g.any({{2, 4, 3, 3}}), g.any({{2, 3, 5, 5}}), g.any({{4, 3, 3, 3}})};
           },
       .kiln =
           [](const KArgs& x) {
             auto [gi, gw, gb] = convolution_backward(x[0], x[1], x[2], {4}, {1}, {0}, {1}, false,
                                                      {0}, 1, {0, 1, 0});
             EXPECT_FALSE(gi.defined());
             EXPECT_FALSE(gb.defined());
             return KTensors{gw};
           },
       .aten =
           [](const AArgs& a) {
             return ATensors{std::get<1>(
                 at::convolution_backward(a[0], a[1], a[2], at::IntArrayRef{4}, {1, 1}, {0, 0},
                                          {1, 1}, false, {0, 0}, 1, {false, true, false}))};
           },
       .tol = Tol::Accum});
  // The public wrappers.
  struct Wrapper {
    const char* label;
    Dims x, w;
    std::function<Tensor(const KTensors&)> k;
    std::function<at::Tensor(const ATensors&)> a;
  };
  const std::vector<Wrapper> wrappers = {
      {"conv1d_unbatched",
       {3, 10},
       {5, 3, 4},
       [](const KTensors& x) { return conv1d(x[0], x[1], Tensor(), {2}, {1}); },
       [](const ATensors& a) { return at::conv1d(a[0], a[1], {}, {2}, {1}); }},
      {"conv2d_same_odd",
       {2, 3, 6, 5},
       {4, 3, 3, 3},
       [](const KTensors& x) { return conv2d(x[0], x[1], Tensor(), {1}, "same"); },
       [](const ATensors& a) { return at::conv2d(a[0], a[1], {}, {1}, "same"); }},
      {"conv2d_same_even_dilated",
       {2, 3, 6, 5},
       {4, 3, 4, 2},
       [](const KTensors& x) {
         return conv2d(x[0], x[1], Tensor(), {1}, "same", {1, 3});
       },
       [](const ATensors& a) {
         return at::conv2d(a[0], a[1], {}, {1}, "same", {1, 3});
       }},
      {"conv2d_valid",
       {2, 3, 6, 5},
       {4, 3, 2, 2},
       [](const KTensors& x) { return conv2d(x[0], x[1], Tensor(), {1}, "valid"); },
       [](const ATensors& a) { return at::conv2d(a[0], a[1], {}, {1}, "valid"); }},
      {"conv3d_groups",
       {1, 4, 4, 5, 4},
       {2, 2, 2, 2, 2},
       [](const KTensors& x) { return conv3d(x[0], x[1], Tensor(), {1}, {1}, {1}, 2); },
       [](const ATensors& a) { return at::conv3d(a[0], a[1], {}, {1}, {1}, {1}, 2); }},
      {"conv_transpose1d",
       {2, 3, 6},
       {3, 2, 3},
       [](const KTensors& x) { return conv_transpose1d(x[0], x[1], Tensor(), {2}, {1}, {1}); },
       [](const ATensors& a) { return at::conv_transpose1d(a[0], a[1], {}, {2}, {1}, {1}); }},
      {"conv_transpose2d",
       {2, 4, 4, 3},
       {4, 1, 3, 2},
       [](const KTensors& x) {
         return conv_transpose2d(x[0], x[1], Tensor(), {2, 1}, {1, 0}, {1, 0}, 2);
       },
       [](const ATensors& a) {
         return at::conv_transpose2d(a[0], a[1], {}, {2, 1}, {1, 0}, {1, 0}, 2);
       }},
      {"conv_transpose3d",
       {1, 2, 3, 2, 3},
       {2, 3, 2, 2, 2},
       [](const KTensors& x) { return conv_transpose3d(x[0], x[1]); },
       [](const ATensors& a) { return at::conv_transpose3d(a[0], a[1]); }},
  };
  for (const Wrapper& w : wrappers) {
    Wrapper fw = w;
    cs.push_back({.name = std::string("convolution_") + w.label,
                  .ops = {"convolution"},
                  .dtypes = {kFloat32, kFloat64},
                  .make =
                      [fw](Gen& g) {
                        return KTensors{g.any({fw.x}), g.any({fw.w})};
                      },
                  .kiln = [fw](const KArgs& x) { return KTensors{fw.k(x.in)}; },
                  .aten = [fw](const AArgs& a) { return ATensors{fw.a(a.in)}; },
                  .tol = Tol::Accum});
  }

  // clang-format off
  OpCase& record = head(cs, "convolution");
  record.grads = conv_grads();
  auto conv = [](const Tensor& x, const Tensor& w, Dims stride = {1}, Dims padding = {0},
                 Dims dilation = {1}, bool transposed = false, Dims op = {0}, int64_t groups = 1,
                 const Tensor& b = {}) {
    convolution(x, w, b, stride, padding, dilation, transposed, op, groups);
  };
  record.errors = {
      {"convolution_weight_dims", K::Value, "convolution", {"3 to 5", "[4, 3]"},
       [=](const Watch&) { conv(f32({2, 3, 5}), f32({4, 3})); }},
      {"convolution_input_dims", K::Value, "convolution", {"4-D", "[3, 5, 5]"},
       [=](const Watch&) { conv(f32({3, 5, 5}), f32({4, 3, 3, 3})); }},
      {"convolution_channels", K::Value, "convolution", {"5 channels", "[4, 3, 3, 3]"},
       [=](const Watch&) { conv(f32({1, 5, 5, 5}), f32({4, 3, 3, 3})); }},
      {"convolution_groups_divide", K::Value, "convolution", {"4", "groups 3"},
       [=](const Watch&) { conv(f32({1, 3, 5, 5}), f32({4, 1, 3, 3}), {1}, {0}, {1}, false, {0}, 3); }},
      {"convolution_groups_zero", K::Value, "convolution", {"groups must be positive", "0"},
       [=](const Watch&) { conv(f32({1, 3, 5, 5}), f32({4, 3, 3, 3}), {1}, {0}, {1}, false, {0}, 0); }},
      {"convolution_int", K::Type, "convolution", {"int64"},
       [=](const Watch&) { conv(i64({1, 3, 5}), i64({4, 3, 3})); }},
      {"convolution_dtype_mismatch", K::Type, "convolution", {"float32", "float64"},
       [=](const Watch&) { conv(f32({1, 3, 5}), ones({4, 3, 3}, kFloat64)); }},
      {"convolution_stride_zero", K::Value, "convolution", {"stride must be positive", "[1, 0]"},
       [=](const Watch&) { conv(f32({1, 3, 5, 5}), f32({4, 3, 3, 3}), {1, 0}); }},
      {"convolution_stride_len", K::Value, "convolution", {"stride", "1 or 2", "[1, 1, 1]"},
       [=](const Watch&) { conv(f32({1, 3, 5, 5}), f32({4, 3, 3, 3}), {1, 1, 1}); }},
      {"convolution_negative_padding", K::Value, "convolution", {"non-negative", "[-1]"},
       [=](const Watch&) { conv(f32({1, 3, 5}), f32({4, 3, 3}), {1}, {-1}); }},
      {"convolution_dilation_zero", K::Value, "convolution", {"dilation must be positive", "[0]"},
       [=](const Watch&) { conv(f32({1, 3, 5}), f32({4, 3, 3}), {1}, {0}, {0}); }},
      {"convolution_kernel_too_big", K::Value, "convolution", {"padded input 4", "dilated kernel 5"},
       [=](const Watch&) { conv(f32({1, 3, 4}), f32({4, 3, 3}), {1}, {0}, {2}); }},
      {"convolution_output_padding", K::Value, "convolution", {"output_padding [2]", "stride [2]"},
       [=](const Watch&) { conv(f32({1, 4, 5}), f32({4, 3, 3}), {2}, {0}, {1}, true, {2}); }},
      {"convolution_output_padding_not_transposed", K::Value, "convolution", {"output_padding [1]"},
       [=](const Watch&) { conv(f32({1, 3, 5}), f32({4, 3, 3}), {2}, {0}, {1}, false, {1}); }},
      {"convolution_transposed_channels", K::Value, "convolution", {"3 channels", "[4, 3, 3]"},
       [=](const Watch&) { conv(f32({1, 3, 5}), f32({4, 3, 3}), {1}, {0}, {1}, true); }},
      {"convolution_bias_shape", K::Value, "convolution", {"4 out channels", "[3]"},
       [=](const Watch&) { conv(f32({1, 3, 5}), f32({4, 3, 3}), {1}, {0}, {1}, false, {0}, 1, f32({3})); }},
      {"convolution_bias_dtype", K::Type, "convolution", {"float32", "float64"},
       [=](const Watch&) {
         conv(f32({1, 3, 5}), f32({4, 3, 3}), {1}, {0}, {1}, false, {0}, 1, ones({4}, kFloat64));
       }},
      {"convolution_empty_output", K::Value, "convolution", {"size -1"},
       [=](const Watch&) { conv(f32({1, 4, 1}), f32({4, 3, 3}), {1}, {2}, {1}, true); }},
      {"conv2d_same_strided", K::Value, "conv2d", {"same", "[2]"},
       [](const Watch&) { conv2d(f32({1, 3, 5, 5}), f32({4, 3, 3, 3}), Tensor(), {2}, "same"); }},
      {"conv2d_bad_padding_string", K::Value, "conv2d", {"\"full\""},
       [](const Watch&) { conv2d(f32({1, 3, 5, 5}), f32({4, 3, 3, 3}), Tensor(), {1}, "full"); }},
      {"conv2d_weight_dims", K::Value, "conv2d", {"4-D", "[4, 3, 3]"},
       [](const Watch&) { conv2d(f32({1, 3, 5, 5}), f32({4, 3, 3})); }}};
  head(cs, "convolution_backward").errors = {
      {"convolution_backward_grad_shape", K::Value, "convolution_backward", {"[2, 6, 7]", "[2, 6, 6]"},
       [](const Watch&) {
         convolution_backward(f32({2, 6, 6}), f32({2, 4, 9}), f32({6, 4, 3}), {}, {1}, {0}, {1},
                              false, {0}, 1, {1, 1, 1});
       }},
      {"convolution_backward_mask", K::Value, "convolution_backward", {"output_mask", "[1, 1]"},
       [](const Watch&) {
         convolution_backward(f32({2, 6, 7}), f32({2, 4, 9}), f32({6, 4, 3}), {}, {1}, {0}, {1},
                              false, {0}, 1, {1, 1});
       }},
      {"convolution_backward_bias_sizes", K::Value, "convolution_backward", {"[6]", "[5]"},
       [](const Watch&) {
         convolution_backward(f32({2, 6, 7}), f32({2, 4, 9}), f32({6, 4, 3}), {5}, {1}, {0}, {1},
                              false, {0}, 1, {1, 1, 1});
       }},
      {"convolution_backward_grad_dtype", K::Type, "convolution_backward", {"float64", "float32"},
       [](const Watch&) {
         convolution_backward(ones({2, 6, 7}, kFloat64), f32({2, 4, 9}), f32({6, 4, 3}), {},
                              {1}, {0}, {1}, false, {0}, 1, {1, 1, 1});
       }}};
  // clang-format on
}

}  // namespace kiln::test

// Op table: pointwise ops (functional, in-place and out= forms), Scalar overloads, type
// promotion and casts.
#include "tests/ops/op_test_util.h"

namespace kiln::test {
namespace {

// The three dispatched forms of a pointwise op, for add_pointwise.
#define KILN_PW(name) ops::op_##name, ops::op_##name##_, ops::op_##name##_out

// A 0-d ATen tensor that promotes like a C++ number, as Kiln's Scalar overloads do.
at::Tensor wrapped(const at::Scalar& s) {
  at::ScalarType t = s.isBoolean() ? at::kBool : s.isIntegral(false) ? at::kLong : at::kDouble;
  at::Tensor w = at::scalar_tensor(s, t);
  w.unsafeGetTensorImpl()->set_wrapped_number(true);
  return w;
}

// Values with many ties, for comparisons: quarter steps in [-2, 2], integers in [-3, 3].
Draw draw_coarse() {
  return [](Gen& g, const Spec& s) {
    if (g.dtype == kBool) return g.mask(s);
    if (!is_floating(g.dtype)) return g.uniform(s, g.dtype == kUInt8 ? 0 : -3, 3);
    return g.make(s, g.dtype, [&] { return static_cast<double>(g.integer(-8, 8)) / 4; });
  };
}
// pow exponents: [-2, 2] for floats (negative bases give NaN), [0, 3] for integers (ATen
// rejects negative integer powers of integers).
Draw draw_exponent() {
  return [](Gen& g, const Spec& s) {
    return is_floating(g.dtype) ? g.uniform(s, -2, 2) : g.uniform(s, 0, 3);
  };
}

// ---------------------------------------------------------------- gradcheck samples

// Broadcasting configurations for binary gradchecks: shapes of self and other.
struct Bcast {
  const char* label;
  Dims a, b;
};
const std::vector<Bcast> kBinaryShapes = {{"same", {2, 3}, {2, 3}},
                                          {"row", {3, 4}, {4}},
                                          {"outer", {3, 1}, {1, 4}},
                                          {"scalar_self", {}, {2, 3}},
                                          {"scalar_other", {2, 3}, {}}};
// In place: self keeps its shape, other broadcasts into it.
const std::vector<Bcast> kInPlaceShapes = {{"same", {2, 3}, {2, 3}}, {"row", {3, 4}, {4}}};

using Binary = std::function<Tensor(const Tensor&, const Tensor&)>;
using BinaryInPlace = std::function<void(const Tensor&, const Tensor&)>;
using GradDraw = std::function<Tensor(GradGen&, const Dims&)>;

GradDraw any_in() {
  return [](GradGen& d, const Dims& s) { return d.var(s); };
}

// A binary op's gradcheck samples on every broadcasting configuration and in place, then
// `extra`.
GradSamples binary_grads(const std::string& name, const Binary& f, const BinaryInPlace& inplace,
                         const GradDraw& da, const GradDraw& db, GradSamples extra = {}) {
  GradSamples cs;
  for (const Bcast& b : kBinaryShapes) {
    cs.push_back({name + "_" + b.label,
                  {name},
                  [=](GradGen& d) {
                    return TensorList{da(d, b.a), db(d, b.b)};
                  },
                  [=](const TensorList& x) { return TensorList{f(x[0], x[1])}; }});
  }
  for (const Bcast& b : kInPlaceShapes) {
    cs.push_back({name + "__inplace_" + b.label,
                  {name + "_"},
                  [=](GradGen& d) {
                    return TensorList{da(d, b.a), db(d, b.b)};
                  },
                  [=](const TensorList& x) {
                    Tensor self = nonleaf(x[0]);
                    inplace(self, x[1]);
                    return TensorList{self};
                  }});
  }
  cs.insert(cs.end(), extra.begin(), extra.end());
  return cs;
}

using Unary = std::function<Tensor(const Tensor&)>;
using UnaryInPlace = std::function<void(const Tensor&)>;

// A unary op's gradcheck samples: 2-d, 0-d and in place.
GradSamples unary_grads(const std::string& name, const std::string& op, const Unary& f,
                        const UnaryInPlace& inplace, const GradDraw& da) {
  GradSamples cs;
  cs.push_back({name,
                {op},
                [=](GradGen& d) {
                  return TensorList{da(d, {2, 3})};
                },
                [=](const TensorList& x) { return TensorList{f(x[0])}; }});
  cs.push_back({name + "_0d",
                {op},
                [=](GradGen& d) { return TensorList{da(d, {})}; },
                [=](const TensorList& x) { return TensorList{f(x[0])}; }});
  cs.push_back({name + "_inplace",
                {op + "_"},
                [=](GradGen& d) {
                  return TensorList{da(d, {3, 4})};
                },
                [=](const TensorList& x) {
                  Tensor self = nonleaf(x[0]);
                  inplace(self);
                  return TensorList{self};
                }});
  return cs;
}

// A sample with one input drawn by `in` and the result of `f`.
GradSample unary_sample(const std::string& name, const std::string& op,
                        std::function<KTensors(GradGen&)> in, const Unary& f) {
  return {name, {op}, std::move(in), [f](const TensorList& x) { return TensorList{f(x[0])}; }};
}

// where: the condition broadcasts too.
GradSamples where_grads() {
  GradSamples cs;
  const std::vector<std::tuple<const char*, Dims, Dims, Dims>> where_shapes = {
      {"same", {2, 3}, {2, 3}, {2, 3}},
      {"bcast", {3, 1}, {3, 4}, {4}},
      {"scalar_other", {2, 3}, {2, 3}, {}},
      {"bcast_cond", {4}, {3, 1}, {1, 4}}};
  for (const auto& [label, c, a, b] : where_shapes) {
    cs.push_back({std::string("where_") + label,
                  {"where"},
                  [c, a, b](GradGen& d) {
                    return TensorList{d.mask(c), d.var(a), d.var(b)};
                  },
                  [](const TensorList& x) { return TensorList{where(x[0], x[1], x[2])}; }});
  }
  cs.push_back({"where_scalar",
                {"where"},
                [](GradGen& d) {
                  return TensorList{d.mask({2, 3}), d.var({2, 3})};
                },
                [](const TensorList& x) { return TensorList{where(x[0], x[1], 0.5)}; }});
  return cs;
}

void add_binary_ops(Cases& cs) {
  const std::vector<Draw> two = {draw_any(), draw_any()};
  add_pointwise(
      cs,
      {.name = "add",
       .dtypes = kAllDTypes,
       .draws = two,
       .special = true,
       // A Scalar operand is a wrapped 0-d tensor that does not require grad.
       .grads = binary_grads(
           "add", [](const Tensor& a, const Tensor& b) { return add(a, b, 2.5); },
           [](const Tensor& a, const Tensor& b) { ops::op_add_(a, b, -1.5); }, any_in(), any_in(),
           {unary_sample(
               "add_scalar_alpha", "add",
               [](GradGen& d) {
                 return TensorList{d.var({2, 3})};
               },
               [](const Tensor& a) { return add(a, 1.5, 3); })}),
       // clang-format off
       .errors = {
           {"add_shape_mismatch", K::Value, "add", {"[2, 3]", "[4]"},
            [](const Watch&) { add(f32({2, 3}), f32({4})); }},
           {"add_float_alpha_on_int", K::Type, "add", {"alpha", "0.5"},
            [](const Watch&) { add(i64({3}), i64({3}), 0.5); }},
           {"add_cpu_meta", K::Device, "add", {"cpu", "meta"},
            [](const Watch&) { add(f32({2, 3}), empty({2, 3}, kFloat32, Device("meta"))); }},
           // In place and out=: the target is unchanged after the failed call.
           {"add__into_expanded", K::Value, "add_", {"single memory location"},
            [](const Watch& watch) {
              Tensor base = from_vector<float>({1, 2, 3}, {1, 3});
              watch(base);
              Tensor self = expand(base, {2, 3});
              add_(self, f32({2, 3}));
            }},
           {"add__broadcast_self", K::Value, "add_", {"[3]", "[2, 3]"},
            [](const Watch& watch) {
              Tensor self = from_vector<float>({1, 2, 3});
              watch(self);
              add_(self, f32({2, 3}));
            }},
           {"add__int_self_float_other", K::Type, "add_", {"float32", "int64"},
            [](const Watch& watch) {
              Tensor self = from_vector<int64_t>({1, 2, 3});
              watch(self);
              add_(self, from_vector<float>({0.5f, 1.5f, 2.5f}));
            }},
           {"add_out_partial_overlap", K::Value, "add_out", {"single memory location"},
            [](const Watch& watch) {
              Tensor base = arange(0, 10, 1, kFloat32);
              watch(base);
              Tensor out = slice(base, 0, 2, 8);
              add_out(out, slice(base, 0, 0, 6), f32({6}));
            }},
           {"add_out_wrong_shape", K::Value, "add_out", {"[2, 2]", "[2, 3]"},
            [](const Watch& watch) {
              Tensor out = zeros({2, 2});
              watch(out);
              add_out(out, f32({2, 3}), f32({2, 3}));
            }}}},
      // clang-format on
      KILN_PW(add), [](auto call, const KArgs& x) { return call(x[0], x[1], Scalar(2)); },
      [](const AArgs& a) { return ATensors{at::add(a[0], a[1], 2)}; });
  add_pointwise(
      cs,
      {.name = "sub",
       .dtypes = kNumericDTypes,
       .draws = two,
       .special = true,
       .grads = binary_grads(
           "sub", [](const Tensor& a, const Tensor& b) { return sub(a, b, -1.5); },
           [](const Tensor& a, const Tensor& b) { ops::op_sub_(a, b, 0.5); }, any_in(), any_in()),
       .errors = {{"sub_bool",
                   K::Type,
                   "sub",
                   {"logical_xor"},
                   [](const Watch&) { sub(ones({3}, kBool), ones({3}, kBool)); }}}},
      KILN_PW(sub), [](auto call, const KArgs& x) { return call(x[0], x[1], Scalar(2)); },
      [](const AArgs& a) { return ATensors{at::sub(a[0], a[1], 2)}; });
  add_pointwise(
      cs,
      {.name = "mul",
       .dtypes = kAllDTypes,
       .draws = two,
       .special = true,
       .grads = binary_grads(
           "mul", [](const Tensor& a, const Tensor& b) { return mul(a, b); },
           [](const Tensor& a, const Tensor& b) { ops::op_mul_(a, b); }, any_in(), any_in(),
           {unary_sample(
               "mul_same_input", "mul",
               [](GradGen& d) {
                 return TensorList{d.var({2, 3})};
               },
               [](const Tensor& a) { return mul(a, a); })}),
       .errors = {{"mul__bool_self_int_other",
                   K::Type,
                   "mul_",
                   {"int64", "bool"},
                   [](const Watch& watch) {
                     Tensor self = ones({3}, kBool);
                     watch(self);
                     mul_(self, i64({3}));
                   }},
                  {"mul_out_float_into_int",
                   K::Type,
                   "mul_out",
                   {"float32", "int64"},
                   [](const Watch& watch) {
                     Tensor out = zeros({3}, kInt64);
                     watch(out);
                     mul_out(out, f32({3}), f32({3}));
                   }}}},
      KILN_PW(mul), [](auto call, const KArgs& x) { return call(x[0], x[1]); },
      [](const AArgs& a) { return ATensors{at::mul(a[0], a[1])}; });
  add_pointwise(
      cs,
      {.name = "div",
       .dtypes = kAllDTypes,
       .draws = two,
       .result = ResultKind::Float,
       .special = true,
       .grads = binary_grads(
           "div", [](const Tensor& a, const Tensor& b) { return div(a, b); },
           [](const Tensor& a, const Tensor& b) { ops::op_div_(a, b); }, any_in(),
           [](GradGen& d, const Dims& s) { return d.away(s, 0.5); })},
      KILN_PW(div), [](auto call, const KArgs& x) { return call(x[0], x[1]); },
      [](const AArgs& a) { return ATensors{at::div(a[0], a[1])}; });
  add_pointwise(
      cs,
      {.name = "pow",
       .dtypes = kNumericDTypes,
       .draws = {draw_any(), draw_exponent()},
       .special = true,
       .grads = binary_grads(
           "pow", [](const Tensor& a, const Tensor& b) { return pow(a, b); },
           [](const Tensor& a, const Tensor& b) { ops::op_pow_(a, b); },
           [](GradGen& d, const Dims& s) { return d.pos(s); },
           [](GradGen& d, const Dims& s) { return d.var(s, -1.5, 1.5); },
           {unary_sample(
                "pow_scalar_exponent", "pow",
                [](GradGen& d) {
                  return TensorList{d.pos({2, 3})};
                },
                [](const Tensor& a) { return pow(a, 2.5); }),
            {"pow_tensor_exponent_only",
             {"pow"},
             [](GradGen& d) {
               return TensorList{d.pos({2, 3}).detach(), d.var({3})};
             },
             [](const TensorList& x) { return TensorList{pow(x[0], x[1])}; }}})},
      KILN_PW(pow), [](auto call, const KArgs& x) { return call(x[0], x[1]); },
      [](const AArgs& a) { return ATensors{at::pow(a[0], a[1])}; });
  add_pointwise(
      cs,
      {.name = "maximum",
       .dtypes = kAllDTypes,
       .draws = {draw_coarse(), draw_coarse()},
       .special = true,
       // Gradchecks on two grids that never tie.
       .grads = binary_grads(
           "maximum", [](const Tensor& a, const Tensor& b) { return maximum(a, b); },
           [](const Tensor& a, const Tensor& b) { ops::op_maximum_(a, b); },
           [](GradGen& d, const Dims& s) { return d.grid(s, 0.1); },
           [](GradGen& d, const Dims& s) { return d.grid(s, 0.35); })},
      KILN_PW(maximum), [](auto call, const KArgs& x) { return call(x[0], x[1]); },
      [](const AArgs& a) { return ATensors{at::maximum(a[0], a[1])}; });
  add_pointwise(
      cs,
      {.name = "minimum",
       .dtypes = kAllDTypes,
       .draws = {draw_coarse(), draw_coarse()},
       .special = true,
       // Gradchecks on two grids that never tie.
       .grads = binary_grads(
           "minimum", [](const Tensor& a, const Tensor& b) { return minimum(a, b); },
           [](const Tensor& a, const Tensor& b) { ops::op_minimum_(a, b); },
           [](GradGen& d, const Dims& s) { return d.grid(s, 0.1); },
           [](GradGen& d, const Dims& s) { return d.grid(s, 0.35); })},
      KILN_PW(minimum), [](auto call, const KArgs& x) { return call(x[0], x[1]); },
      [](const AArgs& a) { return ATensors{at::minimum(a[0], a[1])}; });

  const std::vector<Draw> coarse = {draw_coarse(), draw_coarse()};
  auto cmp = [&](const char* name, auto& f, auto& i, auto& o,
                 at::Tensor (*aten)(const at::Tensor&, const at::Tensor&)) {
    add_pointwise(
        cs,
        {.name = name,
         .dtypes = kAllDTypes,
         .draws = coarse,
         .result = ResultKind::Bool,
         .special = true},
        f, i, o, [](auto call, const KArgs& x) { return call(x[0], x[1]); },
        [aten](const AArgs& a) { return ATensors{aten(a[0], a[1])}; });
  };
  cmp("eq", KILN_PW(eq), &at::eq);
  cmp("ne", KILN_PW(ne), &at::ne);
  cmp("lt", KILN_PW(lt), &at::lt);
  cmp("le", KILN_PW(le), &at::le);
  cmp("gt", KILN_PW(gt), &at::gt);
  cmp("ge", KILN_PW(ge), &at::ge);
  const std::vector<Draw> sparse = {draw_sparse(), draw_sparse()};
  auto logical = [&](const char* name, auto& f, auto& i, auto& o,
                     at::Tensor (*aten)(const at::Tensor&, const at::Tensor&)) {
    add_pointwise(
        cs,
        {.name = name,
         .dtypes = kAllDTypes,
         .draws = sparse,
         .result = ResultKind::Bool,
         .special = true},
        f, i, o, [](auto call, const KArgs& x) { return call(x[0], x[1]); },
        [aten](const AArgs& a) { return ATensors{aten(a[0], a[1])}; });
  };
  logical("logical_and", KILN_PW(logical_and), &at::logical_and);
  logical("logical_or", KILN_PW(logical_or), &at::logical_or);
  logical("logical_xor", KILN_PW(logical_xor), &at::logical_xor);

  add_pointwise(
      cs,
      {.name = "where",
       .dtypes = kAllDTypes,
       .draws = {draw_mask(), draw_any(), draw_any()},
       .inplace_dtypes = std::vector<DType>{kBool},
       // where_ writes into its first argument, the condition: a bool tensor cannot hold the
       // floating result, so where_ can never record a gradient and has no gradcheck.
       .grads = where_grads(),
       .errors = {{"where_non_bool_condition",
                   K::Type,
                   "where",
                   {"int64"},
                   [](const Watch&) { where(i64({3}), f32({3}), f32({3})); }}}},
      KILN_PW(where), [](auto call, const KArgs& x) { return call(x[0], x[1], x[2]); },
      [](const AArgs& a) { return ATensors{at::where(a[0], a[1], a[2])}; });
}

// clamp's gradchecks keep 0.1 away from its bounds, with one bound, the other, and both.
GradSamples clamp_grads() {
  auto away_bounds = [](GradGen& d, const Dims& s) { return d.avoiding(s, {-0.5, 0.75}); };
  GradSamples cs;
  for (const GradSamples& g :
       {unary_grads(
            "clamp_min", "clamp", [](const Tensor& a) { return clamp(a, -0.5); },
            [](const Tensor& a) { ops::op_clamp_(a, Scalar(-0.5), std::nullopt); }, away_bounds),
        unary_grads(
            "clamp_max", "clamp", [](const Tensor& a) { return clamp(a, std::nullopt, 0.75); },
            [](const Tensor& a) { ops::op_clamp_(a, std::nullopt, Scalar(0.75)); }, away_bounds),
        unary_grads(
            "clamp_both", "clamp", [](const Tensor& a) { return clamp(a, -0.5, 0.75); },
            [](const Tensor& a) { ops::op_clamp_(a, Scalar(-0.5), Scalar(0.75)); }, away_bounds)})
    cs.insert(cs.end(), g.begin(), g.end());
  return cs;
}

void add_unary_ops(Cases& cs) {
  // A unary op's record; `grad`: its small functional and in-place rows are gradchecked too
  // (the draws keep clear of the kinks: abs and relu at 0 are hit with probability ~1e-6).
  auto unary = [&](const char* name, std::vector<DType> dtypes, Draw draw, ResultKind result,
                   bool grad, auto& f, auto& i, auto& o, at::Tensor (*aten)(const at::Tensor&),
                   std::vector<ErrorCase> errors = {}) {
    add_pointwise(
        cs,
        {.name = name,
         .dtypes = std::move(dtypes),
         .draws = {std::move(draw)},
         .result = result,
         .special = true,
         .grad = grad,
         .errors = std::move(errors)},
        f, i, o, [](auto call, const KArgs& x) { return call(x[0]); },
        [aten](const AArgs& a) { return ATensors{aten(a[0])}; });
  };
  using R = ResultKind;
  unary("neg", kNumericDTypes, draw_any(), R::Same, true, KILN_PW(neg), &at::neg,
        {{"neg_bool", K::Type, "neg", {"bool"}, [](const Watch&) { neg(ones({3}, kBool)); }}});
  unary("abs", kNumericDTypes, draw_any(), R::Same, true, KILN_PW(abs), &at::abs);
  unary("relu", kNumericDTypes, draw_any(), R::Same, true, KILN_PW(relu), &at::relu);
  unary("exp", kAllDTypes, draw_any(), R::Float, true, KILN_PW(exp), &at::exp);
  unary("log", kAllDTypes, draw_positive(), R::Float, true, KILN_PW(log), &at::log);
  unary("sqrt", kAllDTypes, draw_positive(), R::Float, true, KILN_PW(sqrt), &at::sqrt);
  unary("rsqrt", kAllDTypes, draw_positive(), R::Float, true, KILN_PW(rsqrt), &at::rsqrt);
  unary("tanh", kAllDTypes, draw_any(), R::Float, true, KILN_PW(tanh), &at::tanh);
  unary("sigmoid", kAllDTypes, draw_any(), R::Float, true, KILN_PW(sigmoid), &at::sigmoid);
  unary("sin", kAllDTypes, draw_any(), R::Float, true, KILN_PW(sin), &at::sin);
  unary("erf", kAllDTypes, draw_any(), R::Float, true, KILN_PW(erf), &at::erf);
  unary("cos", kAllDTypes, draw_any(), R::Float, true, KILN_PW(cos), &at::cos);
  unary("silu", kFloatDTypes, draw_uniform(-6, 6), R::Float, true, KILN_PW(silu), &at::silu,
        {{"silu_int", K::Type, "silu", {"int64"}, [](const Watch&) { silu(i64({3})); }}});
  unary("logical_not", kAllDTypes, draw_sparse(), R::Bool, false, KILN_PW(logical_not),
        &at::logical_not);
  add_pointwise(
      cs,
      {.name = "gelu",
       .dtypes = kFloatDTypes,
       .draws = {draw_uniform(-6, 6)},
       .special = true,
       .tag = "erf",
       .grad = true},
      KILN_PW(gelu), [](auto call, const KArgs& x) { return call(x[0], false); },
      [](const AArgs& a) {
        // gelu(+inf) = +inf (libtorch 1.13, and PyTorch on CUDA); libtorch 2.11's vectorised
        // CPU erf makes it NaN, so the reference pins it.
        at::Tensor x = a[0];
        return ATensors{at::where(x.eq(INFINITY), x, at::gelu(x, "none"))};
      });
  add_pointwise(
      cs,
      {.name = "gelu",
       .dtypes = kFloatDTypes,
       .draws = {draw_uniform(-6, 6)},
       .special = true,
       .tag = "tanh",
       .grad = true},
      KILN_PW(gelu), [](auto call, const KArgs& x) { return call(x[0], true); },
      [](const AArgs& a) { return ATensors{at::gelu(a[0], "tanh")}; });
  // gelu's backward (one fused op) against ATen's.
  for (bool tanh : {false, true}) {
    OpCase row{.name = tanh ? "gelu_backward_tanh" : "gelu_backward_erf",
               .ops = {"gelu_backward"},
               .dtypes = kFloatDTypes,
               .make = make_from({draw_any(), draw_uniform(-6, 6)}, {Spec{{7, 9}}, Spec{{7, 9}}}),
               .kiln = [tanh](const KArgs& x) { return KTensors{gelu_backward(x[0], x[1], tanh)}; },
               .aten =
                   [tanh](const AArgs& a) {
                     return ATensors{at::gelu_backward(a[0], a[1], tanh ? "tanh" : "none")};
                   }};
    if (!tanh)
      row.errors = {{"gelu_backward_shape",
                     K::Value,
                     "gelu_backward",
                     {"[2, 3]", "[3, 2]"},
                     [](const Watch&) {
                       gelu_backward(f32({2, 3}), f32({3, 2}));
                     }},
                    {"gelu_backward_int", K::Type, "gelu_backward", {"int64"}, [](const Watch&) {
                       gelu_backward(i64({3}), i64({3}));
                     }}};
    cs.push_back(row);
    if (!tanh)
      cs.push_back(out_variant(row, "gelu_backward_out", [](const KArgs& x) {
        ops::op_gelu_backward_out(x.out, x[0], x[1], false);
        return KTensors{x.out};
      }));
  }
  // relu's backward (threshold_backward) against ATen's: a threshold inside the values (on
  // transposed and strided operands too), relu's results at 0 (exact zeros on the boundary) and
  // NaN, infinities and signed zeros on both sides (a NaN self lets grad through).
  {
    auto kiln_at = [](double th) {
      return [th](const KArgs& x) { return KTensors{threshold_backward(x[0], x[1], th)}; };
    };
    auto aten_at = [](double th) {
      return [th](const AArgs& a) { return ATensors{at::threshold_backward(a[0], a[1], th)}; };
    };
    OpCase row{.name = "threshold_backward",
               .ops = {"threshold_backward"},
               .dtypes = kFloatDTypes,
               .make = make_from({draw_any(), draw_uniform(-2, 2)}, {Spec{{7, 9}}, Spec{{7, 9}}}),
               .kiln = kiln_at(0.5),
               .aten = aten_at(0.5)};
    row.errors = {{"threshold_backward_shape",
                   K::Value,
                   "threshold_backward",
                   {"[2, 3]", "[3, 2]"},
                   [](const Watch&) {
                     threshold_backward(f32({2, 3}), f32({3, 2}), 0);
                   }},
                  {"threshold_backward_int",
                   K::Type,
                   "threshold_backward",
                   {"int64"},
                   [](const Watch&) { threshold_backward(i64({3}), i64({3}), 0); }},
                  {"threshold_backward_dtypes",
                   K::Type,
                   "threshold_backward",
                   {"float64", "float32"},
                   [](const Watch&) { threshold_backward(ones({3}, kFloat64), f32({3}), 0); }}};
    cs.push_back(row);
    cs.push_back(out_variant(row, "threshold_backward_out", [](const KArgs& x) {
      ops::op_threshold_backward_out(x.out, x[0], x[1], 0.5);
      return KTensors{x.out};
    }));
    cs.push_back(
        {.name = "threshold_backward_strided",
         .ops = {"threshold_backward"},
         .dtypes = kFloatDTypes,
         .make = make_from({draw_any(), draw_uniform(-2, 2)},
                           {Spec{{40, 33}, Layout::Transposed}, Spec{{40, 33}, Layout::Strided}}),
         .kiln = kiln_at(-0.25),
         .aten = aten_at(-0.25)});
    cs.push_back(
        {.name = "threshold_backward_relu_result",
         .ops = {"threshold_backward", "relu"},
         .dtypes = kFloatDTypes,
         .make = make_from({draw_any(), draw_any()}, {Spec{{300, 129}}, Spec{{300, 129}}}),
         .kiln = [](const KArgs& x) { return KTensors{threshold_backward(x[0], relu(x[1]), 0)}; },
         .aten =
             [](const AArgs& a) {
               return ATensors{at::threshold_backward(a[0], at::relu(a[1]), 0)};
             }});
    const Dims n{static_cast<int64_t>(special_values().size())};
    Draw special = [](Gen& g, const Spec& s) {
      std::vector<double> v = special_values();
      std::shuffle(v.begin(), v.end(), g.rng);
      return g.values(v, s.shape);
    };
    // A threshold between two float16 (and two bfloat16) values, with self on and around it:
    // self and the threshold compare unrounded, as ATen's CPU kernel compares them.
    cs.push_back({.name = "threshold_backward_unrounded",
                  .ops = {"threshold_backward"},
                  .dtypes = kFloatDTypes,
                  .make =
                      [](Gen& g) {
                        const std::vector<double> v = {0.69921875, 0.7001953125, 0.7, 0.5,
                                                       0.6999,     0.7002,       1.0, -0.7};
                        return KTensors{g.values({1, 2, 3, 4, 5, 6, 7, 8}, {8}), g.values(v, {8})};
                      },
                  .kiln = kiln_at(0.7),
                  .aten = aten_at(0.7)});
    cs.push_back({.name = "threshold_backward_special",
                  .ops = {"threshold_backward"},
                  .dtypes = kFloatDTypes,
                  .make = make_from({special, special}, {Spec{n}, Spec{n}}),
                  .kiln = kiln_at(0),
                  .aten = aten_at(0)});
  }
  add_pointwise(
      cs,
      {.name = "clamp",
       .dtypes = kNumericDTypes,
       .draws = {draw_uniform(-9, 9)},
       .special = true,
       .grads = clamp_grads(),
       .errors = {{"clamp_no_bounds",
                   K::Value,
                   "clamp",
                   {"min", "max"},
                   [](const Watch&) { clamp(f32({3}), std::nullopt, std::nullopt); }}}},
      KILN_PW(clamp),
      [](auto call, const KArgs& x) { return call(x[0], OptScalar(1), OptScalar(5)); },
      [](const AArgs& a) { return ATensors{at::clamp(a[0], 1, 5)}; });
}

// Rows calling the public API: Scalar overloads, operators, public in-place and out= wrappers.
void add_public_api(Cases& cs) {
  auto one = [](Draw d, Spec s) { return make_from({std::move(d)}, {std::move(s)}); };
  auto two = [](Draw d0, Spec s0, Draw d1, Spec s1) {
    return make_from({std::move(d0), std::move(d1)}, {std::move(s0), std::move(s1)});
  };
  const Spec m{{3, 5}}, mt{{3, 5}, Layout::Transposed};
  struct ScalarRow {
    const char* name;
    const char* op;
    std::vector<DType> dtypes;
    Draw draw;
    std::function<Tensor(const Tensor&)> kiln;
    std::function<at::Tensor(const at::Tensor&)> aten;
  };
  const std::vector<ScalarRow> scalar_rows = {
      {"add_scalar_int", "add", kAllDTypes, draw_any(),
       [](const Tensor& t) { return add(t, 3, 2); },
       [](const at::Tensor& t) { return at::add(t, 3, 2); }},
      {"add_scalar_float", "add", kAllDTypes, draw_any(),
       [](const Tensor& t) { return add(t, 2.5); },
       [](const at::Tensor& t) { return at::add(t, 2.5); }},
      {"add_scalar_float_alpha", "add", kFloatDTypes, draw_any(),
       [](const Tensor& t) { return add(t, 2.5, 0.5); },
       [](const at::Tensor& t) { return at::add(t, 2.5, 0.5); }},
      {"add_scalar_bool", "add", kAllDTypes, draw_any(),
       [](const Tensor& t) { return add(t, true); },
       [](const at::Tensor& t) { return at::add(t, true); }},
      {"sub_scalar_int", "sub", kNumericDTypes, draw_any(),
       [](const Tensor& t) { return sub(t, 3, 2); },
       [](const at::Tensor& t) { return at::sub(t, 3, 2); }},
      {"sub_scalar_float", "sub", kNumericDTypes, draw_any(),
       [](const Tensor& t) { return sub(t, 0.75); },
       [](const at::Tensor& t) { return at::sub(t, 0.75); }},
      {"rsub_operator", "sub", kNumericDTypes, draw_any(), [](const Tensor& t) { return 2 - t; },
       [](const at::Tensor& t) { return at::sub(wrapped(2), t); }},
      {"mul_scalar_int", "mul", kAllDTypes, draw_any(), [](const Tensor& t) { return mul(t, 3); },
       [](const at::Tensor& t) { return at::mul(t, 3); }},
      {"mul_scalar_float", "mul", kAllDTypes, draw_any(), [](const Tensor& t) { return t * 1.5; },
       [](const at::Tensor& t) { return at::mul(t, 1.5); }},
      {"div_scalar_int", "div", kAllDTypes, draw_any(), [](const Tensor& t) { return div(t, 4); },
       [](const at::Tensor& t) { return at::div(t, 4); }},
      {"div_scalar_float", "div", kAllDTypes, draw_any(), [](const Tensor& t) { return t / 0.3; },
       [](const at::Tensor& t) { return at::div(t, 0.3); }},
      {"rdiv_operator", "div", kAllDTypes, draw_positive(), [](const Tensor& t) { return 2.0 / t; },
       [](const at::Tensor& t) { return at::div(wrapped(2.0), t); }},
      {"neg_operator", "neg", kNumericDTypes, draw_any(), [](const Tensor& t) { return -t; },
       [](const at::Tensor& t) { return at::neg(t); }},
      {"add_operator_tensor", "add", kAllDTypes, draw_any(), [](const Tensor& t) { return t + t; },
       [](const at::Tensor& t) { return at::add(t, t); }},
      {"pow_scalar_2", "pow", kNumericDTypes, draw_any(), [](const Tensor& t) { return pow(t, 2); },
       [](const at::Tensor& t) { return at::pow(t, 2); }},
      {"pow_scalar_half", "pow", kFloatDTypes, draw_positive(),
       [](const Tensor& t) { return pow(t, 0.5); },
       [](const at::Tensor& t) { return at::pow(t, 0.5); }},
      {"pow_scalar_float_on_int", "pow", kIntDTypes, draw_positive(),
       [](const Tensor& t) { return pow(t, 1.5); },
       [](const at::Tensor& t) { return at::pow(t, 1.5); }},
      {"eq_scalar", "eq", kAllDTypes, draw_coarse(), [](const Tensor& t) { return eq(t, 1); },
       [](const at::Tensor& t) { return at::eq(t, 1); }},
      {"ne_scalar", "ne", kAllDTypes, draw_coarse(), [](const Tensor& t) { return ne(t, 1); },
       [](const at::Tensor& t) { return at::ne(t, 1); }},
      {"lt_scalar_float", "lt", kAllDTypes, draw_coarse(),
       [](const Tensor& t) { return lt(t, 0.5); },
       [](const at::Tensor& t) { return at::lt(t, 0.5); }},
      {"le_scalar", "le", kAllDTypes, draw_coarse(), [](const Tensor& t) { return le(t, 1); },
       [](const at::Tensor& t) { return at::le(t, 1); }},
      {"gt_scalar_float", "gt", kAllDTypes, draw_coarse(),
       [](const Tensor& t) { return gt(t, -0.5); },
       [](const at::Tensor& t) { return at::gt(t, -0.5); }},
      {"ge_scalar", "ge", kAllDTypes, draw_coarse(), [](const Tensor& t) { return ge(t, 0); },
       [](const at::Tensor& t) { return at::ge(t, 0); }},
      {"clamp_float_bounds", "clamp", kFloatDTypes, draw_any(),
       [](const Tensor& t) { return clamp(t, -0.5, 0.75); },
       [](const at::Tensor& t) { return at::clamp(t, -0.5, 0.75); }},
      {"clamp_min_only", "clamp", kNumericDTypes, draw_any(),
       [](const Tensor& t) { return clamp(t, 1, std::nullopt); },
       [](const at::Tensor& t) { return at::clamp(t, 1, c10::nullopt); }},
      {"clamp_max_only", "clamp", kNumericDTypes, draw_any(),
       [](const Tensor& t) { return clamp(t, std::nullopt, 1); },
       [](const at::Tensor& t) { return at::clamp(t, c10::nullopt, 1); }},
      {"clamp_float_bound_on_int", "clamp", kIntDTypes, draw_any(),
       [](const Tensor& t) { return clamp(t, 0.5, std::nullopt); },
       [](const at::Tensor& t) { return at::clamp(t, 0.5, c10::nullopt); }},
      {"cast_function", "to_copy", kAllDTypes, draw_any(),
       [](const Tensor& t) { return cast(t, kFloat64); },
       [](const at::Tensor& t) { return t.to(at::kDouble); }},
  };
  for (const ScalarRow& r : scalar_rows)
    for (const auto& [label, spec] : {std::pair{"", m}, std::pair{"_noncontig", mt}}) {
      auto kf = r.kiln;
      auto af = r.aten;
      cs.push_back({.name = r.name + std::string(label),
                    .ops = {r.op},
                    .dtypes = r.dtypes,
                    .make = one(r.draw, spec),
                    .kiln = [kf](const KArgs& x) { return KTensors{kf(x[0])}; },
                    .aten = [af](const AArgs& a) { return ATensors{af(a[0])}; }});
    }
  cs.push_back({.name = "where_scalar_other",
                .ops = {"where"},
                .dtypes = kAllDTypes,
                .make = two(draw_mask(), Spec{{3, 1}}, draw_any(), mt),
                .kiln = [](const KArgs& x) { return KTensors{where(x[0], x[1], 0.5)}; },
                .aten = [](const AArgs& a) { return ATensors{at::where(a[0], a[1], 0.5)}; }});
  // Runs longer than the CPU engine's 64-element chunks for broadcast operands (relu's backward).
  cs.push_back({.name = "where_scalar_other_long",
                .ops = {"where"},
                .dtypes = kAllDTypes,
                .make = two(draw_mask(), Spec{{5, 70}}, draw_any(), Spec{{5, 70}}),
                .kiln = [](const KArgs& x) { return KTensors{where(x[0], x[1], 0.5)}; },
                .aten = [](const AArgs& a) { return ATensors{at::where(a[0], a[1], 0.5)}; }});
  cs.push_back({.name = "masked_fill",
                .ops = {"where"},
                .dtypes = kAllDTypes,
                .make = two(draw_any(), mt, draw_mask(), Spec{{5}}),
                .kiln = [](const KArgs& x) { return KTensors{masked_fill(x[0], x[1], 1)}; },
                .aten = [](const AArgs& a) { return ATensors{at::masked_fill(a[0], a[1], 1)}; }});
  cs.push_back(
      {.name = "masked_fill_float_value",
       .ops = {"where"},
       .dtypes = kFloatDTypes,
       .make = two(draw_any(), m, draw_mask(), m),
       .kiln = [](const KArgs& x) { return KTensors{masked_fill(x[0], x[1], -1e4)}; },
       .aten = [](const AArgs& a) { return ATensors{at::masked_fill(a[0], a[1], -1e4)}; }});

  // Public in-place wrappers; the reference is the functional result cast to self's dtype.
  struct InPlaceRow {
    const char* name;
    const char* op;
    std::vector<DType> dtypes;
    MakeFn make;
    std::function<void(Tensor&, const KArgs&)> kiln;
    AtenFn aten;
  };
  const Spec self_t{{4, 3}, Layout::Transposed};
  auto self_other = two(draw_any(), self_t, draw_any(), Spec{{3}});
  auto self_pos = one(draw_positive(), self_t);
  auto self_only = one(draw_any(), self_t);
  const std::vector<InPlaceRow> inplace_rows = {
      {"add__public", "add_", kNumericDTypes, self_other,
       [](Tensor& s, const KArgs& x) { add_(s, x[1], 3); },
       [](const AArgs& a) { return ATensors{at::add(a[0], a[1], 3)}; }},
      {"add__public_float_alpha", "add_", kFloatDTypes, self_other,
       [](Tensor& s, const KArgs& x) { add_(s, x[1], 0.5); },
       [](const AArgs& a) { return ATensors{at::add(a[0], a[1], 0.5)}; }},
      {"add__public_scalar", "add_", kNumericDTypes, self_only,
       [](Tensor& s, const KArgs&) { add_(s, 4, 2); },
       [](const AArgs& a) { return ATensors{at::add(a[0], 4, 2)}; }},
      {"sub__public", "sub_", kNumericDTypes, self_other,
       [](Tensor& s, const KArgs& x) { sub_(s, x[1], 2); },
       [](const AArgs& a) { return ATensors{at::sub(a[0], a[1], 2)}; }},
      {"mul__public", "mul_", kAllDTypes, self_other,
       [](Tensor& s, const KArgs& x) { mul_(s, x[1]); },
       [](const AArgs& a) { return ATensors{at::mul(a[0], a[1])}; }},
      {"mul__public_scalar", "mul_", kNumericDTypes, self_only,
       [](Tensor& s, const KArgs&) { mul_(s, 3); },
       [](const AArgs& a) { return ATensors{at::mul(a[0], 3)}; }},
      {"div__public", "div_", kFloatDTypes, self_other,
       [](Tensor& s, const KArgs& x) { div_(s, x[1]); },
       [](const AArgs& a) { return ATensors{at::div(a[0], a[1])}; }},
      {"div__public_scalar", "div_", kFloatDTypes, self_only,
       [](Tensor& s, const KArgs&) { div_(s, 0.3); },
       [](const AArgs& a) { return ATensors{at::div(a[0], 0.3)}; }},
      {"clamp__public", "clamp_", kNumericDTypes, self_only,
       [](Tensor& s, const KArgs&) { clamp_(s, 0, 1); },
       [](const AArgs& a) { return ATensors{at::clamp(a[0], 0, 1)}; }},
      {"relu__public", "relu_", kNumericDTypes, self_only,
       [](Tensor& s, const KArgs&) { relu_(s); },
       [](const AArgs& a) { return ATensors{at::relu(a[0])}; }},
      {"sqrt__public", "sqrt_", kFloatDTypes, self_pos, [](Tensor& s, const KArgs&) { sqrt_(s); },
       [](const AArgs& a) { return ATensors{at::sqrt(a[0])}; }},
      {"neg__public", "neg_", kNumericDTypes, self_only, [](Tensor& s, const KArgs&) { neg_(s); },
       [](const AArgs& a) { return ATensors{at::neg(a[0])}; }},
      {"exp__public", "exp_", kFloatDTypes, self_only, [](Tensor& s, const KArgs&) { exp_(s); },
       [](const AArgs& a) { return ATensors{at::exp(a[0])}; }},
      {"addcmul_", "foreach_addcmul_", kNumericDTypes,
       make_from({draw_any(), draw_any(), draw_any()},
                 {self_t, Spec{{4, 3}, Layout::Strided}, Spec{{4, 3}}}),
       [](Tensor& s, const KArgs& x) { addcmul_(s, x[1], x[2], 2); },
       [](const AArgs& a) { return ATensors{at::addcmul(a[0], a[1], a[2], 2)}; }},
      {"addcmul__float_value", "foreach_addcmul_", kFloatDTypes,
       make_from({draw_any(), draw_any(), draw_any()}, {Spec{{3, 4}}, Spec{{3, 4}}, Spec{{3, 4}}}),
       [](Tensor& s, const KArgs& x) { addcmul_(s, x[1], x[2], 0.5); },
       [](const AArgs& a) { return ATensors{at::addcmul(a[0], a[1], a[2], 0.5)}; }},
      {"addcmul__bcast", "foreach_addcmul_", kFloatDTypes,
       make_from({draw_any(), draw_any(), draw_any()}, {Spec{{3, 4}}, Spec{{4}}, Spec{{3, 1}}}),
       [](Tensor& s, const KArgs& x) { addcmul_(s, x[1], x[2], 0.5); },
       [](const AArgs& a) { return ATensors{at::addcmul(a[0], a[1], a[2], 0.5)}; }},
      {"addcdiv_", "foreach_addcdiv_", kFloatDTypes,
       make_from({draw_any(), draw_any(), draw_positive()},
                 {self_t, Spec{{4, 3}}, Spec{{4, 3}, Layout::Strided}}),
       [](Tensor& s, const KArgs& x) { addcdiv_(s, x[1], x[2], 0.5); },
       [](const AArgs& a) { return ATensors{at::addcdiv(a[0], a[1], a[2], 0.5)}; }},
      {"lerp_", "foreach_lerp_", kFloatDTypes, two(draw_any(), self_t, draw_any(), Spec{{4, 3}}),
       [](Tensor& s, const KArgs& x) { lerp_(s, x[1], 0.3); },
       [](const AArgs& a) { return ATensors{at::lerp(a[0], a[1], 0.3)}; }},
  };
  for (const InPlaceRow& r : inplace_rows) {
    auto kf = r.kiln;
    cs.push_back({.name = r.name,
                  .ops = {r.op},
                  .dtypes = r.dtypes,
                  .make = r.make,
                  .kiln =
                      [kf](const KArgs& x) {
                        Tensor self = x[0];
                        kf(self, x);
                        return KTensors{self};
                      },
                  .aten = r.aten,
                  .mode = Mode::InPlace});
  }

  // Public out= wrappers, into a transposed out.
  auto out_row = [&](const char* name, const char* op, std::vector<DType> dtypes,
                     std::function<void(Tensor&, const KArgs&)> kf, AtenFn af) {
    cs.push_back(
        {.name = name,
         .ops = {op},
         .dtypes = std::move(dtypes),
         .make = two(draw_any(), Spec{{4, 1, 5}}, draw_any(), Spec{{3, 1}, Layout::Expanded}),
         .kiln =
             [kf](const KArgs& x) {
               Tensor out = x.out;
               kf(out, x);
               return KTensors{out};
             },
         .aten = std::move(af),
         .mode = Mode::Out,
         .out_layout = Layout::Transposed});
  };
  out_row(
      "add_out_public", "add_out", kNumericDTypes,
      [](Tensor& o, const KArgs& x) { add_out(o, x[0], x[1], 2); },
      [](const AArgs& a) { return ATensors{at::add(a[0], a[1], 2)}; });
  out_row(
      "sub_out_public", "sub_out", kNumericDTypes,
      [](Tensor& o, const KArgs& x) { sub_out(o, x[0], x[1], 2); },
      [](const AArgs& a) { return ATensors{at::sub(a[0], a[1], 2)}; });
  out_row(
      "mul_out_public", "mul_out", kAllDTypes,
      [](Tensor& o, const KArgs& x) { mul_out(o, x[0], x[1]); },
      [](const AArgs& a) { return ATensors{at::mul(a[0], a[1])}; });
  out_row(
      "div_out_public", "div_out", kAllDTypes,
      [](Tensor& o, const KArgs& x) { div_out(o, x[0], x[1]); },
      [](const AArgs& a) { return ATensors{at::div(a[0], a[1])}; });
}

// Mixed-dtype rows: the result dtype and values follow PyTorch's promotion (tensors by dtype
// category, 0-d tensors below dimensioned ones, C++ numbers below both).
void add_promotion(Cases& cs) {
  struct Mixed {
    const char* name;
    DType da;
    Dims sa;
    DType db;
    Dims sb;
  };
  const std::vector<Mixed> pairs = {
      {"i32_f64", kInt32, {3, 4}, kFloat64, {3, 4}},  {"bool_i32", kBool, {3, 4}, kInt32, {4}},
      {"u8_i32", kUInt8, {3, 4}, kInt32, {3, 4}},     {"u8_bool", kUInt8, {5}, kBool, {5}},
      {"i64_f16", kInt64, {3, 4}, kFloat16, {3, 4}},  {"f16_bf16", kFloat16, {6}, kBFloat16, {6}},
      {"f32_f64", kFloat32, {2, 3}, kFloat64, {3}},   {"0d_f64_1d_i32", kFloat64, {}, kInt32, {5}},
      {"0d_f64_1d_f32", kFloat64, {}, kFloat32, {5}}, {"0d_i64_1d_u8", kInt64, {}, kUInt8, {5}},
      {"0d_f16_1d_i64", kFloat16, {}, kInt64, {5}},   {"0d_i32_0d_f16", kInt32, {}, kFloat16, {}},
      {"1d_bool_0d_f32", kBool, {5}, kFloat32, {}},   {"i32_u8_0d", kInt32, {4}, kUInt8, {}},
  };
  for (const Mixed& p : pairs) {
    MakeFn make = [p](Gen& g) {
      return KTensors{g.any(Spec{p.sa}, p.da), g.positive(Spec{p.sb}, p.db)};
    };
    cs.push_back({.name = std::string("promote_add_") + p.name,
                  .ops = {"add"},
                  .make = make,
                  .kiln = [](const KArgs& x) { return KTensors{add(x[0], x[1])}; },
                  .aten = [](const AArgs& a) { return ATensors{at::add(a[0], a[1])}; }});
    cs.push_back({.name = std::string("promote_div_") + p.name,
                  .ops = {"div"},
                  .make = make,
                  .kiln = [](const KArgs& x) { return KTensors{div(x[0], x[1])}; },
                  .aten = [](const AArgs& a) { return ATensors{at::div(a[0], a[1])}; }});
    cs.push_back({.name = std::string("promote_lt_") + p.name,
                  .ops = {"lt"},
                  .make = make,
                  .kiln = [](const KArgs& x) { return KTensors{lt(x[0], x[1])}; },
                  .aten = [](const AArgs& a) { return ATensors{at::lt(a[0], a[1])}; }});
    cs.push_back({.name = std::string("promote_where_") + p.name,
                  .ops = {"where"},
                  .make =
                      [make](Gen& g) {
                        KTensors in = make(g);
                        in.insert(in.begin(), g.mask(Spec{{1}}));
                        return in;
                      },
                  .kiln = [](const KArgs& x) { return KTensors{where(x[0], x[1], x[2])}; },
                  .aten = [](const AArgs& a) { return ATensors{at::where(a[0], a[1], a[2])}; }});
  }
  auto scalar_row = [&](const char* name, DType d, std::function<Tensor(const Tensor&)> kf,
                        std::function<at::Tensor(const at::Tensor&)> af, const char* op) {
    cs.push_back({.name = name,
                  .ops = {op},
                  .make =
                      [d](Gen& g) {
                        return KTensors{g.any(Spec{{3, 4}}, d)};
                      },
                  .kiln = [kf](const KArgs& x) { return KTensors{kf(x[0])}; },
                  .aten = [af](const AArgs& a) { return ATensors{af(a[0])}; }});
  };
  scalar_row(
      "promote_i64_plus_float", kInt64, [](const Tensor& t) { return t + 2.5; },
      [](const at::Tensor& t) { return at::add(t, 2.5); }, "add");
  scalar_row(
      "promote_u8_plus_300", kUInt8, [](const Tensor& t) { return t + 300; },
      [](const at::Tensor& t) { return at::add(t, 300); }, "add");
  scalar_row(
      "promote_bool_plus_int", kBool, [](const Tensor& t) { return t + 2; },
      [](const at::Tensor& t) { return at::add(t, 2); }, "add");
  scalar_row(
      "promote_bool_times_float", kBool, [](const Tensor& t) { return t * 2.5; },
      [](const at::Tensor& t) { return at::mul(t, 2.5); }, "mul");
  scalar_row(
      "promote_f16_times_float", kFloat16, [](const Tensor& t) { return t * 2.5; },
      [](const at::Tensor& t) { return at::mul(t, 2.5); }, "mul");
  scalar_row(
      "promote_i32_div_int", kInt32, [](const Tensor& t) { return t / 4; },
      [](const at::Tensor& t) { return at::div(t, 4); }, "div");
  scalar_row(
      "promote_i32_where_float", kInt32, [](const Tensor& t) { return where(gt(t, 0), t, 0.5); },
      [](const at::Tensor& t) { return at::where(at::gt(t, 0), t, 0.5); }, "where");
  scalar_row(
      "promote_f16_where_float", kFloat16, [](const Tensor& t) { return where(gt(t, 0), t, 0.5); },
      [](const at::Tensor& t) { return at::where(at::gt(t, 0), t, 0.5); }, "where");

  // In place: computed in the promoted dtype, cast to self's.
  struct InPlaceMixed {
    const char* name;
    DType self, other;
  };
  for (const InPlaceMixed& p : std::vector<InPlaceMixed>{{"f16_f32", kFloat16, kFloat32},
                                                         {"f32_i64", kFloat32, kInt64},
                                                         {"f32_f64", kFloat32, kFloat64},
                                                         {"i64_bool", kInt64, kBool},
                                                         {"bf16_f16", kBFloat16, kFloat16},
                                                         {"i32_u8", kInt32, kUInt8}}) {
    cs.push_back({.name = std::string("promote_add__") + p.name,
                  .ops = {"add_"},
                  .make =
                      [p](Gen& g) {
                        return KTensors{g.any(Spec{{3, 4}}, p.self), g.any(Spec{{4}}, p.other)};
                      },
                  .kiln =
                      [](const KArgs& x) {
                        Tensor s = x[0];
                        add_(s, x[1]);
                        return KTensors{s};
                      },
                  .aten = [](const AArgs& a) { return ATensors{at::add(a[0], a[1])}; },
                  .mode = Mode::InPlace});
    cs.push_back({.name = std::string("promote_mul__") + p.name,
                  .ops = {"mul_"},
                  .make =
                      [p](Gen& g) {
                        return KTensors{g.any(Spec{{3, 4}}, p.self), g.any(Spec{{}}, p.other)};
                      },
                  .kiln =
                      [](const KArgs& x) {
                        Tensor s = x[0];
                        mul_(s, x[1]);
                        return KTensors{s};
                      },
                  .aten = [](const AArgs& a) { return ATensors{at::mul(a[0], a[1])}; },
                  .mode = Mode::InPlace});
  }
}

// t.to(dtype) for every (source, target) pair: the rows are per target, their dtypes the
// sources. Values avoid undefined conversions (negative or huge floats to integers).
void add_casts(Cases& cs) {
  const std::vector<std::pair<const char*, Spec>> configs = {
      {"contig", Spec{{4, 6}}},
      {"noncontig", Spec{{6, 4}, Layout::Transposed}},
      {"strided", Spec{{3, 5}, Layout::Strided}},
      {"0d", Spec{{}}},
      {"zero", Spec{{0, 2}}},
      {"large", Spec{{200, 180}}}};
  for (DType to : kAllDTypes)
    for (const auto& [label, spec] : configs) {
      Spec s = spec;
      cs.push_back({.name = fmt::format("cast_to_{}_{}", name(to), label),
                    .ops = {"to_copy"},
                    .dtypes = kAllDTypes,
                    .make =
                        [s, to](Gen& g) {
                          double lo = to == kUInt8 ? 0 : -50;
                          return KTensors{g.uniform(s, lo, 50)};
                        },
                    .kiln = [to](const KArgs& x) { return KTensors{x[0].to(to)}; },
                    .aten = [to](const AArgs& a) { return ATensors{a[0].to(to_aten(to))}; },
                    .tol = Tol::Exact});
    }
  for (DType to : kFloatDTypes)
    cs.push_back({.name = fmt::format("cast_to_{}_special", name(to)),
                  .ops = {"to_copy"},
                  .dtypes = kFloatDTypes,
                  .make = [](Gen& g) { return KTensors{g.values(special_values(), {23})}; },
                  .kiln = [to](const KArgs& x) { return KTensors{x[0].to(to)}; },
                  .aten = [to](const AArgs& a) { return ATensors{a[0].to(to_aten(to))}; },
                  .tol = Tol::Exact});
  // Rounding to the 16-bit floats: values between representable neighbours.
  for (DType to : {kFloat16, kBFloat16})
    cs.push_back({.name = fmt::format("cast_to_{}_rounding", name(to)),
                  .ops = {"to_copy"},
                  .dtypes = {kFloat32, kFloat64},
                  .make = [](Gen& g) { return KTensors{g.uniform(Spec{{1000}}, -70000, 70000)}; },
                  .kiln = [to](const KArgs& x) { return KTensors{x[0].to(to)}; },
                  .aten = [to](const AArgs& a) { return ATensors{a[0].to(to_aten(to))}; },
                  .tol = Tol::Exact});
}

#undef KILN_PW

}  // namespace

Cases pointwise_math_cases();  // op_test_pointwise_math.cpp

Cases pointwise_cases() {
  Cases cs;
  add_binary_ops(cs);
  add_unary_ops(cs);
  for (OpCase& c : pointwise_math_cases()) cs.push_back(std::move(c));
  add_public_api(cs);
  add_promotion(cs);
  add_casts(cs);
  return cs;
}

}  // namespace kiln::test

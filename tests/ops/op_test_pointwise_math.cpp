// Op table: the pointwise ops of issue 16's batch (trigonometric and hyperbolic functions,
// logarithms, rounding, predicates, hardtanh and leaky_relu), part of the pointwise group
// (pointwise_cases() in op_test_pointwise.cpp appends these).
#include "tests/ops/op_test_util.h"

namespace kiln::test {
namespace {

// The three dispatched forms of a pointwise op, for add_pointwise.
#define KILN_PW(name) ops::op_##name, ops::op_##name##_, ops::op_##name##_out

using R = ResultKind;
using GradDraw = std::function<Tensor(GradGen&, const Dims&)>;
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

// Rounding inputs: half the elements on the quarter grid of [-4, 4] (ties for round, whole
// numbers for ceil and floor), the rest uniform; integers as any().
Draw draw_quarters() {
  return [](Gen& g, const Spec& s) {
    if (!is_floating(g.dtype)) return g.any(s);
    return g.make(s, g.dtype, [&] {
      return g.integer(0, 1) ? static_cast<double>(g.integer(-16, 16)) / 4 : g.real(-4, 4);
    });
  };
}
// Gradcheck inputs kept 0.1 away from every jump of ceil, floor, round, trunc and sign.
GradDraw away_from_halves() {
  return [](GradGen& d, const Dims& s) {
    return d.avoiding(s, {-2, -1.5, -1, -0.5, 0, 0.5, 1, 1.5, 2});
  };
}

void add_float_unary(Cases& cs) {
  auto unary = [&](const char* name, Draw draw, auto& f, auto& i, auto& o,
                   at::Tensor (*aten)(const at::Tensor&), std::vector<ErrorCase> errors = {}) {
    add_pointwise(
        cs,
        {.name = name,
         .dtypes = kAllDTypes,
         .draws = {std::move(draw)},
         .result = R::Float,
         .special = true,
         .grad = true,
         .errors = std::move(errors)},
        f, i, o, [](auto call, const KArgs& x) { return call(x[0]); },
        [aten](const AArgs& a) { return ATensors{aten(a[0])}; });
  };
  // Inside the domains, and for the gradchecks away from the poles of the derivatives.
  unary("acos", draw_uniform(-0.9, 0.9), KILN_PW(acos), &at::acos,
        {{"acos_out_wrong_shape",
          K::Value,
          "acos_out",
          {"[2, 2]", "[2, 3]"},
          [](const Watch& watch) {
            Tensor out = zeros({2, 2});
            watch(out);
            ops::op_acos_out(out, f32({2, 3}));
          }},
         {"acos__int_self", K::Type, "acos_", {"float32", "int64"}, [](const Watch& watch) {
            Tensor self = i64({3});
            watch(self);
            acos_(self);
          }}});
  unary("acosh", draw_uniform(1.1, 5), KILN_PW(acosh), &at::acosh);
  unary("asin", draw_uniform(-0.9, 0.9), KILN_PW(asin), &at::asin);
  unary("asinh", draw_any(), KILN_PW(asinh), &at::asinh);
  unary("atan", draw_any(), KILN_PW(atan), &at::atan);
  unary("atanh", draw_uniform(-0.9, 0.9), KILN_PW(atanh), &at::atanh);
  unary("cosh", draw_any(), KILN_PW(cosh), &at::cosh);
  unary("sinh", draw_any(), KILN_PW(sinh), &at::sinh);
  unary("tan", draw_uniform(-1.4, 1.4), KILN_PW(tan), &at::tan);
  unary("expm1", draw_any(), KILN_PW(expm1), &at::expm1);
  unary("log1p", draw_uniform(-0.9, 5), KILN_PW(log1p), &at::log1p);
  unary("log2", draw_positive(), KILN_PW(log2), &at::log2);
  unary("log10", draw_positive(), KILN_PW(log10), &at::log10);
  unary("reciprocal", draw_positive(), KILN_PW(reciprocal), &at::reciprocal);
  // reciprocal of negative numbers and of integer zeros (inf, as ATen).
  add_pointwise(
      cs,
      {.name = "reciprocal",
       .dtypes = kAllDTypes,
       .draws = {draw_any()},
       .result = R::Float,
       .tag = "signed"},
      KILN_PW(reciprocal), [](auto call, const KArgs& x) { return call(x[0]); },
      [](const AArgs& a) { return ATensors{at::reciprocal(a[0])}; });
}

void add_rounding(Cases& cs) {
  auto rounding = [&](const char* name, auto& f, auto& i, auto& o,
                      at::Tensor (*aten)(const at::Tensor&), Unary kf, UnaryInPlace ki) {
    add_pointwise(
        cs,
        {.name = name,
         .dtypes = kNumericDTypes,
         .draws = {draw_quarters()},
         .special = true,
         .grads = unary_grads(name, name, std::move(kf), std::move(ki), away_from_halves()),
         .errors = {{std::string(name) + "_bool",
                     K::Type,
                     name,
                     {"bool"},
                     [fp = &f](const Watch&) { (*fp)(ones({3}, kBool)); }}}},
        f, i, o, [](auto call, const KArgs& x) { return call(x[0]); },
        [aten](const AArgs& a) { return ATensors{aten(a[0])}; });
  };
  rounding(
      "ceil", KILN_PW(ceil), &at::ceil, [](const Tensor& t) { return ceil(t); },
      [](const Tensor& t) { ops::op_ceil_(t); });
  rounding(
      "floor", KILN_PW(floor), &at::floor, [](const Tensor& t) { return floor(t); },
      [](const Tensor& t) { ops::op_floor_(t); });
  rounding(
      "round", KILN_PW(round), &at::round, [](const Tensor& t) { return round(t); },
      [](const Tensor& t) { ops::op_round_(t); });
  rounding(
      "trunc", KILN_PW(trunc), &at::trunc, [](const Tensor& t) { return trunc(t); },
      [](const Tensor& t) { ops::op_trunc_(t); });
  add_pointwise(
      cs,
      {.name = "sign",
       .dtypes = kAllDTypes,
       .draws = {draw_sparse()},
       .special = true,
       .grads = unary_grads(
           "sign", "sign", [](const Tensor& t) { return sign(t); },
           [](const Tensor& t) { ops::op_sign_(t); }, away_from_halves())},
      KILN_PW(sign), [](auto call, const KArgs& x) { return call(x[0]); },
      [](const AArgs& a) { return ATensors{at::sign(a[0])}; });
  // isnan and isinf: NaN and infinities come from the special rows.
  add_pointwise(
      cs,
      {.name = "isnan",
       .dtypes = kAllDTypes,
       .draws = {draw_any()},
       .result = R::Bool,
       .special = true},
      KILN_PW(isnan), [](auto call, const KArgs& x) { return call(x[0]); },
      [](const AArgs& a) { return ATensors{at::isnan(a[0])}; });
  add_pointwise(
      cs,
      {.name = "isinf",
       .dtypes = kAllDTypes,
       .draws = {draw_any()},
       .result = R::Bool,
       .special = true},
      KILN_PW(isinf), [](auto call, const KArgs& x) { return call(x[0]); },
      [](const AArgs& a) { return ATensors{at::isinf(a[0])}; });
}

void add_parameterised(Cases& cs) {
  auto away = [](std::vector<double> points) {
    return [points](GradGen& d, const Dims& s) { return d.avoiding(s, points); };
  };
  add_pointwise(
      cs,
      {.name = "hardtanh",
       .dtypes = kNumericDTypes,
       .draws = {draw_uniform(-4, 4)},
       .special = true,
       .grads = unary_grads(
           "hardtanh", "hardtanh", [](const Tensor& t) { return hardtanh(t, -0.5, 1.25); },
           [](const Tensor& t) { ops::op_hardtanh_(t, Scalar(-0.5), Scalar(1.25)); },
           away({-0.5, 1.25})),
       .errors = {{"hardtanh_bool",
                   K::Type,
                   "hardtanh",
                   {"bool"},
                   [](const Watch&) { hardtanh(ones({3}, kBool)); }},
                  {"hardtanh__uint8_negative_limit",
                   K::Value,
                   "hardtanh",
                   {"unsigned", "-1"},
                   [](const Watch& watch) {
                     Tensor self = ones({3}, kUInt8);
                     watch(self);
                     hardtanh_(self, -1, 1);
                   }}}},
      KILN_PW(hardtanh), [](auto call, const KArgs& x) { return call(x[0], Scalar(1), Scalar(3)); },
      [](const AArgs& a) { return ATensors{at::hardtanh(a[0], 1, 3)}; });
  add_pointwise(
      cs,
      {.name = "hardtanh",
       .dtypes = kFloatDTypes,
       .draws = {draw_uniform(-2, 2)},
       .tag = "default_bounds"},
      KILN_PW(hardtanh),
      [](auto call, const KArgs& x) { return call(x[0], Scalar(-1), Scalar(1)); },
      [](const AArgs& a) { return ATensors{at::hardtanh(a[0])}; });
  // min_val > max_val: max_val everywhere, as clamp.
  add_pointwise(
      cs,
      {.name = "hardtanh",
       .dtypes = kFloatDTypes,
       .draws = {draw_uniform(-2, 2)},
       .tag = "crossed_bounds"},
      KILN_PW(hardtanh),
      [](auto call, const KArgs& x) { return call(x[0], Scalar(0.5), Scalar(-0.5)); },
      [](const AArgs& a) { return ATensors{at::hardtanh(a[0], 0.5, -0.5)}; });
  add_pointwise(
      cs,
      {.name = "leaky_relu",
       .dtypes = kFloatDTypes,
       .draws = {draw_any()},
       .special = true,
       .grads = unary_grads(
           "leaky_relu", "leaky_relu", [](const Tensor& t) { return leaky_relu(t, 0.2); },
           [](const Tensor& t) { ops::op_leaky_relu_(t, Scalar(0.2)); }, away({0})),
       .errors = {{"leaky_relu_int",
                   K::Type,
                   "leaky_relu",
                   {"int64"},
                   [](const Watch&) { leaky_relu(i64({3})); }}}},
      KILN_PW(leaky_relu), [](auto call, const KArgs& x) { return call(x[0], Scalar(0.2)); },
      [](const AArgs& a) { return ATensors{at::leaky_relu(a[0], 0.2)}; });
  add_pointwise(
      cs,
      {.name = "leaky_relu", .dtypes = kFloatDTypes, .draws = {draw_any()}, .tag = "default_slope"},
      KILN_PW(leaky_relu), [](auto call, const KArgs& x) { return call(x[0], Scalar(0.01)); },
      [](const AArgs& a) { return ATensors{at::leaky_relu(a[0])}; });
}

#undef KILN_PW

}  // namespace

Cases pointwise_math_cases() {
  Cases cs;
  add_float_unary(cs);
  add_rounding(cs);
  add_parameterised(cs);
  return cs;
}

}  // namespace kiln::test

// Op table: the pointwise ops of issue 16's batch (trigonometric and hyperbolic functions,
// logarithms, rounding, predicates, hardtanh and leaky_relu, atan2, fmod, remainder, div's
// rounding modes, the bitwise ops, pow(Scalar, Tensor), clamp with tensor bounds), part of the
// pointwise group
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

// ---------------------------------------------------------------- binary ops

// Broadcasting configurations for binary gradchecks (self, other), then in place.
struct Bcast {
  const char* label;
  Dims a, b;
};
using Binary = std::function<Tensor(const Tensor&, const Tensor&)>;
using BinaryInPlace = std::function<void(const Tensor&, const Tensor&)>;

GradSamples binary_grads(const std::string& name, const Binary& f, const BinaryInPlace& inplace,
                         const GradDraw& da, const GradDraw& db) {
  GradSamples cs;
  for (const Bcast& b : std::vector<Bcast>{{"same", {2, 3}, {2, 3}},
                                           {"row", {3, 4}, {4}},
                                           {"outer", {3, 1}, {1, 4}},
                                           {"scalar_other", {2, 3}, {}}}) {
    cs.push_back({name + "_" + b.label,
                  {name},
                  [=](GradGen& d) {
                    return TensorList{da(d, b.a), db(d, b.b)};
                  },
                  [=](const TensorList& x) { return TensorList{f(x[0], x[1])}; }});
  }
  cs.push_back({name + "__inplace_row",
                {name + "_"},
                [=](GradGen& d) {
                  return TensorList{da(d, {3, 4}), db(d, {4})};
                },
                [=](const TensorList& x) {
                  Tensor self = nonleaf(x[0]);
                  inplace(self, x[1]);
                  return TensorList{self};
                }});
  return cs;
}

// Divisors that are never zero: |x| in [0.5, 3] for floats, [-5, 5] without 0 for integers,
// [1, 9] for uint8.
Draw draw_divisor() {
  return [](Gen& g, const Spec& s) {
    if (g.dtype == kUInt8) return g.uniform(s, 1, 9);
    if (!is_floating(g.dtype))
      return g.make(s, g.dtype, [&] {
        int64_t v = g.integer(1, 5);
        return static_cast<double>(g.integer(0, 1) ? v : -v);
      });
    return g.make(s, g.dtype, [&] {
      double v = g.real(0.5, 3);
      return g.integer(0, 1) ? v : -v;
    });
  };
}
// Dividends: floats in [-8, 8], integers as any().
Draw draw_dividend() {
  return
      [](Gen& g, const Spec& s) { return is_floating(g.dtype) ? g.uniform(s, -8, 8) : g.any(s); };
}
GradDraw divisor_in() {
  return [](GradGen& d, const Dims& s) { return d.away(s, 0.5); };
}
GradDraw any_in() {
  return [](GradGen& d, const Dims& s) { return d.var(s); };
}

// An integer zero divisor raises on the CPU, in every form, and the target is kept.
std::vector<ErrorCase> zero_divisor_errors(const std::string& op,
                                           const std::function<void(Tensor&)>& inplace) {
  return {{op + "_int_zero_divisor",
           K::Value,
           op,
           {"ZeroDivisionError", "int64"},
           [op](const Watch&) {
             Tensor a = from_vector<int64_t>({7, -7, 3}), b = from_vector<int64_t>({2, 0, 1});
             if (op == "fmod") fmod(a, b);
             if (op == "remainder") remainder(a, b);
             if (op == "div_trunc") div(a, b, "trunc");
             if (op == "div_floor") div(a, b, "floor");
           }},
          // The check is the kernel's, so the in-place form's message names the op too.
          {op + "__int_zero_divisor",
           K::Value,
           op,
           {"ZeroDivisionError"},
           [inplace](const Watch& watch) {
             Tensor self = from_vector<int64_t>({7, -7, 3});
             watch(self);
             inplace(self);
           }},
          {op + "_bool", K::Type, op, {"bool"}, [op](const Watch&) {
             Tensor t = ones({3}, kBool);
             if (op == "fmod") fmod(t, t);
             if (op == "remainder") remainder(t, t);
             if (op == "div_trunc") div(t, t, "trunc");
             if (op == "div_floor") div(t, t, "floor");
           }}};
}

void add_binary_math(Cases& cs) {
  auto body = [](auto call, const KArgs& x) { return call(x[0], x[1]); };
  add_pointwise(cs,
                {.name = "atan2",
                 .dtypes = kAllDTypes,
                 .draws = {draw_any(), draw_any()},
                 .result = R::Float,
                 .special = true,
                 .grads = binary_grads(
                     "atan2", [](const Tensor& a, const Tensor& b) { return atan2(a, b); },
                     [](const Tensor& a, const Tensor& b) { ops::op_atan2_(a, b); }, divisor_in(),
                     divisor_in()),
                 .errors = {{"atan2_shape_mismatch",
                             K::Value,
                             "atan2",
                             {"[2, 3]", "[4]"},
                             [](const Watch&) {
                               atan2(f32({2, 3}), f32({4}));
                             }},
                            {"remainder__broadcast_self",
                             K::Value,
                             "remainder_",
                             {"[3]", "[2, 3]"},
                             [](const Watch& watch) {
                               Tensor self = from_vector<float>({1, 2, 3});
                               watch(self);
                               remainder_(self, f32({2, 3}));
                             }},
                            {"atan2__int_self",
                             K::Type,
                             "atan2_",
                             {"float32", "int64"},
                             [](const Watch& watch) {
                               Tensor self = i64({3});
                               watch(self);
                               atan2_(self, i64({3}));
                             }}}},
                KILN_PW(atan2), body,
                [](const AArgs& a) { return ATensors{at::atan2(a[0], a[1])}; });
  add_pointwise(
      cs,
      {.name = "fmod",
       .dtypes = kNumericDTypes,
       .draws = {draw_dividend(), draw_divisor()},
       .special = true,
       .grads = binary_grads(
           "fmod", [](const Tensor& a, const Tensor& b) { return fmod(a, b); },
           [](const Tensor& a, const Tensor& b) { ops::op_fmod_(a, b); }, any_in(), divisor_in()),
       .errors = zero_divisor_errors("fmod", [](Tensor& s) { fmod_(s, 0); })},
      KILN_PW(fmod), body, [](const AArgs& a) { return ATensors{at::fmod(a[0], a[1])}; });
  add_pointwise(cs,
                {.name = "remainder",
                 .dtypes = kNumericDTypes,
                 .draws = {draw_dividend(), draw_divisor()},
                 .special = true,
                 .grads = binary_grads(
                     "remainder", [](const Tensor& a, const Tensor& b) { return remainder(a, b); },
                     [](const Tensor& a, const Tensor& b) { ops::op_remainder_(a, b); }, any_in(),
                     divisor_in()),
                 .errors = zero_divisor_errors("remainder", [](Tensor& s) { remainder_(s, 0); })},
                KILN_PW(remainder), body,
                [](const AArgs& a) { return ATensors{at::remainder(a[0], a[1])}; });
  for (const char* mode : {"trunc", "floor"}) {
    std::string op = std::string("div_") + mode;
    PointwiseSpec spec{.name = op,
                       .dtypes = kNumericDTypes,
                       .draws = {draw_dividend(), draw_divisor()},
                       .special = true,
                       .grads = binary_grads(
                           op, [mode](const Tensor& a, const Tensor& b) { return div(a, b, mode); },
                           [mode](const Tensor& a, const Tensor& b) {
                             Tensor s = a;
                             div_(s, b, mode);
                           },
                           any_in(), divisor_in()),
                       .errors = zero_divisor_errors(op, [mode](Tensor& s) { div_(s, 0, mode); })};
    auto ref = [mode](const AArgs& a) { return ATensors{at::div(a[0], a[1], mode)}; };
    if (std::string(mode) == "trunc")
      add_pointwise(cs, spec, KILN_PW(div_trunc), body, ref);
    else
      add_pointwise(cs, spec, KILN_PW(div_floor), body, ref);
  }
  head(cs, "div_trunc")
      .errors.push_back({"div_bad_rounding_mode", K::Value, "div", {"'round'"}, [](const Watch&) {
                           div(f32({3}), f32({3}), "round");
                         }});
  const std::vector<DType> kBitwiseDTypes = {kBool, kUInt8, kInt32, kInt64};
  auto bitwise = [&](const char* name, auto& f, auto& i, auto& o,
                     at::Tensor (*aten)(const at::Tensor&, const at::Tensor&),
                     std::function<void()> on_float) {
    add_pointwise(cs,
                  {.name = name,
                   .dtypes = kBitwiseDTypes,
                   .draws = {draw_any(), draw_any()},
                   .errors = {{std::string(name) + "_float",
                               K::Type,
                               name,
                               {"float32"},
                               [on_float](const Watch&) { on_float(); }}}},
                  f, i, o, body, [aten](const AArgs& a) { return ATensors{aten(a[0], a[1])}; });
  };
  bitwise("bitwise_and", KILN_PW(bitwise_and), &at::bitwise_and,
          [] { bitwise_and(f32({3}), i64({3})); });
  bitwise("bitwise_or", KILN_PW(bitwise_or), &at::bitwise_or,
          [] { bitwise_or(i64({3}), f32({3})); });
  bitwise("bitwise_xor", KILN_PW(bitwise_xor), &at::bitwise_xor,
          [] { bitwise_xor(f32({3}), f32({3})); });
  add_pointwise(
      cs,
      {.name = "bitwise_not",
       .dtypes = kBitwiseDTypes,
       .draws = {draw_any()},
       .errors = {{"bitwise_not_float",
                   K::Type,
                   "bitwise_not",
                   {"float32"},
                   [](const Watch&) { bitwise_not(f32({3})); }},
                  {"bitwise_not__float",
                   K::Type,
                   "bitwise_not",  // meta names the functional op
                   {"float64"},
                   [](const Watch& watch) {
                     Tensor self = ones({3}, kFloat64);
                     watch(self);
                     bitwise_not_(self);
                   }}}},
      KILN_PW(bitwise_not), [](auto call, const KArgs& x) { return call(x[0]); },
      [](const AArgs& a) { return ATensors{at::bitwise_not(a[0])}; });
}

// Scalar overloads, pow(Scalar, Tensor), div with a rounding mode and clamp with tensor bounds.
void add_binary_public(Cases& cs) {
  struct ScalarRow {
    const char* name;
    const char* op;
    std::vector<DType> dtypes;
    Draw draw;
    std::function<Tensor(const Tensor&)> kiln;
    std::function<at::Tensor(const at::Tensor&)> aten;
  };
  const std::vector<ScalarRow> rows = {
      {"fmod_scalar_int", "fmod", kNumericDTypes, draw_dividend(),
       [](const Tensor& t) { return fmod(t, 3); },
       [](const at::Tensor& t) { return at::fmod(t, 3); }},
      {"fmod_scalar_float", "fmod", kNumericDTypes, draw_dividend(),
       [](const Tensor& t) { return fmod(t, -1.5); },
       [](const at::Tensor& t) { return at::fmod(t, -1.5); }},
      {"remainder_scalar_int", "remainder", kNumericDTypes, draw_dividend(),
       [](const Tensor& t) { return remainder(t, -3); },
       [](const at::Tensor& t) { return at::remainder(t, -3); }},
      {"remainder_scalar_float", "remainder", kNumericDTypes, draw_dividend(),
       [](const Tensor& t) { return remainder(t, 1.5); },
       [](const at::Tensor& t) { return at::remainder(t, 1.5); }},
      {"div_trunc_scalar", "div_trunc", kNumericDTypes, draw_dividend(),
       [](const Tensor& t) { return div(t, -3, "trunc"); },
       [](const at::Tensor& t) { return at::div(t, -3, "trunc"); }},
      {"div_floor_scalar", "div_floor", kNumericDTypes, draw_dividend(),
       [](const Tensor& t) { return div(t, 3, "floor"); },
       [](const at::Tensor& t) { return at::div(t, 3, "floor"); }},
      {"div_floor_scalar_float", "div_floor", kNumericDTypes, draw_dividend(),
       [](const Tensor& t) { return div(t, -0.75, "floor"); },
       [](const at::Tensor& t) { return at::div(t, -0.75, "floor"); }},
      {"div_none_mode", "div", kAllDTypes, draw_divisor(),
       [](const Tensor& t) { return div(t, 4, std::nullopt); },
       [](const at::Tensor& t) { return at::div(t, 4, c10::nullopt); }},
      {"bitwise_and_scalar",
       "bitwise_and",
       {kUInt8, kInt32, kInt64},
       draw_any(),
       [](const Tensor& t) { return bitwise_and(t, 5); },
       [](const at::Tensor& t) { return at::bitwise_and(t, 5); }},
      {"bitwise_or_scalar",
       "bitwise_or",
       {kBool, kUInt8, kInt32, kInt64},
       draw_any(),
       [](const Tensor& t) { return bitwise_or(t, true); },
       [](const at::Tensor& t) { return at::bitwise_or(t, true); }},
      {"bitwise_xor_scalar",
       "bitwise_xor",
       {kUInt8, kInt32, kInt64},
       draw_any(),
       [](const Tensor& t) { return bitwise_xor(t, 6); },
       [](const at::Tensor& t) { return at::bitwise_xor(t, 6); }},
      {"pow_scalar_base_int", "pow", kNumericDTypes, draw_uniform(0, 3),
       [](const Tensor& t) { return pow(2, t); },
       [](const at::Tensor& t) { return at::pow(2, t); }},
      {"pow_scalar_base_float", "pow", kNumericDTypes, draw_uniform(-2, 3),
       [](const Tensor& t) { return pow(2.5, t); },
       [](const at::Tensor& t) { return at::pow(2.5, t); }},
  };
  const Spec m{{3, 5}}, mt{{3, 5}, Layout::Transposed};
  for (const ScalarRow& r : rows)
    for (const auto& [label, spec] : {std::pair{"", m}, std::pair{"_noncontig", mt}}) {
      auto kf = r.kiln;
      auto af = r.aten;
      cs.push_back({.name = r.name + std::string(label),
                    .ops = {r.op},
                    .dtypes = r.dtypes,
                    .make = make_from({r.draw}, {spec}),
                    .kiln = [kf](const KArgs& x) { return KTensors{kf(x[0])}; },
                    .aten = [af](const AArgs& a) { return ATensors{af(a[0])}; }});
    }
  // pow(Scalar, Tensor)'s gradient reaches the exponent only.
  cs.back().grads = {{"pow_scalar_base",
                      {"pow"},
                      [](GradGen& d) {
                        return TensorList{d.var({2, 3})};
                      },
                      [](const TensorList& x) { return TensorList{pow(2.5, x[0])}; }}};

  // clamp with tensor bounds: maximum then minimum (NaN from any input, max wins when crossed).
  auto grid = [](double offset) {
    return [offset](Gen& g, const Spec& s) {
      if (!is_floating(g.dtype)) return g.any(s);
      return g.make(s, g.dtype,
                    [&g, offset] { return offset + static_cast<double>(g.integer(-4, 4)) / 2; });
    };
  };
  cs.push_back(
      {.name = "clamp_tensor",
       .ops = {"maximum", "minimum"},
       .dtypes = kNumericDTypes,
       .make =
           make_from({grid(0.1), grid(0.35), grid(0.2)}, {Spec{{3, 4}}, Spec{{4}}, Spec{{3, 1}}}),
       .kiln = [](const KArgs& x) { return KTensors{clamp(x[0], x[1], x[2])}; },
       .aten = [](const AArgs& a) { return ATensors{at::clamp(a[0], a[1], a[2])}; },
       .grads = {{"clamp_tensor",
                  {"maximum", "minimum"},
                  [](GradGen& d) {
                    return TensorList{d.grid({3, 4}, 0.1), d.grid({4}, 0.35), d.grid({3, 1}, 0.2)};
                  },
                  [](const TensorList& x) { return TensorList{clamp(x[0], x[1], x[2])}; }}},
       .errors = {{"clamp_tensor_no_bounds", K::Value, "clamp", {"min", "max"}, [](const Watch&) {
                     clamp(f32({3}), Tensor(), Tensor());
                   }}}});
  cs.push_back({.name = "clamp_tensor_special",
                .ops = {"maximum", "minimum"},
                .dtypes = kFloatDTypes,
                .make = make_from({draw_any(), draw_any(), draw_any()},
                                  {Spec{{23}}, Spec{{23}}, Spec{{23}}}),
                .kiln = [](const KArgs& x) { return KTensors{clamp(x[0], x[1], x[2])}; },
                .aten = [](const AArgs& a) { return ATensors{at::clamp(a[0], a[1], a[2])}; }});
  cs.back().make = [](Gen& g) {
    std::vector<double> v = special_values();
    std::shuffle(v.begin(), v.end(), g.rng);
    Tensor x = g.values(special_values(), {static_cast<int64_t>(v.size())});
    return KTensors{x, g.values(v, {static_cast<int64_t>(v.size())}), g.any(Spec{{1}})};
  };
  cs.push_back({.name = "clamp_tensor_min_only",
                .ops = {"maximum"},
                .dtypes = kNumericDTypes,
                .make = make_from({draw_any(), draw_any()}, {Spec{{3, 4}}, Spec{{}}}),
                .kiln = [](const KArgs& x) { return KTensors{clamp(x[0], x[1], Tensor())}; },
                .aten =
                    [](const AArgs& a) {
                      return ATensors{at::clamp(a[0], a[1], c10::optional<at::Tensor>())};
                    }});
  cs.push_back({.name = "clamp__tensor_max_only",
                .ops = {"minimum_"},
                .dtypes = kNumericDTypes,
                .make = make_from({draw_any(), draw_any()}, {Spec{{3, 4}}, Spec{{4}}}),
                .kiln =
                    [](const KArgs& x) {
                      Tensor s = x[0];
                      clamp_(s, Tensor(), x[1]);
                      return KTensors{s};
                    },
                .aten =
                    [](const AArgs& a) {
                      return ATensors{at::clamp(a[0], c10::optional<at::Tensor>(), a[1])};
                    },
                .mode = Mode::InPlace});
}

#undef KILN_PW

}  // namespace

Cases pointwise_math_cases() {
  Cases cs;
  add_float_unary(cs);
  add_rounding(cs);
  add_parameterised(cs);
  add_binary_math(cs);
  add_binary_public(cs);
  return cs;
}

}  // namespace kiln::test

// Every backward formula (kiln/autograd/formulas.cpp) against central finite differences, as one
// table of cases in the style of tests/ops/op_test_*.cpp, plus a coverage check: every
// differentiable op in kiln/ops/op_list.h must be exercised by a row of this table.
//
// Note [How a gradcheck row runs]
// `make` draws the row's float64 inputs (those that require grad are the ones checked) from a
// generator seeded by the row's name; `fn` is run once with the Profile key included, recording
// the ops it reaches (each name in the row's `ops` must be among them, so the coverage list
// cannot drift from what the rows really call) and every floating output must require grad;
// then kiln::autograd::gradcheck compares the Jacobian that backward gives with central
// differences (eps 1e-6, atol 1e-5, rtol 1e-3), on copies of the outputs (see the runner).
// Inputs avoid the points where an op is not differentiable (ties of maximum/amax, 0 for abs
// and relu, clamp's bounds). Functions that draw random numbers reseed their Generator on every
// call, so the finite differences see the same mask.
#include <gtest/gtest.h>

#include <functional>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "kiln/autograd/derivative.h"
#include "kiln/autograd/gradcheck.h"
#include "kiln/ops/op_list.h"
#include "kiln/ops/ops.h"

namespace kiln::test {
namespace {

using Dims = std::vector<int64_t>;

// ---------------------------------------------------------------- inputs

// Draws a row's inputs: float64, contiguous, deterministic per row.
class Draw {
 public:
  explicit Draw(const std::string& seed)
      : rng_(static_cast<uint32_t>(std::hash<std::string>{}(seed))) {}

  // Uniform in [lo, hi]; requires grad.
  Tensor var(const Dims& shape, double lo = -2, double hi = 2) {
    return make(shape, [&] { return real(lo, hi); }).requires_grad_();
  }
  // |x| in [gap, 2] with a random sign (away from 0); requires grad.
  Tensor away(const Dims& shape, double gap = 0.25) {
    return make(shape, [&] { return (real(0, 1) < 0.5 ? -1 : 1) * real(gap, 2); }).requires_grad_();
  }
  // Uniform in [0.25, 2]; requires grad.
  Tensor pos(const Dims& shape) { return var(shape, 0.25, 2); }
  // On the grid offset + k/2, k in [-4, 4]: two tensors with offsets 0.1 and 0.35 never tie.
  Tensor grid(const Dims& shape, double offset) {
    return make(shape, [&] { return offset + 0.5 * static_cast<double>(integer(-4, 4)); })
        .requires_grad_();
  }
  // Uniform in [lo, hi], kept at least 0.1 away from each of `avoid`; requires grad.
  Tensor avoiding(const Dims& shape, std::vector<double> avoid, double lo = -2, double hi = 2) {
    return make(shape,
                [&] {
                  for (;;) {
                    double x = real(lo, hi);
                    bool ok = true;
                    for (double a : avoid) ok = ok && std::abs(x - a) >= 0.1;
                    if (ok) return x;
                  }
                })
        .requires_grad_();
  }
  // Uniform in [-2, 2]; does not require grad.
  Tensor fixed(const Dims& shape) {
    return make(shape, [&] { return real(-2, 2); });
  }
  // A bool tensor, about half true.
  Tensor mask(const Dims& shape) {
    return make(shape, [&] { return real(0, 1) < 0.5 ? 1.0 : 0.0; }).to(kBool);
  }

  double real(double lo, double hi) { return std::uniform_real_distribution<double>(lo, hi)(rng_); }
  int64_t integer(int64_t lo, int64_t hi) {
    return std::uniform_int_distribution<int64_t>(lo, hi)(rng_);
  }

 private:
  Tensor make(const Dims& shape, const std::function<double()>& f) {
    int64_t n = 1;
    for (int64_t s : shape) n *= s;
    std::vector<double> v(static_cast<size_t>(n));
    for (double& x : v) x = f();
    return from_vector(v, IntArrayRef({n})).reshape(shape);
  }
  std::mt19937 rng_;
};

// Exactly these values (float64; `grad`: requires grad).
Tensor values(const std::vector<double>& v, const Dims& shape, bool grad = true) {
  Tensor t = from_vector(v, IntArrayRef({static_cast<int64_t>(v.size())})).reshape(shape);
  return grad ? t.requires_grad_() : t;
}
Tensor indices(const std::vector<int64_t>& v, const Dims& shape) {
  return from_vector(v, IntArrayRef({static_cast<int64_t>(v.size())})).reshape(shape);
}

// ---------------------------------------------------------------- rows

using Fn = std::function<TensorList(const TensorList&)>;
struct GradCase {
  std::string name;              // unique; letters, digits and '_'
  std::vector<std::string> ops;  // names in kiln::ops::all_ops() that `fn` reaches
  std::function<TensorList(Draw&)> make;
  Fn fn;
};
using Cases = std::vector<GradCase>;

// A non-leaf copy of `x` (for in-place ops, which a leaf requiring grad refuses).
Tensor nonleaf(const Tensor& x) { return x * 1.0; }

// Broadcasting configurations for binary ops: shapes of self and other.
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
using Drawer = std::function<Tensor(Draw&, const Dims&)>;

Drawer any_in() {
  return [](Draw& d, const Dims& s) { return d.var(s); };
}

void add_binary(Cases& cs, const std::string& name, const Binary& f, const BinaryInPlace& inplace,
                const Drawer& da, const Drawer& db) {
  for (const Bcast& b : kBinaryShapes) {
    cs.push_back({name + "_" + b.label,
                  {name},
                  [=](Draw& d) {
                    return TensorList{da(d, b.a), db(d, b.b)};
                  },
                  [=](const TensorList& x) { return TensorList{f(x[0], x[1])}; }});
  }
  for (const Bcast& b : kInPlaceShapes) {
    cs.push_back({name + "__inplace_" + b.label,
                  {name + "_"},
                  [=](Draw& d) {
                    return TensorList{da(d, b.a), db(d, b.b)};
                  },
                  [=](const TensorList& x) {
                    Tensor self = nonleaf(x[0]);
                    inplace(self, x[1]);
                    return TensorList{self};
                  }});
  }
}

using Unary = std::function<Tensor(const Tensor&)>;
using UnaryInPlace = std::function<void(const Tensor&)>;

void add_unary(Cases& cs, const std::string& name, const std::string& op, const Unary& f,
               const UnaryInPlace& inplace, const Drawer& da) {
  cs.push_back({name,
                {op},
                [=](Draw& d) {
                  return TensorList{da(d, {2, 3})};
                },
                [=](const TensorList& x) { return TensorList{f(x[0])}; }});
  cs.push_back({name + "_0d",
                {op},
                [=](Draw& d) { return TensorList{da(d, {})}; },
                [=](const TensorList& x) { return TensorList{f(x[0])}; }});
  cs.push_back({name + "_inplace",
                {op + "_"},
                [=](Draw& d) {
                  return TensorList{da(d, {3, 4})};
                },
                [=](const TensorList& x) {
                  Tensor self = nonleaf(x[0]);
                  inplace(self);
                  return TensorList{self};
                }});
}

Cases pointwise_cases() {
  Cases cs;
  using namespace ops;  // NOLINT: the *_op handles for in-place variants without a wrapper
  add_binary(
      cs, "add", [](const Tensor& a, const Tensor& b) { return add(a, b, 2.5); },
      [](const Tensor& a, const Tensor& b) { op_add_(a, b, -1.5); }, any_in(), any_in());
  add_binary(
      cs, "sub", [](const Tensor& a, const Tensor& b) { return sub(a, b, -1.5); },
      [](const Tensor& a, const Tensor& b) { op_sub_(a, b, 0.5); }, any_in(), any_in());
  add_binary(
      cs, "mul", [](const Tensor& a, const Tensor& b) { return mul(a, b); },
      [](const Tensor& a, const Tensor& b) { op_mul_(a, b); }, any_in(), any_in());
  add_binary(
      cs, "div", [](const Tensor& a, const Tensor& b) { return div(a, b); },
      [](const Tensor& a, const Tensor& b) { op_div_(a, b); }, any_in(),
      [](Draw& d, const Dims& s) { return d.away(s, 0.5); });
  add_binary(
      cs, "pow", [](const Tensor& a, const Tensor& b) { return pow(a, b); },
      [](const Tensor& a, const Tensor& b) { op_pow_(a, b); },
      [](Draw& d, const Dims& s) { return d.pos(s); },
      [](Draw& d, const Dims& s) { return d.var(s, -1.5, 1.5); });
  auto grid_a = [](Draw& d, const Dims& s) { return d.grid(s, 0.1); };
  auto grid_b = [](Draw& d, const Dims& s) { return d.grid(s, 0.35); };
  add_binary(
      cs, "maximum", [](const Tensor& a, const Tensor& b) { return maximum(a, b); },
      [](const Tensor& a, const Tensor& b) { op_maximum_(a, b); }, grid_a, grid_b);
  add_binary(
      cs, "minimum", [](const Tensor& a, const Tensor& b) { return minimum(a, b); },
      [](const Tensor& a, const Tensor& b) { op_minimum_(a, b); }, grid_a, grid_b);
  // A Scalar operand is a wrapped 0-d tensor that does not require grad.
  cs.push_back({"add_scalar_alpha",
                {"add"},
                [](Draw& d) {
                  return TensorList{d.var({2, 3})};
                },
                [](const TensorList& x) { return TensorList{add(x[0], 1.5, 3)}; }});
  cs.push_back({"pow_scalar_exponent",
                {"pow"},
                [](Draw& d) {
                  return TensorList{d.pos({2, 3})};
                },
                [](const TensorList& x) { return TensorList{pow(x[0], 2.5)}; }});
  cs.push_back({"pow_tensor_exponent_only",
                {"pow"},
                [](Draw& d) {
                  return TensorList{d.pos({2, 3}).detach(), d.var({3})};
                },
                [](const TensorList& x) { return TensorList{pow(x[0], x[1])}; }});
  cs.push_back({"mul_same_input",
                {"mul"},
                [](Draw& d) {
                  return TensorList{d.var({2, 3})};
                },
                [](const TensorList& x) { return TensorList{mul(x[0], x[0])}; }});

  auto any1 = [](Draw& d, const Dims& s) { return d.var(s); };
  auto away = [](Draw& d, const Dims& s) { return d.away(s); };
  auto pos = [](Draw& d, const Dims& s) { return d.pos(s); };
  add_unary(
      cs, "neg", "neg", [](const Tensor& a) { return neg(a); }, [](const Tensor& a) { op_neg_(a); },
      any1);
  add_unary(
      cs, "abs", "abs", [](const Tensor& a) { return abs(a); }, [](const Tensor& a) { op_abs_(a); },
      away);
  add_unary(
      cs, "exp", "exp", [](const Tensor& a) { return exp(a); }, [](const Tensor& a) { op_exp_(a); },
      any1);
  add_unary(
      cs, "log", "log", [](const Tensor& a) { return log(a); }, [](const Tensor& a) { op_log_(a); },
      pos);
  add_unary(
      cs, "sqrt", "sqrt", [](const Tensor& a) { return sqrt(a); },
      [](const Tensor& a) { op_sqrt_(a); }, pos);
  add_unary(
      cs, "rsqrt", "rsqrt", [](const Tensor& a) { return rsqrt(a); },
      [](const Tensor& a) { op_rsqrt_(a); }, pos);
  add_unary(
      cs, "tanh", "tanh", [](const Tensor& a) { return tanh(a); },
      [](const Tensor& a) { op_tanh_(a); }, any1);
  add_unary(
      cs, "sigmoid", "sigmoid", [](const Tensor& a) { return sigmoid(a); },
      [](const Tensor& a) { op_sigmoid_(a); }, any1);
  add_unary(
      cs, "relu", "relu", [](const Tensor& a) { return relu(a); },
      [](const Tensor& a) { op_relu_(a); }, away);
  add_unary(
      cs, "silu", "silu", [](const Tensor& a) { return silu(a); },
      [](const Tensor& a) { op_silu_(a); }, any1);
  add_unary(
      cs, "sin", "sin", [](const Tensor& a) { return sin(a); }, [](const Tensor& a) { op_sin_(a); },
      any1);
  add_unary(
      cs, "cos", "cos", [](const Tensor& a) { return cos(a); }, [](const Tensor& a) { op_cos_(a); },
      any1);
  add_unary(
      cs, "gelu_erf", "gelu", [](const Tensor& a) { return gelu(a, false); },
      [](const Tensor& a) { op_gelu_(a, false); }, any1);
  add_unary(
      cs, "gelu_tanh", "gelu", [](const Tensor& a) { return gelu(a, true); },
      [](const Tensor& a) { op_gelu_(a, true); }, any1);
  auto away_bounds = [](Draw& d, const Dims& s) { return d.avoiding(s, {-0.5, 0.75}); };
  add_unary(
      cs, "clamp_min", "clamp", [](const Tensor& a) { return clamp(a, -0.5); },
      [](const Tensor& a) { op_clamp_(a, Scalar(-0.5), std::nullopt); }, away_bounds);
  add_unary(
      cs, "clamp_max", "clamp", [](const Tensor& a) { return clamp(a, std::nullopt, 0.75); },
      [](const Tensor& a) { op_clamp_(a, std::nullopt, Scalar(0.75)); }, away_bounds);
  add_unary(
      cs, "clamp_both", "clamp", [](const Tensor& a) { return clamp(a, -0.5, 0.75); },
      [](const Tensor& a) { op_clamp_(a, Scalar(-0.5), Scalar(0.75)); }, away_bounds);

  // where: the condition broadcasts too.
  const std::vector<std::tuple<const char*, Dims, Dims, Dims>> where_shapes = {
      {"same", {2, 3}, {2, 3}, {2, 3}},
      {"bcast", {3, 1}, {3, 4}, {4}},
      {"scalar_other", {2, 3}, {2, 3}, {}},
      {"bcast_cond", {4}, {3, 1}, {1, 4}}};
  for (const auto& [label, c, a, b] : where_shapes) {
    cs.push_back({std::string("where_") + label,
                  {"where"},
                  [c, a, b](Draw& d) {
                    return TensorList{d.mask(c), d.var(a), d.var(b)};
                  },
                  [](const TensorList& x) { return TensorList{where(x[0], x[1], x[2])}; }});
  }
  cs.push_back({"where_scalar",
                {"where"},
                [](Draw& d) {
                  return TensorList{d.mask({2, 3}), d.var({2, 3})};
                },
                [](const TensorList& x) { return TensorList{where(x[0], x[1], 0.5)}; }});
  // where_ writes into its first argument, the condition: a bool tensor cannot hold the
  // floating result ("[where_] result type float64 can't be cast to the desired output type
  // bool"), so where_ can never record a gradient and has no row here.
  return cs;
}

Cases reduce_cases() {
  Cases cs;
  struct Red {
    const char* label;
    Dims shape, dims;
    bool keepdim;
  };
  const std::vector<Red> reds = {{"all", {2, 3}, {}, false},
                                 {"all_keepdim", {2, 3}, {}, true},
                                 {"dim0", {2, 3, 4}, {0}, false},
                                 {"dim_neg", {2, 3, 4}, {-1}, false},
                                 {"dims02_keepdim", {2, 3, 4}, {0, 2}, true},
                                 {"dims12", {2, 3, 4}, {1, 2}, false},
                                 {"0d", {}, {}, false}};
  for (const Red& r : reds) {
    cs.push_back({std::string("sum_") + r.label,
                  {"sum"},
                  [r](Draw& d) { return TensorList{d.var(r.shape)}; },
                  [r](const TensorList& x) { return TensorList{sum(x[0], r.dims, r.keepdim)}; }});
    cs.push_back({std::string("mean_") + r.label,
                  {"mean"},
                  [r](Draw& d) { return TensorList{d.var(r.shape)}; },
                  [r](const TensorList& x) { return TensorList{mean(x[0], r.dims, r.keepdim)}; }});
    if (r.shape.empty()) continue;
    // Continuous random values: no ties (ties are checked against libtorch instead).
    cs.push_back({std::string("amax_") + r.label,
                  {"amax"},
                  [r](Draw& d) { return TensorList{d.var(r.shape)}; },
                  [r](const TensorList& x) { return TensorList{amax(x[0], r.dims, r.keepdim)}; }});
    cs.push_back({std::string("amin_") + r.label,
                  {"amin"},
                  [r](Draw& d) { return TensorList{d.var(r.shape)}; },
                  [r](const TensorList& x) { return TensorList{amin(x[0], r.dims, r.keepdim)}; }});
    for (int64_t correction : {0, 1}) {
      cs.push_back({std::string("var_c") + std::to_string(correction) + "_" + r.label,
                    {"var"},
                    [r](Draw& d) { return TensorList{d.var(r.shape)}; },
                    [r, correction](const TensorList& x) {
                      return TensorList{var(x[0], r.dims, correction, r.keepdim)};
                    }});
    }
  }
  cs.push_back({"sum_dtype_float32_input",
                {"sum"},
                [](Draw& d) {
                  return TensorList{d.var({2, 3})};
                },
                [](const TensorList& x) { return TensorList{sum(x[0], {1}, false, kFloat64)}; }});
  for (int64_t dim : {0, 1, 2, -1}) {
    std::string s = dim < 0 ? "neg1" : std::to_string(dim);
    cs.push_back({"softmax_dim" + s,
                  {"softmax"},
                  [](Draw& d) {
                    return TensorList{d.var({2, 3, 4})};
                  },
                  [dim](const TensorList& x) { return TensorList{softmax(x[0], dim)}; }});
    cs.push_back({"log_softmax_dim" + s,
                  {"log_softmax"},
                  [](Draw& d) {
                    return TensorList{d.var({2, 3, 4})};
                  },
                  [dim](const TensorList& x) { return TensorList{log_softmax(x[0], dim)}; }});
  }
  // max(dim) / min(dim): the values (the indices are not differentiable).
  for (auto [dim, keepdim] : {std::pair<int64_t, bool>{0, false}, {1, true}, {-1, false}}) {
    std::string s = std::to_string(dim < 0 ? 9 : dim) + (keepdim ? "_keepdim" : "");
    cs.push_back({"max_dim" + s,
                  {"max_dim"},
                  [](Draw& d) {
                    return TensorList{d.var({3, 4})};
                  },
                  [dim, keepdim](const TensorList& x) {
                    auto [v, i] = max(x[0], dim, keepdim);
                    return TensorList{v, i};
                  }});
    cs.push_back({"min_dim" + s,
                  {"min_dim"},
                  [](Draw& d) {
                    return TensorList{d.var({3, 4})};
                  },
                  [dim, keepdim](const TensorList& x) {
                    auto [v, i] = min(x[0], dim, keepdim);
                    return TensorList{v, i};
                  }});
  }
  return cs;
}

Cases linalg_nn_cases() {
  Cases cs;
  auto two = [](Dims a, Dims b) {
    return [a, b](Draw& d) { return TensorList{d.var(a), d.var(b)}; };
  };
  cs.push_back({"mm", {"mm"}, two({3, 4}, {4, 2}), [](const TensorList& x) {
                  return TensorList{mm(x[0], x[1])};
                }});
  cs.push_back(
      {"mm_transposed_input", {"mm", "transpose"}, two({4, 3}, {4, 2}), [](const TensorList& x) {
         return TensorList{mm(transpose(x[0], 0, 1), x[1])};
       }});
  cs.push_back({"bmm", {"bmm"}, two({2, 3, 4}, {2, 4, 2}), [](const TensorList& x) {
                  return TensorList{bmm(x[0], x[1])};
                }});
  cs.push_back({"addmm_bias_row_beta_alpha",
                {"addmm"},
                [](Draw& d) {
                  return TensorList{d.var({2}), d.var({3, 4}), d.var({4, 2})};
                },
                [](const TensorList& x) { return TensorList{addmm(x[0], x[1], x[2], 0.5, 2)}; }});
  cs.push_back({"addmm_full_self",
                {"addmm"},
                [](Draw& d) {
                  return TensorList{d.var({3, 2}), d.var({3, 4}), d.var({4, 2})};
                },
                [](const TensorList& x) { return TensorList{addmm(x[0], x[1], x[2])}; }});
  cs.push_back({"addmm_beta0",
                {"addmm"},
                [](Draw& d) {
                  return TensorList{d.var({3, 2}), d.var({3, 4}), d.var({4, 2})};
                },
                [](const TensorList& x) { return TensorList{addmm(x[0], x[1], x[2], 0, -1)}; }});
  const std::vector<std::tuple<const char*, Dims, Dims>> matmuls = {
      {"1d_1d", {4}, {4}},
      {"2d_1d", {3, 4}, {4}},
      {"1d_2d", {4}, {4, 3}},
      {"3d_2d", {2, 3, 4}, {4, 2}},
      {"3d_1d", {2, 3, 4}, {4}},
      {"1d_3d", {3}, {2, 3, 2}},
      {"batched", {2, 3, 2}, {2, 2, 3}},
      {"batch_bcast", {2, 1, 2, 3}, {3, 3, 2}}};
  for (const auto& [label, a, b] : matmuls) {
    std::vector<std::string> ops = {a.size() >= 3 && b.size() >= 3 ? "bmm" : "mm"};
    if (std::string(label) == "1d_3d" || std::string(label) == "batch_bcast") ops = {"bmm"};
    cs.push_back({std::string("matmul_") + label, ops, two(a, b),
                  [](const TensorList& x) { return TensorList{matmul(x[0], x[1])}; }});
  }
  cs.push_back({"linear_bias",
                {"addmm", "transpose"},
                [](Draw& d) {
                  return TensorList{d.var({2, 3}), d.var({4, 3}), d.var({4})};
                },
                [](const TensorList& x) { return TensorList{linear(x[0], x[1], x[2])}; }});
  cs.push_back(
      {"linear_no_bias", {"mm", "transpose"}, two({2, 3}, {4, 3}), [](const TensorList& x) {
         return TensorList{linear(x[0], x[1])};
       }});
  cs.push_back({"linear_3d_input",
                {"addmm", "view"},
                [](Draw& d) {
                  return TensorList{d.var({2, 2, 3}), d.var({2, 3}), d.var({2})};
                },
                [](const TensorList& x) { return TensorList{linear(x[0], x[1], x[2])}; }});

  // Norms over 1 and 2 trailing dims, with and without weight/bias.
  struct Norm {
    const char* label;
    Dims x, normalized;
    bool weight, bias;
  };
  const std::vector<Norm> norms = {
      {"1d_affine", {3, 4}, {4}, true, true},       {"1d_plain", {3, 4}, {4}, false, false},
      {"1d_weight_only", {3, 4}, {4}, true, false}, {"1d_bias_only", {3, 4}, {4}, false, true},
      {"2d_affine", {2, 2, 3}, {2, 3}, true, true}, {"2d_plain", {2, 2, 3}, {2, 3}, false, false}};
  for (const Norm& n : norms) {
    cs.push_back({std::string("layer_norm_") + n.label,
                  {"layer_norm"},
                  [n](Draw& d) {
                    return TensorList{d.var(n.x), n.weight ? d.var(n.normalized) : Tensor(),
                                      n.bias ? d.var(n.normalized) : Tensor()};
                  },
                  [n](const TensorList& x) {
                    return TensorList{layer_norm(x[0], n.normalized, x[1], x[2])};
                  }});
    if (n.bias && !n.weight) continue;
    cs.push_back(
        {std::string("rms_norm_") + n.label,
         {"rms_norm"},
         [n](Draw& d) {
           return TensorList{d.var(n.x), n.weight ? d.var(n.normalized) : Tensor()};
         },
         [n](const TensorList& x) { return TensorList{rms_norm(x[0], n.normalized, x[1])}; }});
  }
  cs.push_back({"embedding_repeated_indices",
                {"embedding"},
                [](Draw& d) {
                  return TensorList{d.var({5, 3}), indices({1, 4, 1, 0, 4, 1}, {2, 3})};
                },
                [](const TensorList& x) { return TensorList{embedding(x[0], x[1])}; }});
  cs.push_back({"embedding_1d_indices",
                {"embedding"},
                [](Draw& d) {
                  return TensorList{d.var({4, 2}), indices({3, 3, 0}, {3})};
                },
                [](const TensorList& x) { return TensorList{embedding(x[0], x[1])}; }});
  cs.push_back({"nll_loss",
                {"nll_loss"},
                [](Draw& d) {
                  return TensorList{d.var({4, 5}), indices({1, 0, 4, 1}, {4})};
                },
                [](const TensorList& x) { return TensorList{nll_loss(x[0], x[1])}; }});
  cs.push_back({"nll_loss_ignore_index",
                {"nll_loss"},
                [](Draw& d) {
                  return TensorList{d.var({4, 5}), indices({1, -100, 4, 3}, {4})};
                },
                [](const TensorList& x) { return TensorList{nll_loss(x[0], x[1])}; }});
  cs.push_back({"nll_loss_custom_ignore_index",
                {"nll_loss"},
                [](Draw& d) {
                  return TensorList{d.var({4, 5}), indices({2, 2, 4, 3}, {4})};
                },
                [](const TensorList& x) { return TensorList{nll_loss(x[0], x[1], 2)}; }});
  cs.push_back({"nll_loss_1d",
                {"nll_loss"},
                [](Draw& d) {
                  return TensorList{d.var({5}), indices({3}, {})};
                },
                [](const TensorList& x) { return TensorList{nll_loss(x[0], x[1])}; }});
  cs.push_back({"cross_entropy",
                {"log_softmax", "nll_loss"},
                [](Draw& d) {
                  return TensorList{d.var({4, 5}), indices({1, 0, 4, 1}, {4})};
                },
                [](const TensorList& x) { return TensorList{cross_entropy(x[0], x[1])}; }});
  cs.push_back({"cross_entropy_ignore_index",
                {"log_softmax", "nll_loss"},
                [](Draw& d) {
                  return TensorList{d.var({3, 4}), indices({-1, 2, 0}, {3})};
                },
                [](const TensorList& x) { return TensorList{cross_entropy(x[0], x[1], -1)}; }});
  // The generator is reseeded on every call: the finite differences must see the same mask.
  cs.push_back({"dropout_p05",
                {"native_dropout"},
                [](Draw& d) {
                  return TensorList{d.var({4, 6})};
                },
                [](const TensorList& x) {
                  static Generator gen;
                  gen.set_seed(1234);
                  return TensorList{dropout(x[0], 0.5, true, &gen)};
                }});
  cs.push_back({"native_dropout_mask_output",
                {"native_dropout"},
                [](Draw& d) {
                  return TensorList{d.var({3, 4})};
                },
                [](const TensorList& x) {
                  static Generator gen;
                  gen.set_seed(99);
                  auto [out, mask] = ops::op_native_dropout(x[0], 0.25, &gen);
                  return TensorList{out, mask};
                }});
  auto qkv = [](Draw& d) {
    return TensorList{d.var({2, 3, 2}), d.var({2, 4, 2}), d.var({2, 4, 2})};
  };
  cs.push_back({"sdpa", {"softmax", "bmm"}, qkv, [](const TensorList& x) {
                  return TensorList{scaled_dot_product_attention(x[0], x[1], x[2])};
                }});
  cs.push_back({"sdpa_causal",
                {"softmax", "bmm", "where", "tril"},
                [](Draw& d) {
                  return TensorList{d.var({2, 3, 2}), d.var({2, 3, 2}), d.var({2, 3, 2})};
                },
                [](const TensorList& x) {
                  return TensorList{scaled_dot_product_attention(x[0], x[1], x[2], {}, true)};
                }});
  cs.push_back(
      {"sdpa_bool_mask",
       {"softmax", "bmm", "where"},
       [](Draw& d) {
         TensorList x = {d.var({2, 3, 2}), d.var({2, 4, 2}), d.var({2, 4, 2})};
         // Every query keeps at least one key (column 0).
         x.push_back(values({1, 0, 1, 1, 1, 1, 0, 0, 1, 0, 0, 1}, {3, 4}, false).to(kBool));
         return x;
       },
       [](const TensorList& x) {
         return TensorList{scaled_dot_product_attention(x[0], x[1], x[2], x[3])};
       }});
  // Note [Fused attention]: the backward kernel recomputes p from the saved logsumexp.
  cs.push_back({"flash_attention", {"flash_attention"}, qkv, [](const TensorList& x) {
                  return TensorList{std::get<0>(flash_attention(x[0], x[1], x[2]))};
                }});
  cs.push_back({"flash_attention_causal_l_gt_s",
                {"flash_attention"},
                [](Draw& d) {
                  return TensorList{d.var({1, 2, 5, 3}), d.var({1, 2, 3, 3}), d.var({1, 2, 3, 3})};
                },
                [](const TensorList& x) {
                  return TensorList{std::get<0>(flash_attention(x[0], x[1], x[2], true, 0.8))};
                }});
  // Note [GELU epilogue]: both outputs (gelu_tanh(z), z) carry gradients.
  cs.push_back({"addmm_gelu_both_outputs",
                {"addmm_gelu"},
                [](Draw& d) {
                  return TensorList{d.var({3}), d.var({4, 5}), d.var({5, 3})};
                },
                [](const TensorList& x) {
                  auto [out, z] = addmm_gelu(x[0], x[1], x[2]);
                  return TensorList{out, z};
                }});
  cs.push_back({"linear_gelu_3d_no_bias",
                {"addmm_gelu", "transpose", "view"},
                [](Draw& d) {
                  return TensorList{d.var({2, 3, 4}), d.var({5, 4})};
                },
                [](const TensorList& x) { return TensorList{linear_gelu(x[0], x[1])}; }});
  cs.push_back(
      {"sdpa_float_mask_grad",
       {"softmax", "bmm", "add"},
       [](Draw& d) {
         return TensorList{d.var({1, 3, 2}), d.var({1, 4, 2}), d.var({1, 4, 2}), d.var({3, 4})};
       },
       [](const TensorList& x) {
         return TensorList{scaled_dot_product_attention(x[0], x[1], x[2], x[3], false, 0.7)};
       }});
  return cs;
}

Cases shape_index_cases() {
  Cases cs;
  cs.push_back({"cat_dim0_three",
                {"cat"},
                [](Draw& d) {
                  return TensorList{d.var({2, 3}), d.var({1, 3}), d.var({3, 3})};
                },
                [](const TensorList& x) {
                  return TensorList{cat({x[0], x[1], x[2]}, 0)};
                }});
  cs.push_back({"cat_dim1_mixed_grad",
                {"cat"},
                [](Draw& d) {
                  return TensorList{d.var({2, 2}), d.fixed({2, 1}), d.var({2, 3})};
                },
                [](const TensorList& x) {
                  return TensorList{cat({x[0], x[1], x[2]}, -1)};
                }});
  cs.push_back({"cat_same_input_twice",
                {"cat"},
                [](Draw& d) {
                  return TensorList{d.var({2, 3})};
                },
                [](const TensorList& x) {
                  return TensorList{cat({x[0], x[0]}, 1)};
                }});
  cs.push_back({"cat_skips_legacy_empty",
                {"cat"},
                [](Draw& d) {
                  return TensorList{d.var({2, 3}), d.var({1, 3})};
                },
                [](const TensorList& x) {
                  return TensorList{cat({x[0], zeros({0}, kFloat64), x[1]}, 0)};
                }});
  cs.push_back({"stack_dim0",
                {"cat", "unsqueeze"},
                [](Draw& d) {
                  return TensorList{d.var({2, 3}), d.var({2, 3})};
                },
                [](const TensorList& x) {
                  return TensorList{stack({x[0], x[1]}, 0)};
                }});
  cs.push_back({"stack_dim_last",
                {"cat", "unsqueeze"},
                [](Draw& d) {
                  return TensorList{d.var({3}), d.var({3}), d.var({3})};
                },
                [](const TensorList& x) {
                  return TensorList{stack({x[0], x[1], x[2]}, -1)};
                }});
  cs.push_back({"split_sizes",
                {"slice"},
                [](Draw& d) {
                  return TensorList{d.var({5, 2})};
                },
                [](const TensorList& x) {
                  return split(x[0], IntArrayRef({2, 3}), 0);
                }});
  cs.push_back({"split_uneven_dim1",
                {"slice"},
                [](Draw& d) {
                  return TensorList{d.var({2, 5})};
                },
                [](const TensorList& x) { return split(x[0], 2, 1); }});
  cs.push_back({"chunk_partly_used",
                {"slice", "mul"},
                [](Draw& d) {
                  return TensorList{d.var({6, 2})};
                },
                [](const TensorList& x) {
                  TensorList c = chunk(x[0], 3, 0);
                  return TensorList{c[0] * c[2]};  // chunk 1 unused: its gradient is 0
                }});
  cs.push_back({"index_select_dim0_repeats",
                {"index_select"},
                [](Draw& d) {
                  return TensorList{d.var({4, 3}), indices({3, 0, 3, 3, 1}, {5})};
                },
                [](const TensorList& x) { return TensorList{index_select(x[0], 0, x[1])}; }});
  cs.push_back({"index_select_dim1",
                {"index_select"},
                [](Draw& d) {
                  return TensorList{d.var({2, 4}), indices({2, 1}, {2})};
                },
                [](const TensorList& x) { return TensorList{index_select(x[0], 1, x[1])}; }});
  cs.push_back({"gather_dim1",
                {"gather"},
                [](Draw& d) {
                  return TensorList{d.var({3, 4}), indices({0, 0, 3, 1, 2, 1, 3, 3, 3}, {3, 3})};
                },
                [](const TensorList& x) { return TensorList{gather(x[0], 1, x[1])}; }});
  cs.push_back({"gather_dim0_smaller_index",
                {"gather"},
                [](Draw& d) {
                  return TensorList{d.var({3, 4}), indices({2, 0, 2, 1, 1, 2}, {2, 3})};
                },
                [](const TensorList& x) { return TensorList{gather(x[0], 0, x[1])}; }});
  cs.push_back(
      {"scatter_add_self_and_src",
       {"scatter_add"},
       [](Draw& d) {
         return TensorList{d.var({3, 4}), indices({0, 2, 2, 1, 0, 0}, {2, 3}), d.var({2, 3})};
       },
       [](const TensorList& x) { return TensorList{scatter_add(x[0], 0, x[1], x[2])}; }});
  cs.push_back({"scatter_add_src_larger_than_index",
                {"scatter_add"},
                [](Draw& d) {
                  return TensorList{d.var({3, 4}), indices({3, 3, 1, 0}, {2, 2}), d.var({3, 3})};
                },
                [](const TensorList& x) { return TensorList{scatter_add(x[0], 1, x[1], x[2])}; }});
  cs.push_back({"scatter_add__inplace",
                {"scatter_add", "copy_"},
                [](Draw& d) {
                  return TensorList{d.var({3, 4}), indices({1, 1, 2, 0}, {1, 4}), d.var({1, 4})};
                },
                [](const TensorList& x) {
                  Tensor self = nonleaf(x[0]);
                  scatter_add_(self, 0, x[1], x[2]);
                  return TensorList{self};
                }});
  cs.push_back(
      {"index_add_alpha",
       {"index_add"},
       [](Draw& d) {
         return TensorList{d.var({4, 3}), indices({3, 0, 3}, {3}), d.var({3, 3})};
       },
       [](const TensorList& x) { return TensorList{index_add(x[0], 0, x[1], x[2], 2.5)}; }});
  cs.push_back({"index_add_dim1",
                {"index_add"},
                [](Draw& d) {
                  return TensorList{d.var({2, 4}), indices({1, 1}, {2}), d.var({2, 2})};
                },
                [](const TensorList& x) { return TensorList{index_add(x[0], 1, x[1], x[2])}; }});
  cs.push_back({"index_add__inplace",
                {"index_add", "copy_"},
                [](Draw& d) {
                  return TensorList{d.var({4, 3}), indices({2, 2}, {2}), d.var({2, 3})};
                },
                [](const TensorList& x) {
                  Tensor self = nonleaf(x[0]);
                  index_add_(self, 0, x[1], x[2], -0.5);
                  return TensorList{self};
                }});
  for (int64_t diag : {-1, 0, 1}) {
    std::string s = diag < 0 ? "m1" : std::to_string(diag);
    cs.push_back({"triu_" + s,
                  {"triu"},
                  [](Draw& d) {
                    return TensorList{d.var({3, 4})};
                  },
                  [diag](const TensorList& x) { return TensorList{triu(x[0], diag)}; }});
    cs.push_back({"tril_" + s,
                  {"tril"},
                  [](Draw& d) {
                    return TensorList{d.var({2, 3, 3})};
                  },
                  [diag](const TensorList& x) { return TensorList{tril(x[0], diag)}; }});
  }
  return cs;
}

// View ops, copies and fills, in-place ops on views. Outputs are views of the inputs, or are
// multiplied by a fixed tensor where a plain view would hide a wrong layout of the gradient.
Cases view_cases() {
  Cases cs;
  auto one = [](Dims s) { return [s](Draw& d) { return TensorList{d.var(s)}; }; };
  auto view_row = [&](const std::string& name, std::vector<std::string> ops, Dims shape,
                      std::function<Tensor(const Tensor&)> f) {
    cs.push_back({name, std::move(ops), one(shape),
                  [f](const TensorList& x) { return TensorList{f(x[0])}; }});
  };
  view_row("view", {"view"}, {2, 6}, [](const Tensor& x) { return view(x, {3, 4}); });
  view_row("view_infer", {"view"}, {2, 3, 2}, [](const Tensor& x) { return view(x, {-1, 2}); });
  view_row("reshape_of_transposed", {"transpose", "to_copy", "view"}, {2, 3},
           [](const Tensor& x) { return reshape(transpose(x, 0, 1), {6}); });
  view_row("as_strided", {"as_strided"}, {12}, [](const Tensor& x) {
    return as_strided(x, {2, 3}, {4, 1}, 1);
  });
  view_row("as_strided_overlapping", {"as_strided"}, {6}, [](const Tensor& x) {
    return as_strided(x, {3, 3}, {1, 1}, 0);
  });
  view_row("permute", {"permute"}, {2, 3, 4}, [](const Tensor& x) {
    return permute(x, {2, 0, 1});
  });
  view_row("transpose", {"transpose"}, {2, 3, 4},
           [](const Tensor& x) { return transpose(x, 0, -1); });
  view_row("slice_step2", {"slice"}, {5, 3}, [](const Tensor& x) { return slice(x, 0, 0, 5, 2); });
  view_row("slice_dim1_offset", {"slice"}, {2, 5},
           [](const Tensor& x) { return slice(x, 1, 1, 4, 1); });
  view_row("select", {"select"}, {3, 4}, [](const Tensor& x) { return select(x, 1, 2); });
  view_row("select_neg", {"select"}, {3, 4}, [](const Tensor& x) { return select(x, 0, -1); });
  view_row("expand", {"expand"}, {3, 1}, [](const Tensor& x) { return expand(x, {2, 3, 4}); });
  view_row("expand_0d", {"expand"}, {}, [](const Tensor& x) { return expand(x, {2, 3}); });
  view_row("squeeze_all", {"squeeze"}, {1, 3, 1, 2}, [](const Tensor& x) { return squeeze(x); });
  view_row("squeeze_dim", {"squeeze"}, {3, 1, 2}, [](const Tensor& x) { return squeeze(x, 1); });
  view_row("unsqueeze", {"unsqueeze"}, {3, 2}, [](const Tensor& x) { return unsqueeze(x, -1); });
  view_row("alias_t_1d", {"alias"}, {4}, [](const Tensor& x) { return t(x); });
  view_row("t_2d", {"transpose"}, {2, 3}, [](const Tensor& x) { return t(x); });
  view_row("flatten", {"view"}, {2, 3, 2}, [](const Tensor& x) { return flatten(x, 1); });
  view_row("narrow", {"slice"}, {4, 3}, [](const Tensor& x) { return narrow(x, 0, 1, 2); });
  view_row("view_of_view", {"transpose", "slice", "select"}, {3, 4, 2},
           [](const Tensor& x) { return select(slice(transpose(x, 0, 1), 0, 1, 4, 2), 2, 1); });
  view_row("clone", {"to_copy"}, {2, 3}, [](const Tensor& x) { return clone(x); });
  view_row("contiguous_of_permuted", {"permute", "to_copy"}, {2, 3, 2}, [](const Tensor& x) {
    return contiguous(permute(x, {1, 2, 0}));
  });
  // A view used in arithmetic (a wrongly laid out gradient would not cancel).
  cs.push_back({"transpose_times_fixed",
                {"transpose", "mul"},
                [](Draw& d) {
                  return TensorList{d.var({2, 3}), d.fixed({3, 2})};
                },
                [](const TensorList& x) { return TensorList{transpose(x[0], 0, 1) * x[1]}; }});

  // copy_ and fill_ into non-leaves.
  cs.push_back({"copy__bcast_src",
                {"copy_"},
                [](Draw& d) {
                  return TensorList{d.var({2, 3}), d.var({3})};
                },
                [](const TensorList& x) {
                  Tensor self = nonleaf(x[0]);
                  self.copy_(x[1]);
                  return TensorList{self * 2.0};
                }});
  cs.push_back({"copy__into_slice",
                {"copy_", "slice"},
                [](Draw& d) {
                  return TensorList{d.var({3, 4}), d.var({3, 2})};
                },
                [](const TensorList& x) {
                  Tensor self = nonleaf(x[0]);
                  slice(self, 1, 1, 3).copy_(x[1]);
                  return TensorList{self};
                }});
  cs.push_back({"copy__float32_src",
                {"copy_"},
                [](Draw& d) {
                  return TensorList{d.var({2, 3}), d.fixed({2, 3})};
                },
                [](const TensorList& x) {
                  // A float32 source (no grad): self's old value gets a zero gradient.
                  Tensor self = nonleaf(x[0]);
                  self.copy_(x[1].to(kFloat32));
                  return TensorList{self};
                }});
  cs.push_back({"fill__slice", {"fill_", "slice"}, one({3, 4}), [](const TensorList& x) {
                  Tensor self = nonleaf(x[0]);
                  slice(self, 0, 1, 2).fill_(3.0);
                  return TensorList{self};
                }});
  cs.push_back({"fill__whole",
                {"fill_"},
                [](Draw& d) {
                  return TensorList{d.var({2, 3}), d.var({2, 3})};
                },
                [](const TensorList& x) {
                  Tensor self = nonleaf(x[0]);
                  self.fill_(-1.0);
                  return TensorList{self * x[1]};
                }});

  // In-place ops on views of a non-leaf: the base's history is rewritten (CopySlices).
  auto base_and = [](Dims b, Dims o) {
    return [b, o](Draw& d) { return TensorList{d.var(b), d.var(o)}; };
  };
  cs.push_back({"inplace_mul_on_slice",
                {"mul_", "slice"},
                base_and({4, 3}, {2, 3}),
                [](const TensorList& x) {
                  Tensor b = nonleaf(x[0]);
                  Tensor v = slice(b, 0, 1, 3);
                  mul_(v, x[1]);
                  return TensorList{b};
                }});
  cs.push_back({"inplace_add_on_select_alpha",
                {"add_", "select"},
                base_and({3, 4}, {4}),
                [](const TensorList& x) {
                  Tensor b = nonleaf(x[0]);
                  Tensor v = select(b, 0, 1);
                  add_(v, x[1], 2);
                  return TensorList{b * b};
                }});
  cs.push_back({"inplace_on_strided_slice_then_view_used",
                {"mul_", "slice"},
                base_and({5, 2}, {2}),
                [](const TensorList& x) {
                  Tensor b = nonleaf(x[0]);
                  Tensor v = slice(b, 0, 0, 5, 2);
                  mul_(v, x[1]);
                  return TensorList{b, v * 3.0};
                }});
  cs.push_back({"inplace_on_view_of_view",
                {"exp_", "transpose", "select"},
                one({3, 4}),
                [](const TensorList& x) {
                  Tensor b = nonleaf(x[0]);
                  Tensor v = select(transpose(b, 0, 1), 0, 2);
                  exp_(v);
                  return TensorList{b};
                }});
  cs.push_back({"inplace_on_base_then_old_view",
                {"mul_", "slice"},
                base_and({4, 2}, {4, 2}),
                [](const TensorList& x) {
                  Tensor b = nonleaf(x[0]);
                  Tensor v = slice(b, 0, 1, 3);  // taken before the in-place op on b
                  mul_(b, x[1]);
                  return TensorList{v * v};
                }});
  cs.push_back({"inplace_on_one_view_other_view_read",
                {"mul_", "transpose", "select"},
                base_and({3, 3}, {3}),
                [](const TensorList& x) {
                  Tensor b = nonleaf(x[0]);
                  Tensor row = select(b, 0, 0);
                  Tensor col = select(transpose(b, 0, 1), 0, 0);  // shares b[0][0] with row
                  mul_(row, x[1]);
                  return TensorList{col * 2.0, b};
                }});
  cs.push_back({"inplace_chain_on_nonleaf",
                {"mul_", "add_", "sigmoid_"},
                base_and({2, 3}, {3}),
                [](const TensorList& x) {
                  Tensor b = nonleaf(x[0]);
                  mul_(b, x[1]);
                  add_(b, x[1], -1);
                  ops::op_sigmoid_(b);
                  return TensorList{b};
                }});
  return cs;
}

// ---------------------------------------------------------------- runner

const std::vector<const Cases*>& all_tables() {
  static const Cases pw = pointwise_cases(), red = reduce_cases(), nn = linalg_nn_cases(),
                     si = shape_index_cases(), vw = view_cases();
  static const std::vector<const Cases*> all = {&pw, &red, &nn, &si, &vw};
  return all;
}
std::vector<const GradCase*> rows(size_t table) {
  std::vector<const GradCase*> out;
  for (const GradCase& c : *all_tables()[table]) out.push_back(&c);
  return out;
}

// Records the names of the ops that reach the Profile key while it is included (see
// Note [How a gradcheck row runs]); the fallback is installed only for the recording.
std::set<std::string>* g_recorded = nullptr;
void record_fallback(const OpDef& op, DispatchKey, Stack& stack) {
  if (g_recorded) g_recorded->emplace(op.name());
  ExcludeKeyGuard guard(DispatchKey::Profile);
  op.call_boxed(stack);
}
std::set<std::string> ops_reached(const Fn& fn, const TensorList& inputs) {
  std::set<std::string> out;
  if (fallback_for(DispatchKey::Profile) != nullptr) return out;  // a real profiler owns it
  register_fallback(DispatchKey::Profile, &record_fallback);
  g_recorded = &out;
  try {
    IncludeKeyGuard include(DispatchKey::Profile);
    fn(inputs);
  } catch (...) {
    g_recorded = nullptr;
    register_fallback(DispatchKey::Profile, nullptr);
    throw;
  }
  g_recorded = nullptr;
  register_fallback(DispatchKey::Profile, nullptr);
  return out;
}

class Gradcheck : public testing::TestWithParam<const GradCase*> {};

TEST_P(Gradcheck, MatchesFiniteDifferences) {
  const GradCase& c = *GetParam();
  Draw draw(c.name);
  TensorList inputs = c.make(draw);
  // Every floating output must carry a gradient: gradcheck skips outputs that do not, so a
  // row whose output lost its history would otherwise pass without checking anything.
  for (const Tensor& out : c.fn(inputs)) {
    bool floating = out.defined() && is_floating(out.dtype());
    EXPECT_TRUE(!floating || out.requires_grad())
        << "an output of " << c.name << " does not require grad";
  }
  std::set<std::string> reached = ops_reached(c.fn, inputs);
  if (!reached.empty()) {
    for (const std::string& op : c.ops)
      EXPECT_TRUE(reached.count(op))
          << "row " << c.name << " lists " << op << " but does not call it";
  }
  // Outputs are copied (to_copy, whose backward is the identity) before gradcheck sees them:
  // gradcheck reads the plus and minus evaluations only after restoring the input, so an output
  // that is a view of an input would read the restored values twice (see GradcheckTool below).
  Fn copied = [&c](const TensorList& x) {
    TensorList out = c.fn(x);
    for (Tensor& t : out)
      if (t.defined()) t = clone(t);
    return out;
  };
  std::string why;
  EXPECT_TRUE(autograd::gradcheck(copied, inputs, {}, &why)) << why;
}

std::string row_name(const testing::TestParamInfo<const GradCase*>& info) {
  return info.param->name;
}
INSTANTIATE_TEST_SUITE_P(Pointwise, Gradcheck, testing::ValuesIn(rows(0)), row_name);
INSTANTIATE_TEST_SUITE_P(Reduce, Gradcheck, testing::ValuesIn(rows(1)), row_name);
INSTANTIATE_TEST_SUITE_P(LinalgNN, Gradcheck, testing::ValuesIn(rows(2)), row_name);
INSTANTIATE_TEST_SUITE_P(ShapeIndex, Gradcheck, testing::ValuesIn(rows(3)), row_name);
INSTANTIATE_TEST_SUITE_P(Views, Gradcheck, testing::ValuesIn(rows(4)), row_name);

// gradcheck itself: a function whose output is a view of its input. Central differences must
// see the output at x + eps and at x - eps; if gradcheck keeps the two results and reads them
// after the next perturbation (or after restoring x), both alias the input's current values and
// the numerical derivative is 0.
TEST(GradcheckTool, OutputThatIsAViewOfTheInput) {
  Draw d("gradcheck_view_output");
  TensorList in = {d.var({2, 3})};
  std::string why;
  EXPECT_TRUE(autograd::gradcheck(
      [](const TensorList& x) { return TensorList{transpose(x[0], 0, 1)}; }, in, {}, &why))
      << why;
  EXPECT_TRUE(
      autograd::gradcheck([](const TensorList& x) { return TensorList{x[0]}; }, in, {}, &why))
      << why;
}

// gradcheck rejects a wrong gradient (the tool is not vacuous): a function whose backward
// ignores part of its forward (the detached factor).
TEST(GradcheckTool, DetectsAWrongGradient) {
  Draw d("gradcheck_wrong");
  TensorList in = {d.var({3})};
  std::string why;
  EXPECT_FALSE(autograd::gradcheck(
      [](const TensorList& x) { return TensorList{x[0] * x[0].detach()}; }, in, {}, &why));
  EXPECT_NE(why.find("analytical"), std::string::npos) << why;
}

// ---------------------------------------------------------------- coverage

using autograd::Differentiability;

// ..._backward ops are backward formulas themselves: Kiln has no double backward.
bool is_out_or_foreach(std::string_view name) {
  return name.starts_with("foreach_") || name.ends_with("_out") || name.ends_with("_backward");
}

// Every op but the out= variants and foreach updates says how it differentiates.
TEST(AutogradCoverage, EveryOpHasADerivativeKind) {
  std::string missing;
  for (const OpDef* op : ops::all_ops()) {
    if (is_out_or_foreach(op->name())) continue;
    if (autograd::derivative_of(*op).kind == Differentiability::Unsupported)
      missing += std::string(missing.empty() ? "" : ", ") + std::string(op->name());
  }
  EXPECT_EQ(missing, "") << "ops without a backward formula or Differentiability::None";
}

// Every op with a backward formula is exercised by a row of the table. Adding a formula
// without adding a row here is not allowed.
TEST(AutogradCoverage, EveryFormulaHasAGradcheckRow) {
  std::set<std::string> covered;
  std::set<std::string> names;
  for (const Cases* t : all_tables()) {
    for (const GradCase& c : *t) {
      EXPECT_TRUE(names.insert(c.name).second) << "duplicate row name " << c.name;
      for (const std::string& op : c.ops) {
        EXPECT_NE(ops::find_op(op), nullptr) << "row " << c.name << " lists unknown op " << op;
        covered.insert(op);
      }
    }
  }
  std::string missing;
  for (const OpDef* op : ops::all_ops()) {
    if (autograd::derivative_of(*op).kind != Differentiability::Formula) continue;
    if (!covered.count(std::string(op->name())))
      missing += std::string(missing.empty() ? "" : ", ") + std::string(op->name());
  }
  EXPECT_EQ(missing, "") << "ops with a backward formula but no gradcheck row";
}

// The out= variants and foreach updates are the only ops autograd refuses.
TEST(AutogradCoverage, OutAndForeachAreUnsupported) {
  for (const OpDef* op : ops::all_ops()) {
    if (!is_out_or_foreach(op->name())) continue;
    EXPECT_EQ(autograd::derivative_of(*op).kind, Differentiability::Unsupported) << op->name();
  }
}

}  // namespace
}  // namespace kiln::test

#include "tests/ops/op_test_util.h"

#include <cmath>
#include <limits>
#include <stdexcept>

namespace kiln::test {

namespace {

template <class T>
T from_double(double x) {
  if constexpr (std::is_same_v<T, bool>)
    return x != 0;
  else if constexpr (std::is_same_v<T, Half> || std::is_same_v<T, BFloat16>)
    return T(static_cast<float>(x));
  else
    return static_cast<T>(x);
}

// A contiguous tensor of `shape` holding `v` (in row-major order) converted to `dt`.
Tensor from_doubles(const std::vector<double>& v, IntArrayRef shape, DType dt) {
  return KILN_DISPATCH_TYPES(dt, "test", [&]() -> Tensor {
    std::vector<scalar_t> tv;
    tv.reserve(v.size());
    for (double x : v) tv.push_back(from_double<scalar_t>(x));
    if (shape.empty()) return from_vector(tv, {1}).view({});
    return from_vector(tv, shape);
  });
}

}  // namespace

// ---------------------------------------------------------------- Gen

Tensor Gen::make(const Spec& s, DType dt, const std::function<double()>& draw) {
  IntArrayRef shape = s.shape;
  size_t nd = shape.size();
  Layout layout = s.layout;
  if (layout == Layout::Transposed && nd < 2) layout = nd == 1 ? Layout::Strided : Layout::Contig;
  if (layout == Layout::Strided && nd == 0) layout = Layout::Contig;
  size_t edim = 0;
  if (layout == Layout::Expanded) {
    while (edim < nd && shape[edim] == 1) ++edim;
    if (edim == nd) layout = Layout::Contig;
  }
  Shape base(shape);
  if (layout == Layout::Transposed) std::swap(base[nd - 2], base[nd - 1]);
  if (layout == Layout::Strided) base[nd - 1] = 2 * base[nd - 1] + 1;
  if (layout == Layout::Expanded) base[edim] = 1;
  int64_t n = 1;
  for (int64_t x : base) n *= x;
  std::vector<double> v(static_cast<size_t>(n));
  for (double& x : v) x = draw();
  Tensor t = from_doubles(v, base, dt);
  switch (layout) {
    case Layout::Contig:
      return t;
    case Layout::Transposed:
      return transpose(t, -2, -1);
    case Layout::Strided:
      return slice(t, -1, 1, base[nd - 1], 2);
    case Layout::Expanded:
      return expand(t, shape);
  }
  return t;
}

Tensor Gen::uniform(const Spec& s, double lo, double hi, std::optional<DType> dt) {
  DType d = dt.value_or(dtype);
  if (d == kBool) return make(s, d, [&] { return static_cast<double>(integer(0, 1)); });
  if (!is_floating(d)) {
    auto l = static_cast<int64_t>(std::ceil(lo)), h = static_cast<int64_t>(std::floor(hi));
    if (d == kUInt8) l = std::max<int64_t>(l, 0);
    return make(s, d, [&] { return static_cast<double>(integer(l, h)); });
  }
  return make(s, d, [&] { return real(lo, hi); });
}

Tensor Gen::any(const Spec& s, std::optional<DType> dt) {
  DType d = dt.value_or(dtype);
  if (d == kUInt8) return uniform(s, 0, 18, d);
  if (d == kInt32 || d == kInt64) return uniform(s, -9, 9, d);
  return uniform(s, -2, 2, d);
}

Tensor Gen::positive(const Spec& s, std::optional<DType> dt) {
  DType d = dt.value_or(dtype);
  if (d == kBool) return make(s, d, [] { return 1.0; });
  if (!is_floating(d)) return uniform(s, 1, 9, d);
  return uniform(s, 0.25, 4, d);
}

Tensor Gen::distinct(const Spec& s, std::optional<DType> dt) {
  DType d = dt.value_or(dtype);
  EXPECT_NE(d, kBool) << "distinct values need more than two values";
  std::vector<double> pool(256);
  for (int i = 0; i < 256; ++i) pool[i] = d == kUInt8 ? i : i - 128;
  std::shuffle(pool.begin(), pool.end(), rng);
  size_t next = 0;
  return make(s, d, [&] {
    EXPECT_LT(next, pool.size()) << "distinct() holds at most 256 elements";
    return pool[next++ % pool.size()];
  });
}

Tensor Gen::sparse(const Spec& s, std::optional<DType> dt) {
  DType d = dt.value_or(dtype);
  double lo = d == kUInt8 ? 0 : is_floating(d) ? -2 : -9;
  double hi = d == kUInt8 ? 18 : is_floating(d) ? 2 : 9;
  return make(s, d, [&] {
    if (real(0, 1) < 0.4) return 0.0;
    if (d == kBool) return 1.0;
    return is_floating(d) ? real(lo, hi) : static_cast<double>(integer(lo, hi));
  });
}

Tensor Gen::mask(const Spec& s) {
  return make(s, kBool, [&] { return static_cast<double>(integer(0, 1)); });
}

Tensor Gen::index(const Spec& s, int64_t hi, DType dt) {
  return make(s, dt, [&] { return static_cast<double>(integer(0, hi - 1)); });
}

Tensor Gen::values(const std::vector<double>& v, IntArrayRef shape, std::optional<DType> dt) {
  return from_doubles(v, shape, dt.value_or(dtype));
}

Tensor to_device(const Tensor& t, Device d) { return t.defined() ? t.to(d) : t; }

// ---------------------------------------------------------------- GradGen

Tensor GradGen::make(const Dims& shape, const std::function<double()>& f) {
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  std::vector<double> v(static_cast<size_t>(n));
  for (double& x : v) x = f();
  return from_vector(v, IntArrayRef({n})).reshape(shape);
}
Tensor GradGen::var(const Dims& shape, double lo, double hi) {
  return make(shape, [&] { return real(lo, hi); }).requires_grad_();
}
Tensor GradGen::away(const Dims& shape, double gap) {
  return make(shape, [&] { return (real(0, 1) < 0.5 ? -1 : 1) * real(gap, 2); }).requires_grad_();
}
Tensor GradGen::grid(const Dims& shape, double offset) {
  return make(shape, [&] { return offset + 0.5 * static_cast<double>(integer(-4, 4)); })
      .requires_grad_();
}
Tensor GradGen::avoiding(const Dims& shape, std::vector<double> avoid, double lo, double hi) {
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
Tensor GradGen::fixed(const Dims& shape) {
  return make(shape, [&] { return real(-2, 2); });
}
Tensor GradGen::mask(const Dims& shape) {
  return make(shape, [&] { return real(0, 1) < 0.5 ? 1.0 : 0.0; }).to(kBool);
}

Tensor grad_values(const std::vector<double>& v, const Dims& shape, bool grad) {
  Tensor t = from_vector(v, IntArrayRef({static_cast<int64_t>(v.size())})).reshape(shape);
  return grad ? t.requires_grad_() : t;
}
Tensor grad_indices(const std::vector<int64_t>& v, const Dims& shape) {
  return from_vector(v, IntArrayRef({static_cast<int64_t>(v.size())})).reshape(shape);
}

OpCase& head(Cases& cs, const std::string& op) {
  for (OpCase& c : cs)
    if (!c.ops.empty() && c.ops[0] == op) return c;
  throw std::logic_error("the op table has no row for " + op);
}

// ---------------------------------------------------------------- comparison

std::pair<double, double> tolerance(Tol tol, DType dtype, Where where) {
  if (tol == Tol::Exact || !is_floating(dtype)) return {0, 0};
  bool device = where == Where::Device;
  if (tol == Tol::Searched16) tol = device ? Tol::Unordered16 : Tol::Intermediate16;
  bool intermediate = tol == Tol::Intermediate16;
  bool summed = device && (tol == Tol::Accum || intermediate || tol == Tol::Unordered16);
  double sum_atol = summed ? 1e-4 : 1e-5;
  switch (dtype) {
    case kFloat16:
      if (tol == Tol::Unordered16) return {1e-2, 4e-3};
      return {1e-3, intermediate ? (device ? 2e-3 : 1e-3) : sum_atol};
    case kBFloat16:
      if (tol == Tol::Unordered16) return {6.4e-2, 3.2e-2};
      return {1.6e-2, intermediate ? (device ? 1.6e-2 : 8e-3) : sum_atol};
    case kFloat32:
      if (tol == Tol::Default) return {device ? 4e-6 : 1.3e-6, 1e-5};
      return {device ? 5e-5 : 1e-5, sum_atol};
    default:
      return {1e-7, 1e-7};
  }
}

namespace {
std::string index_str(int64_t flat, at::IntArrayRef sizes) {
  std::vector<int64_t> idx(sizes.size());
  for (size_t d = sizes.size(); d-- > 0;) {
    idx[d] = flat % sizes[d];
    flat /= sizes[d];
  }
  return fmt::format("[{}]", fmt::join(idx, ", "));
}
}  // namespace

testing::AssertionResult compare(const Tensor& got, const at::Tensor& want, Tol tol,
                                 std::optional<DType> tol_dtype, Where computed) {
  if (!got.defined()) return testing::AssertionFailure() << "got an undefined tensor";
  if (!got.device().is_cpu())
    return testing::AssertionFailure() << "got a tensor on " << got.device().str();
  DType wd = from_aten(want.scalar_type());
  if (got.dtype() != wd)
    return testing::AssertionFailure()
           << "dtype: got " << name(got.dtype()) << ", expected " << name(wd);
  std::vector<int64_t> gs = vec(got.sizes());
  if (gs != want.sizes().vec())
    return testing::AssertionFailure()
           << fmt::format("shape: got [{}], expected [{}]", fmt::join(gs, ", "),
                          fmt::join(want.sizes().vec(), ", "));
  if (tol == Tol::ShapeOnly || want.numel() == 0) return testing::AssertionSuccess();
  at::Tensor g = to_aten(got).flatten(), w = want.contiguous().flatten();
  auto [rtol, atol] = tolerance(tol, tol_dtype.value_or(wd), computed);
  at::Tensor bad;
  at::Tensor gd = g.to(at::kDouble), wdbl = w.to(at::kDouble);
  if (!is_floating(wd)) {
    bad = g.to(at::kLong).ne(w.to(at::kLong));
  } else {
    at::Tensor gn = gd.isnan(), wn = wdbl.isnan();
    at::Tensor close = (gd - wdbl).abs().le(atol + rtol * wdbl.abs()) | gd.eq(wdbl);
    bad = gn.ne(wn) | (gn.logical_not() & wn.logical_not() & close.logical_not());
  }
  int64_t nbad = bad.sum().item<int64_t>();
  if (nbad == 0) return testing::AssertionSuccess();
  auto r = testing::AssertionFailure();
  r << nbad << " of " << want.numel() << " values differ (rtol " << rtol << ", atol " << atol
    << "); first:";
  at::Tensor where = bad.nonzero().flatten();
  for (int64_t i = 0; i < std::min<int64_t>(where.numel(), 6); ++i) {
    int64_t k = where[i].item<int64_t>();
    r << fmt::format(" {} got {} want {};", index_str(k, want.sizes()), gd[k].item<double>(),
                     wdbl[k].item<double>());
  }
  return r;
}

// ---------------------------------------------------------------- row builders

Draw draw_any() {
  return [](Gen& g, const Spec& s) { return g.any(s); };
}
Draw draw_positive() {
  return [](Gen& g, const Spec& s) { return g.positive(s); };
}
Draw draw_sparse() {
  return [](Gen& g, const Spec& s) { return g.sparse(s); };
}
Draw draw_mask() {
  return [](Gen& g, const Spec& s) { return g.mask(s); };
}
Draw draw_uniform(double lo, double hi) {
  return [lo, hi](Gen& g, const Spec& s) { return g.uniform(s, lo, hi); };
}

MakeFn make_from(std::vector<Draw> draws, std::vector<Spec> specs) {
  return [draws = std::move(draws), specs = std::move(specs)](Gen& g) {
    KTensors in;
    for (size_t i = 0; i < draws.size(); ++i) in.push_back(draws[i](g, specs[i]));
    return in;
  };
}

namespace {
constexpr auto C = Layout::Contig;
constexpr auto T = Layout::Transposed;
constexpr auto S = Layout::Strided;
constexpr auto E = Layout::Expanded;
}  // namespace

bool grad_config(const ShapeConfig& c) {
  for (const Spec& s : c.in) {
    int64_t n = 1;
    for (int64_t d : s.shape) n *= d;
    if (n > 64) return false;
  }
  return true;
}

// Sizes are small except `large`, which has more elements than the CPU backend's grain size
// (32768) so that its parallel path runs too.
std::vector<ShapeConfig> functional_configs(size_t arity) {
  if (arity == 1)
    return {{"contig", {{{3, 5}, C}}},   {"noncontig", {{{4, 6}, T}}}, {"strided", {{{5, 7}, S}}},
            {"expanded", {{{4, 5}, E}}}, {"zero", {{{0, 3}, C}}},      {"0d", {{{}, C}}},
            {"large", {{{300, 129}, C}}}};
  if (arity == 2)
    return {{"contig", {{{3, 5}, C}, {{3, 5}, C}}},
            {"bcast", {{{4, 1, 5}, C}, {{3, 1}, C}}},
            {"bcast_row", {{{3, 5}, C}, {{5}, C}}},
            {"noncontig", {{{5, 3}, T}, {{5, 3}, S}}},
            {"expanded", {{{4, 5}, E}, {{4, 5}, C}}},
            {"zero", {{{0, 5}, C}, {{5}, C}}},
            {"0d_1d", {{{}, C}, {{3}, C}}},
            {"2d_0d", {{{3, 4}, C}, {{}, C}}},
            {"0d_0d", {{{}, C}, {{}, C}}},
            {"large", {{{300, 129}, C}, {{129}, C}}},
            {"large_noncontig", {{{129, 300}, T}, {{129, 300}, C}}}};
  return {{"contig", {{{3, 5}, C}, {{3, 5}, C}, {{3, 5}, C}}},
          {"bcast", {{{3, 1}, C}, {{5}, C}, {{4, 3, 1}, C}}},
          {"noncontig", {{{5, 3}, T}, {{5, 3}, S}, {{5, 3}, T}}},
          {"zero", {{{0, 5}, C}, {{5}, C}, {{1, 5}, C}}},
          {"0d", {{{}, C}, {{}, C}, {{}, C}}},
          {"0d_mixed", {{{3}, C}, {{}, C}, {{3}, C}}},
          {"large", {{{300, 129}, C}, {{300, 129}, C}, {{129}, C}}}};
}

// The first input is self: its shape is the result's.
std::vector<ShapeConfig> inplace_configs(size_t arity) {
  if (arity == 1)
    return {{"contig", {{{3, 5}, C}}},  {"noncontig", {{{3, 5}, T}}},
            {"strided", {{{4, 5}, S}}}, {"zero", {{{0, 3}, C}}},
            {"0d", {{{}, C}}},          {"large", {{{300, 129}, T}}}};
  if (arity == 2)
    return {{"contig", {{{3, 5}, C}, {{3, 5}, C}}},
            {"bcast", {{{3, 5}, T}, {{5}, C}}},
            {"strided", {{{4, 5}, S}, {{4, 5}, T}}},
            {"zero", {{{0, 5}, C}, {{5}, C}}},
            {"0d", {{{}, C}, {{}, C}}},
            {"1d_0d", {{{4}, C}, {{}, C}}},
            {"large", {{{300, 129}, C}, {{129}, C}}}};
  return {{"contig", {{{3, 5}, C}, {{3, 5}, C}, {{3, 5}, C}}},
          {"bcast", {{{3, 5}, T}, {{5}, C}, {{3, 1}, C}}},
          {"zero", {{{0, 5}, C}, {{0, 5}, C}, {{5}, C}}},
          {"0d", {{{}, C}, {{}, C}, {{}, C}}}};
}

// "noncontig" writes into a transposed out, "wider" into a wider dtype (see OutDType).
std::vector<ShapeConfig> out_configs(size_t arity) {
  if (arity == 1)
    return {{"contig", {{{3, 5}, C}}},
            {"noncontig", {{{3, 5}, C}}},
            {"wider", {{{3, 5}, T}}},
            {"zero", {{{0, 3}, C}}}};
  if (arity == 2)
    return {{"contig", {{{3, 5}, C}, {{3, 5}, C}}},
            {"noncontig", {{{4, 1, 5}, C}, {{3, 1}, C}}},
            {"wider", {{{3, 5}, C}, {{5}, C}}},
            {"zero", {{{0, 5}, C}, {{5}, C}}}};
  return {{"contig", {{{3, 5}, C}, {{3, 5}, C}, {{3, 5}, C}}},
          {"noncontig", {{{3, 1}, C}, {{5}, C}, {{4, 3, 1}, C}}},
          {"wider", {{{3, 5}, C}, {{3, 5}, C}, {{5}, C}}}};
}

const std::vector<double>& special_values() {
  static const std::vector<double> v = {std::numeric_limits<double>::quiet_NaN(),
                                        std::numeric_limits<double>::infinity(),
                                        -std::numeric_limits<double>::infinity(),
                                        0.0,
                                        -0.0,
                                        1e-30,
                                        -1e-30,
                                        1e-5,
                                        -1e-5,
                                        0.5,
                                        -0.5,
                                        1,
                                        -1,
                                        3.25,
                                        -3.25,
                                        20,
                                        -20,
                                        88,
                                        -88,
                                        1e4,
                                        -1e4,
                                        1e30,
                                        -1e30};
  return v;
}

OpCase out_variant(const OpCase& base, const std::string& op, KilnFn kiln,
                   const std::string& suffix, Layout out_layout, OutDType out_dtype) {
  OpCase c = base;
  c.name = base.name + "_out" + suffix;
  c.ops = {op};
  c.kiln = std::move(kiln);
  c.mode = Mode::Out;
  c.out_layout = out_layout;
  c.out_dtype = out_dtype;
  c.alias = Alias::None;
  c.grad = false;  // the record's gradchecks and errors stay with `base`
  c.grads.clear();
  c.errors.clear();
  return c;
}

std::vector<int64_t> dims_or_all(IntArrayRef dims, int64_t ndim) {
  if (!dims.empty()) return vec(dims);
  std::vector<int64_t> all(static_cast<size_t>(ndim));
  for (int64_t i = 0; i < ndim; ++i) all[i] = i;
  return all;
}

Shape shape_of(const at::Tensor& t) {
  Shape s;
  for (int64_t x : t.sizes()) s.push_back(x);
  return s;
}

}  // namespace kiln::test

// Op table: the pooling ops (max_pool2d/3d_with_indices, avg_pool2d/3d, adaptive_avg_pool2d/3d)
// and their backward ops, against ATen's (at::max_pool2d_with_indices, at::avg_pool2d,
// at::_adaptive_avg_pool2d, ...): kernel, stride, padding, dilation, ceil_mode,
// count_include_pad and divisor_override variants, batched and unbatched, 2-D and 3-D,
// non-contiguous inputs; the 1-D composites; gradchecks in float64; error rows. Means sum in
// another order than ATen's: Tol::Accum; max values and indices are exact.
#include <limits>

#include "tests/ops/op_test_util.h"

namespace kiln::test {
namespace {

constexpr auto C = Layout::Contig;
constexpr auto T = Layout::Transposed;

at::IntArrayRef ar(const Dims& d) { return at::IntArrayRef(d.data(), d.size()); }

struct PoolConfig {
  const char* label;
  Dims x;           // input [N, C, *spatial] or [C, *spatial]
  Dims k, s, p, d;  // kernel, stride, padding, dilation (avg: d unused); adaptive: k = output
  bool ceil = false;
  bool cip = true;                  // avg: count_include_pad
  std::optional<int64_t> div = {};  // avg: divisor_override
  Layout layout = C;
};

int64_t spatial(const PoolConfig& c) {
  return c.k.size() == 3 || (c.k.size() == 1 && c.x.size() >= 5) ? 3 : 2;
}

const std::vector<PoolConfig>& max_configs() {
  static const std::vector<PoolConfig> c = {
      {"2d_k2", {2, 3, 8, 8}, {2}, {}, {0}, {1}},
      // Note [2x2 max pooling]'s loop with a row and a column left over, and the general loop
      // where ceil_mode's last windows overhang the plane.
      {"2d_k2_odd", {2, 3, 7, 9}, {2}, {}, {0}, {1}},
      {"2d_k2_odd_ceil", {1, 2, 7, 9}, {2}, {}, {0}, {1}, true},
      {"3d_depth1_k122", {2, 2, 1, 6, 6}, {1, 2, 2}, {1, 2, 2}, {0}, {1}},
      {"2d_k3_s2_p1", {2, 3, 7, 9}, {3}, {2}, {1}, {1}},
      {"2d_rect_dilated", {1, 2, 9, 10}, {3, 2}, {2, 1}, {1, 0}, {2, 1}},
      {"2d_ceil", {2, 2, 8, 8}, {3}, {2}, {0}, {1}, true},
      {"2d_ceil_pad", {1, 2, 6, 6}, {3}, {2}, {1}, {1}, true},
      {"2d_unbatched", {3, 6, 5}, {2}, {1}, {0}, {1}},
      {"2d_noncontig", {2, 3, 6, 7}, {2, 3}, {1, 2}, {0, 1}, {1}, false, true, {}, T},
      {"3d_k2", {1, 2, 4, 6, 6}, {2, 2, 2}, {}, {0}, {1}},
      {"3d_pad_dilated_ceil", {2, 2, 6, 7, 5}, {3, 2, 3}, {2, 1, 2}, {1, 1, 0}, {1, 2, 1}, true},
      {"3d_unbatched", {2, 4, 4, 5}, {2, 2, 3}, {1, 2, 1}, {0}, {1}},
  };
  return c;
}

const std::vector<PoolConfig>& avg_configs() {
  static const std::vector<PoolConfig> c = {
      {"2d_k2", {2, 3, 8, 8}, {2}, {}, {0}, {}},
      {"2d_pad", {2, 3, 7, 9}, {3}, {2}, {1}, {}},
      {"2d_pad_exclude", {2, 3, 7, 9}, {3}, {2}, {1}, {}, false, false},
      {"2d_ceil_exclude", {1, 2, 8, 8}, {3}, {2}, {1}, {}, true, false},
      {"2d_ceil_include", {1, 2, 8, 7}, {3, 2}, {2}, {1, 0}, {}, true, true},
      {"2d_divisor", {2, 2, 6, 6}, {3}, {1}, {1}, {}, false, true, 5},
      {"2d_unbatched", {3, 6, 5}, {3, 2}, {2, 1}, {1, 0}, {}},
      {"2d_noncontig", {2, 3, 6, 7}, {2, 3}, {1, 2}, {0, 1}, {}, false, false, {}, T},
      {"3d_k2", {1, 2, 4, 6, 6}, {2, 2, 2}, {}, {0}, {}},
      {"3d_pad_ceil_exclude", {2, 2, 6, 7, 5}, {3, 2, 3}, {2, 1, 2}, {1, 1, 0}, {}, true, false},
      {"3d_divisor", {1, 2, 4, 5, 6}, {2, 3, 2}, {1}, {1}, {}, false, true, -3},
      {"3d_unbatched", {2, 4, 4, 5}, {2, 2, 2}, {}, {0}, {}},
  };
  return c;
}

const std::vector<PoolConfig>& adaptive_configs() {
  static const std::vector<PoolConfig> c = {
      {"2d_even", {2, 3, 6, 6}, {3, 3}, {}, {}, {}},
      {"2d_uneven", {2, 3, 7, 9}, {3, 4}, {}, {}, {}},
      {"2d_larger", {1, 2, 3, 4}, {5, 7}, {}, {}, {}},
      {"2d_global", {2, 4, 5, 5}, {1, 1}, {}, {}, {}},
      {"2d_unbatched", {3, 7, 5}, {2, 3}, {}, {}, {}},
      {"2d_noncontig", {2, 3, 6, 7}, {4, 3}, {}, {}, {}, false, true, {}, T},
      {"3d", {1, 2, 5, 6, 7}, {2, 3, 4}, {}, {}, {}},
      {"3d_unbatched", {2, 4, 5, 3}, {3, 2, 5}, {}, {}, {}},
  };
  return c;
}

// Each kind's forward through Kiln and ATen (max: values and indices).
KTensors kmax(const PoolConfig& c, const Tensor& x) {
  auto [y, i] = spatial(c) == 2 ? max_pool2d_with_indices(x, c.k, c.s, c.p, c.d, c.ceil)
                                : max_pool3d_with_indices(x, c.k, c.s, c.p, c.d, c.ceil);
  return {y, i};
}
ATensors amax(const PoolConfig& c, const at::Tensor& x) {
  auto [y, i] = spatial(c) == 2
                    ? at::max_pool2d_with_indices(x, ar(c.k), ar(c.s), ar(c.p), ar(c.d), c.ceil)
                    : at::max_pool3d_with_indices(x, ar(c.k), ar(c.s), ar(c.p), ar(c.d), c.ceil);
  return {y, i};
}
Tensor kavg(const PoolConfig& c, const Tensor& x) {
  return spatial(c) == 2 ? avg_pool2d(x, c.k, c.s, c.p, c.ceil, c.cip, c.div)
                         : avg_pool3d(x, c.k, c.s, c.p, c.ceil, c.cip, c.div);
}
c10::optional<int64_t> adiv(const PoolConfig& c) {
  return c.div ? c10::optional<int64_t>(*c.div) : c10::nullopt;
}
at::Tensor aavg(const PoolConfig& c, const at::Tensor& x) {
  return spatial(c) == 2 ? at::avg_pool2d(x, ar(c.k), ar(c.s), ar(c.p), c.ceil, c.cip, adiv(c))
                         : at::avg_pool3d(x, ar(c.k), ar(c.s), ar(c.p), c.ceil, c.cip, adiv(c));
}
Tensor kadaptive(const PoolConfig& c, const Tensor& x) {
  return spatial(c) == 2 ? adaptive_avg_pool2d(x, c.k) : adaptive_avg_pool3d(x, c.k);
}
at::Tensor aadaptive(const PoolConfig& c, const at::Tensor& x) {
  return spatial(c) == 2 ? at::_adaptive_avg_pool2d(x, ar(c.k))
                         : at::_adaptive_avg_pool3d(x, ar(c.k));
}

std::string op_name(const char* kind, const PoolConfig& c, bool backward) {
  std::string n = std::string(kind) + std::to_string(spatial(c)) + "d";
  if (std::string(kind) == "max_pool") n += "_with_indices";
  return backward ? n + "_backward" : n;
}

// A grad_output of the forward's output shape (computed on the drawn input).
Tensor grad_like(Gen& g, const Tensor& y) {
  return g.any({Dims(y.sizes().begin(), y.sizes().end())});
}

void add_max(Cases& cs, GradSamples& grads) {
  for (const PoolConfig& c : max_configs()) {
    PoolConfig fc = c;
    cs.push_back({.name = "max_pool_" + std::string(c.label),
                  .ops = {op_name("max_pool", c, false)},
                  .dtypes = kFloatDTypes,
                  .make =
                      [fc](Gen& g) {
                        return KTensors{g.any({fc.x, fc.layout})};
                      },
                  .kiln = [fc](const KArgs& x) { return kmax(fc, x[0]); },
                  .aten = [fc](const AArgs& a) { return amax(fc, a[0]); },
                  .tol = Tol::Exact});
    // The backward op with each side's own indices (the forward rows show they are equal).
    cs.push_back(
        {.name = "max_pool_backward_" + std::string(c.label),
         .ops = {op_name("max_pool", c, true)},
         .dtypes = kFloatDTypes,
         .make =
             [fc](Gen& g) {
               Tensor x = g.any({fc.x, fc.layout});
               return KTensors{grad_like(g, kmax(fc, x)[0]), x};
             },
         .kiln =
             [fc](const KArgs& x) {
               Tensor idx = kmax(fc, x[1])[1];
               return KTensors{spatial(fc) == 2
                                   ? max_pool2d_with_indices_backward(x[0], x[1], fc.k, fc.s, fc.p,
                                                                      fc.d, fc.ceil, idx)
                                   : max_pool3d_with_indices_backward(x[0], x[1], fc.k, fc.s, fc.p,
                                                                      fc.d, fc.ceil, idx)};
             },
         .aten =
             [fc](const AArgs& a) {
               at::Tensor idx = amax(fc, a[1])[1];
               return ATensors{
                   spatial(fc) == 2
                       ? at::max_pool2d_with_indices_backward(a[0], a[1], ar(fc.k), ar(fc.s),
                                                              ar(fc.p), ar(fc.d), fc.ceil, idx)
                       : at::max_pool3d_with_indices_backward(a[0], a[1], ar(fc.k), ar(fc.s),
                                                              ar(fc.p), ar(fc.d), fc.ceil, idx)};
             },
         .tol = Tol::Accum});
    if (c.layout == C)
      grads.push_back({"max_pool_" + std::string(c.label),
                       {op_name("max_pool", c, false)},
                       [fc](GradGen& d) { return KTensors{d.var(fc.x)}; },
                       [fc](const KTensors& x) { return KTensors{kmax(fc, x[0])[0]}; }});
  }
}

// NaN wins a window (the last one when several), ties go to the first, and -inf is a value.
// nan_first_k2's 2x2 windows start with a NaN, hold only -inf, tie, and end with a NaN.
void add_max_special(Cases& cs) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const double inf = std::numeric_limits<double>::infinity();
  const std::vector<double> mixed = {1, nan, 3, 3, nan, 2, nan, 0, -inf, -inf, 5, 5, 1, 1, 5, 7};
  const std::vector<double> edges = {nan, 1, -inf, -inf, 2, 3, -inf, -inf,
                                     5,   5, nan,  2,    5, 5, 1,    nan};
  const std::pair<PoolConfig, std::vector<double>> rows[] = {
      {{"nan_k2", {1, 1, 4, 4}, {2}, {}, {0}, {1}}, mixed},
      {{"nan_k3_overlapping", {1, 1, 4, 4}, {3}, {1}, {1}, {1}}, mixed},
      {{"nan_first_k2", {1, 1, 4, 4}, {2}, {}, {0}, {1}}, edges}};
  for (const auto& row : rows) {
    const PoolConfig fc = row.first;
    const std::vector<double> v = row.second;
    cs.push_back({.name = "max_pool_" + std::string(fc.label),
                  .ops = {"max_pool2d_with_indices"},
                  .dtypes = kFloatDTypes,
                  .make =
                      [v](Gen& g) {
                        return KTensors{g.values(v, {1, 1, 4, 4})};
                      },
                  .kiln = [fc](const KArgs& x) { return kmax(fc, x[0]); },
                  .aten = [fc](const AArgs& a) { return amax(fc, a[0]); },
                  .tol = Tol::Exact});
  }
}

void add_avg(Cases& cs, GradSamples& grads) {
  for (const PoolConfig& c : avg_configs()) {
    PoolConfig fc = c;
    cs.push_back({.name = "avg_pool_" + std::string(c.label),
                  .ops = {op_name("avg_pool", c, false)},
                  .dtypes = kFloatDTypes,
                  .make =
                      [fc](Gen& g) {
                        return KTensors{g.any({fc.x, fc.layout})};
                      },
                  .kiln = [fc](const KArgs& x) { return KTensors{kavg(fc, x[0])}; },
                  .aten = [fc](const AArgs& a) { return ATensors{aavg(fc, a[0])}; },
                  .tol = Tol::Accum});
    cs.push_back(
        {.name = "avg_pool_backward_" + std::string(c.label),
         .ops = {op_name("avg_pool", c, true)},
         .dtypes = kFloatDTypes,
         .make =
             [fc](Gen& g) {
               Tensor x = g.any({fc.x, fc.layout});
               return KTensors{grad_like(g, kavg(fc, x)), x};
             },
         .kiln =
             [fc](const KArgs& x) {
               return KTensors{spatial(fc) == 2 ? avg_pool2d_backward(x[0], x[1], fc.k, fc.s, fc.p,
                                                                      fc.ceil, fc.cip, fc.div)
                                                : avg_pool3d_backward(x[0], x[1], fc.k, fc.s, fc.p,
                                                                      fc.ceil, fc.cip, fc.div)};
             },
         .aten =
             [fc](const AArgs& a) {
               return ATensors{spatial(fc) == 2
                                   ? at::avg_pool2d_backward(a[0], a[1], ar(fc.k), ar(fc.s),
                                                             ar(fc.p), fc.ceil, fc.cip, adiv(fc))
                                   : at::avg_pool3d_backward(a[0], a[1], ar(fc.k), ar(fc.s),
                                                             ar(fc.p), fc.ceil, fc.cip, adiv(fc))};
             },
         .tol = Tol::Accum});
    if (c.layout == C)
      grads.push_back({"avg_pool_" + std::string(c.label),
                       {op_name("avg_pool", c, false)},
                       [fc](GradGen& d) { return KTensors{d.var(fc.x)}; },
                       [fc](const KTensors& x) { return KTensors{kavg(fc, x[0])}; }});
  }
}

void add_adaptive(Cases& cs, GradSamples& grads) {
  for (const PoolConfig& c : adaptive_configs()) {
    PoolConfig fc = c;
    cs.push_back({.name = "adaptive_avg_pool_" + std::string(c.label),
                  .ops = {op_name("adaptive_avg_pool", c, false)},
                  .dtypes = kFloatDTypes,
                  .make =
                      [fc](Gen& g) {
                        return KTensors{g.any({fc.x, fc.layout})};
                      },
                  .kiln = [fc](const KArgs& x) { return KTensors{kadaptive(fc, x[0])}; },
                  .aten = [fc](const AArgs& a) { return ATensors{aadaptive(fc, a[0])}; },
                  .tol = Tol::Accum});
    cs.push_back(
        {.name = "adaptive_avg_pool_backward_" + std::string(c.label),
         .ops = {op_name("adaptive_avg_pool", c, true)},
         .dtypes = kFloatDTypes,
         .make =
             [fc](Gen& g) {
               Tensor x = g.any({fc.x, fc.layout});
               return KTensors{grad_like(g, kadaptive(fc, x)), x};
             },
         .kiln =
             [fc](const KArgs& x) {
               return KTensors{spatial(fc) == 2 ? adaptive_avg_pool2d_backward(x[0], x[1])
                                                : adaptive_avg_pool3d_backward(x[0], x[1])};
             },
         .aten =
             [fc](const AArgs& a) {
               return ATensors{spatial(fc) == 2 ? at::_adaptive_avg_pool2d_backward(a[0], a[1])
                                                : at::_adaptive_avg_pool3d_backward(a[0], a[1])};
             },
         .tol = Tol::Accum});
    if (c.layout == C)
      grads.push_back({"adaptive_avg_pool_" + std::string(c.label),
                       {op_name("adaptive_avg_pool", c, false)},
                       [fc](GradGen& d) { return KTensors{d.var(fc.x)}; },
                       [fc](const KTensors& x) { return KTensors{kadaptive(fc, x[0])}; }});
  }
}

// The public functions over the ops: the 1-D composites and max_pool2d/3d's values.
void add_wrappers(Cases& cs, GradSamples& grads) {
  struct Wrapper {
    const char* label;
    const char* op;
    Dims x;
    std::function<Tensor(const Tensor&)> k;
    std::function<at::Tensor(const at::Tensor&)> a;
  };
  const std::vector<Wrapper> wrappers = {
      {"max_pool1d",
       "max_pool2d_with_indices",
       {2, 3, 11},
       [](const Tensor& x) { return max_pool1d(x, {3}, {2}, {1}); },
       [](const at::Tensor& x) { return at::max_pool1d(x, {3}, {2}, {1}); }},
      {"max_pool1d_unbatched_dilated_ceil",
       "max_pool2d_with_indices",
       {3, 10},
       [](const Tensor& x) { return max_pool1d(x, {2}, {}, {1}, {2}, true); },
       [](const at::Tensor& x) { return at::max_pool1d(x, {2}, {}, {1}, {2}, true); }},
      {"max_pool1d_indices",
       "max_pool2d_with_indices",
       {2, 2, 9},
       [](const Tensor& x) { return std::get<1>(max_pool1d_with_indices(x, {2})); },
       [](const at::Tensor& x) { return std::get<1>(at::max_pool1d_with_indices(x, {2})); }},
      {"max_pool2d",
       "max_pool2d_with_indices",
       {2, 3, 6, 6},
       [](const Tensor& x) { return max_pool2d(x, {2}); },
       [](const at::Tensor& x) { return at::max_pool2d(x, {2}); }},
      {"max_pool3d",
       "max_pool3d_with_indices",
       {1, 2, 4, 4, 4},
       [](const Tensor& x) { return max_pool3d(x, {2}, {1}); },
       [](const at::Tensor& x) { return at::max_pool3d(x, {2}, {1}); }},
      {"avg_pool1d",
       "avg_pool2d",
       {2, 3, 10},
       [](const Tensor& x) { return avg_pool1d(x, {3}, {2}, {1}, true, false); },
       [](const at::Tensor& x) { return at::avg_pool1d(x, {3}, {2}, {1}, true, false); }},
      {"avg_pool1d_unbatched",
       "avg_pool2d",
       {3, 9},
       [](const Tensor& x) { return avg_pool1d(x, {2}); },
       [](const at::Tensor& x) { return at::avg_pool1d(x, {2}); }},
      {"adaptive_avg_pool1d",
       "adaptive_avg_pool2d",
       {2, 3, 10},
       [](const Tensor& x) { return adaptive_avg_pool1d(x, {4}); },
       [](const at::Tensor& x) { return at::adaptive_avg_pool1d(x, {4}); }},
      {"adaptive_avg_pool1d_unbatched",
       "adaptive_avg_pool2d",
       {3, 7},
       [](const Tensor& x) { return adaptive_avg_pool1d(x, {3}); },
       [](const at::Tensor& x) { return at::adaptive_avg_pool1d(x, {3}); }},
  };
  for (const Wrapper& w : wrappers) {
    Wrapper fw = w;
    cs.push_back({.name = std::string("pool_") + w.label,
                  .ops = {w.op},
                  .dtypes = {kFloat32, kFloat64},
                  .make = [fw](Gen& g) { return KTensors{g.any({fw.x})}; },
                  .kiln = [fw](const KArgs& x) { return KTensors{fw.k(x[0])}; },
                  .aten = [fw](const AArgs& a) { return ATensors{fw.a(a[0])}; },
                  .tol = Tol::Accum});
    if (std::string(w.label).find("indices") == std::string::npos)
      grads.push_back({std::string("pool_") + w.label,
                       {w.op},
                       [fw](GradGen& d) { return KTensors{d.var(fw.x)}; },
                       [fw](const KTensors& x) { return KTensors{fw.k(x[0])}; }});
  }
}

}  // namespace

void add_pooling(Cases& cs) {
  GradSamples max_grads, avg_grads, adaptive_grads, wrapper_grads;
  add_max(cs, max_grads);
  add_max_special(cs);
  add_avg(cs, avg_grads);
  add_adaptive(cs, adaptive_grads);
  add_wrappers(cs, wrapper_grads);
  auto split = [](const GradSamples& all, const std::string& op) {
    GradSamples r;
    for (const GradSample& s : all)
      if (s.ops[0] == op) r.push_back(s);
    return r;
  };
  for (const char* op : {"max_pool2d_with_indices", "max_pool3d_with_indices", "avg_pool2d",
                         "avg_pool3d", "adaptive_avg_pool2d", "adaptive_avg_pool3d"}) {
    GradSamples gs = split(max_grads, op);
    for (const GradSamples* more : {&avg_grads, &adaptive_grads, &wrapper_grads})
      for (const GradSample& s : split(*more, op)) gs.push_back(s);
    head(cs, op).grads = gs;
  }

  // clang-format off
  head(cs, "max_pool2d_with_indices").errors = {
      {"max_pool2d_kernel_len", K::Value, "max_pool2d_with_indices", {"kernel_size", "1 or 2", "[2, 2, 2]"},
       [](const Watch&) { max_pool2d(f32({1, 2, 6, 6}), {2, 2, 2}); }},
      {"max_pool2d_kernel_zero", K::Value, "max_pool2d_with_indices", {"kernel_size must be positive", "[0, 2]"},
       [](const Watch&) { max_pool2d(f32({1, 2, 6, 6}), {0, 2}); }},
      {"max_pool2d_stride_zero", K::Value, "max_pool2d_with_indices", {"stride must be positive", "[0]"},
       [](const Watch&) { max_pool2d(f32({1, 2, 6, 6}), {2}, {0}); }},
      {"max_pool2d_dilation_zero", K::Value, "max_pool2d_with_indices", {"dilation must be positive", "[1, 0]"},
       [](const Watch&) { max_pool2d(f32({1, 2, 6, 6}), {2}, {}, {0}, {1, 0}); }},
      {"max_pool2d_padding_half", K::Value, "max_pool2d_with_indices", {"half the kernel", "padding [2]", "kernel_size [3]"},
       [](const Watch&) { max_pool2d(f32({1, 2, 6, 6}), {3}, {1}, {2}); }},
      {"max_pool2d_padding_negative", K::Value, "max_pool2d_with_indices", {"non-negative", "[-1]"},
       [](const Watch&) { max_pool2d(f32({1, 2, 6, 6}), {3}, {1}, {-1}); }},
      {"max_pool2d_output_empty", K::Value, "max_pool2d_with_indices", {"size 0", "[1, 2, 2, 6]"},
       [](const Watch&) { max_pool2d(f32({1, 2, 2, 6}), {3}); }},
      {"max_pool2d_output_dilated", K::Value, "max_pool2d_with_indices", {"size -1", "dilation [3]"},
       [](const Watch&) { max_pool2d(f32({1, 2, 5, 8}), {3}, {1}, {0}, {3}); }},
      {"max_pool2d_rank", K::Value, "max_pool2d_with_indices", {"3-D", "4-D", "[6, 6]"},
       [](const Watch&) { max_pool2d(f32({6, 6}), {2}); }},
      {"max_pool2d_empty_plane", K::Value, "max_pool2d_with_indices", {"non-empty", "[1, 0, 6, 6]"},
       [](const Watch&) { max_pool2d(f32({1, 0, 6, 6}), {2}); }},
      {"max_pool2d_int", K::Type, "max_pool2d_with_indices", {"floating", "int64"},
       [](const Watch&) { max_pool2d(i64({1, 2, 6, 6}), {2}); }},
      {"max_pool1d_kernel_len", K::Value, "max_pool1d", {"kernel_size", "1 element", "[2, 2]"},
       [](const Watch&) { max_pool1d(f32({1, 2, 6}), {2, 2}); }},
      {"max_pool1d_rank", K::Value, "max_pool1d", {"2-D", "3-D", "[1, 2, 6, 6]"},
       [](const Watch&) { max_pool1d(f32({1, 2, 6, 6}), {2}); }}};
  head(cs, "max_pool3d_with_indices").errors = {
      {"max_pool3d_rank", K::Value, "max_pool3d_with_indices", {"4-D", "5-D", "[2, 6, 6]"},
       [](const Watch&) { max_pool3d(f32({2, 6, 6}), {2}); }},
      {"max_pool3d_padding_half", K::Value, "max_pool3d_with_indices", {"half the kernel", "padding [0, 0, 2]", "kernel_size [2, 2, 3]"},
       [](const Watch&) { max_pool3d(f32({1, 2, 6, 6, 6}), {2, 2, 3}, {}, {0, 0, 2}); }}};
  head(cs, "max_pool2d_with_indices_backward").errors = {
      {"max_pool2d_backward_grad_shape", K::Value, "max_pool2d_with_indices_backward", {"[1, 2, 3, 3]", "[1, 2, 3, 4]"},
       [](const Watch&) {
         max_pool2d_with_indices_backward(f32({1, 2, 3, 4}), f32({1, 2, 6, 6}), {2}, {}, {0}, {1}, false, i64({1, 2, 3, 3}));
       }},
      {"max_pool2d_backward_indices_dtype", K::Type, "max_pool2d_with_indices_backward", {"indices", "int64", "float32"},
       [](const Watch&) {
         max_pool2d_with_indices_backward(f32({1, 2, 3, 3}), f32({1, 2, 6, 6}), {2}, {}, {0}, {1}, false, f32({1, 2, 3, 3}));
       }},
      {"max_pool2d_backward_index_range", K::Index, "max_pool2d_with_indices_backward", {"index 36", "plane of size 36"},
       [](const Watch&) {
         max_pool2d_with_indices_backward(f32({1, 2, 3, 3}), f32({1, 2, 6, 6}), {2}, {}, {0}, {1}, false,
                                          mul(i64({1, 2, 3, 3}), 36));
       }}};
  head(cs, "avg_pool2d").errors = {
      {"avg_pool2d_divisor_zero", K::Value, "avg_pool2d", {"divisor_override", "zero"},
       [](const Watch&) { avg_pool2d(f32({1, 2, 6, 6}), {2}, {}, {0}, false, true, 0); }},
      {"avg_pool2d_padding_half", K::Value, "avg_pool2d", {"half the kernel", "padding [1, 2]", "kernel_size [3]"},
       [](const Watch&) { avg_pool2d(f32({1, 2, 6, 6}), {3}, {1}, {1, 2}); }},
      {"avg_pool2d_stride_len", K::Value, "avg_pool2d", {"stride", "[1, 1, 1]"},
       [](const Watch&) { avg_pool2d(f32({1, 2, 6, 6}), {3}, {1, 1, 1}); }},
      {"avg_pool2d_output_empty", K::Value, "avg_pool2d", {"size 0", "[2, 1, 6]"},
       [](const Watch&) { avg_pool2d(f32({2, 1, 6}), {2}); }},
      {"avg_pool2d_int", K::Type, "avg_pool2d", {"floating", "int64"},
       [](const Watch&) { avg_pool2d(i64({1, 2, 6, 6}), {2}); }},
      {"avg_pool1d_rank", K::Value, "avg_pool1d", {"2-D", "[6]"},
       [](const Watch&) { avg_pool1d(f32({6}), {2}); }}};
  head(cs, "avg_pool3d").errors = {
      {"avg_pool3d_kernel_len", K::Value, "avg_pool3d", {"kernel_size", "1 or 3", "[2, 2]"},
       [](const Watch&) { avg_pool3d(f32({1, 2, 4, 4, 4}), {2, 2}); }}};
  head(cs, "avg_pool2d_backward").errors = {
      {"avg_pool2d_backward_grad_dtype", K::Type, "avg_pool2d_backward", {"float32", "float64"},
       [](const Watch&) {
         avg_pool2d_backward(ones({1, 2, 3, 3}, kFloat64), f32({1, 2, 6, 6}), {2}, {}, {0}, false, true, std::nullopt);
       }}};
  head(cs, "adaptive_avg_pool2d").errors = {
      {"adaptive_avg_pool2d_output_len", K::Value, "adaptive_avg_pool2d", {"output_size", "2 elements", "[3]"},
       [](const Watch&) { adaptive_avg_pool2d(f32({1, 2, 6, 6}), {3}); }},
      {"adaptive_avg_pool2d_output_negative", K::Value, "adaptive_avg_pool2d", {"non-negative", "[2, -1]"},
       [](const Watch&) { adaptive_avg_pool2d(f32({1, 2, 6, 6}), {2, -1}); }},
      {"adaptive_avg_pool2d_rank", K::Value, "adaptive_avg_pool2d", {"3-D", "4-D", "[1, 1, 2, 6, 6]"},
       [](const Watch&) { adaptive_avg_pool2d(f32({1, 1, 2, 6, 6}), {2, 2}); }},
      {"adaptive_avg_pool2d_empty_plane", K::Value, "adaptive_avg_pool2d", {"non-empty", "[1, 2, 0, 6]"},
       [](const Watch&) { adaptive_avg_pool2d(f32({1, 2, 0, 6}), {2, 2}); }},
      {"adaptive_avg_pool2d_int", K::Type, "adaptive_avg_pool2d", {"floating", "int64"},
       [](const Watch&) { adaptive_avg_pool2d(i64({1, 2, 6, 6}), {2, 2}); }},
      {"adaptive_avg_pool1d_output_len", K::Value, "adaptive_avg_pool1d", {"output_size", "[2, 2]"},
       [](const Watch&) { adaptive_avg_pool1d(f32({1, 2, 6}), {2, 2}); }}};
  head(cs, "adaptive_avg_pool3d").errors = {
      {"adaptive_avg_pool3d_output_len", K::Value, "adaptive_avg_pool3d", {"3 elements", "[2, 2]"},
       [](const Watch&) { adaptive_avg_pool3d(f32({1, 2, 4, 4, 4}), {2, 2}); }}};
  head(cs, "adaptive_avg_pool2d_backward").errors = {
      {"adaptive_avg_pool2d_backward_rank", K::Value, "adaptive_avg_pool2d_backward", {"4 dims", "[2, 3, 3]"},
       [](const Watch&) { adaptive_avg_pool2d_backward(f32({2, 3, 3}), f32({1, 2, 6, 6})); }}};
  // clang-format on
}

}  // namespace kiln::test

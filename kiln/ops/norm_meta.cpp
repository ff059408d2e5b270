// Batch, group and layer norm: meta functions, meta kernels and the driver the CPU and CUDA
// kernels share.
#include "kiln/ops/norm_meta.h"

#include "kiln/ops/ops.h"
#include "kiln/ops/structured.h"

namespace kiln {

// Note [Batch, group and layer norm]
// ATen's core normalization ops, one driver for every backend. Each normalises groups of
// elements of a contiguous view [n, c, hw] by their mean and 1 / sqrt(biased variance + eps):
//   batch norm  [N, C, HxW]      statistics per channel, over the batch and the spatial dims;
//   group norm  [1, N * G, D]    per (sample, group), D = C / G * HxW elements;
//   layer norm  [1, M, D]        per row of the D normalised elements.
// A backend writes three kernels (NormKernels): the moments of each of the c groups, two sums
// per group for the backward (sum dy and sum dy * (x - mean)), and one elementwise pass
//   out = (a * p[q] + b * r[q] + s[q]) * w[k] + bias[k]
// with per-group (or per (sample, channel)) coefficients. The driver computes the coefficients
// from the statistics with ops on [C]-sized tensors: the forward is y = x * scale + shift with
// scale = rstd * w and shift = bias - mean * scale, the backward
//   dx = rstd * w * (dy - mean(dy) - xhat * mean(dy * xhat))
// as dy * p + x * r + s (ATen's form). So every backend gets the same arithmetic: statistics
// in norm_stat_dtype (float32 for the 16-bit floats, as ATen's mixed-dtype batch norm and its
// CUDA kernels), the output rounded once.
// Batch norm's running stats are updated in place in training as ATen does:
//   running_mean = (1 - momentum) * running_mean + momentum * mean
//   running_var  = (1 - momentum) * running_var  + momentum * var * n / (n - 1)   (unbiased)
// with n the values per channel; training needs n > 1 (ATen's "Expected more than 1 value per
// channel when training"). In eval (no_training, or legit with training false) the running
// stats normalise and save_mean/save_rstd are empty, as ATen returns them. Weight, bias and
// running stats have the input's dtype, or float32 for a 16-bit input (mixed dtype); the
// saved statistics are float32 for 16-bit inputs, the input's dtype otherwise. Every check runs
// before the first write, so a failed call leaves the running stats as they were.
//
// Note [Norm statistics]
// What the ops return as statistics follows ATen's CPU kernels (libtorch 1.13): batch norm's
// save_mean/save_invstd are float32 for a 16-bit input, group and layer norm's mean/rstd have
// the input's dtype (computed in float32 and rounded once at the end). Their backward ops take
// either dtype and widen them to float32 again. ATen's CUDA layer norm returns float32 instead;
// Kiln returns the same dtype on every device.

namespace meta {
namespace {

constexpr const char* kBn = "batch_norm";
constexpr const char* kGn = "group_norm";
constexpr const char* kLn = "layer_norm";

bool is_16bit(DType t) { return t == kFloat16 || t == kBFloat16; }

void check_input(const char* op, const Tensor& x, int64_t min_dim) {
  check_defined(op, x, "input");
  KILN_CHECK_TYPE(is_floating(x.dtype()), "[{}] input must be floating, got {}", op, x.dtype());
  KILN_CHECK(x.dim() >= min_dim, "[{}] input must have at least {} dims, got shape {}", op, min_dim,
             x.sizes());
}

// A parameter (weight, bias, running stat): undefined, or of `shape`, the input's dtype (or
// float32 for a 16-bit input) and device.
void check_param(const char* op, const char* what, const Tensor& p, const Tensor& x,
                 IntArrayRef shape) {
  if (!p.defined()) return;
  KILN_CHECK(p.sizes() == shape, "[{}] {} must have shape {}, got {}", op, what, shape, p.sizes());
  KILN_CHECK_TYPE(p.dtype() == x.dtype() || (is_16bit(x.dtype()) && p.dtype() == kFloat32),
                  "[{}] {} must be {} like input{}, got {}", op, what, x.dtype(),
                  is_16bit(x.dtype()) ? " or float32" : "", p.dtype());
  KILN_CHECK_DEVICE(p.device() == x.device(), "[{}] {} is on {}, input on {}", op, what, p.device(),
                    x.device());
}

// A statistic of a backward call: defined, of `shape`, the stats dtype, input's device.
void check_stat(const char* op, const char* what, const Tensor& s, const Tensor& x,
                IntArrayRef shape) {
  KILN_CHECK(s.defined(), "[{}] {} must be given", op, what);
  KILN_CHECK(s.sizes() == shape, "[{}] {} must have shape {}, got {}", op, what, shape, s.sizes());
  KILN_CHECK_TYPE(s.dtype() == norm_stat_dtype(x.dtype()) || s.dtype() == x.dtype(),
                  "[{}] {} must be {}, got {}", op, what, norm_stat_dtype(x.dtype()), s.dtype());
  KILN_CHECK_DEVICE(s.device() == x.device(), "[{}] {} is on {}, input on {}", op, what, s.device(),
                    x.device());
}

void check_grad(const char* op, const Tensor& g, const Tensor& x) {
  check_defined(op, g, "grad_out");
  KILN_CHECK(g.sizes() == x.sizes(), "[{}] grad_out must have input's shape {}, got {}", op,
             x.sizes(), g.sizes());
  KILN_CHECK_TYPE(g.dtype() == x.dtype(), "[{}] grad_out must be {} like input, got {}", op,
                  x.dtype(), g.dtype());
  KILN_CHECK_DEVICE(g.device() == x.device(), "[{}] grad_out is on {}, input on {}", op, g.device(),
                    x.device());
}

void check_mask(const char* op, IntArrayRef mask) {
  KILN_CHECK(mask.size() == 3, "[{}] output_mask must have 3 flags, got {}", op, mask);
  for (int64_t m : mask)
    KILN_CHECK(m == 0 || m == 1, "[{}] output_mask flags must be 0 or 1, got {}", op, mask);
}

void check_eps(const char* op, double eps) {
  KILN_CHECK(eps >= 0, "[{}] eps must be non-negative, got {}", op, eps);
}

}  // namespace

DType norm_stat_dtype(DType input) { return is_16bit(input) ? kFloat32 : input; }

void batch_norm(const Tensor& input, const Tensor& weight, const Tensor& bias,
                const Tensor& running_mean, const Tensor& running_var, bool has_stats,
                bool training, double eps) {
  check_input(kBn, input, 2);
  const Shape c{input.size(1)};
  check_param(kBn, "weight", weight, input, c);
  check_param(kBn, "bias", bias, input, c);
  if (has_stats) {
    KILN_CHECK(running_mean.defined() && running_var.defined(),
               "[{}] running_mean and running_var must be given", kBn);
  }
  check_param(kBn, "running_mean", running_mean, input, c);
  check_param(kBn, "running_var", running_var, input, c);
  KILN_CHECK(training || has_stats, "[{}] eval (training false) needs running_mean and running_var",
             kBn);
  check_eps(kBn, eps);
  if (training) {
    const int64_t per_channel = input.size(1) == 0 ? 0 : input.numel() / input.size(1);
    KILN_CHECK(per_channel > 1,
               "[{}] Expected more than 1 value per channel when training, got input size {}", kBn,
               input.sizes());
  }
}

void batch_norm_backward(const Tensor& grad_out, const Tensor& input, const Tensor& weight,
                         const Tensor& running_mean, const Tensor& running_var,
                         const Tensor& save_mean, const Tensor& save_invstd, bool train, double eps,
                         IntArrayRef output_mask) {
  const char* op = "native_batch_norm_backward";
  check_input(op, input, 2);
  check_grad(op, grad_out, input);
  const Shape c{input.size(1)};
  check_param(op, "weight", weight, input, c);
  check_mask(op, output_mask);
  check_eps(op, eps);
  if (train) {
    check_stat(op, "save_mean", save_mean, input, c);
    check_stat(op, "save_invstd", save_invstd, input, c);
  } else {
    KILN_CHECK(running_mean.defined() && running_var.defined(),
               "[{}] eval (train false) needs running_mean and running_var", op);
    check_param(op, "running_mean", running_mean, input, c);
    check_param(op, "running_var", running_var, input, c);
  }
}

void group_norm(const Tensor& input, const Tensor& weight, const Tensor& bias, int64_t N, int64_t C,
                int64_t HxW, int64_t group, double eps) {
  check_input(kGn, input, 2);
  KILN_CHECK(group > 0, "[{}] num_groups must be positive, got {}", kGn, group);
  KILN_CHECK(N >= 0 && C > 0 && HxW >= 0 && input.numel() == N * C * HxW && input.size(0) == N &&
                 input.size(1) == C,
             "[{}] input of shape {} is not [N, C, *] with N={}, C={}, HxW={}", kGn, input.sizes(),
             N, C, HxW);
  KILN_CHECK(C % group == 0,
             "[{}] Expected number of channels in input to be divisible by num_groups, but got "
             "input of shape {} and num_groups={}",
             kGn, input.sizes(), group);
  const Shape c{C};
  check_param(kGn, "weight", weight, input, c);
  check_param(kGn, "bias", bias, input, c);
  check_eps(kGn, eps);
}

void group_norm_backward(const Tensor& grad_out, const Tensor& input, const Tensor& mean,
                         const Tensor& rstd, const Tensor& weight, int64_t N, int64_t C,
                         int64_t HxW, int64_t group, IntArrayRef output_mask) {
  const char* op = "native_group_norm_backward";
  group_norm(input, weight, Tensor(), N, C, HxW, group, 0);
  check_grad(op, grad_out, input);
  check_stat(op, "mean", mean, input, Shape{N, group});
  check_stat(op, "rstd", rstd, input, Shape{N, group});
  check_mask(op, output_mask);
}

int64_t native_layer_norm(const Tensor& input, IntArrayRef normalized_shape, const Tensor& weight,
                          const Tensor& bias, double eps) {
  check_input(kLn, input, 1);
  const int64_t k = static_cast<int64_t>(normalized_shape.size());
  KILN_CHECK(k >= 1 && k <= input.dim() &&
                 input.sizes().subspan(static_cast<size_t>(input.dim() - k)) == normalized_shape,
             "[{}] normalized_shape {} must be the last dims of input's shape {}", kLn,
             normalized_shape, input.sizes());
  check_param(kLn, "weight", weight, input, normalized_shape);
  check_param(kLn, "bias", bias, input, normalized_shape);
  check_eps(kLn, eps);
  return input.dim() - k;
}

int64_t native_layer_norm_backward(const Tensor& grad_out, const Tensor& input,
                                   IntArrayRef normalized_shape, const Tensor& mean,
                                   const Tensor& rstd, const Tensor& weight, const Tensor& bias,
                                   IntArrayRef output_mask) {
  const char* op = "native_layer_norm_backward";
  const int64_t axis = meta::native_layer_norm(input, normalized_shape, weight, bias, 0);
  check_grad(op, grad_out, input);
  Shape s(input.sizes().subspan(0, static_cast<size_t>(axis)));
  for (size_t i = 0; i < normalized_shape.size(); ++i) s.push_back(1);
  check_stat(op, "mean", mean, input, s);
  check_stat(op, "rstd", rstd, input, s);
  check_mask(op, output_mask);
  return axis;
}

void layer_norm_fused_backward(const Tensor& grad, const Tensor& input,
                               IntArrayRef normalized_shape, const Tensor& weight, double eps,
                               IntArrayRef output_mask) {
  check_layer_norm_backward("layer_norm_fused_backward", grad, input, normalized_shape, weight,
                            eps);
  check_mask("layer_norm_fused_backward", output_mask);
}

}  // namespace meta

namespace detail {
namespace {

DType stat(const Tensor& x) { return meta::norm_stat_dtype(x.dtype()); }
// `t` contiguous in dtype `dt` (undefined stays undefined).
Tensor as(const Tensor& t, DType dt) {
  if (!t.defined()) return t;
  return t.dtype() == dt && t.is_contiguous() ? t : t.to(dt).contiguous();
}
Tensor stats_empty(IntArrayRef sizes, const Tensor& x) {
  return empty_tensor(sizes, stat(x), x.device());
}
// The dtype a parameter's gradient has: the parameter's, else the input's.
DType param_dtype(const Tensor& p, const Tensor& x) { return p.defined() ? p.dtype() : x.dtype(); }
int64_t prod(IntArrayRef s, size_t from, size_t to) {
  int64_t n = 1;
  for (size_t i = from; i < to; ++i) n *= s[i];
  return n;
}
// `t` broadcast to `shape`, contiguous.
Tensor spread(const Tensor& t, IntArrayRef shape) {
  return add(zeros(shape, t.dtype(), t.device()), t);
}

}  // namespace

TensorTriple run_batch_norm(const NormKernels& k, const Tensor& input, const Tensor& weight,
                            const Tensor& bias, const Tensor& running_mean,
                            const Tensor& running_var, bool has_stats, bool training,
                            double momentum, double eps) {
  meta::batch_norm(input, weight, bias, running_mean, running_var, has_stats, training, eps);
  const DType S = stat(input);
  const int64_t N = input.size(0), C = input.size(1);
  const int64_t HW = N * C == 0 ? 0 : input.numel() / (N * C);
  const Tensor x = input.contiguous();
  Tensor mean, invstd, save_mean, save_invstd;
  if (training) {
    mean = stats_empty({C}, input);
    Tensor var = stats_empty({C}, input);
    k.moments(x, N, C, HW, mean, var);
    invstd = rsqrt(add(var, eps));
    if (running_mean.defined()) {
      const double n = static_cast<double>(N * HW);
      Tensor rm = add(mul(as(running_mean, S), 1 - momentum), mul(mean, momentum));
      Tensor rv = add(mul(as(running_var, S), 1 - momentum), mul(var, momentum * n / (n - 1)));
      ops::op_copy_(running_mean, rm);
      ops::op_copy_(running_var, rv);
    }
    save_mean = mean;
    save_invstd = invstd;
  } else {
    mean = as(running_mean, S);
    invstd = rsqrt(add(as(running_var, S), eps));
    save_mean = stats_empty({0}, input);
    save_invstd = stats_empty({0}, input);
  }
  Tensor scale = weight.defined() ? mul(invstd, as(weight, S)) : invstd;
  Tensor shift = neg(mul(mean, scale));
  if (bias.defined()) shift = add(shift, as(bias, S));
  Tensor out = empty_tensor(input.sizes(), input.dtype(), input.device());
  if (out.numel() > 0)
    k.apply(out, x, scale.contiguous(), Tensor(), Tensor(), shift.contiguous(), Tensor(), Tensor(),
            N, C, HW, 0, 1);
  return {out, save_mean, save_invstd};
}

TensorTriple run_batch_norm_backward(const NormKernels& k, const Tensor& grad_out,
                                     const Tensor& input, const Tensor& weight,
                                     const Tensor& running_mean, const Tensor& running_var,
                                     const Tensor& save_mean, const Tensor& save_invstd, bool train,
                                     double eps, IntArrayRef output_mask) {
  meta::batch_norm_backward(grad_out, input, weight, running_mean, running_var, save_mean,
                            save_invstd, train, eps, output_mask);
  const DType S = stat(input);
  const int64_t N = input.size(0), C = input.size(1);
  const int64_t HW = N * C == 0 ? 0 : input.numel() / (N * C);
  const Tensor x = input.contiguous(), dy = grad_out.contiguous();
  const Tensor mean = train ? as(save_mean, S) : as(running_mean, S);
  const Tensor invstd = train ? as(save_invstd, S) : rsqrt(add(as(running_var, S), eps));
  Tensor sum_dy = stats_empty({C}, input), sum_dy_xmu = stats_empty({C}, input);
  k.dot(dy, x, mean, N, C, HW, sum_dy, sum_dy_xmu);
  Tensor gi, gw, gb;
  const DType pd = param_dtype(weight, input);
  if (output_mask[1]) gw = mul(sum_dy_xmu, invstd).to(pd);
  if (output_mask[2]) gb = sum_dy.to(pd);
  if (output_mask[0]) {
    gi = empty_tensor(input.sizes(), input.dtype(), input.device());
    Tensor wi = weight.defined() ? mul(invstd, as(weight, S)) : invstd;  // dy's coefficient
    if (gi.numel() > 0) {
      if (train) {
        const double m = static_cast<double>(N * HW);
        Tensor proj = div(mul(mul(sum_dy_xmu, invstd), invstd), m);  // sum dy (x - mean) / var m
        Tensor r = neg(mul(wi, proj));
        Tensor s = sub(mul(mul(wi, proj), mean), div(mul(wi, sum_dy), m));
        k.apply(gi, dy, wi.contiguous(), x, r.contiguous(), s.contiguous(), Tensor(), Tensor(), N,
                C, HW, 0, 1);
      } else {
        k.apply(gi, dy, wi.contiguous(), Tensor(), Tensor(), Tensor(), Tensor(), Tensor(), N, C, HW,
                0, 1);
      }
    }
  }
  return {gi, gw, gb};
}

TensorTriple run_group_norm(const NormKernels& k, const Tensor& input, const Tensor& weight,
                            const Tensor& bias, int64_t N, int64_t C, int64_t HxW, int64_t group,
                            double eps) {
  meta::group_norm(input, weight, bias, N, C, HxW, group, eps);
  const DType S = stat(input);
  const int64_t G = group, Cg = C / G;
  const Tensor x = input.contiguous();
  Tensor mean = stats_empty({N, G}, input), var = stats_empty({N, G}, input);
  Tensor out = empty_tensor(input.sizes(), input.dtype(), input.device());
  if (N == 0) return {out, mean.to(input.dtype()), var.to(input.dtype())};
  k.moments(x, 1, N * G, Cg * HxW, mean, var);
  Tensor rstd = rsqrt(add(var, eps));
  // scale[n, c] = rstd[n, g] * w[c], shift[n, c] = bias[c] - mean[n, g] * scale[n, c].
  Tensor r3 = rstd.view({N, G, 1}), m3 = mean.view({N, G, 1});
  Tensor scale =
      weight.defined() ? mul(r3, as(weight, S).view({1, G, Cg})) : spread(r3, {N, G, Cg});
  Tensor shift = neg(mul(m3, scale));
  if (bias.defined()) shift = add(shift, as(bias, S).view({1, G, Cg}));
  if (out.numel() > 0)
    k.apply(out, x, scale.contiguous(), Tensor(), Tensor(), shift.contiguous(), Tensor(), Tensor(),
            N, C, HxW, C, 1);
  return {out, mean.to(input.dtype()), rstd.to(input.dtype())};  // See Note [Norm statistics]
}

TensorTriple run_group_norm_backward(const NormKernels& k, const Tensor& grad_out,
                                     const Tensor& input, const Tensor& mean, const Tensor& rstd,
                                     const Tensor& weight, int64_t N, int64_t C, int64_t HxW,
                                     int64_t group, IntArrayRef output_mask) {
  meta::group_norm_backward(grad_out, input, mean, rstd, weight, N, C, HxW, group, output_mask);
  const DType S = stat(input);
  const int64_t G = group, Cg = C / G;
  const Tensor x = input.contiguous(), dy = grad_out.contiguous();
  const DType pd = param_dtype(weight, input);
  Tensor gi, gw, gb;
  // db[n, c] = sum dy, ds[n, c] = sum dy * x over the spatial dims (ATen's names).
  Tensor db = stats_empty({N, C}, input), ds = stats_empty({N, C}, input);
  if (N > 0) k.dot(dy, x, Tensor(), 1, N * C, HxW, db, ds);
  Tensor m3 = as(mean, S).view({N, G, 1}), r3 = as(rstd, S).view({N, G, 1});
  Tensor db3 = db.view({N, G, Cg}), ds3 = ds.view({N, G, Cg});
  if (output_mask[1])
    gw = sum(mul(sub(ds3, mul(db3, m3)), r3), {0}, false, std::nullopt).view({C}).to(pd);
  if (output_mask[2]) gb = sum(db, {0}, false, std::nullopt).to(pd);
  if (output_mask[0]) {
    gi = empty_tensor(input.sizes(), input.dtype(), input.device());
    if (gi.numel() > 0) {
      Tensor w3 = weight.defined() ? as(weight, S).view({1, G, Cg}) : Tensor();
      Tensor dsw = w3.defined() ? mul(ds3, w3) : ds3, dbw = w3.defined() ? mul(db3, w3) : db3;
      Tensor ds_g = sum(dsw, {2}, true, std::nullopt), db_g = sum(dbw, {2}, true, std::nullopt);
      const double s = 1.0 / static_cast<double>(Cg * HxW);
      Tensor c2 = mul(mul(mul(sub(mul(db_g, m3), ds_g), r3), mul(r3, r3)), s);  // x's coefficient
      Tensor c3 = sub(neg(mul(c2, m3)), mul(mul(db_g, r3), s));
      Tensor p = w3.defined() ? mul(r3, w3) : spread(r3, {N, G, Cg});
      k.apply(gi, dy, p.contiguous(), x, spread(c2, {N, G, Cg}), spread(c3, {N, G, Cg}), Tensor(),
              Tensor(), N, C, HxW, C, 1);
    }
  }
  return {gi, gw, gb};
}

LayerNormGrads layer_norm_fused_backward_outputs(const Tensor& grad, const Tensor& input,
                                                 IntArrayRef normalized_shape, const Tensor& weight,
                                                 double eps, IntArrayRef output_mask) {
  meta::layer_norm_fused_backward(grad, input, normalized_shape, weight, eps, output_mask);
  LayerNormGrads r;
  r.n = prod(normalized_shape, 0, normalized_shape.size());
  r.rows = r.n == 0 ? 0 : input.numel() / r.n;
  const Device d = input.device();
  if (output_mask[0]) r.dx = empty_tensor(input.sizes(), input.dtype(), d);
  for (auto [flag, t] : {std::pair{output_mask[1], &r.dw}, std::pair{output_mask[2], &r.db}}) {
    if (!flag) continue;
    *t = empty_tensor(normalized_shape, input.dtype(), d);
    if (r.rows == 0) t->zero_();
  }
  return r;
}

TensorTriple run_layer_norm(const NormKernels& k, const Tensor& input, IntArrayRef normalized_shape,
                            const Tensor& weight, const Tensor& bias, double eps) {
  const int64_t axis = meta::native_layer_norm(input, normalized_shape, weight, bias, eps);
  const DType S = stat(input);
  const size_t a = static_cast<size_t>(axis);
  const int64_t M = prod(input.sizes(), 0, a), D = prod(input.sizes(), a, input.sizes().size());
  Shape ss(input.sizes().subspan(0, a));
  for (size_t i = 0; i < normalized_shape.size(); ++i) ss.push_back(1);
  const Tensor x = input.contiguous();
  Tensor mean = stats_empty({M}, input), var = stats_empty({M}, input);
  Tensor out = empty_tensor(input.sizes(), input.dtype(), input.device());
  if (M == 0) return {out, mean.to(input.dtype()).view(ss), var.to(input.dtype()).view(ss)};
  k.moments(x, 1, M, D, mean, var);
  Tensor rstd = rsqrt(add(var, eps));
  if (out.numel() > 0)
    k.apply(out, x, rstd, Tensor(), Tensor(), neg(mul(mean, rstd)), as(weight, S), as(bias, S), M,
            1, D, 1, 0);
  // See Note [Norm statistics]: ATen's CPU kernels return them in the input's dtype.
  return {out, mean.to(input.dtype()).view(ss), rstd.to(input.dtype()).view(ss)};
}

TensorTriple run_layer_norm_backward(const NormKernels& k, const Tensor& grad_out,
                                     const Tensor& input, IntArrayRef normalized_shape,
                                     const Tensor& mean, const Tensor& rstd, const Tensor& weight,
                                     const Tensor& bias, IntArrayRef output_mask) {
  const int64_t axis = meta::native_layer_norm_backward(grad_out, input, normalized_shape, mean,
                                                        rstd, weight, bias, output_mask);
  const DType S = stat(input);
  const size_t a = static_cast<size_t>(axis);
  const int64_t M = prod(input.sizes(), 0, a), D = prod(input.sizes(), a, input.sizes().size());
  const Tensor x = input.contiguous(), dy = grad_out.contiguous();
  const Tensor m1 = as(mean, S).view({M}), r1 = as(rstd, S).view({M});
  Shape lead;
  for (int64_t i = 0; i < axis; ++i) lead.push_back(i);
  // The sum over the leading dims (none: the tensor itself; sum's empty dims would be all).
  auto sum_lead = [&](const Tensor& t) {
    return lead.empty() ? t : sum(t, lead, false, std::nullopt);
  };
  Tensor gi, gw, gb;
  if (output_mask[1]) {
    Tensor xhat = empty_tensor(input.sizes(), input.dtype(), input.device());
    if (xhat.numel() > 0)
      k.apply(xhat, x, r1, Tensor(), Tensor(), neg(mul(m1, r1)), Tensor(), Tensor(), M, 1, D, 1, 0);
    gw = sum_lead(mul(dy.to(S), xhat.to(S))).to(param_dtype(weight, input));
  }
  if (output_mask[2]) gb = sum_lead(dy.to(S)).to(param_dtype(bias, input));
  if (output_mask[0]) {
    gi = empty_tensor(input.sizes(), input.dtype(), input.device());
    if (gi.numel() > 0) {
      // g = dy * w; dx = rstd * (g - mean(g) - xhat * mean(g * xhat)) per row.
      Tensor g = weight.defined() ? mul(dy, weight).to(input.dtype()).contiguous() : dy;
      Tensor sum_g = stats_empty({M}, input), sum_gxmu = stats_empty({M}, input);
      k.dot(g, x, m1, 1, M, D, sum_g, sum_gxmu);
      const double inv_d = 1.0 / static_cast<double>(D);
      Tensor proj = mul(mul(mul(sum_gxmu, r1), r1), inv_d);
      Tensor r = neg(mul(r1, proj));
      Tensor s = sub(mul(mul(r1, proj), m1), mul(mul(r1, sum_g), inv_d));
      k.apply(gi, g, r1, x, r, s, Tensor(), Tensor(), M, 1, D, 1, 0);
    }
  }
  return {gi, gw, gb};
}

}  // namespace detail

namespace {

Device meta_dev() { return Device(kMeta); }
Tensor me(IntArrayRef s, DType dt) { return detail::empty_tensor(s, dt, meta_dev()); }
DType sd(const Tensor& x) { return meta::norm_stat_dtype(x.dtype()); }
DType pdt(const Tensor& p, const Tensor& x) { return p.defined() ? p.dtype() : x.dtype(); }

TensorTriple meta_bn(const Tensor& x, const Tensor& w, const Tensor& b, const Tensor& rm,
                     const Tensor& rv, bool has_stats, bool training, double eps) {
  meta::batch_norm(x, w, b, rm, rv, has_stats, training, eps);
  const int64_t n = training ? x.size(1) : 0;
  return {me(x.sizes(), x.dtype()), me({n}, sd(x)), me({n}, sd(x))};
}
TensorTriple meta_bn_legit(const Tensor& x, const Tensor& w, const Tensor& b, const Tensor& rm,
                           const Tensor& rv, bool training, double, double eps) {
  return meta_bn(x, w, b, rm, rv, true, training, eps);
}
TensorTriple meta_bn_no_stats(const Tensor& x, const Tensor& w, const Tensor& b, bool training,
                              double, double eps) {
  return meta_bn(x, w, b, Tensor(), Tensor(), false, training, eps);
}
TensorTriple meta_bn_no_training(const Tensor& x, const Tensor& w, const Tensor& b,
                                 const Tensor& rm, const Tensor& rv, double, double eps) {
  return meta_bn(x, w, b, rm, rv, true, false, eps);
}
TensorTriple meta_bn_backward(const Tensor& g, const Tensor& x, const Tensor& w, const Tensor& rm,
                              const Tensor& rv, const Tensor& sm, const Tensor& si, bool train,
                              double eps, IntArrayRef mask) {
  meta::batch_norm_backward(g, x, w, rm, rv, sm, si, train, eps, mask);
  Tensor gi, gw, gb;
  if (mask[0]) gi = me(x.sizes(), x.dtype());
  if (mask[1]) gw = me({x.size(1)}, pdt(w, x));
  if (mask[2]) gb = me({x.size(1)}, pdt(w, x));
  return {gi, gw, gb};
}
TensorTriple meta_gn(const Tensor& x, const Tensor& w, const Tensor& b, int64_t N, int64_t C,
                     int64_t HxW, int64_t group, double eps) {
  meta::group_norm(x, w, b, N, C, HxW, group, eps);
  return {me(x.sizes(), x.dtype()), me({N, group}, x.dtype()), me({N, group}, x.dtype())};
}
TensorTriple meta_gn_backward(const Tensor& g, const Tensor& x, const Tensor& mean,
                              const Tensor& rstd, const Tensor& w, int64_t N, int64_t C,
                              int64_t HxW, int64_t group, IntArrayRef mask) {
  meta::group_norm_backward(g, x, mean, rstd, w, N, C, HxW, group, mask);
  Tensor gi, gw, gb;
  if (mask[0]) gi = me(x.sizes(), x.dtype());
  if (mask[1]) gw = me({C}, pdt(w, x));
  if (mask[2]) gb = me({C}, pdt(w, x));
  return {gi, gw, gb};
}
Shape ln_stat_shape(const Tensor& x, int64_t axis) {
  Shape s(x.sizes().subspan(0, static_cast<size_t>(axis)));
  for (int64_t i = axis; i < x.dim(); ++i) s.push_back(1);
  return s;
}
TensorTriple meta_ln(const Tensor& x, IntArrayRef shape, const Tensor& w, const Tensor& b,
                     double eps) {
  const int64_t axis = meta::native_layer_norm(x, shape, w, b, eps);
  Shape s = ln_stat_shape(x, axis);
  return {me(x.sizes(), x.dtype()), me(s, x.dtype()), me(s, x.dtype())};
}
TensorTriple meta_ln_backward(const Tensor& g, const Tensor& x, IntArrayRef shape,
                              const Tensor& mean, const Tensor& rstd, const Tensor& w,
                              const Tensor& b, IntArrayRef mask) {
  meta::native_layer_norm_backward(g, x, shape, mean, rstd, w, b, mask);
  Tensor gi, gw, gb;
  if (mask[0]) gi = me(x.sizes(), x.dtype());
  if (mask[1]) gw = me(shape, pdt(w, x));
  if (mask[2]) gb = me(shape, pdt(b, x));
  return {gi, gw, gb};
}

TensorTriple meta_ln_grads(const Tensor& g, const Tensor& x, IntArrayRef shape, const Tensor& w,
                           double eps, IntArrayRef mask) {
  meta::layer_norm_fused_backward(g, x, shape, w, eps, mask);
  Tensor gi, gw, gb;
  if (mask[0]) gi = me(x.sizes(), x.dtype());
  if (mask[1]) gw = me(shape, x.dtype());
  if (mask[2]) gb = me(shape, x.dtype());
  return {gi, gw, gb};
}

template <class Sig>
void reg(TypedOp<Sig>& op, Sig* fn) {
  op.def.set_meta_raw(reinterpret_cast<void*>(fn));
  op.set_kernel(DispatchKey::Meta, fn);
}
const bool registered = [] {
  reg(ops::op_native_batch_norm_legit, &meta_bn_legit);
  reg(ops::op_native_batch_norm_legit_no_stats, &meta_bn_no_stats);
  reg(ops::op_native_batch_norm_legit_no_training, &meta_bn_no_training);
  reg(ops::op_native_batch_norm_backward, &meta_bn_backward);
  reg(ops::op_native_group_norm, &meta_gn);
  reg(ops::op_native_group_norm_backward, &meta_gn_backward);
  reg(ops::op_native_layer_norm, &meta_ln);
  reg(ops::op_native_layer_norm_backward, &meta_ln_backward);
  reg(ops::op_layer_norm_fused_backward, &meta_ln_grads);
  return true;
}();

}  // namespace
}  // namespace kiln

// Backward formulas for every op of kiln/ops/op_list.h. `g` is the output's gradient, `gi` the
// arguments' gradients by slot (see BackwardCtx). Results may keep a broadcast shape: the node
// sums them to each argument's shape (OpNode::apply).
#include <array>
#include <cmath>
#include <numbers>

#include "kiln/autograd/derivative.h"
#include "kiln/ops/index_meta.h"
#include "kiln/ops/op_list.h"
#include "kiln/ops/ops.h"

namespace kiln::autograd {

namespace {

using Grads = TensorList;
constexpr uint32_t S(int k) { return 1u << k; }

Tensor zeros_of(const BackwardCtx& c, size_t slot) {
  const TensorGeometry& geo = c.geometry(slot);
  if (geo.layout) {
    const Scalar zero(0);
    return detail::sharded_full(geo.layout, &zero);  // a DTensor input's: a DTensor
  }
  return zeros(geo.sizes, geo.dtype, geo.device);
}
bool is_one(const Scalar& s) { return s.to_double() == 1.0; }
Tensor scaled(const Tensor& g, const Scalar& s) { return is_one(s) ? g : mul(g, s); }

// The dims a reduction reduced: `dims` wrapped, or all of them when empty.
Shape reduced_dims(IntArrayRef dims, int64_t ndim) {
  Shape out;
  if (dims.empty()) {
    for (int64_t d = 0; d < ndim; ++d) out.push_back(d);
  } else {
    for (int64_t d : dims) out.push_back(wrap_dim(d, ndim, "backward"));
  }
  std::sort(out.begin(), out.end());
  return out;
}
// A reduction's output (or its gradient) with the reduced dims put back as size 1.
Tensor keep_dims(const Tensor& t, IntArrayRef dims, int64_t ndim, bool keepdim) {
  if (keepdim || ndim == 0) return t;
  Tensor r = t;
  for (int64_t d : reduced_dims(dims, ndim)) r = unsqueeze(r, d);
  return r;
}
int64_t reduced_count(IntArrayRef sizes, IntArrayRef dims) {
  int64_t n = 1;
  for (int64_t d : reduced_dims(dims, static_cast<int64_t>(sizes.size()))) n *= sizes[d];
  return n;
}
// The last `k` dims, as layer_norm and rms_norm normalise over them.
Shape last_dims(int64_t k, int64_t ndim) {
  Shape out;
  for (int64_t d = ndim - k; d < ndim; ++d) out.push_back(d);
  return out;
}

// ---------------------------------------------------------------- pointwise
void add_bw(const BackwardCtx& c, const Grads& g, Grads& gi) {
  if (c.needs(0)) gi[0] = g[0];
  if (c.needs(1)) gi[1] = scaled(g[0], c.get<Scalar>(2));
}
void sub_bw(const BackwardCtx& c, const Grads& g, Grads& gi) {
  if (c.needs(0)) gi[0] = g[0];
  if (c.needs(1)) gi[1] = neg(scaled(g[0], c.get<Scalar>(2)));
}
void mul_bw(const BackwardCtx& c, const Grads& g, Grads& gi) {
  if (c.needs(0)) gi[0] = mul(g[0], c.input(1));
  if (c.needs(1)) gi[1] = mul(g[0], c.input(0));
}
void div_bw(const BackwardCtx& c, const Grads& g, Grads& gi) {
  Tensor b = c.input(1);
  if (c.needs(0)) gi[0] = div(g[0], b);
  if (c.needs(1)) gi[1] = neg(div(mul(g[0], c.input(0)), mul(b, b)));
}
void pow_bw(const BackwardCtx& c, const Grads& g, Grads& gi) {
  Tensor a = c.input(0), b = c.input(1);
  if (c.needs(0))
    gi[0] = where(eq(b, 0.0), zeros_like(g[0]), mul(mul(g[0], b), pow(a, sub(b, 1.0))));
  if (c.needs(1)) {
    Tensor at_zero = logical_and(eq(a, 0.0), ge(b, 0.0));
    gi[1] = where(logical_not(at_zero), mul(g[0], mul(c.output(0), log(a))), 0.0);
  }
}
// d/da atan2(a, b) = b / (a^2 + b^2), d/db = -a / (a^2 + b^2)
void atan2_bw(const BackwardCtx& c, const Grads& g, Grads& gi) {
  Tensor a = c.input(0), b = c.input(1);
  Tensor r = div(g[0], add(mul(a, a), mul(b, b)));
  if (c.needs(0)) gi[0] = mul(r, b);
  if (c.needs(1)) gi[1] = neg(mul(r, a));
}
// fmod(a, b) = a - trunc(a / b) * b and remainder(a, b) = a - floor(a / b) * b: the quotient is
// piecewise constant, so the gradients are g and -g * quotient, as in PyTorch.
void fmod_bw(const BackwardCtx& c, const Grads& g, Grads& gi) {
  if (c.needs(0)) gi[0] = g[0];
  if (c.needs(1)) gi[1] = neg(mul(g[0], div(c.input(0), c.input(1), "trunc")));
}
void remainder_bw(const BackwardCtx& c, const Grads& g, Grads& gi) {
  if (c.needs(0)) gi[0] = g[0];
  if (c.needs(1)) gi[1] = neg(mul(g[0], div(c.input(0), c.input(1), "floor")));
}
// Rounded quotients are piecewise constant: zero gradients, as in PyTorch.
void div_rounding_bw(const BackwardCtx& c, const Grads&, Grads& gi) {
  if (c.needs(0)) gi[0] = zeros_of(c, 0);
  if (c.needs(1)) gi[1] = zeros_of(c, 1);
}
// Ties split the gradient evenly, as in PyTorch.
void max_min_bw(const BackwardCtx& c, const Grads& g, Grads& gi, bool is_max) {
  Tensor a = c.input(0), b = c.input(1);
  Tensor shared = where(eq(a, b), div(g[0], 2.0), g[0]);
  if (c.needs(0)) gi[0] = where(is_max ? ge(a, b) : le(a, b), shared, 0.0);
  if (c.needs(1)) gi[1] = where(is_max ? le(a, b) : ge(a, b), shared, 0.0);
}
void maximum_bw(const BackwardCtx& c, const Grads& g, Grads& gi) { max_min_bw(c, g, gi, true); }
void minimum_bw(const BackwardCtx& c, const Grads& g, Grads& gi) { max_min_bw(c, g, gi, false); }
void neg_bw(const BackwardCtx&, const Grads& g, Grads& gi) { gi[0] = neg(g[0]); }
void abs_bw(const BackwardCtx& c, const Grads& g, Grads& gi) {
  Tensor a = c.input(0);
  gi[0] = where(gt(a, 0.0), g[0], where(lt(a, 0.0), neg(g[0]), 0.0));
}
void exp_bw(const BackwardCtx& c, const Grads& g, Grads& gi) { gi[0] = mul(g[0], c.output(0)); }
void log_bw(const BackwardCtx& c, const Grads& g, Grads& gi) { gi[0] = div(g[0], c.input(0)); }
void sqrt_bw(const BackwardCtx& c, const Grads& g, Grads& gi) {
  gi[0] = div(g[0], mul(c.output(0), 2.0));
}
void rsqrt_bw(const BackwardCtx& c, const Grads& g, Grads& gi) {
  Tensor y = c.output(0);
  gi[0] = mul(g[0], mul(mul(y, mul(y, y)), -0.5));
}
void tanh_bw(const BackwardCtx& c, const Grads& g, Grads& gi) {
  Tensor y = c.output(0);
  gi[0] = mul(g[0], 1.0 - mul(y, y));
}
void sigmoid_bw(const BackwardCtx& c, const Grads& g, Grads& gi) {
  Tensor y = c.output(0);
  gi[0] = mul(g[0], mul(y, 1.0 - y));
}
// One pass over grad and the result (threshold_backward), as PyTorch's relu backward.
void relu_bw(const BackwardCtx& c, const Grads& g, Grads& gi) {
  gi[0] = threshold_backward(g[0], c.output(0), 0);
}
void silu_bw(const BackwardCtx& c, const Grads& g, Grads& gi) {
  Tensor a = c.input(0), s = sigmoid(a);
  gi[0] = mul(g[0], mul(s, add(mul(a, 1.0 - s), 1.0)));
}
void sin_bw(const BackwardCtx& c, const Grads& g, Grads& gi) { gi[0] = mul(g[0], cos(c.input(0))); }
void cos_bw(const BackwardCtx& c, const Grads& g, Grads& gi) {
  gi[0] = neg(mul(g[0], sin(c.input(0))));
}
// d/dx erf(x) = 2 / sqrt(pi) * exp(-x^2)
void erf_bw(const BackwardCtx& c, const Grads& g, Grads& gi) {
  Tensor x = c.input(0);
  gi[0] = mul(g[0], mul(exp(neg(mul(x, x))), 2.0 / std::sqrt(std::numbers::pi)));
}
void acos_bw(const BackwardCtx& c, const Grads& g, Grads& gi) {
  Tensor x = c.input(0);
  gi[0] = neg(div(g[0], sqrt(1.0 - mul(x, x))));
}
void acosh_bw(const BackwardCtx& c, const Grads& g, Grads& gi) {
  Tensor x = c.input(0);
  gi[0] = div(g[0], sqrt(sub(mul(x, x), 1.0)));
}
void asin_bw(const BackwardCtx& c, const Grads& g, Grads& gi) {
  Tensor x = c.input(0);
  gi[0] = div(g[0], sqrt(1.0 - mul(x, x)));
}
void asinh_bw(const BackwardCtx& c, const Grads& g, Grads& gi) {
  Tensor x = c.input(0);
  gi[0] = div(g[0], sqrt(add(mul(x, x), 1.0)));
}
void atan_bw(const BackwardCtx& c, const Grads& g, Grads& gi) {
  Tensor x = c.input(0);
  gi[0] = div(g[0], add(mul(x, x), 1.0));
}
void atanh_bw(const BackwardCtx& c, const Grads& g, Grads& gi) {
  Tensor x = c.input(0);
  gi[0] = div(g[0], 1.0 - mul(x, x));
}
void cosh_bw(const BackwardCtx& c, const Grads& g, Grads& gi) {
  gi[0] = mul(g[0], sinh(c.input(0)));
}
void sinh_bw(const BackwardCtx& c, const Grads& g, Grads& gi) {
  gi[0] = mul(g[0], cosh(c.input(0)));
}
// d/dx tan(x) = 1 + tan(x)^2
void tan_bw(const BackwardCtx& c, const Grads& g, Grads& gi) {
  Tensor y = c.output(0);
  gi[0] = mul(g[0], add(mul(y, y), 1.0));
}
void expm1_bw(const BackwardCtx& c, const Grads& g, Grads& gi) {
  gi[0] = mul(g[0], add(c.output(0), 1.0));
}
void log1p_bw(const BackwardCtx& c, const Grads& g, Grads& gi) {
  gi[0] = div(g[0], add(c.input(0), 1.0));
}
void log2_bw(const BackwardCtx& c, const Grads& g, Grads& gi) {
  gi[0] = div(g[0], mul(c.input(0), std::numbers::ln2));
}
void log10_bw(const BackwardCtx& c, const Grads& g, Grads& gi) {
  gi[0] = div(g[0], mul(c.input(0), std::numbers::ln10));
}
void reciprocal_bw(const BackwardCtx& c, const Grads& g, Grads& gi) {
  Tensor y = c.output(0);
  gi[0] = neg(mul(g[0], mul(y, y)));
}
// ceil, floor, round, trunc and sign are piecewise constant: a zero gradient, as in PyTorch.
void zero_bw(const BackwardCtx&, const Grads& g, Grads& gi) { gi[0] = zeros_like(g[0]); }
// The gradient flows strictly inside (min_val, max_val), as ATen's hardtanh_backward.
void hardtanh_bw(const BackwardCtx& c, const Grads& g, Grads& gi) {
  Tensor x = c.input(0);
  Tensor inside = logical_and(gt(x, c.get<Scalar>(1)), lt(x, c.get<Scalar>(2)));
  gi[0] = where(inside, g[0], 0.0);
}
void leaky_relu_bw(const BackwardCtx& c, const Grads& g, Grads& gi) {
  gi[0] = where(gt(c.input(0), 0.0), g[0], mul(g[0], c.get<Scalar>(1)));
}
void gelu_bw(const BackwardCtx& c, const Grads& g, Grads& gi) {
  gi[0] = gelu_backward(g[0], c.input(0), c.get<bool>(1));
}
void clamp_bw(const BackwardCtx& c, const Grads& g, Grads& gi) {
  Tensor a = c.input(0);
  const IValue &lo = c.arg(1), &hi = c.arg(2);
  Tensor keep = ones_like(a).to(kBool);
  if (auto* s = std::get_if<Scalar>(&lo)) keep = logical_and(keep, ge(a, *s));
  if (auto* s = std::get_if<Scalar>(&hi)) keep = logical_and(keep, le(a, *s));
  gi[0] = where(keep, g[0], 0.0);
}
void where_bw(const BackwardCtx& c, const Grads& g, Grads& gi) {
  Tensor cond = c.input(0);
  if (c.needs(1)) gi[1] = where(cond, g[0], 0.0);
  if (c.needs(2)) gi[2] = where(logical_not(cond), g[0], 0.0);
}

// ---------------------------------------------------------------- reductions
void sum_bw(const BackwardCtx& c, const Grads& g, Grads& gi) {
  IntArrayRef in = c.sizes(0);
  gi[0] = expand(keep_dims(g[0], c.get<Shape>(1), in.size(), c.get<bool>(2)), in);
}
void mean_bw(const BackwardCtx& c, const Grads& g, Grads& gi) {
  IntArrayRef in = c.sizes(0);
  int64_t n = reduced_count(in, c.get<Shape>(1));
  gi[0] = expand(div(keep_dims(g[0], c.get<Shape>(1), in.size(), c.get<bool>(2)), n), in);
}
void var_bw(const BackwardCtx& c, const Grads& g, Grads& gi) {
  Tensor a = c.input(0);
  const Shape& dims = c.get<Shape>(1);
  double denom = static_cast<double>(reduced_count(a.sizes(), dims) - c.get<int64_t>(2));
  Tensor centered = sub(a, mean(a, dims, true));
  gi[0] = mul(keep_dims(g[0], dims, a.dim(), c.get<bool>(3)), mul(centered, 2.0 / denom));
}
// The gradient is shared evenly by the elements that equal the extreme value.
void amax_amin_bw(const BackwardCtx& c, const Grads& g, Grads& gi) {
  Tensor a = c.input(0);
  const Shape& dims = c.get<Shape>(1);
  bool keepdim = c.get<bool>(2);
  Tensor mask = eq(a, keep_dims(c.output(0), dims, a.dim(), keepdim));
  Tensor count = sum(mask, dims, true, a.dtype());
  gi[0] = where(mask, div(keep_dims(g[0], dims, a.dim(), keepdim), count), 0.0);
}
void softmax_bw(const BackwardCtx& c, const Grads& g, Grads& gi) {
  Tensor y = c.output(0);
  int64_t dim = c.get<int64_t>(1);
  gi[0] = mul(y, sub(g[0], sum(mul(g[0], y), {dim}, true)));
}
void log_softmax_bw(const BackwardCtx& c, const Grads& g, Grads& gi) {
  int64_t dim = c.get<int64_t>(1);
  gi[0] = sub(g[0], mul(exp(c.output(0)), sum(g[0], {dim}, true)));
}

// ---------------------------------------------------------------- linear algebra, nn
// The gradient of b in a @ b, laid out like b: when b is a transposed view (linear's weight^T)
// it is computed as (g^T a)^T, so that the weight's own gradient comes out contiguous and
// accumulates without a strided pass. PyTorch's mm_mat2_backward does the same.
Tensor mat2_grad(const Tensor& g, const Tensor& a, const TensorGeometry& b) {
  bool transposed =
      b.sizes.size() == 2 && b.strides[0] == 1 && b.strides[1] == b.sizes[0] && b.sizes[0] > 1;
  return transposed ? t(mm(t(g), a)) : mm(t(a), g);
}
void mm_bw(const BackwardCtx& c, const Grads& g, Grads& gi) {
  if (c.needs(0)) gi[0] = mm(g[0], t(c.input(1)));
  if (c.needs(1)) gi[1] = mat2_grad(g[0], c.input(0), c.geometry(1));
}
void bmm_bw(const BackwardCtx& c, const Grads& g, Grads& gi) {
  if (c.needs(0)) gi[0] = bmm(g[0], transpose(c.input(1), 1, 2));
  if (c.needs(1)) gi[1] = bmm(transpose(c.input(0), 1, 2), g[0]);
}
// The gradients of inputs 1 and 2 of an op computing alpha * (input 1 @ input 2) + ..., from
// the gradient g of that sum (addmm, addmm_gelu).
void product_grads(const BackwardCtx& c, const Tensor& g, const Scalar& alpha, Grads& gi) {
  if (c.needs(1)) gi[1] = scaled(mm(g, t(c.input(2))), alpha);
  if (c.needs(2)) gi[2] = scaled(mat2_grad(g, c.input(1), c.geometry(2)), alpha);
}
void addmm_bw(const BackwardCtx& c, const Grads& g, Grads& gi) {
  if (c.needs(0)) gi[0] = scaled(g[0], c.get<Scalar>(3));
  product_grads(c, g[0], c.get<Scalar>(4), gi);
}
// y = xhat * w + b, xhat = (x - mean) * rstd over the normalised (last) dims: dx alone in one
// pass per row (layer_norm_backward), or with dw = sum(g * xhat) and db = sum(g) from the same
// pass (layer_norm_fused_backward).
void layer_norm_bw(const BackwardCtx& c, const Grads& g, Grads& gi) {
  Tensor x = c.input(0);
  Shape shape = c.get<Shape>(1);
  double eps = c.get<double>(4);
  if (!c.needs(1) && !c.needs(2)) {
    if (c.needs(0)) gi[0] = layer_norm_backward(g[0], x, shape.span(), c.input(1), eps);
    return;
  }
  const std::array<int64_t, 3> mask = {c.needs(0), c.needs(1), c.needs(2)};
  auto [dx, dw, db] =
      ops::op_layer_norm_fused_backward(g[0], x, shape.span(), c.input(1), eps, mask);
  gi[0] = dx;
  gi[1] = dw;
  gi[2] = db;
}
// y = xhat * w, xhat = x * rstd, rstd = 1 / sqrt(mean(x^2) + eps) over the last dims.
void rms_norm_bw(const BackwardCtx& c, const Grads& g, Grads& gi) {
  Tensor x = c.input(0);
  Shape dims = last_dims(static_cast<int64_t>(c.get<Shape>(1).size()), x.dim());
  Tensor rstd = rsqrt(add(mean(mul(x, x), dims, true), c.get<double>(3)));
  Tensor xhat = mul(x, rstd);
  if (c.needs(1)) gi[1] = mul(g[0], xhat);
  if (c.needs(0)) {
    Tensor w = c.input(1);
    Tensor gx = w.defined() ? mul(g[0], w) : g[0];
    gi[0] = mul(rstd, sub(gx, mul(xhat, mean(mul(gx, xhat), dims, true))));
  }
}
// See Note [Embedding gradients] in kiln/ops/embedding_meta.cpp.
void embedding_bw(const BackwardCtx& c, const Grads& g, Grads& gi) {
  gi[0] = ops::op_embedding_dense_backward(g[0], c.input(1), c.sizes(0)[0], c.get<int64_t>(2),
                                           c.get<bool>(3));
}
// embedding_bag (Note [embedding_bag] in kiln/ops/embedding_meta.cpp), as ATen's
// _embedding_bag_backward: each index's row of the gradient is its bag's (offset2bag), divided by
// the bag's size for mean and times its per-sample weight, then summed into weight's rows by
// embedding_dense_backward (padding_idx and scale_grad_by_freq there); max sends each bag's
// gradient to the rows max_indices names (empty bags send nothing). per_sample_weights' gradient
// is each index's row of weight dotted with its bag's gradient (0 at padding_idx).
void embedding_bag_bw(const BackwardCtx& c, const Grads& g, Grads& gi) {
  if (!g[0].defined()) return;
  const bool scale = c.get<bool>(3);
  const int64_t mode = c.get<int64_t>(4), padding = c.get<int64_t>(8);
  Tensor indices = c.input(1), offset2bag = c.output(1), bag_size = c.output(2);
  Tensor rows = index_select(g[0], 0, offset2bag);
  if (c.needs(0) && mode == 2) {
    Tensor keep = unsqueeze(gt(bag_size, 0), 1);
    gi[0] = scatter_add(zeros_of(c, 0), 0, c.output(3).to(kInt64), where(keep, g[0], 0.0));
  } else if (c.needs(0)) {
    Tensor r = rows;
    if (mode == 1) {
      Tensor n = index_select(masked_fill(bag_size, eq(bag_size, 0), 1), 0, offset2bag);
      r = div(r, unsqueeze(n.to(r.dtype()), 1));
    }
    if (Tensor psw = c.input(3); psw.defined()) r = mul(r, unsqueeze(psw, 1));
    gi[0] = ops::op_embedding_dense_backward(r, indices, c.sizes(0)[0], padding, scale);
  }
  if (c.needs(3)) {
    Tensor d = sum(mul(rows, embedding(c.input(0), indices)), {1});
    gi[3] = padding >= 0 ? masked_fill(d, eq(indices, padding), 0) : d;
  }
}
// loss = -mean over kept rows of input[n, target[n]].
void nll_loss_bw(const BackwardCtx& c, const Grads& g, Grads& gi) {
  Tensor target = c.input(1);
  int64_t ignore = c.get<int64_t>(2);
  const TensorGeometry& in = c.geometry(0);
  Tensor keep = ne(target, ignore);
  Tensor count = sum(keep, {}, false, in.dtype);
  Tensor row = where(keep, div(neg(g[0]), count), 0.0);
  Tensor col = where(keep, target, 0);
  int64_t cdim = in.sizes.size() == 2 ? 1 : 0;
  gi[0] = scatter_add(zeros_of(c, 0), cdim, unsqueeze(col, -1), unsqueeze(row, -1).to(in.dtype));
}

// ---------------------------------------------------------------- shape and indexing
void cat_bw(const BackwardCtx& c, const Grads& g, Grads& gi) {
  int64_t dim = wrap_dim(c.get<int64_t>(1), g[0].dim(), "cat");
  int64_t offset = 0;
  for (size_t k = 0; k < c.num_slots(); ++k) {
    IntArrayRef s = c.sizes(k);
    if (s.size() == 1 && s[0] == 0 && g[0].dim() != 1) continue;  // skipped by the forward
    if (c.needs(k)) gi[k] = narrow(g[0], dim, offset, s[dim]);
    offset += s[dim];
  }
}
void index_select_bw(const BackwardCtx& c, const Grads& g, Grads& gi) {
  gi[0] = index_add(zeros_of(c, 0), c.get<int64_t>(1), c.input(1), g[0]);
}
void gather_bw(const BackwardCtx& c, const Grads& g, Grads& gi) {
  gi[0] = scatter_add(zeros_of(c, 0), c.get<int64_t>(1), c.input(1), g[0]);
}
void scatter_add_bw(const BackwardCtx& c, const Grads& g, Grads& gi) {
  if (c.needs(0)) gi[0] = g[0];
  if (c.needs(2)) {
    Tensor picked = gather(g[0], c.get<int64_t>(1), c.input(1));
    if (picked.sizes() == c.sizes(2)) {
      gi[2] = picked;
    } else {  // src may be larger than index: its other elements were not used
      gi[2] = zeros_of(c, 2);
      Tensor part = gi[2];
      for (int64_t d = 0; d < picked.dim(); ++d) part = narrow(part, d, 0, picked.size(d));
      part.copy_(picked);
    }
  }
}
void index_add_bw(const BackwardCtx& c, const Grads& g, Grads& gi) {
  if (c.needs(0)) gi[0] = g[0];
  if (c.needs(2)) {
    Tensor picked = index_select(g[0], c.get<int64_t>(1), c.input(1));
    gi[2] = scaled(picked, c.get<Scalar>(4)).reshape(c.sizes(2));
  }
}
// The index tensors of index/index_put, slots [1, 1 + n) (undefined ones keep their dims).
TensorList saved_indices(const BackwardCtx& c, size_t n) {
  TensorList idx;
  for (size_t k = 1; k <= n; ++k) idx.push_back(c.input(k));
  return idx;
}
// index(self, indices): the gradient accumulated back into self's positions.
void index_bw(const BackwardCtx& c, const Grads& g, Grads& gi) {
  gi[0] = ops::op_index_put(zeros_of(c, 0), saved_indices(c, c.num_slots() - 1), g[0], true);
}
// index_put(self, indices, values, accumulate): self's gradient is g with the written positions
// zeroed (accumulate: g itself); values' is g at those positions (summed back to values' shape
// by the node when values was broadcast).
void index_put_bw(const BackwardCtx& c, const Grads& g, Grads& gi) {
  const size_t nv = c.num_slots() - 1;
  TensorList idx = saved_indices(c, nv - 1);
  if (c.needs(0))
    gi[0] = c.get<bool>(3)
                ? g[0]
                : ops::op_index_put(g[0], idx, zeros({}, g[0].dtype(), g[0].device()), false);
  if (c.needs(nv)) gi[nv] = ops::op_index(g[0], idx);
}
// scatter(self, dim, index, src): self's gradient is g with the written positions zeroed, src's
// is g read at them (src may be larger than index: its other elements get zero).
// `picked` (a gradient read at the index's coordinates) in the leading corner of zeros shaped as
// tensor slot `slot`.
Tensor padded_to_slot(const BackwardCtx& c, size_t slot, const Tensor& picked) {
  if (picked.sizes() == c.sizes(slot)) return picked;
  Tensor r = zeros_of(c, slot);
  Tensor part = r;
  for (int64_t d = 0; d < picked.dim(); ++d) part = narrow(part, d, 0, picked.size(d));
  part.copy_(picked);
  return r;
}
void scatter_bw(const BackwardCtx& c, const Grads& g, Grads& gi) {
  const int64_t dim = c.get<int64_t>(1);
  if (c.needs(0)) gi[0] = scatter(g[0], dim, c.input(1), Scalar(0));
  if (c.needs(2)) gi[2] = padded_to_slot(c, 2, gather(g[0], dim, c.input(1)));
}
// scatter_reduce (Note [scatter_reduce] in kiln/ops/scatter_meta.cpp), as ATen's
// scatter_reduce_backward: sum passes g to self and gathers it for src; mean divides both by the
// count of values each position reduced; prod is the product of the others (the product over a
// zero computed without dividing by it, when a position has one zero); amax/amin split g evenly
// among the values equal to the result. include_self=false zeroes self's gradient where some
// index writes. src's gradient is zero outside the index's shape.
void scatter_reduce_bw(const BackwardCtx& c, const Grads& g, Grads& gi) {
  const int64_t dim = c.get<int64_t>(1), reduce = c.get<int64_t>(4);
  const bool include_self = c.get<bool>(5);
  const Tensor& grad = g[0];
  Tensor self = c.input(0), index = c.input(1), src = c.input(2);
  for (int64_t k = 0; k < index.dim() && k < src.dim(); ++k) src = narrow(src, k, 0, index.size(k));
  Tensor gself, gsrc;
  if (reduce == 0) {
    gself = grad;
    gsrc = gather(grad, dim, index);
  } else if (reduce == 1) {
    Tensor result = c.output(0);
    Tensor masked_self = masked_fill(self, eq(self, 0), 1);
    gself = div(mul(grad, ops::op_scatter_reduce(masked_self, dim, index, src, 1, include_self)),
                masked_self);
    Tensor src_zero = eq(src, 0);
    Tensor zeros_at =
        gather(scatter_add(zeros_like(self), dim, index, src_zero.to(self.dtype())), dim, index);
    Tensor single_zero = logical_and(src_zero, eq(zeros_at, 1));
    Tensor masked_src_result =
        ops::op_scatter_reduce(self, dim, index, masked_fill(src, single_zero, 1), 1, include_self);
    gsrc = where(single_zero, gather(mul(grad, masked_src_result), dim, index),
                 div(gather(mul(grad, result), dim, index), masked_fill(src, src_zero, 1)));
  } else if (reduce == 2) {
    Tensor n =
        scatter_add(include_self ? ones_like(grad) : zeros_like(grad), dim, index, ones_like(src));
    n = masked_fill(n, eq(n, 0), 1);
    gself = div(grad, n);
    gsrc = div(gather(grad, dim, index), gather(n, dim, index));
  } else {
    Tensor result = c.output(0);
    Tensor self_is = eq(self, result).to(grad.dtype());
    Tensor src_is = eq(src, gather(result, dim, index)).to(grad.dtype());
    Tensor shared = div(grad, scatter_add(self_is, dim, index, src_is));
    gself = mul(self_is, shared);
    gsrc = mul(src_is, gather(shared, dim, index));
  }
  if (!include_self) gself = scatter(gself, dim, index, Scalar(0));
  if (c.needs(0)) gi[0] = gself;
  if (c.needs(2)) gi[2] = padded_to_slot(c, 2, gsrc);
}
// select_scatter/slice_scatter(self, src, ...): self's gradient is g with the view zeroed, src's
// the view of g.
void select_scatter_bw(const BackwardCtx& c, const Grads& g, Grads& gi) {
  const int64_t dim = c.get<int64_t>(2), index = c.get<int64_t>(3);
  if (c.needs(0)) gi[0] = select_scatter(g[0], zeros_of(c, 1), dim, index);
  if (c.needs(1)) {
    const int64_t d = wrap_dim(dim, g[0].dim(), "select_scatter");
    gi[1] = select(g[0], d, index < 0 ? index + g[0].size(d) : index);
  }
}
void slice_scatter_bw(const BackwardCtx& c, const Grads& g, Grads& gi) {
  const int64_t dim = c.get<int64_t>(2), step = c.get<int64_t>(5);
  auto opt = [&](size_t pos) -> OptInt {
    const IValue& v = c.arg(pos);
    if (auto* i = std::get_if<int64_t>(&v)) return *i;
    return std::nullopt;
  };
  const OptInt start = opt(3), end = opt(4);
  if (c.needs(0)) gi[0] = slice_scatter(g[0], zeros_of(c, 1), dim, start, end, step);
  if (c.needs(1)) {
    const int64_t d = wrap_dim(dim, g[0].dim(), "slice_scatter");
    const auto [s, e] = meta::slice_bounds(g[0].size(d), start, end);
    gi[1] = slice(g[0], d, s, e, step);
  }
}
void triu_bw(const BackwardCtx& c, const Grads& g, Grads& gi) {
  gi[0] = triu(g[0], c.get<int64_t>(1));
}
void tril_bw(const BackwardCtx& c, const Grads& g, Grads& gi) {
  gi[0] = tril(g[0], c.get<int64_t>(1));
}
void reshape_bw(const BackwardCtx& c, const Grads& g, Grads& gi) {
  gi[0] = g[0].reshape(c.sizes(0));
}
void identity_bw(const BackwardCtx&, const Grads& g, Grads& gi) { gi[0] = g[0]; }
void as_strided_bw(const BackwardCtx& c, const Grads& g, Grads& gi) {
  const TensorGeometry& in = c.geometry(0);
  gi[0] = as_strided_backward(g[0], in.sizes, in.strides, in.offset, c.get<Shape>(1),
                              c.get<Shape>(2), c.get<int64_t>(3));
}
void permute_bw(const BackwardCtx& c, const Grads& g, Grads& gi) {
  const Shape& dims = c.get<Shape>(1);
  Shape inverse(dims.size());
  for (size_t i = 0; i < dims.size(); ++i)
    inverse[wrap_dim(dims[i], static_cast<int64_t>(dims.size()), "permute")] =
        static_cast<int64_t>(i);
  gi[0] = permute(g[0], inverse);
}
void transpose_bw(const BackwardCtx& c, const Grads& g, Grads& gi) {
  gi[0] = transpose(g[0], c.get<int64_t>(1), c.get<int64_t>(2));
}
void slice_bw(const BackwardCtx& c, const Grads& g, Grads& gi) {
  gi[0] = zeros_of(c, 0);
  slice(gi[0], c.get<int64_t>(1), c.get<int64_t>(2), c.get<int64_t>(3), c.get<int64_t>(4))
      .copy_(g[0]);
}
void select_bw(const BackwardCtx& c, const Grads& g, Grads& gi) {
  gi[0] = zeros_of(c, 0);
  select(gi[0], c.get<int64_t>(1), c.get<int64_t>(2)).copy_(g[0]);
}
// diagonal: the gradient lands on the same diagonal of a zero tensor of the input's shape.
void diagonal_bw(const BackwardCtx& c, const Grads& g, Grads& gi) {
  gi[0] = zeros_of(c, 0);
  diagonal(gi[0], c.get<int64_t>(1), c.get<int64_t>(2), c.get<int64_t>(3)).copy_(g[0]);
}
void flip_bw(const BackwardCtx& c, const Grads& g, Grads& gi) {
  gi[0] = flip(g[0], c.get<Shape>(1));
}
// repeat: g viewed as [r0, s0, r1, s1, ...] (s = 1 for repeat's new leading dims) summed over
// the tiles r0, r1, ...
void repeat_bw(const BackwardCtx& c, const Grads& g, Grads& gi) {
  const Shape repeats = c.get<Shape>(1);
  IntArrayRef in = c.sizes(0);
  const int64_t nr = static_cast<int64_t>(repeats.size());
  const int64_t lead = nr - static_cast<int64_t>(in.size());
  Shape split, tiles;
  for (int64_t i = 0; i < nr; ++i) {
    split.push_back(repeats[i]);
    split.push_back(i < lead ? 1 : in[i - lead]);
    tiles.push_back(2 * i);
  }
  gi[0] = nr == 0 ? g[0] : sum(g[0].reshape(split), tiles).reshape(in);
}
void copy_bw(const BackwardCtx& c, const Grads& g, Grads& gi) {
  if (c.needs(0)) gi[0] = zeros_of(c, 0);  // the old value of self is overwritten
  if (c.needs(1)) gi[1] = g[0];
}
void fill_bw(const BackwardCtx& c, const Grads&, Grads& gi) { gi[0] = zeros_of(c, 0); }
// values of max_dim / min_dim: the gradient goes to the selected index.
void max_min_dim_bw(const BackwardCtx& c, const Grads& g, Grads& gi) {
  int64_t ndim = static_cast<int64_t>(c.sizes(0).size());
  int64_t dim = ndim == 0 ? 0 : wrap_dim(c.get<int64_t>(1), ndim, "max");
  bool keepdim = c.get<bool>(2) || ndim == 0;
  Tensor idx = keepdim ? c.output(1) : unsqueeze(c.output(1), dim);
  Tensor gv = keepdim ? g[0] : unsqueeze(g[0], dim);
  gi[0] = ndim == 0 ? gv : scatter_add(zeros_of(c, 0), dim, idx, gv);
}
// values of sort / topk: each value's gradient goes back to the position it came from (the
// indices are a permutation, or a selection without repeats, so scatter_add is a scatter).
void sort_topk_bw(const BackwardCtx& c, const Grads& g, Grads& gi, int64_t dim) {
  if (!g[0].defined()) return;
  int64_t ndim = static_cast<int64_t>(c.sizes(0).size());
  gi[0] = ndim == 0 ? g[0]
                    : scatter_add(zeros_of(c, 0), wrap_dim(dim, ndim, "sort"), c.output(1), g[0]);
}
void sort_bw(const BackwardCtx& c, const Grads& g, Grads& gi) {
  sort_topk_bw(c, g, gi, c.get<int64_t>(1));
}
void topk_bw(const BackwardCtx& c, const Grads& g, Grads& gi) {
  sort_topk_bw(c, g, gi, c.get<int64_t>(2));
}
// cumsum: the gradient is the reversed cumulative sum of g along dim (g flipped, summed,
// flipped back: index_select with the reversed positions), in the input's dtype.
void cumsum_bw(const BackwardCtx& c, const Grads& g, Grads& gi) {
  Tensor gt = g[0].to(c.geometry(0).dtype);
  int64_t ndim = static_cast<int64_t>(c.sizes(0).size());
  if (ndim == 0) {
    gi[0] = gt;
    return;
  }
  int64_t d = wrap_dim(c.get<int64_t>(1), ndim, "cumsum");
  int64_t n = c.sizes(0)[d];
  Tensor rev = arange(n - 1, -1, -1, kInt64, gt.device());
  gi[0] = index_select(cumsum(index_select(gt, d, rev), d), d, rev);
}
// Note [prod backward with zeros]
// d prod / d x_j is the product of the other elements. Dividing the product by x_j fails at a
// zero, so (as ATen's prod_backward, without its host reads) each slice counts its zeros: none
// gives prod / x_j; one gives the product of the non-zero elements at the zero and 0 elsewhere;
// two or more give 0 everywhere. The product of the non-zero elements is prod itself over the
// input with its zeros replaced by 1, so the formula is differentiable again.
void prod_bw(const BackwardCtx& c, const Grads& g, Grads& gi) {
  Tensor x = c.input(0);
  Tensor gv = g[0].to(x.dtype());
  int64_t d = 0;
  Tensor xs = x;
  if (std::holds_alternative<std::monostate>(c.arg(1)) || x.dim() == 0) {
    xs = reshape(x, {-1});
    gv = reshape(gv, {1});
  } else {
    d = wrap_dim(c.get<int64_t>(1), x.dim(), "prod");
    if (!c.get<bool>(2)) gv = unsqueeze(gv, d);
  }
  Tensor zero = eq(xs, 0);
  Tensor count = sum(zero, {d}, true);
  Tensor nonzero = where(zero, ones_like(xs), xs);
  Tensor p = prod(nonzero, d, true);
  Tensor factor =
      where(eq(count, 0), div(p, nonzero), where(logical_and(eq(count, 1), zero), p, 0.0));
  gi[0] = reshape(mul(gv, factor), x.sizes());
}
void elu_bw(const BackwardCtx& c, const Grads& g, Grads& gi) {
  gi[0] =
      elu_backward(g[0], c.get<Scalar>(1), c.get<Scalar>(2), c.get<Scalar>(3), false, c.input(0));
}
void dropout_bw(const BackwardCtx& c, const Grads& g, Grads& gi) {
  double p = c.get<double>(1);
  gi[0] = where(c.output(1), mul(g[0], p < 1 ? 1.0 / (1.0 - p) : 0.0), 0.0);
}
// Note [Fused attention]: the gradients come from flash_attention_backward, which recomputes
// the probabilities from the saved logsumexp; the logsumexp output itself has none.
void flash_attention_bw(const BackwardCtx& c, const Grads& g, Grads& gi) {
  KILN_CHECK(g.size() < 2 || !g[1].defined(),
             "[flash_attention] the logsumexp output carries no gradient; compute it from the "
             "scores (logsumexp of q k^T * scale) to differentiate it");
  if (!g[0].defined()) return;
  auto [dq, dk, dv] =
      ops::op_flash_attention_backward(g[0], c.input(0), c.input(1), c.input(2), c.output(0),
                                       c.output(1), c.get<bool>(3), c.get<double>(4));
  if (c.needs(0)) gi[0] = dq;
  if (c.needs(1)) gi[1] = dk;
  if (c.needs(2)) gi[2] = dv;
}

// Note [GELU epilogue]: z = mat1 @ mat2 + bias is the saved preactivation (output 1, which may
// carry a gradient of its own); out = gelu_tanh(z). dz = gelu_backward(dout, z) (+ dz), then
// addmm's gradients (the bias's is dz summed to its n elements).
void addmm_gelu_bw(const BackwardCtx& c, const Grads& g, Grads& gi) {
  Tensor dz;
  if (g[0].defined()) dz = gelu_backward(g[0], c.output(1), true);
  if (g.size() > 1 && g[1].defined()) dz = dz.defined() ? add(dz, g[1]) : g[1];
  if (!dz.defined()) return;
  if (c.needs(0)) gi[0] = dz;
  product_grads(c, dz, 1, gi);
}

// convolution: convolution_backward computes the gradients the call needs (its output_mask),
// the bias's as grad_output summed over every dim but the channels.
void convolution_bw(const BackwardCtx& c, const Grads& g, Grads& gi) {
  // An undefined bias never needs a gradient; a bias has grad_output's channel count.
  const bool bias_grad = c.num_slots() > 2 && c.needs(2);
  Shape bias_sizes;
  if (bias_grad) bias_sizes.push_back(g[0].size(1));
  Shape mask{c.needs(0) ? 1 : 0, c.needs(1) ? 1 : 0, bias_grad ? 1 : 0};
  auto [di, dw, db] = ops::op_convolution_backward(
      g[0], c.input(0), c.input(1), bias_sizes, c.get<Shape>(3), c.get<Shape>(4), c.get<Shape>(5),
      c.get<bool>(6), c.get<Shape>(7), c.get<int64_t>(8), mask);
  if (mask[0]) gi[0] = di;
  if (mask[1]) gi[1] = dw;
  if (mask[2]) gi[2] = db;
}

// Pooling (Note [Pooling] in kiln/ops/pool_meta.cpp): each forward op's backward op, from the
// saved input (and max pooling's saved indices, output 1; the indices have no gradient).
template <int nd>
void max_pool_bw(const BackwardCtx& c, const Grads& g, Grads& gi) {
  auto& bw =
      nd == 2 ? ops::op_max_pool2d_with_indices_backward : ops::op_max_pool3d_with_indices_backward;
  gi[0] = bw(g[0], c.input(0), c.get<Shape>(1), c.get<Shape>(2), c.get<Shape>(3), c.get<Shape>(4),
             c.get<bool>(5), c.output(1));
}
template <int nd>
void avg_pool_bw(const BackwardCtx& c, const Grads& g, Grads& gi) {
  auto& bw = nd == 2 ? ops::op_avg_pool2d_backward : ops::op_avg_pool3d_backward;
  const IValue& div = c.arg(6);
  std::optional<int64_t> divisor;
  if (!std::holds_alternative<std::monostate>(div)) divisor = std::get<int64_t>(div);
  gi[0] = bw(g[0], c.input(0), c.get<Shape>(1), c.get<Shape>(2), c.get<Shape>(3), c.get<bool>(4),
             c.get<bool>(5), divisor);
}
template <int nd>
void adaptive_avg_pool_bw(const BackwardCtx& c, const Grads& g, Grads& gi) {
  auto& bw = nd == 2 ? ops::op_adaptive_avg_pool2d_backward : ops::op_adaptive_avg_pool3d_backward;
  gi[0] = bw(g[0], c.input(0));
}

// Padding and upsampling (Note [Padding and upsampling] in kiln/ops/pad_meta.cpp): constant
// padding's gradient crops (the pads negated); the others call their backward ops.
void constant_pad_bw(const BackwardCtx& c, const Grads& g, Grads& gi) {
  Shape pad = c.get<Shape>(1);
  for (int64_t& p : pad) p = -p;
  gi[0] = ops::op_constant_pad_nd(g[0], pad, 0);
}
template <int mode, int nd>
void pad_bw(const BackwardCtx& c, const Grads& g, Grads& gi) {
  using Op = decltype(ops::op_reflection_pad1d_backward);
  static Op* const bw[2][3] = {
      {&ops::op_reflection_pad1d_backward, &ops::op_reflection_pad2d_backward,
       &ops::op_reflection_pad3d_backward},
      {&ops::op_replication_pad1d_backward, &ops::op_replication_pad2d_backward,
       &ops::op_replication_pad3d_backward}};
  gi[0] = (*bw[mode][nd - 1])(g[0], c.input(0), c.get<Shape>(1));
}
std::optional<double> opt_double(const IValue& v) {
  if (std::holds_alternative<std::monostate>(v)) return std::nullopt;
  return std::get<double>(v);
}
void upsample_nearest_bw(const BackwardCtx& c, const Grads& g, Grads& gi) {
  gi[0] = ops::op_upsample_nearest2d_backward(g[0], c.get<Shape>(1), c.sizes(0),
                                              opt_double(c.arg(2)), opt_double(c.arg(3)));
}
void upsample_bilinear_bw(const BackwardCtx& c, const Grads& g, Grads& gi) {
  gi[0] = ops::op_upsample_bilinear2d_backward(g[0], c.get<Shape>(1), c.sizes(0), c.get<bool>(2),
                                               opt_double(c.arg(3)), opt_double(c.arg(4)));
}

// cdist and pdist (Note [cdist and pdist] in kiln/ops/distance_meta.cpp) through their backward
// ops, from the saved inputs and result: x2's gradient is cdist_backward with x1 and x2 swapped
// and grad and the result transposed, as ATen's; a batch-broadcast gradient is summed back to
// the input's shape by the node.
void cdist_bw(const BackwardCtx& c, const Grads& g, Grads& gi) {
  const double p = c.get<double>(2);
  Tensor x1 = c.input(0), x2 = c.input(1), out = c.output(0);
  if (c.needs(0)) gi[0] = ops::op_cdist_backward(g[0], x1, x2, p, out);
  if (c.needs(1))
    gi[1] = ops::op_cdist_backward(transpose(g[0], -1, -2), x2, x1, p, transpose(out, -1, -2));
}
void pdist_bw(const BackwardCtx& c, const Grads& g, Grads& gi) {
  gi[0] = ops::op_pdist_backward(g[0], c.input(0), c.get<double>(1), c.output(0));
}

// im2col and col2im (Note [im2col and col2im] in kiln/ops/fold_meta.cpp) are linear and each
// other's adjoint: each one's gradient is the other op with the same kernel geometry.
void im2col_bw(const BackwardCtx& c, const Grads& g, Grads& gi) {
  IntArrayRef in = c.sizes(0);
  gi[0] = ops::op_col2im(g[0], Shape{in[in.size() - 2], in[in.size() - 1]}, c.get<Shape>(1),
                         c.get<Shape>(2), c.get<Shape>(3), c.get<Shape>(4));
}
void col2im_bw(const BackwardCtx& c, const Grads& g, Grads& gi) {
  gi[0] = ops::op_im2col(g[0], c.get<Shape>(2), c.get<Shape>(3), c.get<Shape>(4), c.get<Shape>(5));
}

// grid_sampler_2d (Note [grid_sampler_2d] in kiln/ops/grid_sample_meta.cpp): its backward op
// computes the gradients the call needs (output_mask), from the saved input and grid.
void grid_sampler_2d_bw(const BackwardCtx& c, const Grads& g, Grads& gi) {
  Shape mask{c.needs(0) ? 1 : 0, c.needs(1) ? 1 : 0};
  auto [dinput, dgrid] = ops::op_grid_sampler_2d_backward(
      g[0], c.input(0), c.input(1), c.get<int64_t>(2), c.get<int64_t>(3), c.get<bool>(4), mask);
  if (mask[0]) gi[0] = dinput;
  if (mask[1]) gi[1] = dgrid;
}

// Batch, group and layer norm (Note [Batch, group and layer norm] in kiln/ops/norm_meta.cpp):
// their backward ops compute what the call needs (output_mask); save_mean/save_rstd (mean/rstd)
// are the forward's outputs 1 and 2, and carry no gradient. Eval batch norm differentiates
// through the running stats, which training would have overwritten (it never reads them).
Shape norm_mask(const BackwardCtx& c) {
  return {c.needs(0) ? 1 : 0, c.needs(1) ? 1 : 0, c.needs(2) ? 1 : 0};
}
void set_norm_grads(const Shape& mask, const TensorTriple& r, Grads& gi) {
  if (mask[0]) gi[0] = std::get<0>(r);
  if (mask[1]) gi[1] = std::get<1>(r);
  if (mask[2]) gi[2] = std::get<2>(r);
}
// Slots: input, weight, bias[, running_mean, running_var]; `train` and `eps` at these positions.
void batch_norm_grads(const BackwardCtx& c, const Grads& g, Grads& gi, bool stats, bool train,
                      double eps) {
  if (!g[0].defined()) return;
  const Shape mask = norm_mask(c);
  const bool eval = stats && !train;
  set_norm_grads(
      mask,
      ops::op_native_batch_norm_backward(
          g[0], c.input(0), c.input(1), eval ? c.input(3) : Tensor(), eval ? c.input(4) : Tensor(),
          eval ? Tensor() : c.output(1), eval ? Tensor() : c.output(2), !eval, eps, mask),
      gi);
}
void batch_norm_legit_bw(const BackwardCtx& c, const Grads& g, Grads& gi) {
  batch_norm_grads(c, g, gi, true, c.get<bool>(5), c.get<double>(7));
}
void batch_norm_no_stats_bw(const BackwardCtx& c, const Grads& g, Grads& gi) {
  batch_norm_grads(c, g, gi, false, true, c.get<double>(5));
}
void batch_norm_no_training_bw(const BackwardCtx& c, const Grads& g, Grads& gi) {
  batch_norm_grads(c, g, gi, true, false, c.get<double>(6));
}
void group_norm_bw(const BackwardCtx& c, const Grads& g, Grads& gi) {
  if (!g[0].defined()) return;
  const Shape mask = norm_mask(c);
  set_norm_grads(mask,
                 ops::op_native_group_norm_backward(
                     g[0], c.input(0), c.output(1), c.output(2), c.input(1), c.get<int64_t>(3),
                     c.get<int64_t>(4), c.get<int64_t>(5), c.get<int64_t>(6), mask),
                 gi);
}
void native_layer_norm_bw(const BackwardCtx& c, const Grads& g, Grads& gi) {
  if (!g[0].defined()) return;
  const Shape mask = norm_mask(c);
  set_norm_grads(mask,
                 ops::op_native_layer_norm_backward(g[0], c.input(0), c.get<Shape>(1), c.output(1),
                                                    c.output(2), c.input(1), c.input(2), mask),
                 gi);
}

struct Entry {
  OpDef* op;
  Derivative d;
};
constexpr Derivative F(BackwardFn fn, uint32_t in = 0, uint32_t out = 0) {
  return {Differentiability::Formula, fn, in, out};
}
constexpr Derivative kNone{Differentiability::None, nullptr, 0, 0};

// Pointwise ops: the same formula serves `name` and `name_`.
const Entry kPointwise[] = {
    {&ops::op_add.def, F(add_bw)},
    {&ops::op_sub.def, F(sub_bw)},
    {&ops::op_mul.def, F(mul_bw, S(0) | S(1))},
    {&ops::op_div.def, F(div_bw, S(0) | S(1))},
    {&ops::op_pow.def, F(pow_bw, S(0) | S(1), S(0))},
    {&ops::op_maximum.def, F(maximum_bw, S(0) | S(1))},
    {&ops::op_minimum.def, F(minimum_bw, S(0) | S(1))},
    {&ops::op_atan2.def, F(atan2_bw, S(0) | S(1))},
    {&ops::op_fmod.def, F(fmod_bw, S(0) | S(1))},
    {&ops::op_remainder.def, F(remainder_bw, S(0) | S(1))},
    {&ops::op_div_trunc.def, F(div_rounding_bw)},
    {&ops::op_div_floor.def, F(div_rounding_bw)},
    {&ops::op_bitwise_and.def, kNone},
    {&ops::op_bitwise_or.def, kNone},
    {&ops::op_bitwise_xor.def, kNone},
    {&ops::op_bitwise_not.def, kNone},
    {&ops::op_eq.def, kNone},
    {&ops::op_ne.def, kNone},
    {&ops::op_lt.def, kNone},
    {&ops::op_le.def, kNone},
    {&ops::op_gt.def, kNone},
    {&ops::op_ge.def, kNone},
    {&ops::op_logical_and.def, kNone},
    {&ops::op_logical_or.def, kNone},
    {&ops::op_logical_xor.def, kNone},
    {&ops::op_logical_not.def, kNone},
    {&ops::op_neg.def, F(neg_bw)},
    {&ops::op_abs.def, F(abs_bw, S(0))},
    {&ops::op_exp.def, F(exp_bw, 0, S(0))},
    {&ops::op_log.def, F(log_bw, S(0))},
    {&ops::op_sqrt.def, F(sqrt_bw, 0, S(0))},
    {&ops::op_rsqrt.def, F(rsqrt_bw, 0, S(0))},
    {&ops::op_tanh.def, F(tanh_bw, 0, S(0))},
    {&ops::op_sigmoid.def, F(sigmoid_bw, 0, S(0))},
    {&ops::op_relu.def, F(relu_bw, 0, S(0))},
    {&ops::op_silu.def, F(silu_bw, S(0))},
    {&ops::op_sin.def, F(sin_bw, S(0))},
    {&ops::op_cos.def, F(cos_bw, S(0))},
    {&ops::op_erf.def, F(erf_bw, S(0))},
    {&ops::op_acos.def, F(acos_bw, S(0))},
    {&ops::op_acosh.def, F(acosh_bw, S(0))},
    {&ops::op_asin.def, F(asin_bw, S(0))},
    {&ops::op_asinh.def, F(asinh_bw, S(0))},
    {&ops::op_atan.def, F(atan_bw, S(0))},
    {&ops::op_atanh.def, F(atanh_bw, S(0))},
    {&ops::op_cosh.def, F(cosh_bw, S(0))},
    {&ops::op_sinh.def, F(sinh_bw, S(0))},
    {&ops::op_tan.def, F(tan_bw, 0, S(0))},
    {&ops::op_expm1.def, F(expm1_bw, 0, S(0))},
    {&ops::op_log1p.def, F(log1p_bw, S(0))},
    {&ops::op_log2.def, F(log2_bw, S(0))},
    {&ops::op_log10.def, F(log10_bw, S(0))},
    {&ops::op_reciprocal.def, F(reciprocal_bw, 0, S(0))},
    {&ops::op_ceil.def, F(zero_bw)},
    {&ops::op_floor.def, F(zero_bw)},
    {&ops::op_round.def, F(zero_bw)},
    {&ops::op_trunc.def, F(zero_bw)},
    {&ops::op_sign.def, F(zero_bw)},
    {&ops::op_isnan.def, kNone},
    {&ops::op_isinf.def, kNone},
    {&ops::op_hardtanh.def, F(hardtanh_bw, S(0))},
    {&ops::op_leaky_relu.def, F(leaky_relu_bw, S(0))},
    {&ops::op_elu.def, F(elu_bw, S(0))},
    {&ops::op_gelu.def, F(gelu_bw, S(0))},
    {&ops::op_clamp.def, F(clamp_bw, S(0))},
    {&ops::op_where.def, F(where_bw, S(0))},
};

const Entry kOthers[] = {
    {&ops::op_sum.def, F(sum_bw)},
    {&ops::op_cumsum.def, F(cumsum_bw)},
    {&ops::op_prod.def, F(prod_bw, S(0))},
    {&ops::op_mean.def, F(mean_bw)},
    {&ops::op_var.def, F(var_bw, S(0))},
    {&ops::op_amax.def, F(amax_amin_bw, S(0), S(0))},
    {&ops::op_amin.def, F(amax_amin_bw, S(0), S(0))},
    {&ops::op_all.def, kNone},
    {&ops::op_any.def, kNone},
    {&ops::op_argmax.def, kNone},
    {&ops::op_argmin.def, kNone},
    {&ops::op_softmax.def, F(softmax_bw, 0, S(0))},
    {&ops::op_log_softmax.def, F(log_softmax_bw, 0, S(0))},
    {&ops::op_mm.def, F(mm_bw, S(0) | S(1))},
    {&ops::op_bmm.def, F(bmm_bw, S(0) | S(1))},
    {&ops::op_addmm.def, F(addmm_bw, S(1) | S(2))},
    {&ops::op_addmm_gelu.def, F(addmm_gelu_bw, S(1) | S(2), S(1))},
    {&ops::op_layer_norm.def, F(layer_norm_bw, S(0) | S(1))},
    {&ops::op_rms_norm.def, F(rms_norm_bw, S(0) | S(1))},
    {&ops::op_embedding.def, F(embedding_bw, S(1))},
    {&ops::op_embedding_bag.def, F(embedding_bag_bw, S(0) | S(1) | S(3), S(1) | S(2) | S(3))},
    {&ops::op_nll_loss.def, F(nll_loss_bw, S(1))},
    {&ops::op_cat.def, F(cat_bw)},
    {&ops::op_index_select.def, F(index_select_bw, S(1))},
    {&ops::op_gather.def, F(gather_bw, S(1))},
    {&ops::op_scatter_add.def, F(scatter_add_bw, S(1))},
    {&ops::op_index_add.def, F(index_add_bw, S(1))},
    {&ops::op_index.def, F(index_bw, ~S(0))},
    {&ops::op_index_put.def, F(index_put_bw, ~S(0))},
    {&ops::op_nonzero.def, kNone},
    {&ops::op_scatter.def, F(scatter_bw, S(1))},
    {&ops::op_scatter_reduce.def, F(scatter_reduce_bw, S(0) | S(1) | S(2), S(0))},
    {&ops::op_select_scatter.def, F(select_scatter_bw)},
    {&ops::op_slice_scatter.def, F(slice_scatter_bw)},
    {&ops::op_triu.def, F(triu_bw)},
    {&ops::op_flip.def, F(flip_bw)},
    {&ops::op_repeat.def, F(repeat_bw)},
    {&ops::op_tril.def, F(tril_bw)},
    {&ops::op_one_hot.def, kNone},
    {&ops::op_view.def, F(reshape_bw)},
    {&ops::op_as_strided.def, F(as_strided_bw)},
    {&ops::op_permute.def, F(permute_bw)},
    {&ops::op_transpose.def, F(transpose_bw)},
    {&ops::op_slice.def, F(slice_bw)},
    {&ops::op_select.def, F(select_bw)},
    {&ops::op_diagonal.def, F(diagonal_bw)},
    {&ops::op_squeeze_dims.def, F(reshape_bw)},
    {&ops::op_expand.def, F(identity_bw)},
    {&ops::op_squeeze.def, F(reshape_bw)},
    {&ops::op_unsqueeze.def, F(reshape_bw)},
    {&ops::op_alias.def, F(identity_bw)},
    {&ops::op_detach.def, kNone},
    {&ops::op_empty.def, kNone},
    {&ops::op_full.def, kNone},
    {&ops::op_arange.def, kNone},
    {&ops::op_linspace.def, kNone},
    {&ops::op_rand.def, kNone},
    {&ops::op_randn.def, kNone},
    {&ops::op_randint.def, kNone},
    {&ops::op_randperm.def, kNone},
    {&ops::op_empty_strided.def, kNone},
    // Loss scaling writes gradients and the scaler's state, never anything that needs a grad.
    {&ops::op_amp_non_finite_check_and_unscale_.def, kNone},
    {&ops::op_amp_update_scale_.def, kNone},
    {&ops::op_copy_.def, F(copy_bw)},
    {&ops::op_fill_.def, F(fill_bw)},
    {&ops::op_to_copy.def, F(identity_bw)},
    {&ops::op_max_dim.def, F(max_min_dim_bw, 0, S(1))},
    {&ops::op_sort.def, F(sort_bw, 0, S(1))},
    {&ops::op_topk.def, F(topk_bw, 0, S(1))},
    {&ops::op_min_dim.def, F(max_min_dim_bw, 0, S(1))},
    {&ops::op_native_dropout.def, F(dropout_bw, 0, S(1))},
    {&ops::op_flash_attention.def, F(flash_attention_bw, kSaveAll, S(0) | S(1))},
    {&ops::op_convolution.def, F(convolution_bw, S(0) | S(1))},
    {&ops::op_native_batch_norm_legit.def,
     F(batch_norm_legit_bw, S(0) | S(1) | S(3) | S(4), S(1) | S(2))},
    {&ops::op_native_batch_norm_legit_no_stats.def,
     F(batch_norm_no_stats_bw, S(0) | S(1), S(1) | S(2))},
    {&ops::op_native_batch_norm_legit_no_training.def,
     F(batch_norm_no_training_bw, S(0) | S(1) | S(3) | S(4), S(1) | S(2))},
    {&ops::op_native_group_norm.def, F(group_norm_bw, S(0) | S(1), S(1) | S(2))},
    {&ops::op_native_layer_norm.def, F(native_layer_norm_bw, S(0) | S(1) | S(2), S(1) | S(2))},
    {&ops::op_max_pool2d_with_indices.def, F(max_pool_bw<2>, S(0), S(1))},
    {&ops::op_max_pool3d_with_indices.def, F(max_pool_bw<3>, S(0), S(1))},
    {&ops::op_avg_pool2d.def, F(avg_pool_bw<2>, S(0))},
    {&ops::op_avg_pool3d.def, F(avg_pool_bw<3>, S(0))},
    {&ops::op_adaptive_avg_pool2d.def, F(adaptive_avg_pool_bw<2>, S(0))},
    {&ops::op_adaptive_avg_pool3d.def, F(adaptive_avg_pool_bw<3>, S(0))},
    {&ops::op_cdist_forward.def, F(cdist_bw, S(0) | S(1), S(0))},
    {&ops::op_pdist_forward.def, F(pdist_bw, S(0), S(0))},
    {&ops::op_constant_pad_nd.def, F(constant_pad_bw)},
    {&ops::op_reflection_pad1d.def, F(pad_bw<0, 1>, S(0))},
    {&ops::op_reflection_pad2d.def, F(pad_bw<0, 2>, S(0))},
    {&ops::op_reflection_pad3d.def, F(pad_bw<0, 3>, S(0))},
    {&ops::op_replication_pad1d.def, F(pad_bw<1, 1>, S(0))},
    {&ops::op_replication_pad2d.def, F(pad_bw<1, 2>, S(0))},
    {&ops::op_replication_pad3d.def, F(pad_bw<1, 3>, S(0))},
    {&ops::op_upsample_nearest2d.def, F(upsample_nearest_bw)},
    {&ops::op_upsample_bilinear2d.def, F(upsample_bilinear_bw)},
    {&ops::op_im2col.def, F(im2col_bw)},
    {&ops::op_col2im.def, F(col2im_bw)},
    {&ops::op_grid_sampler_2d.def, F(grid_sampler_2d_bw, S(0) | S(1))},
};

void set_derivative(const OpDef* op, const Derivative& d) {
  KILN_ASSERT(!op->derivative(), "two backward formulas for {}", op->name());
  const_cast<OpDef*>(op)->set_derivative(&d);
}

const bool registered = [] {
  for (const Entry& e : kPointwise) {
    set_derivative(e.op, e.d);
    // where_ writes into its bool condition: it can never carry a gradient.
    bool writes_bool = e.op == &ops::op_where.def;
    set_derivative(e.op->inplace_variant(), writes_bool ? kNone : e.d);
  }
  for (const Entry& e : kOthers) set_derivative(e.op, e.d);
  return true;
}();

}  // namespace

const Derivative& derivative_of(const OpDef& op) {
  static constexpr Derivative kUnsupported{};
  auto* d = static_cast<const Derivative*>(op.derivative());
  return d ? *d : kUnsupported;
}

}  // namespace kiln::autograd

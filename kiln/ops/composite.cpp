// Ops written in terms of other ops: they have no kernels of their own, so every backend (and,
// later, autograd and tracing) gets them for free.
#include <cmath>

#include "kiln/ops/meta.h"
#include "kiln/ops/op_list.h"
#include "kiln/ops/ops.h"
#include "kiln/ops/other_meta.h"
#include "kiln/ops/views.h"

namespace kiln {

using namespace ops;  // NOLINT: the *_op handles

// ---------------------------------------------------------------- linear algebra
Tensor mm(const Tensor& a, const Tensor& b) { return op_mm(a, b); }
Tensor bmm(const Tensor& a, const Tensor& b) { return op_bmm(a, b); }
Tensor addmm(const Tensor& self, const Tensor& a, const Tensor& b, const Scalar& beta,
             const Scalar& alpha) {
  return op_addmm(self, a, b, beta, alpha);
}

Tensor matmul(const Tensor& a, const Tensor& b) {
  KILN_CHECK(a.defined() && b.defined(), "[matmul] undefined tensor argument");
  int64_t da = a.dim(), db = b.dim();
  KILN_CHECK(da >= 1 && db >= 1,
             "[matmul] both arguments need at least 1 dimension, got {}-D and {}-D", da, db);
  if (da == 1 && db == 1) {
    KILN_CHECK(a.size(0) == b.size(0), "[matmul] size mismatch: a is [{}], b is [{}]", a.size(0),
               b.size(0));
    return op_mm(a.view({1, a.size(0)}), b.view({b.size(0), 1})).view({});
  }
  if (da == 2 && db == 1) return squeeze(op_mm(a, unsqueeze(b, 1)), -1);
  if (da == 1 && db == 2) return squeeze(op_mm(unsqueeze(a, 0), b), 0);
  if (da == 2 && db == 2) return op_mm(a, b);
  if (da >= 3 && db <= 2) {
    // Fold the batch into rows: [..., n, m] @ [m, p] is one mm.
    Tensor b2 = db == 1 ? unsqueeze(b, 1) : b;
    Shape out(a.sizes());
    Tensor r = op_mm(reshape(a, {-1, a.size(-1)}), b2);
    out.back() = b2.size(1);
    if (db == 1) out.erase(out.size() - 1);
    return r.reshape(out);
  }
  // Batched: broadcast the batch dims, then bmm.
  Tensor a2 = da == 1 ? unsqueeze(a, 0) : a;
  Tensor b2 = db == 1 ? unsqueeze(b, 1) : b;
  IntArrayRef ba = a2.sizes().subspan(0, a2.dim() - 2), bb = b2.sizes().subspan(0, b2.dim() - 2);
  size_t nb = std::max(ba.size(), bb.size());
  Shape batch(nb);
  for (size_t i = 0; i < nb; ++i) {
    int64_t x = i < nb - ba.size() ? 1 : ba[i - (nb - ba.size())];
    int64_t y = i < nb - bb.size() ? 1 : bb[i - (nb - bb.size())];
    KILN_CHECK(x == y || x == 1 || y == 1,
               "[matmul] batch dims [{}] and [{}] are not broadcastable", fmt::join(ba, ", "),
               fmt::join(bb, ", "));
    batch[i] = x == 1 ? y : x;
  }
  int64_t n = a2.size(-2), m = a2.size(-1), p = b2.size(-1);
  KILN_CHECK(b2.size(-2) == m, "[matmul] size mismatch: a is [{}], b is [{}]",
             fmt::join(a.sizes(), ", "), fmt::join(b.sizes(), ", "));
  int64_t nbatch = 1;
  for (int64_t s : batch) nbatch *= s;
  Shape ea(batch), eb(batch);
  ea.push_back(n);
  ea.push_back(m);
  eb.push_back(m);
  eb.push_back(p);
  Tensor r = op_bmm(expand(a2, ea).reshape({nbatch, n, m}), expand(b2, eb).reshape({nbatch, m, p}));
  Shape out(batch);
  if (da > 1) out.push_back(n);
  if (db > 1) out.push_back(p);
  return r.reshape(out);
}

namespace {
// linear's shape handling: x [..., in] as a 2-D [rows, in] matrix, `product(x2, weight^T)`
// ([rows, out]), and the result with x's leading dims.
template <class Product>
Tensor linear_2d(const char* op, const Tensor& x, const Tensor& weight, Product product) {
  KILN_CHECK(weight.defined() && weight.dim() == 2, "[{}] weight must be a 2-D tensor", op);
  KILN_CHECK(x.defined() && x.dim() >= 1, "[{}] input must have at least 1 dimension", op);
  KILN_CHECK(x.size(-1) == weight.size(1),
             "[{}] input's last dim {} does not match weight [{}] (expected [out, {}])", op,
             x.size(-1), fmt::join(weight.sizes(), ", "), x.size(-1));
  Tensor x2 = x.dim() == 2 ? x : reshape(x, {-1, x.size(-1)});
  Tensor y = product(x2, transpose(weight, 0, 1));
  if (x.dim() == 2) return y;
  Shape out(x.sizes());
  out.back() = weight.size(0);
  return y.reshape(out);
}
}  // namespace

Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias) {
  return linear_2d("linear", x, weight, [&](const Tensor& x2, const Tensor& wt) {
    return bias.defined() ? op_addmm(bias, x2, wt, 1, 1) : op_mm(x2, wt);
  });
}
TensorPair detail::addmm_gelu_unfused(const Tensor& bias, const Tensor& mat1, const Tensor& mat2) {
  meta::addmm_gelu(bias, mat1, mat2);
  Tensor pre = bias.defined() ? op_addmm(bias, mat1, mat2, 1, 1) : op_mm(mat1, mat2);
  return {op_gelu(pre, true), pre};
}
namespace {
// q k^T * scale (q and k in the statistics' dtype), keys after each query at -inf when causal.
Tensor attention_scores(const Tensor& q, const Tensor& k, bool causal, double scale) {
  Tensor scores = mul(matmul(q, transpose(k, -2, -1)), scale);
  if (!causal) return scores;
  Tensor keep = tril(ones({q.size(-2), k.size(-2)}, kBool, q.device()));
  return where(keep, scores, -INFINITY);
}
}  // namespace
TensorPair detail::flash_attention_math(const Tensor& q, const Tensor& k, const Tensor& v,
                                        bool causal, double scale) {
  TensorSpec s = meta::flash_attention(q, k, v, causal, scale);
  DType acc = meta::attention_stats_dtype(s.dtype);
  Tensor scores = attention_scores(q.to(acc), k.to(acc), causal, scale);
  Tensor m = amax(scores, {-1}, true);  // finite: every query sees key 0
  Tensor lse = add(m, log(sum(exp(sub(scores, m)), {-1}, true)));
  Tensor out = matmul(exp(sub(scores, lse)), v.to(acc));
  return {out.to(s.dtype), squeeze(lse, -1)};
}
TensorTriple detail::flash_attention_backward_math(const Tensor& grad_out, const Tensor& q,
                                                   const Tensor& k, const Tensor& v,
                                                   const Tensor& out, const Tensor& lse,
                                                   bool causal, double scale) {
  TensorSpec s = meta::flash_attention_backward(grad_out, q, k, v, out, lse, causal, scale);
  DType acc = meta::attention_stats_dtype(s.dtype);
  Tensor qa = q.to(acc), ka = k.to(acc), g = grad_out.to(acc);
  Tensor p = exp(sub(attention_scores(qa, ka, causal, scale), unsqueeze(lse.to(acc), -1)));
  Tensor dv = matmul(transpose(p, -2, -1), g);
  Tensor delta = sum(mul(g, out.to(acc)), {-1}, true);
  Tensor ds = mul(mul(p, sub(matmul(g, transpose(v.to(acc), -2, -1)), delta)), scale);
  Tensor dq = matmul(ds, ka), dk = matmul(transpose(ds, -2, -1), qa);
  return {dq.to(s.dtype), dk.to(s.dtype), dv.to(s.dtype)};
}

std::tuple<Tensor, Tensor> addmm_gelu(const Tensor& bias, const Tensor& mat1, const Tensor& mat2) {
  return op_addmm_gelu(bias, mat1, mat2);
}
Tensor linear_gelu(const Tensor& x, const Tensor& weight, const Tensor& bias) {
  return linear_2d("linear_gelu", x, weight, [&](const Tensor& x2, const Tensor& wt) {
    KILN_CHECK(!bias.defined() || (bias.dim() == 1 && bias.size(0) == wt.size(1)),
               "[linear_gelu] bias must be a vector of weight's {} output rows, got {}", wt.size(1),
               bias.sizes());
    return std::get<0>(op_addmm_gelu(bias, x2, wt));
  });
}

// ---------------------------------------------------------------- neural-net functions
Tensor layer_norm(const Tensor& x, IntArrayRef shape, const Tensor& w, const Tensor& b,
                  double eps) {
  return op_layer_norm(x, shape, w, b, eps);
}
Tensor rms_norm(const Tensor& x, IntArrayRef shape, const Tensor& w, double eps) {
  return op_rms_norm(x, shape, w, eps);
}
Tensor embedding(const Tensor& weight, const Tensor& indices, int64_t padding_idx,
                 bool scale_grad_by_freq, bool sparse) {
  return op_embedding(weight, indices, padding_idx, scale_grad_by_freq, sparse);
}
Tensor nll_loss(const Tensor& log_probs, const Tensor& target, int64_t ignore_index) {
  return op_nll_loss(log_probs, target, ignore_index);
}
Tensor cross_entropy(const Tensor& logits, const Tensor& target, int64_t ignore_index) {
  KILN_CHECK(logits.defined() && (logits.dim() == 1 || logits.dim() == 2),
             "[cross_entropy] expected logits of shape [N, C] or [C]");
  return op_nll_loss(op_log_softmax(logits, -1), target, ignore_index);
}
Tensor dropout(const Tensor& x, double p, bool train, Generator* gen) {
  KILN_CHECK(p >= 0 && p <= 1, "[dropout] probability has to be between 0 and 1, but got {}", p);
  if (!train || p == 0) return x;
  return std::get<0>(op_native_dropout(x, p, gen));
}

namespace {
// See scaled_dot_product_attention in ops.h.
bool fused_attention_applies(const Tensor& q, const Tensor& k, const Tensor& v,
                             const Tensor& mask) {
  if (!fused_attention() || mask.defined() || q.device().is_cpu() || k.device() != q.device() ||
      v.device() != q.device() || k.dim() != q.dim() || v.dim() != q.dim() || q.dim() < 2)
    return false;
  // Only where the backend has kernels of its own (CUDA): the CPU and the backends served by a
  // generic fallback (sim) keep the math path, and so stay bitwise equal to each other.
  if (!op_flash_attention.def.has_kernel(q.device().dispatch_key()) ||
      !op_flash_attention_backward.def.has_kernel(q.device().dispatch_key()))
    return false;
  DType t = q.dtype();
  if ((t != kFloat32 && t != kFloat16 && t != kBFloat16) || k.dtype() != t || v.dtype() != t)
    return false;
  // (The caller has checked that k's embedding size is q's and v's length is k's.)
  int64_t e = q.size(-1);
  if (e < 1 || e > 128 || v.size(-1) != e || q.size(-2) < 1 || k.size(-2) < 1) return false;
  for (int64_t d = 0; d < q.dim() - 2; ++d)
    if (k.size(d) != q.size(d) || v.size(d) != q.size(d)) return false;
  return true;
}
}  // namespace

Tensor scaled_dot_product_attention(const Tensor& q, const Tensor& k, const Tensor& v,
                                    const Tensor& attn_mask, bool is_causal,
                                    std::optional<double> scale) {
  const char* op = "scaled_dot_product_attention";
  KILN_CHECK(q.defined() && k.defined() && v.defined(), "[{}] undefined q, k or v", op);
  KILN_CHECK(q.dim() >= 2 && k.dim() >= 2 && v.dim() >= 2,
             "[{}] q, k and v need at least 2 dims ([..., L, E]), got {}, {} and {}", op, q.dim(),
             k.dim(), v.dim());
  KILN_CHECK(q.size(-1) == k.size(-1),
             "[{}] q and k must have the same embedding size, got {} and {}", op, q.size(-1),
             k.size(-1));
  KILN_CHECK(k.size(-2) == v.size(-2), "[{}] k and v must have the same length, got {} and {}", op,
             k.size(-2), v.size(-2));
  KILN_CHECK(!(is_causal && attn_mask.defined()),
             "[{}] pass either attn_mask or is_causal, not both", op);
  double s = scale ? *scale : 1.0 / std::sqrt(static_cast<double>(q.size(-1)));
  if (fused_attention_applies(q, k, v, attn_mask))
    return std::get<0>(op_flash_attention(q, k, v, is_causal, s));
  Tensor scores = matmul(q, transpose(k, -2, -1)) * s;  // [..., L, S]
  int64_t L = q.size(-2), S = k.size(-2);
  if (is_causal) {
    Tensor keep = tril(ones({L, S}, kBool, q.device()));
    scores = where(keep, scores, -INFINITY);
  } else if (attn_mask.defined()) {
    if (attn_mask.dtype() == kBool)
      scores = where(attn_mask, scores, -INFINITY);
    else
      scores = scores + attn_mask;
  }
  return matmul(op_softmax(scores, -1), v);
}

// ---------------------------------------------------------------- views and shapes
Tensor view(const Tensor& t, IntArrayRef sizes) { return op_view(t, sizes); }
Tensor reshape(const Tensor& t, IntArrayRef sizes) {
  KILN_CHECK(t.defined(), "[reshape] undefined tensor");
  Shape shape = detail::infer_size("reshape", sizes, t.numel());
  if (detail::view_strides(t.sizes(), t.strides(), shape)) return op_view(t, shape);
  return op_view(contiguous(t), shape);
}
Tensor permute(const Tensor& t, IntArrayRef dims) { return op_permute(t, dims); }
Tensor transpose(const Tensor& t, int64_t d0, int64_t d1) { return op_transpose(t, d0, d1); }
Tensor t(const Tensor& x) {
  KILN_CHECK(x.defined() && x.dim() <= 2, "[t] expects a tensor with <= 2 dimensions, but got {}D",
             x.defined() ? x.dim() : -1);
  return x.dim() < 2 ? op_alias(x) : op_transpose(x, 0, 1);
}
Tensor narrow(const Tensor& t, int64_t dim, int64_t start, int64_t length) {
  KILN_CHECK(t.defined() && t.dim() > 0, "[narrow] cannot be applied to a 0-dim tensor");
  int64_t d = wrap_dim(dim, t.dim(), "narrow");
  int64_t n = t.size(d);
  KILN_CHECK_INDEX(start >= -n && start <= n,
                   "[narrow] start {} is out of range for dim {} of size {}", start, d, n);
  if (start < 0) start += n;
  KILN_CHECK_INDEX(length >= 0 && length <= n - start,
                   "[narrow] start ({}) + length ({}) exceeds dimension size ({})", start, length,
                   n);
  return op_slice(t, d, start, start + length, 1);
}
Tensor slice(const Tensor& t, int64_t dim, int64_t start, int64_t end, int64_t step) {
  return op_slice(t, dim, start, end, step);
}
Tensor select(const Tensor& t, int64_t dim, int64_t index) { return op_select(t, dim, index); }
Tensor expand(const Tensor& t, IntArrayRef sizes) { return op_expand(t, sizes); }
Tensor expand_as(const Tensor& t, const Tensor& other) {
  meta::check_defined("expand_as", other, "other");
  return op_expand(t, other.sizes());
}
Tensor squeeze(const Tensor& t, std::optional<int64_t> dim) { return op_squeeze(t, dim); }
Tensor squeeze(const Tensor& t, IntArrayRef dims) { return op_squeeze_dims(t, dims); }
Tensor diagonal(const Tensor& t, int64_t offset, int64_t dim1, int64_t dim2) {
  return op_diagonal(t, offset, dim1, dim2);
}
Tensor flip(const Tensor& t, IntArrayRef dims) { return op_flip(t, dims); }
Tensor repeat(const Tensor& t, IntArrayRef repeats) { return op_repeat(t, repeats); }
Tensor unsqueeze(const Tensor& t, int64_t dim) { return op_unsqueeze(t, dim); }
Tensor flatten(const Tensor& t, int64_t start_dim, int64_t end_dim) {
  KILN_CHECK(t.defined(), "[flatten] undefined tensor");
  if (t.dim() == 0) return reshape(t, {1});
  int64_t s = wrap_dim(start_dim, t.dim(), "flatten"), e = wrap_dim(end_dim, t.dim(), "flatten");
  KILN_CHECK(s <= e, "[flatten] start_dim ({}) cannot come after end_dim ({})", s, e);
  Shape out;
  for (int64_t i = 0; i < s; ++i) out.push_back(t.size(i));
  int64_t mid = 1;
  for (int64_t i = s; i <= e; ++i) mid *= t.size(i);
  out.push_back(mid);
  for (int64_t i = e + 1; i < t.dim(); ++i) out.push_back(t.size(i));
  return reshape(t, out);
}
Tensor as_strided(const Tensor& t, IntArrayRef sizes, IntArrayRef strides,
                  std::optional<int64_t> offset) {
  return op_as_strided(t, sizes, strides, offset ? *offset : t.storage_offset());
}
Tensor detach(const Tensor& t) { return op_detach(t); }
Tensor contiguous(const Tensor& t) { return t.is_contiguous() ? t : clone(t); }
Tensor clone(const Tensor& t) { return op_to_copy(t, t.dtype(), t.device()); }
Tensor cat(const TensorList& tensors, int64_t dim) { return op_cat(tensors, dim); }
Tensor stack(const TensorList& tensors, int64_t dim) {
  KILN_CHECK(!tensors.empty(), "[stack] expected a non-empty list of tensors");
  for (const Tensor& x : tensors) meta::check_defined("stack", x, "tensors");
  for (size_t i = 1; i < tensors.size(); ++i)
    KILN_CHECK(std::ranges::equal(tensors[i].sizes(), tensors[0].sizes()),
               "[stack] expects each tensor to be equal size, but got [{}] at entry 0 and [{}] at "
               "entry {}",
               fmt::join(tensors[0].sizes(), ", "), fmt::join(tensors[i].sizes(), ", "), i);
  int64_t d = wrap_dim(dim, tensors[0].dim() + 1, "stack");
  TensorList u;
  u.reserve(tensors.size());
  for (const auto& x : tensors) u.push_back(op_unsqueeze(x, d));
  return op_cat(u, d);
}
std::vector<Tensor> split(const Tensor& t, int64_t split_size, int64_t dim) {
  KILN_CHECK(t.defined() && t.dim() > 0, "[split] expects at least a 1-dimensional tensor");
  KILN_CHECK(split_size >= 0, "[split] split_size must be non-negative, got {}", split_size);
  int64_t d = wrap_dim(dim, t.dim(), "split");
  int64_t n = t.size(d);
  KILN_CHECK(split_size > 0 || n == 0, "[split] split_size can only be 0 if dimension size is 0");
  std::vector<Tensor> out;
  if (n == 0) return {t};
  for (int64_t s = 0; s < n; s += split_size)
    out.push_back(op_slice(t, d, s, std::min(n, s + split_size), 1));
  return out;
}
std::vector<Tensor> split(const Tensor& t, IntArrayRef sizes, int64_t dim) {
  KILN_CHECK(t.defined() && t.dim() > 0, "[split] expects at least a 1-dimensional tensor");
  int64_t d = wrap_dim(dim, t.dim(), "split");
  int64_t total = 0;
  for (int64_t s : sizes) {
    KILN_CHECK(s >= 0, "[split] split sizes must be non-negative, got [{}]",
               fmt::join(sizes, ", "));
    total += s;
  }
  KILN_CHECK(total == t.size(d), "[split] split sizes [{}] sum to {} but dimension {} has size {}",
             fmt::join(sizes, ", "), total, d, t.size(d));
  std::vector<Tensor> out;
  int64_t start = 0;
  for (int64_t s : sizes) {
    out.push_back(op_slice(t, d, start, start + s, 1));
    start += s;
  }
  return out;
}
std::vector<Tensor> chunk(const Tensor& t, int64_t chunks, int64_t dim) {
  KILN_CHECK(chunks > 0, "[chunk] number of chunks must be greater than 0, got {}", chunks);
  KILN_CHECK(t.defined() && t.dim() > 0, "[chunk] expects at least a 1-dimensional tensor");
  int64_t n = t.size(wrap_dim(dim, t.dim(), "chunk"));
  int64_t size = (n + chunks - 1) / chunks;
  return split(t, std::max<int64_t>(size, n == 0 ? 0 : 1), dim);
}

}  // namespace kiln

// Meta functions of reductions, matmul, normalisation, indexing and the other structured ops,
// and their kernels on the meta device.
#include "kiln/ops/index_meta.h"
#include "kiln/ops/meta.h"
#include "kiln/ops/norm_meta.h"
#include "kiln/ops/structured.h"

namespace kiln::meta {

namespace {
TensorSpec reduction(const char* op, const Tensor& self, IntArrayRef dims, bool keepdim,
                     DType dtype) {
  check_defined(op, self, "self");
  auto mask = reduce_mask(op, self, dims);
  return {reduced_shape(self.sizes(), mask, keepdim), dtype, self.device()};
}
// amax, argmax and friends have no identity: reducing an empty dim is an error.
void check_nonempty_reduction(const char* op, const Tensor& self, IntArrayRef dims) {
  if (self.numel() != 0) return;
  auto mask = reduce_mask(op, self, dims);
  for (int64_t i = 0; i < self.dim(); ++i)
    KILN_CHECK_INDEX(!(mask[i] && self.sizes()[i] == 0),
                     "[{}] cannot reduce over dim {} of size 0 (the op has no identity)", op, i);
  KILN_CHECK_INDEX(self.dim() > 0, "[{}] cannot reduce an empty tensor", op);
}
void check_float(const char* op, DType t, const char* what = "input") {
  KILN_CHECK_TYPE(is_floating(t), "[{}] expected a floating-point {}, got {}", op, what, t);
}
void check_index_dtype(const char* op, const Tensor& index, const char* arg) {
  KILN_CHECK_TYPE(index.dtype() == kInt64 || index.dtype() == kInt32,
                  "[{}] {} must be an int64 or int32 tensor, got {}", op, arg, index.dtype());
}
void check_same_device(const char* op, std::initializer_list<const Tensor*> ts) {
  (void)common_device(op, ts);
}
}  // namespace

TensorSpec sum(const Tensor& self, IntArrayRef dims, bool keepdim, const OptDType& dtype) {
  check_defined("sum", self, "self");
  DType t = dtype ? *dtype : is_floating(self.dtype()) ? self.dtype() : kInt64;
  return reduction("sum", self, dims, keepdim, t);
}
TensorSpec mean(const Tensor& self, IntArrayRef dims, bool keepdim, const OptDType& dtype) {
  check_defined("mean", self, "self");
  DType t = dtype ? *dtype : self.dtype();
  KILN_CHECK_TYPE(is_floating(t),
                  "[mean] could not infer the output dtype: the input dtype must be floating "
                  "point, got {}; pass dtype= or convert the input",
                  t);
  return reduction("mean", self, dims, keepdim, t);
}
TensorSpec var(const Tensor& self, IntArrayRef dims, int64_t correction, bool keepdim) {
  check_defined("var", self, "self");
  check_float("var", self.dtype());
  KILN_CHECK(correction >= 0, "[var] correction must be non-negative, got {}", correction);
  return reduction("var", self, dims, keepdim, self.dtype());
}
TensorSpec amax(const Tensor& self, IntArrayRef dims, bool keepdim) {
  check_defined("amax", self, "self");
  check_nonempty_reduction("amax", self, dims);
  return reduction("amax", self, dims, keepdim, self.dtype());
}
TensorSpec amin(const Tensor& self, IntArrayRef dims, bool keepdim) {
  check_defined("amin", self, "self");
  check_nonempty_reduction("amin", self, dims);
  return reduction("amin", self, dims, keepdim, self.dtype());
}
// uint8 in, uint8 out: PyTorch keeps this legacy rule for all/any.
TensorSpec all(const Tensor& self, IntArrayRef dims, bool keepdim) {
  check_defined("all", self, "self");
  return reduction("all", self, dims, keepdim, self.dtype() == kUInt8 ? kUInt8 : kBool);
}
TensorSpec any(const Tensor& self, IntArrayRef dims, bool keepdim) {
  check_defined("any", self, "self");
  return reduction("any", self, dims, keepdim, self.dtype() == kUInt8 ? kUInt8 : kBool);
}
namespace {
TensorSpec arg_reduction(const char* op, const Tensor& self, const OptInt& dim, bool keepdim) {
  check_defined(op, self, "self");
  KILN_CHECK_TYPE(self.dtype() != kBool, "[{}] not supported on bool tensors", op);
  if (!dim) {
    KILN_CHECK_INDEX(self.numel() > 0, "[{}] cannot take the {} of an empty tensor", op, op);
    return {keepdim ? Shape(static_cast<size_t>(self.dim()), 1) : Shape(), kInt64, self.device()};
  }
  int64_t d = *dim;
  check_nonempty_reduction(op, self, IntArrayRef(&d, 1));
  return reduction(op, self, IntArrayRef(&d, 1), keepdim, kInt64);
}
}  // namespace
TensorSpec argmax(const Tensor& self, const OptInt& dim, bool keepdim) {
  return arg_reduction("argmax", self, dim, keepdim);
}
TensorSpec argmin(const Tensor& self, const OptInt& dim, bool keepdim) {
  return arg_reduction("argmin", self, dim, keepdim);
}

TensorSpec softmax(const Tensor& self, int64_t dim) {
  check_defined("softmax", self, "self");
  check_float("softmax", self.dtype());
  wrap_dim(dim, self.dim(), "softmax");
  return {Shape(self.sizes()), self.dtype(), self.device()};
}
TensorSpec log_softmax(const Tensor& self, int64_t dim) {
  check_defined("log_softmax", self, "self");
  check_float("log_softmax", self.dtype());
  wrap_dim(dim, self.dim(), "log_softmax");
  return {Shape(self.sizes()), self.dtype(), self.device()};
}

namespace {
void check_matmul_dtypes(const char* op, const Tensor& a, const Tensor& b) {
  KILN_CHECK_TYPE(a.dtype() == b.dtype(),
                  "[{}] expected both operands to have the same dtype, "
                  "but got {} and {}",
                  op, a.dtype(), b.dtype());
  KILN_CHECK_TYPE(a.dtype() != kBool, "[{}] not supported for bool tensors", op);
}
}  // namespace

TensorSpec mm(const Tensor& a, const Tensor& b) {
  check_defined("mm", a, "self");
  check_defined("mm", b, "mat2");
  KILN_CHECK(a.dim() == 2 && b.dim() == 2, "[mm] expected 2-D tensors, got {}-D and {}-D", a.dim(),
             b.dim());
  KILN_CHECK(a.size(1) == b.size(0),
             "[mm] size mismatch: a is [{}], b is [{}] (a.size(1) must equal b.size(0))",
             fmt::join(a.sizes(), ", "), fmt::join(b.sizes(), ", "));
  check_matmul_dtypes("mm", a, b);
  return {Shape{a.size(0), b.size(1)}, a.dtype(), common_device("mm", {&a, &b})};
}
TensorSpec bmm(const Tensor& a, const Tensor& b) {
  check_defined("bmm", a, "self");
  check_defined("bmm", b, "mat2");
  KILN_CHECK(a.dim() == 3 && b.dim() == 3, "[bmm] expected 3-D tensors, got {}-D and {}-D", a.dim(),
             b.dim());
  KILN_CHECK(a.size(0) == b.size(0) && a.size(2) == b.size(1),
             "[bmm] size mismatch: a is [{}], b is [{}] (expected [B, n, m] and [B, m, p])",
             fmt::join(a.sizes(), ", "), fmt::join(b.sizes(), ", "));
  check_matmul_dtypes("bmm", a, b);
  return {Shape{a.size(0), a.size(1), b.size(2)}, a.dtype(), common_device("bmm", {&a, &b})};
}
TensorSpec addmm(const Tensor& self, const Tensor& a, const Tensor& b, const Scalar& beta,
                 const Scalar& alpha) {
  TensorSpec s = mm(a, b);
  check_defined("addmm", self, "self");
  KILN_CHECK_TYPE(self.dtype() == a.dtype(), "[addmm] self has dtype {} but the matrices have {}",
                  self.dtype(), a.dtype());
  check_broadcasts_to("addmm", "self", self.sizes(), s.sizes);
  KILN_CHECK_TYPE(is_floating(s.dtype) || (!alpha.is_floating() && !beta.is_floating()),
                  "[addmm] alpha and beta must be integers for integer matrices");
  s.device = common_device("addmm", {&self, &a, &b});
  return s;
}

namespace {
void check_norm_args(const char* op, const Tensor& x, IntArrayRef shape, const Tensor& w,
                     const Tensor* b) {
  check_defined(op, x, "input");
  check_float(op, x.dtype());
  int64_t k = static_cast<int64_t>(shape.size());
  KILN_CHECK(k >= 1, "[{}] normalized_shape must have at least one dimension", op);
  bool ok = x.dim() >= k && std::ranges::equal(x.sizes().subspan(x.dim() - k), shape);
  KILN_CHECK(ok, "[{}] input of shape [{}] does not end with normalized_shape [{}]", op,
             fmt::join(x.sizes(), ", "), fmt::join(shape, ", "));
  for (const Tensor* p : {&w, b}) {
    if (!p || !p->defined()) continue;
    KILN_CHECK(std::ranges::equal(p->sizes(), shape),
               "[{}] weight/bias of shape [{}] must equal normalized_shape [{}]", op,
               fmt::join(p->sizes(), ", "), fmt::join(shape, ", "));
    KILN_CHECK_TYPE(p->dtype() == x.dtype(), "[{}] weight/bias dtype {} differs from input {}", op,
                    p->dtype(), x.dtype());
  }
  check_same_device(op, {&x, &w, b});
}
}  // namespace
TensorSpec layer_norm(const Tensor& x, IntArrayRef shape, const Tensor& w, const Tensor& b,
                      double eps) {
  check_norm_args("layer_norm", x, shape, w, &b);
  KILN_CHECK(eps >= 0, "[layer_norm] eps must be non-negative, got {}", eps);
  return {Shape(x.sizes()), x.dtype(), x.device()};
}
void check_layer_norm_backward(const char* op, const Tensor& grad, const Tensor& x,
                               IntArrayRef shape, const Tensor& w, double eps) {
  check_norm_args(op, x, shape, w, nullptr);
  KILN_CHECK(eps >= 0, "[{}] eps must be non-negative, got {}", op, eps);
  check_defined(op, grad, "grad_output");
  KILN_CHECK_TYPE(grad.dtype() == x.dtype(), "[{}] grad_output dtype {} differs from input {}", op,
                  grad.dtype(), x.dtype());
  KILN_CHECK(grad.sizes() == x.sizes(), "[{}] grad_output has shape [{}], but input has shape [{}]",
             op, fmt::join(grad.sizes(), ", "), fmt::join(x.sizes(), ", "));
  check_same_device(op, {&grad, &x});
}
TensorSpec layer_norm_backward(const Tensor& grad, const Tensor& x, IntArrayRef shape,
                               const Tensor& w, double eps) {
  check_layer_norm_backward("layer_norm_backward", grad, x, shape, w, eps);
  return {Shape(x.sizes()), x.dtype(), x.device()};
}
TensorSpec rms_norm(const Tensor& x, IntArrayRef shape, const Tensor& w, double eps) {
  check_norm_args("rms_norm", x, shape, w, nullptr);
  KILN_CHECK(eps >= 0, "[rms_norm] eps must be non-negative, got {}", eps);
  return {Shape(x.sizes()), x.dtype(), x.device()};
}

// embedding and embedding_dense_backward: kiln/ops/embedding_meta.cpp.

TensorSpec nll_loss(const Tensor& self, const Tensor& target, int64_t) {
  check_defined("nll_loss", self, "self");
  check_defined("nll_loss", target, "target");
  check_float("nll_loss", self.dtype());
  KILN_CHECK(self.dim() == 1 || self.dim() == 2,
             "[nll_loss] expected input of shape [N, C] or [C], got [{}]",
             fmt::join(self.sizes(), ", "));
  KILN_CHECK_TYPE(target.dtype() == kInt64, "[nll_loss] target must be int64, got {}",
                  target.dtype());
  int64_t n = self.dim() == 2 ? self.size(0) : 1;
  bool shape_ok = self.dim() == 2 ? (target.dim() == 1 && target.size(0) == n) : target.dim() == 0;
  KILN_CHECK(shape_ok, "[nll_loss] input [{}] and target [{}] do not match (expected target [N])",
             fmt::join(self.sizes(), ", "), fmt::join(target.sizes(), ", "));
  return {Shape(), self.dtype(), common_device("nll_loss", {&self, &target})};
}

TensorSpec cat(const TensorList& ts, int64_t dim) {
  KILN_CHECK(!ts.empty(), "[cat] expected a non-empty list of tensors");
  const Tensor* ref = nullptr;
  for (const auto& t : ts) {
    check_defined("cat", t, "tensors");
    // Legacy rule kept by PyTorch: 1-D empty tensors are skipped.
    if (!(t.dim() == 1 && t.numel() == 0) && !ref) ref = &t;
  }
  std::vector<const Tensor*> ptrs;
  DType dtype = ts[0].dtype();
  for (const auto& t : ts) dtype = promote_types(dtype, t.dtype());
  Device dev = ts[0].device();
  for (size_t i = 0; i < ts.size(); ++i)
    KILN_CHECK_DEVICE(ts[i].device() == dev,
                      "[cat] expected all tensors to be on the same device, but tensor 0 is on {} "
                      "and tensor {} is on {}",
                      dev, i, ts[i].device());
  if (!ref) return {Shape{0}, dtype, dev};
  int64_t d = wrap_dim(dim, ref->dim(), "cat");
  KILN_CHECK(ref->dim() > 0, "[cat] zero-dimensional tensor cannot be concatenated");
  Shape out(ref->sizes());
  out[d] = 0;
  for (size_t i = 0; i < ts.size(); ++i) {
    const Tensor& t = ts[i];
    if (t.dim() == 1 && t.numel() == 0) continue;
    KILN_CHECK(t.dim() == ref->dim(),
               "[cat] tensors must have the same number of dimensions: got {} and {} (tensor {})",
               ref->dim(), t.dim(), i);
    for (int64_t j = 0; j < t.dim(); ++j)
      KILN_CHECK(j == d || t.sizes()[j] == ref->sizes()[j],
                 "[cat] sizes of tensors must match except in dimension {}: expected size {} but "
                 "got size {} for tensor {} at dim {}",
                 d, ref->sizes()[j], t.sizes()[j], i, j);
    out[d] += t.sizes()[d];
  }
  return {out, dtype, dev};
}

TensorSpec index_select(const Tensor& self, int64_t dim, const Tensor& index) {
  check_defined("index_select", self, "self");
  check_defined("index_select", index, "index");
  check_index_dtype("index_select", index, "index");
  KILN_CHECK(index.dim() <= 1, "[index_select] index must be 0-D or 1-D, got shape [{}]",
             fmt::join(index.sizes(), ", "));
  int64_t d = wrap_dim(dim, self.dim(), "index_select");
  KILN_CHECK_INDEX(self.dim() > 0 || index.numel() == 1,
                   "[index_select] a 0-d self takes exactly one index, got {}", index.numel());
  Shape out(self.sizes());
  if (self.dim() > 0) out[d] = index.numel();
  return {out, self.dtype(), common_device("index_select", {&self, &index})};
}

TensorSpec gather(const Tensor& self, int64_t dim, const Tensor& index) {
  check_defined("gather", self, "self");
  check_defined("gather", index, "index");
  KILN_CHECK_TYPE(index.dtype() == kInt64, "[gather] index must be int64, got {}", index.dtype());
  int64_t d = wrap_dim(dim, self.dim(), "gather");
  KILN_CHECK(std::max<int64_t>(index.dim(), 1) == std::max<int64_t>(self.dim(), 1),
             "[gather] index and self must have the same number of dimensions, got {} and {}",
             index.dim(), self.dim());
  for (int64_t i = 0; i < index.dim(); ++i)
    KILN_CHECK(i == d || index.sizes()[i] <= self.sizes()[i],
               "[gather] index size {} exceeds self size {} at dim {} (only dim {} may be larger)",
               index.sizes()[i], self.sizes()[i], i, d);
  return {Shape(index.sizes()), self.dtype(), common_device("gather", {&self, &index})};
}

// scatter's checks (meta::check_scatter_args), then one rank to the letter: scatter_add's kernels
// take a 0-d self, index or src only with all three 0-d (ATen also takes a 0-d one among 1-d
// ones, as scatter does).
TensorSpec scatter_add(const Tensor& self, int64_t dim, const Tensor& index, const Tensor& src) {
  const Device device = check_scatter_args("scatter_add", self, dim, index, src);
  KILN_CHECK(index.dim() == self.dim() && src.dim() == self.dim(),
             "[scatter_add] index, src and self must have the same number of dimensions, got {}, "
             "{} and {}",
             index.dim(), src.dim(), self.dim());
  return {Shape(self.sizes()), self.dtype(), device};
}

TensorSpec index_add(const Tensor& self, int64_t dim, const Tensor& index, const Tensor& source,
                     const Scalar& alpha) {
  check_defined("index_add", self, "self");
  check_defined("index_add", index, "index");
  check_defined("index_add", source, "source");
  check_index_dtype("index_add", index, "index");
  KILN_CHECK(index.dim() <= 1, "[index_add] index must be 0-D or 1-D, got shape [{}]",
             fmt::join(index.sizes(), ", "));
  KILN_CHECK_TYPE(source.dtype() == self.dtype(),
                  "[index_add] source dtype {} differs from self {}", source.dtype(), self.dtype());
  int64_t d = wrap_dim(dim, self.dim(), "index_add");
  Shape expected(self.sizes());
  if (self.dim() > 0) expected[d] = index.numel();
  bool ok = self.dim() == 0 ? source.numel() == index.numel()
                            : std::ranges::equal(source.sizes(), expected);
  KILN_CHECK(ok, "[index_add] source of shape [{}] does not match the expected shape [{}]",
             fmt::join(source.sizes(), ", "), fmt::join(expected, ", "));
  KILN_CHECK_TYPE(is_floating(self.dtype()) || !alpha.is_floating(),
                  "[index_add] alpha must be an integer for integer tensors");
  return {Shape(self.sizes()), self.dtype(), common_device("index_add", {&self, &index, &source})};
}

TensorSpec triu(const Tensor& self, int64_t) {
  check_defined("triu", self, "self");
  KILN_CHECK(self.dim() >= 2, "[triu] input must have at least 2 dimensions, got {}", self.dim());
  return {Shape(self.sizes()), self.dtype(), self.device()};
}
TensorSpec tril(const Tensor& self, int64_t) {
  check_defined("tril", self, "self");
  KILN_CHECK(self.dim() >= 2, "[tril] input must have at least 2 dimensions, got {}", self.dim());
  return {Shape(self.sizes()), self.dtype(), self.device()};
}
namespace {
// A pointwise backward op's operands: grad_output and self (or the result), floating, of one
// dtype, one shape and one device.
TensorSpec pointwise_backward(const char* op, const Tensor& grad, const Tensor& self) {
  check_defined(op, grad, "grad_output");
  check_defined(op, self, "self");
  KILN_CHECK_TYPE(is_floating(self.dtype()) && grad.dtype() == self.dtype(),
                  "[{}] expected floating-point grad_output and self of one dtype, got {} and {}",
                  op, name(grad.dtype()), name(self.dtype()));
  KILN_CHECK(grad.sizes() == self.sizes(),
             "[{}] grad_output has shape [{}], but self has shape [{}]", op,
             fmt::join(grad.sizes(), ", "), fmt::join(self.sizes(), ", "));
  return {Shape(self.sizes()), self.dtype(), common_device(op, {&grad, &self})};
}
}  // namespace
TensorSpec gelu_backward(const Tensor& grad, const Tensor& self, bool) {
  return pointwise_backward("gelu_backward", grad, self);
}
TensorSpec threshold_backward(const Tensor& grad, const Tensor& self, const Scalar&) {
  return pointwise_backward("threshold_backward", grad, self);
}

TensorSpec one_hot(const Tensor& self, int64_t num_classes) {
  check_defined("one_hot", self, "self");
  KILN_CHECK_TYPE(self.dtype() == kInt64, "[one_hot] input must be int64, got {}", self.dtype());
  KILN_CHECK(num_classes >= 1,
             "[one_hot] num_classes must be positive, got {} (kiln::one_hot infers it when you "
             "pass -1)",
             num_classes);
  Shape out(self.sizes());
  out.push_back(num_classes);
  return {out, kInt64, self.device()};
}

}  // namespace kiln::meta

namespace kiln::detail {
namespace {
#define KILN_REGISTER_META_STRUCTURED(name, ARGS, schema)                                     \
  ops::op_##name.def.set_meta_raw(reinterpret_cast<void*>(&meta::name));                      \
  ops::op_##name##_out.def.set_meta_raw(reinterpret_cast<void*>(&meta::name));                \
  {                                                                                           \
    using S = Structured<decltype(ops::op_##name)::Sig>;                                      \
    ops::op_##name.set_kernel(DispatchKey::Meta, &S::functional<&meta::name, &S::no_data>);   \
    ops::op_##name##_out.set_kernel(DispatchKey::Meta,                                        \
                                    &S::out<ops::op_##name##_out, &meta::name, &S::no_data>); \
  }
const bool registered = [] {
  KILN_FORALL_STRUCTURED(KILN_REGISTER_META_STRUCTURED)
  return true;
}();
}  // namespace
}  // namespace kiln::detail

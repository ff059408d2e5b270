// Meta functions and meta-device kernels of factories, copies, multi-output ops and foreach.
#include "kiln/ops/other_meta.h"

#include <cmath>

#include "kiln/ops/amp_meta.h"

#include "kiln/ops/structured.h"

namespace kiln {

namespace detail {
Tensor empty_tensor(IntArrayRef sizes, DType dtype, Device device) {
  size_t nbytes = static_cast<size_t>(checked_numel(sizes, "empty")) * itemsize(dtype);
  Allocator* alloc;
  if (device.is_cpu()) {
    alloc = cpu_allocator();
  } else {
    DeviceInterface* iface = device_interface(device.type());
    KILN_CHECK_DEVICE(iface != nullptr,
                      "[empty] no backend is loaded for device {} (kiln::load_backend(\"{}\") "
                      "loads it)",
                      device, device_type_name(device.type()));
    alloc = iface->allocator(device.index());
  }
  auto storage = make_ref<StorageImpl>(nbytes, device, alloc);
  return Tensor(
      make_ref<TensorImpl>(std::move(storage), dtype, sizes, contiguous_strides(sizes), 0));
}
}  // namespace detail

namespace meta {

void factory(const char* op, IntArrayRef sizes, DType) { checked_numel(sizes, op); }

int64_t arange_length(const Scalar& start, const Scalar& end, const Scalar& step) {
  double s = start.to_double(), e = end.to_double(), st = step.to_double();
  KILN_CHECK(st != 0, "[arange] step must be nonzero");
  KILN_CHECK(std::isfinite(s) && std::isfinite(e), "[arange] unsupported range: {} -> {}", s, e);
  KILN_CHECK((st > 0 && e >= s) || (st < 0 && e <= s),
             "[arange] upper bound and larger bound inconsistent with step sign: start {}, end "
             "{}, step {}",
             start, end, step);
  if (start.is_floating() || end.is_floating() || step.is_floating()) {
    double n = std::ceil((e - s) / st);
    KILN_CHECK(n < 9.2e18,
               "[arange] invalid size {} (start {}, end {}, step {}): too many elements", n, start,
               end, step);
    return static_cast<int64_t>(n);
  }
  // Exact integer length, computed in 128 bits so no bound can overflow it.
  __int128 si = start.to_int(), ei = end.to_int(), sti = step.to_int();
  __int128 n = sti > 0 ? (ei - si + sti - 1) / sti : (si - ei - sti - 1) / -sti;
  KILN_CHECK(n <= INT64_MAX, "[arange] invalid size (start {}, end {}, step {}): too many elements",
             start, end, step);
  return static_cast<int64_t>(n);
}
void arange(const Scalar& start, const Scalar& end, const Scalar& step, DType dtype) {
  (void)arange_length(start, end, step);
  KILN_CHECK_TYPE(dtype != kBool, "[arange] bool dtype is not supported");
}
void linspace(const Scalar&, const Scalar&, int64_t steps, DType dtype) {
  KILN_CHECK(steps >= 0, "[linspace] number of steps must be non-negative, got {}", steps);
  KILN_CHECK_TYPE(dtype != kBool, "[linspace] bool dtype is not supported");
}
void randint(int64_t low, int64_t high, IntArrayRef sizes, DType dtype) {
  factory("randint", sizes, dtype);
  KILN_CHECK(low < high, "[randint] expected low < high, but got low={} and high={}", low, high);
  (void)dtype;  // every dtype holds some range; values are cast like PyTorch's
}

void copy_(const Tensor& self, const Tensor& src) {
  check_defined("copy_", self, "self");
  check_defined("copy_", src, "src");
  check_broadcasts_to("copy_", "src", src.sizes(), self.sizes());
  KILN_CHECK_DEVICE(!src.device().is_meta() || self.device().is_meta(),
                    "[copy_] cannot copy data out of a meta tensor into a tensor on {}",
                    self.device());
  TensorSpec spec{Shape(self.sizes()), self.dtype(), self.device()};
  check_inplace("copy_", self, spec, {&src});
}
void check_fits(const char* op, const Scalar& v, DType t) {
  if (t == kBool) return;  // any number converts to bool (nonzero is true)
  double d = v.to_double();
  if (!std::isfinite(d)) {
    KILN_CHECK_TYPE(is_floating(t), "[{}] value {} cannot be converted to {}", op, v, t);
    return;
  }
  double lo = 0, hi = 0;
  switch (t) {
    case kUInt8:
      lo = 0, hi = 255;
      break;
    case kInt32:
      lo = -2147483648.0, hi = 2147483647.0;
      break;
    case kInt64:
      lo = -9223372036854775808.0, hi = 9223372036854775807.0;
      break;
    case kFloat16:
      lo = -65504.0, hi = 65504.0;
      break;
    case kBFloat16:
    case kFloat32:
      lo = -3.4028234663852886e38, hi = 3.4028234663852886e38;
      break;
    default:
      return;  // float64 holds every finite double
  }
  // Integer bounds are exclusive above: hi + 1 is exact in double for every integer type here.
  bool ok = v.is_integral() && t == kInt64 ? true
                                           : (d >= lo && (is_floating(t) ? d <= hi : d < hi + 1.0));
  KILN_CHECK_TYPE(ok, "[{}] value {} cannot be converted to {} without overflow", op, v, t);
}

void fill_(const Tensor& self, const Scalar& value) {
  check_defined("fill_", self, "self");
  check_fits("fill_", value, self.dtype());
  KILN_CHECK_TYPE(is_floating(self.dtype()) || !value.is_floating() ||
                      value.to_double() == std::trunc(value.to_double()) || self.dtype() == kBool,
                  "[fill_] value {} cannot be converted to {} without overflow or truncation",
                  value, self.dtype());
  check_inplace("fill_", self, {Shape(self.sizes()), self.dtype(), self.device()}, {});
}
TensorSpec to_copy(const Tensor& self, DType dtype, Device device) {
  check_defined("to", self, "self");
  KILN_CHECK_DEVICE(!self.device().is_meta() || device.is_meta(),
                    "[to] cannot copy data out of a meta tensor to {}", device);
  return {Shape(self.sizes()), dtype, device};
}
namespace {
TensorSpec minmax_dim(const char* op, const Tensor& self, int64_t dim, bool keepdim) {
  check_defined(op, self, "self");
  KILN_CHECK_TYPE(self.dtype() != kBool, "[{}] not supported on bool tensors", op);
  int64_t d = wrap_dim(dim, self.dim(), op);
  if (self.dim() > 0)
    KILN_CHECK_INDEX(self.sizes()[d] > 0,
                     "[{}] cannot reduce over dim {} of size 0 (the op has no identity)", op, d);
  auto mask = reduce_mask(op, self, IntArrayRef(&dim, 1));
  return {reduced_shape(self.sizes(), mask, keepdim), self.dtype(), self.device()};
}
}  // namespace
TensorSpec max_dim(const Tensor& self, int64_t dim, bool keepdim) {
  return minmax_dim("max", self, dim, keepdim);
}
TensorSpec min_dim(const Tensor& self, int64_t dim, bool keepdim) {
  return minmax_dim("min", self, dim, keepdim);
}
TensorSpec native_dropout(const Tensor& input, double p, Generator*) {
  check_defined("dropout", input, "input");
  KILN_CHECK(p >= 0 && p <= 1, "[dropout] probability has to be between 0 and 1, but got {}", p);
  KILN_CHECK_TYPE(is_floating(input.dtype()), "[dropout] expected a floating-point input, got {}",
                  input.dtype());
  return {Shape(input.sizes()), input.dtype(), input.device()};
}

TensorSpec flash_attention(const Tensor& q, const Tensor& k, const Tensor& v, bool, double scale) {
  const char* op = "flash_attention";
  check_defined(op, q, "query");
  check_defined(op, k, "key");
  check_defined(op, v, "value");
  KILN_CHECK(q.dim() >= 2 && k.dim() == q.dim() && v.dim() == q.dim(),
             "[{}] query, key and value need one rank >= 2 ([..., L, E]), got {}, {} and {} dims",
             op, q.dim(), k.dim(), v.dim());
  KILN_CHECK_TYPE(is_floating(q.dtype()) && k.dtype() == q.dtype() && v.dtype() == q.dtype(),
                  "[{}] query, key and value need one floating dtype, got {}, {} and {}", op,
                  q.dtype(), k.dtype(), v.dtype());
  Device dev = common_device(op, {&q, &k, &v});
  KILN_CHECK_DEVICE(k.device() == dev && v.device() == dev && q.device() == dev,
                    "[{}] query, key and value must be on one device, got {}, {} and {}", op,
                    q.device(), k.device(), v.device());
  int64_t n = q.dim();
  for (int64_t d = 0; d < n - 2; ++d)
    KILN_CHECK(k.size(d) == q.size(d) && v.size(d) == q.size(d),
               "[{}] query, key and value need the same leading dims, got {}, {} and {}", op,
               q.sizes(), k.sizes(), v.sizes());
  KILN_CHECK(k.size(-2) == v.size(-2),
             "[{}] key and value must have the same length, got {} and {}", op, k.size(-2),
             v.size(-2));
  KILN_CHECK(k.size(-1) == q.size(-1) && v.size(-1) == q.size(-1),
             "[{}] query, key and value need one embedding size, got {}, {} and {}", op, q.size(-1),
             k.size(-1), v.size(-1));
  KILN_CHECK(q.size(-2) >= 1 && k.size(-2) >= 1 && q.size(-1) >= 1,
             "[{}] needs at least one query, one key and an embedding size >= 1, got query {} "
             "and key {}",
             op, q.sizes(), k.sizes());
  KILN_CHECK(std::isfinite(scale), "[{}] scale must be finite, got {}", op, scale);
  return {Shape(q.sizes()), q.dtype(), dev};
}
TensorSpec addmm_gelu(const Tensor& bias, const Tensor& mat1, const Tensor& mat2) {
  const char* op = "addmm_gelu";
  check_defined(op, mat1, "mat1");
  check_defined(op, mat2, "mat2");
  KILN_CHECK(mat1.dim() == 2 && mat2.dim() == 2, "[{}] mat1 and mat2 must be 2-D, got {} and {}",
             op, mat1.sizes(), mat2.sizes());
  KILN_CHECK(mat1.size(1) == mat2.size(0),
             "[{}] mat1 {} and mat2 {} cannot be multiplied ({} != {})", op, mat1.sizes(),
             mat2.sizes(), mat1.size(1), mat2.size(0));
  KILN_CHECK_TYPE(is_floating(mat1.dtype()) && mat2.dtype() == mat1.dtype(),
                  "[{}] mat1 and mat2 need one floating dtype, got {} and {}", op, mat1.dtype(),
                  mat2.dtype());
  Device dev =
      bias.defined() ? common_device(op, {&bias, &mat1, &mat2}) : common_device(op, {&mat1, &mat2});
  KILN_CHECK_DEVICE(mat1.device() == dev && mat2.device() == dev,
                    "[{}] mat1 and mat2 must be on one device, got {} and {}", op, mat1.device(),
                    mat2.device());
  if (bias.defined()) {
    KILN_CHECK(bias.dim() == 1 && bias.size(0) == mat2.size(1),
               "[{}] bias must be a vector of mat2's {} columns, got {}", op, mat2.size(1),
               bias.sizes());
    KILN_CHECK_TYPE(bias.dtype() == mat1.dtype(), "[{}] bias must be {} like mat1, got {}", op,
                    mat1.dtype(), bias.dtype());
    KILN_CHECK_DEVICE(bias.device() == dev, "[{}] bias is on {}, mat1 on {}", op, bias.device(),
                      dev);
  }
  return {Shape{mat1.size(0), mat2.size(1)}, mat1.dtype(), dev};
}
DType attention_stats_dtype(DType input) { return input == kFloat64 ? kFloat64 : kFloat32; }
TensorSpec flash_attention_backward(const Tensor& grad_out, const Tensor& q, const Tensor& k,
                                    const Tensor& v, const Tensor& out, const Tensor& lse,
                                    bool is_causal, double scale) {
  const char* op = "flash_attention_backward";
  TensorSpec s = flash_attention(q, k, v, is_causal, scale);
  check_defined(op, grad_out, "grad_out");
  check_defined(op, out, "out");
  check_defined(op, lse, "logsumexp");
  for (const Tensor* t : {&grad_out, &out}) {
    KILN_CHECK(t->sizes() == q.sizes(), "[{}] grad_out and out must have query's shape {}, got {}",
               op, q.sizes(), t->sizes());
    KILN_CHECK_TYPE(t->dtype() == q.dtype(), "[{}] grad_out and out must be {} like query, got {}",
                    op, q.dtype(), t->dtype());
  }
  IntArrayRef rows = attention_stats_sizes(q);
  KILN_CHECK(lse.sizes() == rows, "[{}] logsumexp must have shape {}, got {}", op, rows,
             lse.sizes());
  KILN_CHECK_TYPE(lse.dtype() == attention_stats_dtype(q.dtype()),
                  "[{}] logsumexp must be {}, got {}", op, attention_stats_dtype(q.dtype()),
                  lse.dtype());
  for (const Tensor* t : {&grad_out, &out, &lse})
    KILN_CHECK_DEVICE(t->device() == s.device, "[{}] every tensor must be on {}, got {}", op,
                      s.device, t->device());
  return s;
}

void foreach_lists(const char* op, std::initializer_list<const TensorList*> lists) {
  const TensorList& self = **lists.begin();
  size_t li = 0;
  for (const TensorList* l : lists) {
    KILN_CHECK(l->size() == self.size(),
               "[{}] tensor lists must have the same length, got {} and {} (list {})", op,
               self.size(), l->size(), li);
    for (size_t i = 0; i < self.size(); ++i) {
      check_defined(op, (*l)[i], "tensors");
      KILN_CHECK(std::ranges::equal((*l)[i].sizes(), self[i].sizes()),
                 "[{}] tensor {} of list {} has shape [{}] but self[{}] has shape [{}]", op, i, li,
                 fmt::join((*l)[i].sizes(), ", "), i, fmt::join(self[i].sizes(), ", "));
      KILN_CHECK_DEVICE((*l)[i].device() == self[i].device(),
                        "[{}] tensor {} of list {} is on {} but self[{}] is on {}", op, i, li,
                        (*l)[i].device(), i, self[i].device());
      KILN_CHECK_TYPE(can_cast((*l)[i].dtype(), self[i].dtype()),
                      "[{}] tensor {} of list {} has dtype {} which can't be cast to {}", op, i, li,
                      (*l)[i].dtype(), self[i].dtype());
    }
    ++li;
  }
}
void foreach_scalar(const char* op, const TensorList& self, const Scalar& s) {
  for (size_t i = 0; i < self.size(); ++i) {
    DType t = self[i].dtype();
    KILN_CHECK_TYPE(is_floating(t) || !s.is_floating(),
                    "[{}] result type float can't be cast to tensor {}'s dtype {} (scalar {})", op,
                    i, t, s);
    KILN_CHECK_TYPE(t == kBool || !s.is_bool(),
                    "[{}] a bool scalar needs bool tensors; tensor {} is {}", op, i, t);
  }
}

void foreach_adamw(const char* op, const TensorList& p, const TensorList& g, const TensorList& m,
                   const TensorList& v, const TensorList& steps, const Tensor& lr, double beta1,
                   double beta2, double eps, double wd, const Tensor& found_inf) {
  foreach_lists(op, {&p, &g, &m, &v});
  foreach_float(op, p);
  KILN_CHECK(eps >= 0 && wd >= 0, "[{}] eps and weight_decay must be >= 0, got {} and {}", op, eps,
             wd);
  KILN_CHECK(beta1 >= 0 && beta1 < 1 && beta2 >= 0 && beta2 < 1,
             "[{}] betas must be in [0, 1), got {} and {}", op, beta1, beta2);
  KILN_CHECK(steps.size() == p.size(), "[{}] got {} step tensors for {} parameters", op,
             steps.size(), p.size());
  check_defined(op, lr, "lr");
  KILN_CHECK_TYPE(lr.dim() == 0 && lr.dtype() == kFloat64,
                  "[{}] lr must be a 0-d float64 tensor, got [{}] {}", op,
                  fmt::join(lr.sizes(), ", "), name(lr.dtype()));
  if (found_inf.defined()) check_found_inf(op, found_inf, lr.device());
  for (size_t i = 0; i < p.size(); ++i) {
    check_defined(op, steps[i], "steps");
    KILN_CHECK_TYPE(steps[i].dim() == 0 && steps[i].dtype() == kFloat64,
                    "[{}] steps[{}] must be a 0-d float64 tensor, got [{}] {}", op, i,
                    fmt::join(steps[i].sizes(), ", "), name(steps[i].dtype()));
    KILN_CHECK_DEVICE(steps[i].device() == p[i].device() && lr.device() == p[i].device(),
                      "[{}] steps[{}] is on {} and lr on {}, but self[{}] is on {}", op, i,
                      steps[i].device(), lr.device(), i, p[i].device());
  }
  const char* names[] = {"grads", "exp_avg", "exp_avg_sq"};
  const TensorList* lists[] = {&g, &m, &v};
  for (size_t i = 0; i < p.size(); ++i) {
    for (int l = 0; l < 3; ++l) {
      const Tensor& t = (*lists[l])[i];
      KILN_CHECK_TYPE(t.dtype() == p[i].dtype(), "[{}] {}[{}] is {}, but self[{}] is {}", op,
                      names[l], i, name(t.dtype()), i, name(p[i].dtype()));
    }
  }
}

void foreach_float(const char* op, const TensorList& self) {
  for (size_t i = 0; i < self.size(); ++i)
    KILN_CHECK_TYPE(is_floating(self[i].dtype()),
                    "[{}] expected floating-point tensors, tensor {} is {}", op, i,
                    self[i].dtype());
}

}  // namespace meta

// Kernels on the meta device: validate, then make shape-only tensors.
namespace {
using detail::empty_tensor;
Device meta_dev() { return Device(kMeta); }

Tensor meta_empty(IntArrayRef sizes, DType dtype, Device d) {
  meta::factory("empty", sizes, dtype);
  return empty_tensor(sizes, dtype, d);
}
Tensor meta_full(IntArrayRef sizes, const Scalar& v, DType dtype, Device d) {
  meta::factory("full", sizes, dtype);
  meta::check_fits("full", v, dtype);
  return empty_tensor(sizes, dtype, d);
}
Tensor meta_arange(const Scalar& a, const Scalar& b, const Scalar& s, DType dtype, Device d) {
  meta::arange(a, b, s, dtype);
  int64_t n = meta::arange_length(a, b, s);
  return empty_tensor(IntArrayRef(&n, 1), dtype, d);
}
Tensor meta_linspace(const Scalar& a, const Scalar& b, int64_t steps, DType dtype, Device d) {
  meta::linspace(a, b, steps, dtype);
  return empty_tensor(IntArrayRef(&steps, 1), dtype, d);
}
Tensor meta_rand(IntArrayRef sizes, Generator*, DType dtype, Device d) {
  meta::factory("rand", sizes, dtype);
  KILN_CHECK_TYPE(is_floating(dtype), "[rand] expected a floating-point dtype, got {}", dtype);
  return empty_tensor(sizes, dtype, d);
}
Tensor meta_randint(int64_t lo, int64_t hi, IntArrayRef sizes, Generator*, DType dtype, Device d) {
  meta::randint(lo, hi, sizes, dtype);
  return empty_tensor(sizes, dtype, d);
}
void meta_copy_(const Tensor& self, const Tensor& src) { meta::copy_(self, src); }
void meta_fill_(const Tensor& self, const Scalar& v) { meta::fill_(self, v); }
Tensor meta_to_copy(const Tensor& self, DType dtype, Device device) {
  TensorSpec s = meta::to_copy(self, dtype, device);
  return empty_tensor(s.sizes, s.dtype, s.device);
}
TensorPair meta_max_dim(const Tensor& self, int64_t dim, bool keepdim) {
  TensorSpec s = meta::max_dim(self, dim, keepdim);
  return {empty_tensor(s.sizes, s.dtype, meta_dev()), empty_tensor(s.sizes, kInt64, meta_dev())};
}
TensorPair meta_min_dim(const Tensor& self, int64_t dim, bool keepdim) {
  TensorSpec s = meta::min_dim(self, dim, keepdim);
  return {empty_tensor(s.sizes, s.dtype, meta_dev()), empty_tensor(s.sizes, kInt64, meta_dev())};
}
TensorPair meta_dropout(const Tensor& x, double p, Generator* g) {
  TensorSpec s = meta::native_dropout(x, p, g);
  return {empty_tensor(s.sizes, s.dtype, meta_dev()), empty_tensor(s.sizes, kBool, meta_dev())};
}
TensorPair meta_flash_attention(const Tensor& q, const Tensor& k, const Tensor& v, bool causal,
                                double scale) {
  TensorSpec s = meta::flash_attention(q, k, v, causal, scale);
  return {empty_tensor(s.sizes, s.dtype, meta_dev()),
          empty_tensor(meta::attention_stats_sizes(q), meta::attention_stats_dtype(s.dtype),
                       meta_dev())};
}
TensorTriple meta_flash_attention_backward(const Tensor& g, const Tensor& q, const Tensor& k,
                                           const Tensor& v, const Tensor& out, const Tensor& lse,
                                           bool causal, double scale) {
  TensorSpec s = meta::flash_attention_backward(g, q, k, v, out, lse, causal, scale);
  return {empty_tensor(s.sizes, s.dtype, meta_dev()), empty_tensor(k.sizes(), s.dtype, meta_dev()),
          empty_tensor(v.sizes(), s.dtype, meta_dev())};
}
TensorPair meta_addmm_gelu(const Tensor& bias, const Tensor& mat1, const Tensor& mat2) {
  TensorSpec s = meta::addmm_gelu(bias, mat1, mat2);
  return {empty_tensor(s.sizes, s.dtype, meta_dev()), empty_tensor(s.sizes, s.dtype, meta_dev())};
}
void meta_foreach_add_(const TensorList& a, const TensorList& b, const Scalar& s) {
  meta::foreach_lists("foreach_add_", {&a, &b});
  meta::foreach_scalar("foreach_add_", a, s);
}
void meta_foreach_mul_(const TensorList& a, const Scalar& s) {
  meta::foreach_lists("foreach_mul_", {&a});
  meta::foreach_scalar("foreach_mul_", a, s);
}
void meta_foreach_mul_list_(const TensorList& a, const TensorList& b) {
  meta::foreach_lists("foreach_mul_list_", {&a, &b});
}
void meta_foreach_lerp_(const TensorList& a, const TensorList& b, const Scalar&) {
  meta::foreach_lists("foreach_lerp_", {&a, &b});
  meta::foreach_float("foreach_lerp_", a);
}
void meta_foreach_addcmul_(const TensorList& a, const TensorList& b, const TensorList& c,
                           const Scalar& s) {
  meta::foreach_lists("foreach_addcmul_", {&a, &b, &c});
  meta::foreach_scalar("foreach_addcmul_", a, s);
}
void meta_foreach_addcdiv_(const TensorList& a, const TensorList& b, const TensorList& c,
                           const Scalar&) {
  meta::foreach_lists("foreach_addcdiv_", {&a, &b, &c});
  meta::foreach_float("foreach_addcdiv_", a);
}
TensorList meta_foreach_sqrt(const TensorList& a) {
  meta::foreach_lists("foreach_sqrt", {&a});
  TensorList out;
  for (const auto& t : a)
    out.push_back(empty_tensor(t.sizes(), meta::float_result(t.dtype()), meta_dev()));
  return out;
}
void meta_foreach_sqrt_(const TensorList& a) {
  meta::foreach_lists("foreach_sqrt_", {&a});
  meta::foreach_float("foreach_sqrt_", a);
}

void meta_foreach_adamw_(const TensorList& p, const TensorList& g, const TensorList& m,
                         const TensorList& v, const TensorList& steps, const Tensor& lr,
                         double beta1, double beta2, double eps, double wd,
                         const Tensor& found_inf) {
  meta::foreach_adamw("foreach_adamw_", p, g, m, v, steps, lr, beta1, beta2, eps, wd, found_inf);
}

template <class Sig>
void reg(TypedOp<Sig>& op, Sig* fn) {
  op.def.set_meta_raw(reinterpret_cast<void*>(fn));
  op.set_kernel(DispatchKey::Meta, fn);
}
const bool registered = [] {
  reg(ops::op_empty, &meta_empty);
  ops::op_empty.def.set_uninitialized(true);
  reg(ops::op_full, &meta_full);
  reg(ops::op_arange, &meta_arange);
  reg(ops::op_linspace, &meta_linspace);
  reg(ops::op_rand, &meta_rand);
  reg(ops::op_randn, &meta_rand);
  reg(ops::op_randint, &meta_randint);
  reg(ops::op_copy_, &meta_copy_);
  reg(ops::op_fill_, &meta_fill_);
  reg(ops::op_to_copy, &meta_to_copy);
  reg(ops::op_max_dim, &meta_max_dim);
  reg(ops::op_min_dim, &meta_min_dim);
  reg(ops::op_native_dropout, &meta_dropout);
  reg(ops::op_flash_attention, &meta_flash_attention);
  reg(ops::op_flash_attention_backward, &meta_flash_attention_backward);
  reg(ops::op_addmm_gelu, &meta_addmm_gelu);
  reg(ops::op_foreach_add_, &meta_foreach_add_);
  reg(ops::op_foreach_mul_, &meta_foreach_mul_);
  reg(ops::op_foreach_mul_list_, &meta_foreach_mul_list_);
  reg(ops::op_foreach_lerp_, &meta_foreach_lerp_);
  reg(ops::op_foreach_addcmul_, &meta_foreach_addcmul_);
  reg(ops::op_foreach_addcdiv_, &meta_foreach_addcdiv_);
  reg(ops::op_foreach_sqrt, &meta_foreach_sqrt);
  reg(ops::op_foreach_sqrt_, &meta_foreach_sqrt_);
  reg(ops::op_foreach_adamw_, &meta_foreach_adamw_);
  return true;
}();
}  // namespace

}  // namespace kiln

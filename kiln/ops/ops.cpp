// The public functional API: thin wrappers that fill in defaults and call the dispatched ops.
#include "kiln/ops/ops.h"

#include <atomic>
#include <cmath>

#include "kiln/ops/op_list.h"
#include "kiln/ops/structured.h"

namespace kiln {

using namespace ops;  // NOLINT: the *_op handles

namespace {
std::atomic<bool> g_allow_tf32{false};
}  // namespace
void set_allow_tf32(bool allow) { g_allow_tf32.store(allow, std::memory_order_relaxed); }
bool allow_tf32() { return g_allow_tf32.load(std::memory_order_relaxed); }
namespace {
std::atomic<bool> g_fused_attention{true};
std::atomic<bool> g_deterministic{false};
}  // namespace
void set_fused_attention(bool on) { g_fused_attention.store(on, std::memory_order_relaxed); }
bool fused_attention() { return g_fused_attention.load(std::memory_order_relaxed); }
void set_deterministic_algorithms(bool on) { g_deterministic.store(on, std::memory_order_relaxed); }
bool deterministic_algorithms() { return g_deterministic.load(std::memory_order_relaxed); }

namespace {
// Wrapped numbers keep their category's widest type (int64, float64), as in PyTorch.
Tensor wrap(const Scalar& s) {
  Tensor t = scalar_tensor(s, s.dtype(), Device(kCPU));
  t.impl()->set_wrapped_number(true);
  return t;
}
DType float_or(std::optional<DType> d) { return d ? *d : default_dtype(); }
Device device_or(std::optional<Device> d) { return d ? *d : default_device(); }
}  // namespace

// ---------------------------------------------------------------- factories
Tensor empty(IntArrayRef sizes, std::optional<DType> dtype, std::optional<Device> device) {
  return empty_op(sizes, float_or(dtype), device_or(device));
}
Tensor zeros(IntArrayRef sizes, std::optional<DType> dtype, std::optional<Device> device) {
  return full_op(sizes, 0, float_or(dtype), device_or(device));
}
Tensor ones(IntArrayRef sizes, std::optional<DType> dtype, std::optional<Device> device) {
  return full_op(sizes, 1, float_or(dtype), device_or(device));
}
Tensor full(IntArrayRef sizes, const Scalar& value, std::optional<DType> dtype,
            std::optional<Device> device) {
  DType d = dtype ? *dtype : value.is_floating() ? default_dtype() : value.dtype();
  return full_op(sizes, value, d, device_or(device));
}
Tensor empty_like(const Tensor& t) { return empty_op(t.sizes(), t.dtype(), t.device()); }
Tensor zeros_like(const Tensor& t) { return full_op(t.sizes(), 0, t.dtype(), t.device()); }
Tensor ones_like(const Tensor& t) { return full_op(t.sizes(), 1, t.dtype(), t.device()); }
Tensor full_like(const Tensor& t, const Scalar& v) {
  return full_op(t.sizes(), v, t.dtype(), t.device());
}
Tensor arange(const Scalar& end, std::optional<DType> dtype, std::optional<Device> device) {
  return arange(0, end, 1, dtype, device);
}
Tensor arange(const Scalar& start, const Scalar& end, const Scalar& step,
              std::optional<DType> dtype, std::optional<Device> device) {
  bool floating = start.is_floating() || end.is_floating() || step.is_floating();
  DType d = dtype ? *dtype : floating ? default_dtype() : kInt64;
  return arange_op(start, end, step, d, device_or(device));
}
Tensor linspace(const Scalar& start, const Scalar& end, int64_t steps, std::optional<DType> dtype,
                std::optional<Device> device) {
  return linspace_op(start, end, steps, float_or(dtype), device_or(device));
}
Tensor rand(IntArrayRef sizes, Generator* gen, std::optional<DType> dtype,
            std::optional<Device> device) {
  return rand_op(sizes, gen, float_or(dtype), device_or(device));
}
Tensor randn(IntArrayRef sizes, Generator* gen, std::optional<DType> dtype,
             std::optional<Device> device) {
  return randn_op(sizes, gen, float_or(dtype), device_or(device));
}
Tensor randint(int64_t low, int64_t high, IntArrayRef sizes, Generator* gen,
               std::optional<DType> dtype, std::optional<Device> device) {
  return randint_op(low, high, sizes, gen, dtype ? *dtype : kInt64, device_or(device));
}
Tensor rand_like(const Tensor& t, Generator* gen) {
  return rand_op(t.sizes(), gen, t.dtype(), t.device());
}
Tensor randn_like(const Tensor& t, Generator* gen) {
  return randn_op(t.sizes(), gen, t.dtype(), t.device());
}
template <class T>
Tensor from_vector(const std::vector<T>& values, IntArrayRef sizes, std::optional<Device> device) {
  int64_t n = static_cast<int64_t>(values.size());
  Shape shape = sizes.empty() ? Shape{n} : Shape(sizes);
  int64_t want = checked_numel(shape, "from_vector");
  KILN_CHECK(want == n, "[from_vector] shape [{}] needs {} values but {} were given",
             fmt::join(shape, ", "), want, n);
  Tensor host = detail::empty_tensor(shape, dtype_of<T>::value, Device(kCPU));
  T* p = static_cast<T*>(host.impl()->data());
  for (int64_t i = 0; i < n; ++i) p[i] = values[i];
  Device d = device_or(device);
  return d.is_cpu() ? host : host.to(d);
}
#define KILN_INSTANTIATE_FROM_VECTOR(T) \
  template Tensor from_vector<T>(const std::vector<T>&, IntArrayRef, std::optional<Device>);
KILN_INSTANTIATE_FROM_VECTOR(bool)
KILN_INSTANTIATE_FROM_VECTOR(uint8_t)
KILN_INSTANTIATE_FROM_VECTOR(int32_t)
KILN_INSTANTIATE_FROM_VECTOR(int64_t)
KILN_INSTANTIATE_FROM_VECTOR(Half)
KILN_INSTANTIATE_FROM_VECTOR(BFloat16)
KILN_INSTANTIATE_FROM_VECTOR(float)
KILN_INSTANTIATE_FROM_VECTOR(double)
#undef KILN_INSTANTIATE_FROM_VECTOR

Tensor scalar_tensor(const Scalar& value, std::optional<DType> dtype,
                     std::optional<Device> device) {
  DType d = dtype ? *dtype : value.is_floating() ? default_dtype() : value.dtype();
  Device dev = device_or(device);
  // Another device's memory is written by an op (which compile traces), not by the host.
  if (!dev.is_cpu()) return full({}, value, d, dev);
  Tensor t = detail::empty_tensor({}, d, dev);
  KILN_DISPATCH_TYPES(d, "scalar_tensor",
                      [&] { *static_cast<scalar_t*>(t.impl()->data()) = value.to<scalar_t>(); });
  return t;
}

// ---------------------------------------------------------------- pointwise
Tensor add(const Tensor& a, const Tensor& b, const Scalar& alpha) { return add_op(a, b, alpha); }
Tensor add(const Tensor& a, const Scalar& b, const Scalar& alpha) {
  return add_op(a, wrap(b), alpha);
}
Tensor sub(const Tensor& a, const Tensor& b, const Scalar& alpha) { return sub_op(a, b, alpha); }
Tensor sub(const Tensor& a, const Scalar& b, const Scalar& alpha) {
  return sub_op(a, wrap(b), alpha);
}
#define KILN_BINARY_WRAPPERS(name)                                          \
  Tensor name(const Tensor& a, const Tensor& b) { return name##_op(a, b); } \
  Tensor name(const Tensor& a, const Scalar& b) { return name##_op(a, wrap(b)); }
KILN_BINARY_WRAPPERS(mul)
KILN_BINARY_WRAPPERS(div)
KILN_BINARY_WRAPPERS(pow)
KILN_BINARY_WRAPPERS(eq)
KILN_BINARY_WRAPPERS(ne)
KILN_BINARY_WRAPPERS(lt)
KILN_BINARY_WRAPPERS(le)
KILN_BINARY_WRAPPERS(gt)
KILN_BINARY_WRAPPERS(ge)
#undef KILN_BINARY_WRAPPERS
Tensor maximum(const Tensor& a, const Tensor& b) { return maximum_op(a, b); }
Tensor minimum(const Tensor& a, const Tensor& b) { return minimum_op(a, b); }
Tensor logical_and(const Tensor& a, const Tensor& b) { return logical_and_op(a, b); }
Tensor logical_or(const Tensor& a, const Tensor& b) { return logical_or_op(a, b); }
Tensor logical_xor(const Tensor& a, const Tensor& b) { return logical_xor_op(a, b); }
#define KILN_UNARY_WRAPPER(name) \
  Tensor name(const Tensor& a) { return name##_op(a); }
KILN_UNARY_WRAPPER(logical_not)
KILN_UNARY_WRAPPER(neg)
KILN_UNARY_WRAPPER(abs)
KILN_UNARY_WRAPPER(exp)
KILN_UNARY_WRAPPER(log)
KILN_UNARY_WRAPPER(sqrt)
KILN_UNARY_WRAPPER(rsqrt)
KILN_UNARY_WRAPPER(tanh)
KILN_UNARY_WRAPPER(sigmoid)
KILN_UNARY_WRAPPER(relu)
KILN_UNARY_WRAPPER(silu)
KILN_UNARY_WRAPPER(sin)
KILN_UNARY_WRAPPER(cos)
#undef KILN_UNARY_WRAPPER
Tensor gelu(const Tensor& a, bool approximate_tanh) { return gelu_op(a, approximate_tanh); }
Tensor layer_norm_backward(const Tensor& grad, const Tensor& x, IntArrayRef normalized_shape,
                           const Tensor& weight, double eps) {
  return layer_norm_backward_op(grad, x, normalized_shape, weight, eps);
}
namespace {
double attention_scale(const Tensor& q, std::optional<double> scale) {
  KILN_CHECK(q.defined() && q.dim() >= 1,
             "[flash_attention] query must be a defined tensor with "
             "at least 1 dim");
  return scale ? *scale : 1.0 / std::sqrt(static_cast<double>(q.size(-1)));
}
}  // namespace
std::tuple<Tensor, Tensor> flash_attention(const Tensor& q, const Tensor& k, const Tensor& v,
                                           bool is_causal, std::optional<double> scale) {
  return flash_attention_op(q, k, v, is_causal, attention_scale(q, scale));
}
std::tuple<Tensor, Tensor, Tensor> flash_attention_backward(const Tensor& grad_out, const Tensor& q,
                                                            const Tensor& k, const Tensor& v,
                                                            const Tensor& out,
                                                            const Tensor& logsumexp, bool is_causal,
                                                            std::optional<double> scale) {
  return flash_attention_backward_op(grad_out, q, k, v, out, logsumexp, is_causal,
                                     attention_scale(q, scale));
}
Tensor gelu_backward(const Tensor& grad, const Tensor& self, bool approximate_tanh) {
  return gelu_backward_op(grad, self, approximate_tanh);
}
Tensor clamp(const Tensor& a, std::optional<Scalar> lo, std::optional<Scalar> hi) {
  return clamp_op(a, lo, hi);
}
Tensor where(const Tensor& c, const Tensor& a, const Tensor& b) { return where_op(c, a, b); }
Tensor where(const Tensor& c, const Tensor& a, const Scalar& b) { return where_op(c, a, wrap(b)); }
Tensor masked_fill(const Tensor& a, const Tensor& mask, const Scalar& value) {
  meta::check_defined("masked_fill", a, "self");
  return where_op(mask, scalar_tensor(value, a.dtype(), Device(kCPU)), a);
}
Tensor cast(const Tensor& t, DType dtype) { return t.to(dtype); }

Tensor& add_(Tensor& self, const Tensor& b, const Scalar& alpha) {
  add__op(self, b, alpha);
  return self;
}
Tensor& add_(Tensor& self, const Scalar& b, const Scalar& alpha) {
  add__op(self, wrap(b), alpha);
  return self;
}
Tensor& sub_(Tensor& self, const Tensor& b, const Scalar& alpha) {
  sub__op(self, b, alpha);
  return self;
}
Tensor& mul_(Tensor& self, const Tensor& b) {
  mul__op(self, b);
  return self;
}
Tensor& mul_(Tensor& self, const Scalar& b) {
  mul__op(self, wrap(b));
  return self;
}
Tensor& div_(Tensor& self, const Tensor& b) {
  div__op(self, b);
  return self;
}
Tensor& div_(Tensor& self, const Scalar& b) {
  div__op(self, wrap(b));
  return self;
}
Tensor& clamp_(Tensor& self, std::optional<Scalar> lo, std::optional<Scalar> hi) {
  clamp__op(self, lo, hi);
  return self;
}
Tensor& relu_(Tensor& self) {
  relu__op(self);
  return self;
}
Tensor& sqrt_(Tensor& self) {
  sqrt__op(self);
  return self;
}
Tensor& neg_(Tensor& self) {
  neg__op(self);
  return self;
}
Tensor& exp_(Tensor& self) {
  exp__op(self);
  return self;
}
namespace {
// The operands of an in-place op broadcast to self's shape (and never beyond it).
Tensor broadcast_to_self(const char* op, const Tensor& self, const Tensor& t) {
  meta::check_defined(op, self, "self");
  meta::check_defined(op, t, "tensor");
  meta::check_broadcasts_to(op, "an operand", t.sizes(), self.sizes());
  return expand_op(t, self.sizes());
}
}  // namespace
Tensor& addcmul_(Tensor& self, const Tensor& t1, const Tensor& t2, const Scalar& value) {
  foreach_addcmul__op({self}, {broadcast_to_self("addcmul_", self, t1)},
                      {broadcast_to_self("addcmul_", self, t2)}, value);
  return self;
}
Tensor& addcdiv_(Tensor& self, const Tensor& t1, const Tensor& t2, const Scalar& value) {
  foreach_addcdiv__op({self}, {broadcast_to_self("addcdiv_", self, t1)},
                      {broadcast_to_self("addcdiv_", self, t2)}, value);
  return self;
}
Tensor& lerp_(Tensor& self, const Tensor& end, const Scalar& weight) {
  foreach_lerp__op({self}, {broadcast_to_self("lerp_", self, end)}, weight);
  return self;
}
Tensor& add_out(Tensor& out, const Tensor& a, const Tensor& b, const Scalar& alpha) {
  add_out_op(out, a, b, alpha);
  return out;
}
Tensor& sub_out(Tensor& out, const Tensor& a, const Tensor& b, const Scalar& alpha) {
  sub_out_op(out, a, b, alpha);
  return out;
}
Tensor& mul_out(Tensor& out, const Tensor& a, const Tensor& b) {
  mul_out_op(out, a, b);
  return out;
}
Tensor& div_out(Tensor& out, const Tensor& a, const Tensor& b) {
  div_out_op(out, a, b);
  return out;
}
Tensor& mm_out(Tensor& out, const Tensor& a, const Tensor& b) {
  mm_out_op(out, a, b);
  return out;
}
Tensor& sum_out(Tensor& out, const Tensor& a, IntArrayRef dims, bool keepdim) {
  sum_out_op(out, a, dims, keepdim, std::nullopt);
  return out;
}

// ---------------------------------------------------------------- reductions
Tensor sum(const Tensor& a, IntArrayRef dims, bool keepdim, std::optional<DType> dtype) {
  return sum_op(a, dims, keepdim, dtype);
}
Tensor mean(const Tensor& a, IntArrayRef dims, bool keepdim, std::optional<DType> dtype) {
  return mean_op(a, dims, keepdim, dtype);
}
Tensor var(const Tensor& a, IntArrayRef dims, int64_t correction, bool keepdim) {
  return var_op(a, dims, correction, keepdim);
}
Tensor amax(const Tensor& a, IntArrayRef dims, bool keepdim) { return amax_op(a, dims, keepdim); }
Tensor amin(const Tensor& a, IntArrayRef dims, bool keepdim) { return amin_op(a, dims, keepdim); }
Tensor max(const Tensor& a) { return amax_op(a, {}, false); }
Tensor min(const Tensor& a) { return amin_op(a, {}, false); }
std::tuple<Tensor, Tensor> max(const Tensor& a, int64_t dim, bool keepdim) {
  return max_dim_op(a, dim, keepdim);
}
std::tuple<Tensor, Tensor> min(const Tensor& a, int64_t dim, bool keepdim) {
  return min_dim_op(a, dim, keepdim);
}
Tensor argmax(const Tensor& a, std::optional<int64_t> dim, bool keepdim) {
  return argmax_op(a, dim, keepdim);
}
Tensor argmin(const Tensor& a, std::optional<int64_t> dim, bool keepdim) {
  return argmin_op(a, dim, keepdim);
}
Tensor all(const Tensor& a, IntArrayRef dims, bool keepdim) { return all_op(a, dims, keepdim); }
Tensor any(const Tensor& a, IntArrayRef dims, bool keepdim) { return any_op(a, dims, keepdim); }
Tensor softmax(const Tensor& a, int64_t dim) { return softmax_op(a, dim); }
Tensor log_softmax(const Tensor& a, int64_t dim) { return log_softmax_op(a, dim); }

// ---------------------------------------------------------------- indexing
Tensor index_select(const Tensor& t, int64_t dim, const Tensor& index) {
  return index_select_op(t, dim, index);
}
Tensor gather(const Tensor& t, int64_t dim, const Tensor& index) {
  return gather_op(t, dim, index);
}
Tensor scatter_add(const Tensor& self, int64_t dim, const Tensor& index, const Tensor& src) {
  return scatter_add_op(self, dim, index, src);
}
Tensor index_add(const Tensor& self, int64_t dim, const Tensor& index, const Tensor& source,
                 const Scalar& alpha) {
  return index_add_op(self, dim, index, source, alpha);
}
// The in-place forms run as out= into self (which computes through a temporary, as out
// shares self's storage). out= is not differentiable, so with autograd they copy a result.
static bool records_grad(const Tensor& a, const Tensor& b) {
  return (a.requires_grad() || b.requires_grad()) &&
         !local_dispatch_state().excluded.has(DispatchKey::Autograd);
}
Tensor& scatter_add_(Tensor& self, int64_t dim, const Tensor& index, const Tensor& src) {
  if (records_grad(self, src)) return self.copy_(scatter_add_op(self, dim, index, src));
  scatter_add_out_op(self, self, dim, index, src);
  return self;
}
Tensor& index_add_(Tensor& self, int64_t dim, const Tensor& index, const Tensor& source,
                   const Scalar& alpha) {
  if (records_grad(self, source)) return self.copy_(index_add_op(self, dim, index, source, alpha));
  index_add_out_op(self, self, dim, index, source, alpha);
  return self;
}
Tensor triu(const Tensor& t, int64_t diagonal) { return triu_op(t, diagonal); }
Tensor tril(const Tensor& t, int64_t diagonal) { return tril_op(t, diagonal); }
Tensor one_hot(const Tensor& t, int64_t num_classes) {
  if (num_classes == -1) {
    KILN_CHECK(t.numel() > 0, "[one_hot] cannot infer num_classes from an empty tensor");
    num_classes = amax(t).item<int64_t>() + 1;
  }
  return one_hot_op(t, num_classes);
}

// ---------------------------------------------------------------- multi-tensor updates
void foreach_add_(const TensorList& self, const TensorList& other, const Scalar& alpha) {
  foreach_add__op(self, other, alpha);
}
void foreach_mul_(const TensorList& self, const Scalar& s) { foreach_mul__op(self, s); }
void foreach_mul_(const TensorList& self, const TensorList& other) {
  foreach_mul_list__op(self, other);
}
void foreach_adamw_(const TensorList& p, const TensorList& g, const TensorList& m,
                    const TensorList& v, const TensorList& steps, const Tensor& lr, double beta1,
                    double beta2, double eps, double weight_decay) {
  foreach_adamw__op(p, g, m, v, steps, lr, beta1, beta2, eps, weight_decay);
}
void foreach_lerp_(const TensorList& self, const TensorList& end, const Scalar& w) {
  foreach_lerp__op(self, end, w);
}
void foreach_addcmul_(const TensorList& self, const TensorList& t1, const TensorList& t2,
                      const Scalar& v) {
  foreach_addcmul__op(self, t1, t2, v);
}
void foreach_addcdiv_(const TensorList& self, const TensorList& t1, const TensorList& t2,
                      const Scalar& v) {
  foreach_addcdiv__op(self, t1, t2, v);
}
TensorList foreach_sqrt(const TensorList& self) { return foreach_sqrt_op(self); }
void foreach_sqrt_(const TensorList& self) { foreach_sqrt__op(self); }

// ---------------------------------------------------------------- operators
Tensor operator+(const Tensor& a, const Tensor& b) { return add(a, b); }
Tensor operator+(const Tensor& a, const Scalar& b) { return add(a, b); }
Tensor operator+(const Scalar& a, const Tensor& b) { return add(b, a); }
Tensor operator-(const Tensor& a, const Tensor& b) { return sub(a, b); }
Tensor operator-(const Tensor& a, const Scalar& b) { return sub(a, b); }
Tensor operator-(const Scalar& a, const Tensor& b) { return sub_op(wrap(a), b, 1); }
Tensor operator*(const Tensor& a, const Tensor& b) { return mul(a, b); }
Tensor operator*(const Tensor& a, const Scalar& b) { return mul(a, b); }
Tensor operator*(const Scalar& a, const Tensor& b) { return mul(b, a); }
Tensor operator/(const Tensor& a, const Tensor& b) { return div(a, b); }
Tensor operator/(const Tensor& a, const Scalar& b) { return div(a, b); }
Tensor operator/(const Scalar& a, const Tensor& b) { return div_op(wrap(a), b); }
Tensor operator-(const Tensor& a) { return neg(a); }

bool allclose(const Tensor& a, const Tensor& b, double rtol, double atol, bool equal_nan) {
  meta::check_defined("allclose", a, "a");
  meta::check_defined("allclose", b, "b");
  if (!std::ranges::equal(a.sizes(), b.sizes())) return false;
  auto x = a.to_vector<double>();
  auto y = b.to_vector<double>();
  for (size_t i = 0; i < x.size(); ++i) {
    if (std::isnan(x[i]) || std::isnan(y[i])) {
      if (!(equal_nan && std::isnan(x[i]) && std::isnan(y[i]))) return false;
      continue;
    }
    if (x[i] == y[i]) continue;  // equal infinities
    if (!(std::abs(x[i] - y[i]) <= atol + rtol * std::abs(y[i]))) return false;
  }
  return true;
}
bool equal(const Tensor& a, const Tensor& b) {
  meta::check_defined("equal", a, "a");
  meta::check_defined("equal", b, "b");
  return a.dtype() == b.dtype() && allclose(a, b, 0, 0, false);
}

}  // namespace kiln

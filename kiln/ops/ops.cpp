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
  return op_empty(sizes, float_or(dtype), device_or(device));
}
Tensor zeros(IntArrayRef sizes, std::optional<DType> dtype, std::optional<Device> device) {
  return op_full(sizes, 0, float_or(dtype), device_or(device));
}
Tensor ones(IntArrayRef sizes, std::optional<DType> dtype, std::optional<Device> device) {
  return op_full(sizes, 1, float_or(dtype), device_or(device));
}
Tensor full(IntArrayRef sizes, const Scalar& value, std::optional<DType> dtype,
            std::optional<Device> device) {
  DType d = dtype ? *dtype : value.is_floating() ? default_dtype() : value.dtype();
  return op_full(sizes, value, d, device_or(device));
}
namespace {
detail::ShardedLikeFactory g_sharded_like = nullptr;
// A DTensor's *_like is a DTensor (its gradients and buffers live on its mesh): the factory
// kiln/dtensor installs makes it. Factories proper take no tensor, so they cannot tell.
bool sharded(const Tensor& t) { return t.key_set().has(DispatchKey::Sharded) && g_sharded_like; }
}  // namespace
void detail::set_sharded_like_factory(ShardedLikeFactory f) { g_sharded_like = f; }
namespace {
detail::ShardedLayoutFactory g_sharded_layout = nullptr;
}  // namespace
void detail::set_sharded_layout_factory(ShardedLayoutFactory f) { g_sharded_layout = f; }
Tensor detail::sharded_full(const void* layout, const Scalar* fill) {
  KILN_ASSERT(g_sharded_layout, "a DTensor layout without kiln/dtensor's factory");
  return g_sharded_layout(layout, fill);
}

Tensor empty_like(const Tensor& t) {
  if (sharded(t)) return g_sharded_like(t, {});
  return op_empty(t.sizes(), t.dtype(), t.device());
}
Tensor zeros_like(const Tensor& t) { return full_like(t, 0); }
Tensor ones_like(const Tensor& t) { return full_like(t, 1); }
Tensor full_like(const Tensor& t, const Scalar& v) {
  if (sharded(t)) return g_sharded_like(t, {detail::LikeFill::Kind::kFull, &v});
  return op_full(t.sizes(), v, t.dtype(), t.device());
}
Tensor arange(const Scalar& end, std::optional<DType> dtype, std::optional<Device> device) {
  return arange(0, end, 1, dtype, device);
}
Tensor arange(const Scalar& start, const Scalar& end, const Scalar& step,
              std::optional<DType> dtype, std::optional<Device> device) {
  bool floating = start.is_floating() || end.is_floating() || step.is_floating();
  DType d = dtype ? *dtype : floating ? default_dtype() : kInt64;
  return op_arange(start, end, step, d, device_or(device));
}
Tensor linspace(const Scalar& start, const Scalar& end, int64_t steps, std::optional<DType> dtype,
                std::optional<Device> device) {
  return op_linspace(start, end, steps, float_or(dtype), device_or(device));
}
Tensor rand(IntArrayRef sizes, Generator* gen, std::optional<DType> dtype,
            std::optional<Device> device) {
  return op_rand(sizes, gen, float_or(dtype), device_or(device));
}
Tensor randn(IntArrayRef sizes, Generator* gen, std::optional<DType> dtype,
             std::optional<Device> device) {
  return op_randn(sizes, gen, float_or(dtype), device_or(device));
}
Tensor randint(int64_t low, int64_t high, IntArrayRef sizes, Generator* gen,
               std::optional<DType> dtype, std::optional<Device> device) {
  return op_randint(low, high, sizes, gen, dtype ? *dtype : kInt64, device_or(device));
}
Tensor rand_like(const Tensor& t, Generator* gen) {
  if (sharded(t)) return g_sharded_like(t, {detail::LikeFill::Kind::kRand, nullptr, gen});
  return op_rand(t.sizes(), gen, t.dtype(), t.device());
}
Tensor randn_like(const Tensor& t, Generator* gen) {
  if (sharded(t)) return g_sharded_like(t, {detail::LikeFill::Kind::kRandn, nullptr, gen});
  return op_randn(t.sizes(), gen, t.dtype(), t.device());
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
Tensor add(const Tensor& a, const Tensor& b, const Scalar& alpha) { return op_add(a, b, alpha); }
Tensor add(const Tensor& a, const Scalar& b, const Scalar& alpha) {
  return op_add(a, wrap(b), alpha);
}
Tensor sub(const Tensor& a, const Tensor& b, const Scalar& alpha) { return op_sub(a, b, alpha); }
Tensor sub(const Tensor& a, const Scalar& b, const Scalar& alpha) {
  return op_sub(a, wrap(b), alpha);
}
#define KILN_BINARY_WRAPPERS(name)                                          \
  Tensor name(const Tensor& a, const Tensor& b) { return op_##name(a, b); } \
  Tensor name(const Tensor& a, const Scalar& b) { return op_##name(a, wrap(b)); }
KILN_BINARY_WRAPPERS(mul)
KILN_BINARY_WRAPPERS(div)
KILN_BINARY_WRAPPERS(pow)
KILN_BINARY_WRAPPERS(eq)
KILN_BINARY_WRAPPERS(ne)
KILN_BINARY_WRAPPERS(lt)
KILN_BINARY_WRAPPERS(le)
KILN_BINARY_WRAPPERS(gt)
KILN_BINARY_WRAPPERS(ge)
KILN_BINARY_WRAPPERS(fmod)
KILN_BINARY_WRAPPERS(remainder)
KILN_BINARY_WRAPPERS(bitwise_and)
KILN_BINARY_WRAPPERS(bitwise_or)
KILN_BINARY_WRAPPERS(bitwise_xor)
#undef KILN_BINARY_WRAPPERS
Tensor pow(const Scalar& a, const Tensor& b) { return op_pow(wrap(a), b); }
Tensor atan2(const Tensor& a, const Tensor& b) { return op_atan2(a, b); }
Tensor bitwise_not(const Tensor& a) { return op_bitwise_not(a); }
namespace {
// Which op divides with `rounding_mode`: nullptr for true division.
decltype(&op_div_trunc) rounding_div(std::optional<std::string_view> mode) {
  if (!mode) return nullptr;
  if (*mode == "trunc") return &op_div_trunc;
  if (*mode == "floor") return &op_div_floor;
  KILN_THROW(Value, "[div] expected rounding_mode to be one of None, 'trunc' or 'floor', got '{}'",
             *mode);
}
}  // namespace
Tensor div(const Tensor& a, const Tensor& b, std::optional<std::string_view> rounding_mode) {
  auto* op = rounding_div(rounding_mode);
  return op ? (*op)(a, b) : op_div(a, b);
}
Tensor div(const Tensor& a, const Scalar& b, std::optional<std::string_view> rounding_mode) {
  return div(a, wrap(b), rounding_mode);
}
Tensor clamp(const Tensor& a, const Tensor& min, const Tensor& max) {
  KILN_CHECK(min.defined() || max.defined(),
             "[clamp] at least one of 'min' or 'max' must be given");
  Tensor r = min.defined() ? op_maximum(a, min) : a;
  return max.defined() ? op_minimum(r, max) : r;
}
Tensor maximum(const Tensor& a, const Tensor& b) { return op_maximum(a, b); }
Tensor minimum(const Tensor& a, const Tensor& b) { return op_minimum(a, b); }
Tensor logical_and(const Tensor& a, const Tensor& b) { return op_logical_and(a, b); }
Tensor logical_or(const Tensor& a, const Tensor& b) { return op_logical_or(a, b); }
Tensor logical_xor(const Tensor& a, const Tensor& b) { return op_logical_xor(a, b); }
#define KILN_DEFINE_PUBLIC_UNARY(name)                        \
  Tensor name(const Tensor& self) { return op_##name(self); } \
  Tensor& name##_(Tensor& self) {                             \
    op_##name##_(self);                                       \
    return self;                                              \
  }
KILN_FORALL_PUBLIC_UNARY(KILN_DEFINE_PUBLIC_UNARY)
#undef KILN_DEFINE_PUBLIC_UNARY
Tensor gelu(const Tensor& a, bool approximate_tanh) { return op_gelu(a, approximate_tanh); }
Tensor isnan(const Tensor& self) { return op_isnan(self); }
Tensor isinf(const Tensor& self) { return op_isinf(self); }
Tensor hardtanh(const Tensor& a, const Scalar& min_val, const Scalar& max_val) {
  return op_hardtanh(a, min_val, max_val);
}
Tensor leaky_relu(const Tensor& a, const Scalar& negative_slope) {
  return op_leaky_relu(a, negative_slope);
}
Tensor elu(const Tensor& a, const Scalar& alpha, const Scalar& scale, const Scalar& input_scale) {
  return op_elu(a, alpha, scale, input_scale);
}
Tensor elu_backward(const Tensor& grad, const Scalar& alpha, const Scalar& scale,
                    const Scalar& input_scale, bool is_result, const Tensor& self_or_result) {
  return op_elu_backward(grad, alpha, scale, input_scale, is_result, self_or_result);
}
Tensor layer_norm_backward(const Tensor& grad, const Tensor& x, IntArrayRef normalized_shape,
                           const Tensor& weight, double eps) {
  return op_layer_norm_backward(grad, x, normalized_shape, weight, eps);
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
  return op_flash_attention(q, k, v, is_causal, attention_scale(q, scale));
}
std::tuple<Tensor, Tensor, Tensor> flash_attention_backward(const Tensor& grad_out, const Tensor& q,
                                                            const Tensor& k, const Tensor& v,
                                                            const Tensor& out,
                                                            const Tensor& logsumexp, bool is_causal,
                                                            std::optional<double> scale) {
  return op_flash_attention_backward(grad_out, q, k, v, out, logsumexp, is_causal,
                                     attention_scale(q, scale));
}
Tensor gelu_backward(const Tensor& grad, const Tensor& self, bool approximate_tanh) {
  return op_gelu_backward(grad, self, approximate_tanh);
}
Tensor threshold_backward(const Tensor& grad, const Tensor& self, const Scalar& threshold) {
  return op_threshold_backward(grad, self, threshold);
}
Tensor clamp(const Tensor& a, std::optional<Scalar> lo, std::optional<Scalar> hi) {
  return op_clamp(a, lo, hi);
}
Tensor where(const Tensor& c, const Tensor& a, const Tensor& b) { return op_where(c, a, b); }
Tensor where(const Tensor& c, const Tensor& a, const Scalar& b) { return op_where(c, a, wrap(b)); }
Tensor masked_fill(const Tensor& a, const Tensor& mask, const Scalar& value) {
  meta::check_defined("masked_fill", a, "self");
  return op_where(mask, scalar_tensor(value, a.dtype(), Device(kCPU)), a);
}
Tensor cast(const Tensor& t, DType dtype) { return t.to(dtype); }

// The public in-place forms: each runs the op's in-place variant and hands back self.
Tensor& add_(Tensor& self, const Tensor& other, const Scalar& alpha) {
  op_add_(self, other, alpha);
  return self;
}
Tensor& add_(Tensor& self, const Scalar& other, const Scalar& alpha) {
  op_add_(self, wrap(other), alpha);
  return self;
}
Tensor& sub_(Tensor& self, const Tensor& other, const Scalar& alpha) {
  op_sub_(self, other, alpha);
  return self;
}
Tensor& sub_(Tensor& self, const Scalar& other, const Scalar& alpha) {
  op_sub_(self, wrap(other), alpha);
  return self;
}
#define KILN_INPLACE_BINARY(name, Other, pass) \
  Tensor& name##_(Tensor& self, Other other) { \
    op_##name##_(self, pass);                  \
    return self;                               \
  }
#define KILN_INPLACE_BINARY_AND_SCALAR(name)      \
  KILN_INPLACE_BINARY(name, const Tensor&, other) \
  KILN_INPLACE_BINARY(name, const Scalar&, wrap(other))
KILN_INPLACE_BINARY_AND_SCALAR(mul)
KILN_INPLACE_BINARY_AND_SCALAR(div)
KILN_INPLACE_BINARY_AND_SCALAR(pow)
KILN_INPLACE_BINARY_AND_SCALAR(eq)
KILN_INPLACE_BINARY_AND_SCALAR(ne)
KILN_INPLACE_BINARY_AND_SCALAR(lt)
KILN_INPLACE_BINARY_AND_SCALAR(le)
KILN_INPLACE_BINARY_AND_SCALAR(gt)
KILN_INPLACE_BINARY_AND_SCALAR(ge)
KILN_INPLACE_BINARY_AND_SCALAR(fmod)
KILN_INPLACE_BINARY_AND_SCALAR(remainder)
KILN_INPLACE_BINARY_AND_SCALAR(bitwise_and)
KILN_INPLACE_BINARY_AND_SCALAR(bitwise_or)
KILN_INPLACE_BINARY_AND_SCALAR(bitwise_xor)
KILN_INPLACE_BINARY(atan2, const Tensor&, other)
KILN_INPLACE_BINARY(maximum, const Tensor&, other)
KILN_INPLACE_BINARY(minimum, const Tensor&, other)
KILN_INPLACE_BINARY(logical_and, const Tensor&, other)
KILN_INPLACE_BINARY(logical_or, const Tensor&, other)
KILN_INPLACE_BINARY(logical_xor, const Tensor&, other)
#undef KILN_INPLACE_BINARY_AND_SCALAR
#undef KILN_INPLACE_BINARY
Tensor& gelu_(Tensor& self, bool approximate_tanh) {
  op_gelu_(self, approximate_tanh);
  return self;
}
Tensor& hardtanh_(Tensor& self, const Scalar& min_val, const Scalar& max_val) {
  op_hardtanh_(self, min_val, max_val);
  return self;
}
Tensor& leaky_relu_(Tensor& self, const Scalar& negative_slope) {
  op_leaky_relu_(self, negative_slope);
  return self;
}
Tensor& elu_(Tensor& self, const Scalar& alpha, const Scalar& scale, const Scalar& input_scale) {
  op_elu_(self, alpha, scale, input_scale);
  return self;
}
Tensor& bitwise_not_(Tensor& self) {
  op_bitwise_not_(self);
  return self;
}
Tensor& div_(Tensor& self, const Tensor& other, std::optional<std::string_view> rounding_mode) {
  if (!rounding_mode) return div_(self, other);
  if (*rounding_mode == "trunc")
    op_div_trunc_(self, other);
  else if (*rounding_mode == "floor")
    op_div_floor_(self, other);
  else
    KILN_THROW(Value,
               "[div_] expected rounding_mode to be one of None, 'trunc' or 'floor', got '{}'",
               *rounding_mode);
  return self;
}
Tensor& div_(Tensor& self, const Scalar& other, std::optional<std::string_view> rounding_mode) {
  return div_(self, wrap(other), rounding_mode);
}
Tensor& clamp_(Tensor& self, const Tensor& min, const Tensor& max) {
  KILN_CHECK(min.defined() || max.defined(),
             "[clamp_] at least one of 'min' or 'max' must be given");
  if (min.defined()) op_maximum_(self, min);
  if (max.defined()) op_minimum_(self, max);
  return self;
}
Tensor& clamp_(Tensor& self, std::optional<Scalar> min, std::optional<Scalar> max) {
  op_clamp_(self, min, max);
  return self;
}
namespace {
// The operands of an in-place op broadcast to self's shape (and never beyond it).
Tensor broadcast_to_self(const char* op, const Tensor& self, const Tensor& t) {
  meta::check_defined(op, self, "self");
  meta::check_defined(op, t, "tensor");
  meta::check_broadcasts_to(op, "an operand", t.sizes(), self.sizes());
  return op_expand(t, self.sizes());
}
}  // namespace
Tensor& addcmul_(Tensor& self, const Tensor& t1, const Tensor& t2, const Scalar& value) {
  op_foreach_addcmul_({self}, {broadcast_to_self("addcmul_", self, t1)},
                      {broadcast_to_self("addcmul_", self, t2)}, value);
  return self;
}
Tensor& addcdiv_(Tensor& self, const Tensor& t1, const Tensor& t2, const Scalar& value) {
  op_foreach_addcdiv_({self}, {broadcast_to_self("addcdiv_", self, t1)},
                      {broadcast_to_self("addcdiv_", self, t2)}, value);
  return self;
}
Tensor& lerp_(Tensor& self, const Tensor& end, const Scalar& weight) {
  op_foreach_lerp_({self}, {broadcast_to_self("lerp_", self, end)}, weight);
  return self;
}
Tensor& add_out(Tensor& out, const Tensor& a, const Tensor& b, const Scalar& alpha) {
  op_add_out(out, a, b, alpha);
  return out;
}
Tensor& sub_out(Tensor& out, const Tensor& a, const Tensor& b, const Scalar& alpha) {
  op_sub_out(out, a, b, alpha);
  return out;
}
Tensor& mul_out(Tensor& out, const Tensor& a, const Tensor& b) {
  op_mul_out(out, a, b);
  return out;
}
Tensor& div_out(Tensor& out, const Tensor& a, const Tensor& b) {
  op_div_out(out, a, b);
  return out;
}
Tensor& mm_out(Tensor& out, const Tensor& a, const Tensor& b) {
  op_mm_out(out, a, b);
  return out;
}
Tensor& sum_out(Tensor& out, const Tensor& a, IntArrayRef dims, bool keepdim) {
  op_sum_out(out, a, dims, keepdim, std::nullopt);
  return out;
}

// ---------------------------------------------------------------- reductions
Tensor sum(const Tensor& a, IntArrayRef dims, bool keepdim, std::optional<DType> dtype) {
  return op_sum(a, dims, keepdim, dtype);
}
Tensor mean(const Tensor& a, IntArrayRef dims, bool keepdim, std::optional<DType> dtype) {
  return op_mean(a, dims, keepdim, dtype);
}
Tensor var(const Tensor& a, IntArrayRef dims, int64_t correction, bool keepdim) {
  return op_var(a, dims, correction, keepdim);
}
Tensor amax(const Tensor& a, IntArrayRef dims, bool keepdim) { return op_amax(a, dims, keepdim); }
Tensor amin(const Tensor& a, IntArrayRef dims, bool keepdim) { return op_amin(a, dims, keepdim); }
Tensor max(const Tensor& a) { return op_amax(a, {}, false); }
Tensor min(const Tensor& a) { return op_amin(a, {}, false); }
std::tuple<Tensor, Tensor> max(const Tensor& a, int64_t dim, bool keepdim) {
  return op_max_dim(a, dim, keepdim);
}
std::tuple<Tensor, Tensor> min(const Tensor& a, int64_t dim, bool keepdim) {
  return op_min_dim(a, dim, keepdim);
}
Tensor prod(const Tensor& a, std::optional<int64_t> dim, bool keepdim, std::optional<DType> dtype) {
  return op_prod(a, dim, keepdim, dtype);
}
Tensor cumsum(const Tensor& a, int64_t dim, std::optional<DType> dtype) {
  return op_cumsum(a, dim, dtype);
}
std::tuple<Tensor, Tensor> sort(const Tensor& a, int64_t dim, bool descending) {
  return op_sort(a, dim, descending);
}
std::tuple<Tensor, Tensor> topk(const Tensor& a, int64_t k, int64_t dim, bool largest,
                                bool sorted) {
  return op_topk(a, k, dim, largest, sorted);
}
Tensor argmax(const Tensor& a, std::optional<int64_t> dim, bool keepdim) {
  return op_argmax(a, dim, keepdim);
}
Tensor argmin(const Tensor& a, std::optional<int64_t> dim, bool keepdim) {
  return op_argmin(a, dim, keepdim);
}
Tensor all(const Tensor& a, IntArrayRef dims, bool keepdim) { return op_all(a, dims, keepdim); }
Tensor any(const Tensor& a, IntArrayRef dims, bool keepdim) { return op_any(a, dims, keepdim); }
Tensor softmax(const Tensor& a, int64_t dim) { return op_softmax(a, dim); }
Tensor log_softmax(const Tensor& a, int64_t dim) { return op_log_softmax(a, dim); }

// ---------------------------------------------------------------- indexing
Tensor index_select(const Tensor& t, int64_t dim, const Tensor& index) {
  return op_index_select(t, dim, index);
}
Tensor gather(const Tensor& t, int64_t dim, const Tensor& index) {
  return op_gather(t, dim, index);
}
Tensor scatter_add(const Tensor& self, int64_t dim, const Tensor& index, const Tensor& src) {
  return op_scatter_add(self, dim, index, src);
}
Tensor index_add(const Tensor& self, int64_t dim, const Tensor& index, const Tensor& source,
                 const Scalar& alpha) {
  return op_index_add(self, dim, index, source, alpha);
}
// The in-place forms run as out= into self (which computes through a temporary, as out
// shares self's storage). out= is not differentiable, so with autograd they copy a result.
static bool records_grad(const Tensor& a, const Tensor& b) {
  return (a.requires_grad() || b.requires_grad()) &&
         !local_dispatch_state().excluded.has(DispatchKey::Autograd);
}
Tensor& scatter_add_(Tensor& self, int64_t dim, const Tensor& index, const Tensor& src) {
  if (records_grad(self, src)) return self.copy_(op_scatter_add(self, dim, index, src));
  op_scatter_add_out(self, self, dim, index, src);
  return self;
}
Tensor& index_add_(Tensor& self, int64_t dim, const Tensor& index, const Tensor& source,
                   const Scalar& alpha) {
  if (records_grad(self, source)) return self.copy_(op_index_add(self, dim, index, source, alpha));
  op_index_add_out(self, self, dim, index, source, alpha);
  return self;
}
Tensor triu(const Tensor& t, int64_t diagonal) { return op_triu(t, diagonal); }
Tensor tril(const Tensor& t, int64_t diagonal) { return op_tril(t, diagonal); }
Tensor one_hot(const Tensor& t, int64_t num_classes) {
  if (num_classes == -1) {
    KILN_CHECK(t.numel() > 0, "[one_hot] cannot infer num_classes from an empty tensor");
    num_classes = amax(t).item<int64_t>() + 1;
  }
  return op_one_hot(t, num_classes);
}

// ---------------------------------------------------------------- multi-tensor updates
void foreach_add_(const TensorList& self, const TensorList& other, const Scalar& alpha) {
  op_foreach_add_(self, other, alpha);
}
void foreach_mul_(const TensorList& self, const Scalar& s) { op_foreach_mul_(self, s); }
void foreach_mul_(const TensorList& self, const TensorList& other) {
  op_foreach_mul_list_(self, other);
}
void foreach_adamw_(const TensorList& p, const TensorList& g, const TensorList& m,
                    const TensorList& v, const TensorList& steps, const Tensor& lr, double beta1,
                    double beta2, double eps, double weight_decay, const Tensor& found_inf) {
  op_foreach_adamw_(p, g, m, v, steps, lr, beta1, beta2, eps, weight_decay, found_inf);
}
void amp_non_finite_check_and_unscale_(const TensorList& self, const Tensor& found_inf,
                                       const Tensor& inv_scale) {
  op_amp_non_finite_check_and_unscale_(self, found_inf, inv_scale);
}
void amp_update_scale_(const Tensor& scale, const Tensor& growth_tracker, const Tensor& found_inf,
                       double growth_factor, double backoff_factor, int64_t growth_interval) {
  op_amp_update_scale_(scale, growth_tracker, found_inf, growth_factor, backoff_factor,
                       growth_interval);
}
void foreach_lerp_(const TensorList& self, const TensorList& end, const Scalar& w) {
  op_foreach_lerp_(self, end, w);
}
void foreach_addcmul_(const TensorList& self, const TensorList& t1, const TensorList& t2,
                      const Scalar& v) {
  op_foreach_addcmul_(self, t1, t2, v);
}
void foreach_addcdiv_(const TensorList& self, const TensorList& t1, const TensorList& t2,
                      const Scalar& v) {
  op_foreach_addcdiv_(self, t1, t2, v);
}
TensorList foreach_sqrt(const TensorList& self) { return op_foreach_sqrt(self); }
void foreach_sqrt_(const TensorList& self) { op_foreach_sqrt_(self); }

// ---------------------------------------------------------------- operators
Tensor operator+(const Tensor& a, const Tensor& b) { return add(a, b); }
Tensor operator+(const Tensor& a, const Scalar& b) { return add(a, b); }
Tensor operator+(const Scalar& a, const Tensor& b) { return add(b, a); }
Tensor operator-(const Tensor& a, const Tensor& b) { return sub(a, b); }
Tensor operator-(const Tensor& a, const Scalar& b) { return sub(a, b); }
Tensor operator-(const Scalar& a, const Tensor& b) { return op_sub(wrap(a), b, 1); }
Tensor operator*(const Tensor& a, const Tensor& b) { return mul(a, b); }
Tensor operator*(const Tensor& a, const Scalar& b) { return mul(a, b); }
Tensor operator*(const Scalar& a, const Tensor& b) { return mul(b, a); }
Tensor operator/(const Tensor& a, const Tensor& b) { return div(a, b); }
Tensor operator/(const Tensor& a, const Scalar& b) { return div(a, b); }
Tensor operator/(const Scalar& a, const Tensor& b) { return op_div(wrap(a), b); }
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

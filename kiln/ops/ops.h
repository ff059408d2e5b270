#pragma once
// Kiln's functional API. Every function dispatches (see kiln/dispatch/op.h); errors are
// raised before anything is written. Scalar arguments promote like PyTorch's wrapped numbers.
#include <optional>
#include <string_view>
#include <vector>

#include "kiln/core/generator.h"
#include "kiln/core/tensor.h"
#include "kiln/ops/conv.h"  // conv1d/2d/3d, conv_transpose1d/2d/3d
#include "kiln/ops/distance.h"
#include "kiln/ops/embedding_bag.h"  // embedding_bag, embedding_dense_backward
#include "kiln/ops/fold.h"           // fold, unfold (sliding blocks)
#include "kiln/ops/grid_sample.h"
#include "kiln/ops/norm.h"  // batch_norm, group_norm, native_*_norm
#include "kiln/ops/pad.h"   // pad, interpolate, constant/reflection/replication pads, upsampling
#include "kiln/ops/pool.h"  // max_pool, avg_pool, adaptive_avg_pool (1-3 spatial dims)

namespace kiln {

// Threads the CPU kernels use (OpenMP loops and BLAS alike) on the calling thread; the
// default is the number of cores.
void set_num_threads(int n);
int get_num_threads();
// Whether float arithmetic on the CPU flushes denormal numbers to zero, as PyTorch's
// torch.set_flush_denormal: results too small for a normal float become 0 (FTZ) and denormal
// inputs count as 0 (DAZ), which keeps products from slowing several times when values drift
// towards zero. Set on the calling thread and the OpenMP workers of its CPU kernels (not
// OpenBLAS's own pool, nor other threads: Note [Flushing denormals] in
// kiln/backend/cpu/denormal.cpp). Returns whether this CPU supports it (x86-64: yes); off by
// default.
bool set_flush_denormal(bool on);
// Whether float32 matrix products on GPUs may use TF32 tensor cores (10-bit mantissa inputs,
// float32 accumulation), as PyTorch's torch.backends.cuda.matmul.allow_tf32. Off by default.
void set_allow_tf32(bool allow);
bool allow_tf32();
// Whether scaled_dot_product_attention may take the fused kernels (Note [Fused attention]),
// as PyTorch's torch.backends.cuda.enable_flash_sdp. On by default.
void set_fused_attention(bool enabled);
bool fused_attention();
// Whether kernels must give the same bits on every run, as PyTorch's
// torch.use_deterministic_algorithms: on CUDA, flash_attention's backward then recomputes the
// scores for dq in a kernel of its own instead of adding each key tile's share with atomics
// (whose order varies). Off by default.
void set_deterministic_algorithms(bool deterministic);
bool deterministic_algorithms();

// ---------------------------------------------------------------- factories
// dtype defaults to default_dtype() (int64 for arange/randint of integers), device to
// default_device().
Tensor empty(IntArrayRef sizes, std::optional<DType> dtype = {}, std::optional<Device> device = {});
Tensor zeros(IntArrayRef sizes, std::optional<DType> dtype = {}, std::optional<Device> device = {});
Tensor ones(IntArrayRef sizes, std::optional<DType> dtype = {}, std::optional<Device> device = {});
// dtype defaults to the value's category: bool, int64 or the default float dtype.
Tensor full(IntArrayRef sizes, const Scalar& value, std::optional<DType> dtype = {},
            std::optional<Device> device = {});
// Of a DTensor: a DTensor on its mesh (detail::set_sharded_like_factory); so are rand_like's
// and randn_like's.
Tensor empty_like(const Tensor& t);
Tensor zeros_like(const Tensor& t);
Tensor ones_like(const Tensor& t);
Tensor full_like(const Tensor& t, const Scalar& value);
namespace detail {
// What a *_like of a DTensor holds: uninitialised values (empty_like), `value` (full_like) or a
// draw from `gen` (rand_like, randn_like; null: the default generator).
struct LikeFill {
  enum class Kind { kEmpty, kFull, kRand, kRandn };
  Kind kind = Kind::kEmpty;
  const Scalar* value = nullptr;
  Generator* gen = nullptr;
};
// Makes the *_like of a DTensor; installed by kiln/dtensor.
using ShardedLikeFactory = Tensor (*)(const Tensor& like, const LikeFill& fill);
void set_sharded_like_factory(ShardedLikeFactory f);
// The same from a DTensor's layout (ShardedMetaBase::layout()), for autograd's saved geometry.
using ShardedLayoutFactory = Tensor (*)(const void* layout, const Scalar* fill);
void set_sharded_layout_factory(ShardedLayoutFactory f);
Tensor sharded_full(const void* layout, const Scalar* fill);
}  // namespace detail
// [start, end) in steps; int64 when all three are integers, else the default float dtype.
Tensor arange(const Scalar& end, std::optional<DType> dtype = {},
              std::optional<Device> device = {});
Tensor arange(const Scalar& start, const Scalar& end, const Scalar& step = 1,
              std::optional<DType> dtype = {}, std::optional<Device> device = {});
Tensor linspace(const Scalar& start, const Scalar& end, int64_t steps,
                std::optional<DType> dtype = {}, std::optional<Device> device = {});
// Uniform [0, 1), standard normal, and integers in [low, high). `gen` defaults to the
// process-wide generator (see manual_seed).
Tensor rand(IntArrayRef sizes, Generator* gen = nullptr, std::optional<DType> dtype = {},
            std::optional<Device> device = {});
Tensor randn(IntArrayRef sizes, Generator* gen = nullptr, std::optional<DType> dtype = {},
             std::optional<Device> device = {});
Tensor randint(int64_t low, int64_t high, IntArrayRef sizes, Generator* gen = nullptr,
               std::optional<DType> dtype = {}, std::optional<Device> device = {});
Tensor rand_like(const Tensor& t, Generator* gen = nullptr);
Tensor randn_like(const Tensor& t, Generator* gen = nullptr);
// A tensor holding a copy of `values` with the given shape (1-D when sizes is empty).
template <class T>
Tensor from_vector(const std::vector<T>& values, IntArrayRef sizes = {},
                   std::optional<Device> device = {});
// A 0-d tensor holding `value`: of `dtype` (default: the default dtype for a floating value,
// else the value's own type), on `device` (default: the default device).
Tensor scalar_tensor(const Scalar& value, std::optional<DType> dtype = {},
                     std::optional<Device> device = {});

// ---------------------------------------------------------------- pointwise
Tensor add(const Tensor& a, const Tensor& b, const Scalar& alpha = 1);
Tensor add(const Tensor& a, const Scalar& b, const Scalar& alpha = 1);
Tensor sub(const Tensor& a, const Tensor& b, const Scalar& alpha = 1);
Tensor sub(const Tensor& a, const Scalar& b, const Scalar& alpha = 1);
Tensor mul(const Tensor& a, const Tensor& b);
Tensor mul(const Tensor& a, const Scalar& b);
// True division: integer inputs give a floating result.
Tensor div(const Tensor& a, const Tensor& b);
Tensor div(const Tensor& a, const Scalar& b);
Tensor pow(const Tensor& a, const Tensor& b);
Tensor pow(const Tensor& a, const Scalar& b);
Tensor pow(const Scalar& a, const Tensor& b);
// Division with a rounding mode: "trunc" (towards zero) or "floor" (towards -inf), in the
// inputs' promoted dtype (integers stay integers; dividing an integer by zero throws on the CPU);
// none is true division, div(a, b). Kiln's ops are div_trunc and div_floor.
Tensor div(const Tensor& a, const Tensor& b, std::optional<std::string_view> rounding_mode);
Tensor div(const Tensor& a, const Scalar& b, std::optional<std::string_view> rounding_mode);
Tensor atan2(const Tensor& a, const Tensor& b);
// fmod: the remainder of truncated division (the sign of a); remainder: of floored division
// (the sign of b, as Python's %). Integer division by zero throws on the CPU, as in ATen.
Tensor fmod(const Tensor& a, const Tensor& b);
Tensor fmod(const Tensor& a, const Scalar& b);
Tensor remainder(const Tensor& a, const Tensor& b);
Tensor remainder(const Tensor& a, const Scalar& b);
// Bool and integer tensors only (bool: logical); a floating dtype is a TypeError.
Tensor bitwise_and(const Tensor& a, const Tensor& b);
Tensor bitwise_and(const Tensor& a, const Scalar& b);
Tensor bitwise_or(const Tensor& a, const Tensor& b);
Tensor bitwise_or(const Tensor& a, const Scalar& b);
Tensor bitwise_xor(const Tensor& a, const Tensor& b);
Tensor bitwise_xor(const Tensor& a, const Scalar& b);
Tensor bitwise_not(const Tensor& a);
Tensor maximum(const Tensor& a, const Tensor& b);
Tensor minimum(const Tensor& a, const Tensor& b);
Tensor eq(const Tensor& a, const Tensor& b);
Tensor eq(const Tensor& a, const Scalar& b);
Tensor ne(const Tensor& a, const Tensor& b);
Tensor ne(const Tensor& a, const Scalar& b);
Tensor lt(const Tensor& a, const Tensor& b);
Tensor lt(const Tensor& a, const Scalar& b);
Tensor le(const Tensor& a, const Tensor& b);
Tensor le(const Tensor& a, const Scalar& b);
Tensor gt(const Tensor& a, const Tensor& b);
Tensor gt(const Tensor& a, const Scalar& b);
Tensor ge(const Tensor& a, const Tensor& b);
Tensor ge(const Tensor& a, const Scalar& b);
Tensor logical_and(const Tensor& a, const Tensor& b);
Tensor logical_or(const Tensor& a, const Tensor& b);
Tensor logical_xor(const Tensor& a, const Tensor& b);
// The unary pointwise ops, each `Tensor name(const Tensor& self)` and, in place on self,
// `Tensor& name_(Tensor& self)` (defined in ops.cpp from this list).
#define KILN_FORALL_PUBLIC_UNARY(_) \
  _(logical_not)                    \
  _(neg)                            \
  _(abs)                            \
  _(exp)                            \
  _(log)                            \
  _(sqrt)                           \
  _(rsqrt)                          \
  _(tanh)                           \
  _(sigmoid)                        \
  _(relu)                           \
  _(silu)                           \
  _(sin)                            \
  _(cos)                            \
  _(erf)                            \
  _(acos)                           \
  _(acosh)                          \
  _(asin)                           \
  _(asinh)                          \
  _(atan)                           \
  _(atanh)                          \
  _(cosh)                           \
  _(sinh)                           \
  _(tan)                            \
  _(expm1)                          \
  _(log1p)                          \
  _(log2)                           \
  _(log10)                          \
  _(reciprocal)                     \
  _(ceil)                           \
  _(floor)                          \
  _(round)                          \
  _(trunc)                          \
  _(sign)
#define KILN_DECLARE_PUBLIC_UNARY(name) \
  Tensor name(const Tensor& self);      \
  Tensor& name##_(Tensor& self);
KILN_FORALL_PUBLIC_UNARY(KILN_DECLARE_PUBLIC_UNARY)
#undef KILN_DECLARE_PUBLIC_UNARY
// approximate = false: x * Phi(x) with erf; true: the tanh approximation.
Tensor gelu(const Tensor& a, bool approximate_tanh = false);
// grad * d/dx gelu(x), in one pass: gelu's backward formula (no double backward).
Tensor gelu_backward(const Tensor& grad, const Tensor& self, bool approximate_tanh = false);
// grad where self > threshold, else 0, in one pass (ATen's threshold_backward): relu's backward
// formula, with relu's result as self and threshold 0. A NaN self lets grad through.
Tensor threshold_backward(const Tensor& grad, const Tensor& self, const Scalar& threshold);
// round: half to even, as PyTorch. ceil, floor, round and trunc keep integer tensors as they are.
// isnan and isinf: bool results, false for integer and bool tensors (no in-place forms).
Tensor isnan(const Tensor& self);
Tensor isinf(const Tensor& self);
// clamp(self, min_val, max_val); min_val > max_val gives max_val everywhere, as PyTorch.
Tensor hardtanh(const Tensor& a, const Scalar& min_val = -1, const Scalar& max_val = 1);
// x for x > 0, else negative_slope * x (floating tensors only).
Tensor leaky_relu(const Tensor& a, const Scalar& negative_slope = 0.01);
Tensor clamp(const Tensor& a, std::optional<Scalar> min, std::optional<Scalar> max = {});
// scale * (x > 0 ? x : alpha * (exp(input_scale * x) - 1)), as ATen's elu.
Tensor elu(const Tensor& a, const Scalar& alpha = 1, const Scalar& scale = 1,
           const Scalar& input_scale = 1);
// elu's gradient from its input (is_result false) or, for alpha >= 0, its result.
Tensor elu_backward(const Tensor& grad, const Scalar& alpha, const Scalar& scale,
                    const Scalar& input_scale, bool is_result, const Tensor& self_or_result);
// Tensor bounds (either undefined for none, not both), broadcast with a: minimum(maximum(a, min),
// max), so NaN in any input gives NaN and min > max gives max, as ATen's clamp.Tensor.
Tensor clamp(const Tensor& a, const Tensor& min, const Tensor& max);
Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b);
Tensor where(const Tensor& cond, const Tensor& a, const Scalar& b);
Tensor masked_fill(const Tensor& a, const Tensor& mask, const Scalar& value);
// Cast (same as t.to(dtype)).
Tensor cast(const Tensor& t, DType dtype);

// In place on `self` (returned): one for every pointwise op of kiln/ops/op_list.h but where
// (whose in-place op writes into its bool condition), checked by tests/ops/inplace_api_test.cpp.
// The result must have self's shape and a dtype that casts to self's.
Tensor& add_(Tensor& self, const Tensor& other, const Scalar& alpha = 1);
Tensor& add_(Tensor& self, const Scalar& other, const Scalar& alpha = 1);
Tensor& sub_(Tensor& self, const Tensor& other, const Scalar& alpha = 1);
Tensor& sub_(Tensor& self, const Scalar& other, const Scalar& alpha = 1);
Tensor& mul_(Tensor& self, const Tensor& other);
Tensor& mul_(Tensor& self, const Scalar& other);
Tensor& div_(Tensor& self, const Tensor& other);
Tensor& div_(Tensor& self, const Scalar& other);
Tensor& pow_(Tensor& self, const Tensor& exponent);
Tensor& pow_(Tensor& self, const Scalar& exponent);
Tensor& div_(Tensor& self, const Tensor& other, std::optional<std::string_view> rounding_mode);
Tensor& div_(Tensor& self, const Scalar& other, std::optional<std::string_view> rounding_mode);
Tensor& atan2_(Tensor& self, const Tensor& other);
Tensor& fmod_(Tensor& self, const Tensor& other);
Tensor& fmod_(Tensor& self, const Scalar& other);
Tensor& remainder_(Tensor& self, const Tensor& other);
Tensor& remainder_(Tensor& self, const Scalar& other);
Tensor& bitwise_and_(Tensor& self, const Tensor& other);
Tensor& bitwise_and_(Tensor& self, const Scalar& other);
Tensor& bitwise_or_(Tensor& self, const Tensor& other);
Tensor& bitwise_or_(Tensor& self, const Scalar& other);
Tensor& bitwise_xor_(Tensor& self, const Tensor& other);
Tensor& bitwise_xor_(Tensor& self, const Scalar& other);
Tensor& bitwise_not_(Tensor& self);
Tensor& maximum_(Tensor& self, const Tensor& other);
Tensor& minimum_(Tensor& self, const Tensor& other);
// Comparisons in place write 1 or 0 in self's dtype.
Tensor& eq_(Tensor& self, const Tensor& other);
Tensor& eq_(Tensor& self, const Scalar& other);
Tensor& ne_(Tensor& self, const Tensor& other);
Tensor& ne_(Tensor& self, const Scalar& other);
Tensor& lt_(Tensor& self, const Tensor& other);
Tensor& lt_(Tensor& self, const Scalar& other);
Tensor& le_(Tensor& self, const Tensor& other);
Tensor& le_(Tensor& self, const Scalar& other);
Tensor& gt_(Tensor& self, const Tensor& other);
Tensor& gt_(Tensor& self, const Scalar& other);
Tensor& ge_(Tensor& self, const Tensor& other);
Tensor& ge_(Tensor& self, const Scalar& other);
Tensor& logical_and_(Tensor& self, const Tensor& other);
Tensor& logical_or_(Tensor& self, const Tensor& other);
Tensor& logical_xor_(Tensor& self, const Tensor& other);
// (and the unary ops' name_, declared above with KILN_FORALL_PUBLIC_UNARY)
Tensor& gelu_(Tensor& self, bool approximate_tanh = false);
Tensor& hardtanh_(Tensor& self, const Scalar& min_val = -1, const Scalar& max_val = 1);
Tensor& leaky_relu_(Tensor& self, const Scalar& negative_slope = 0.01);
Tensor& clamp_(Tensor& self, std::optional<Scalar> min, std::optional<Scalar> max = {});
Tensor& elu_(Tensor& self, const Scalar& alpha = 1, const Scalar& scale = 1,
             const Scalar& input_scale = 1);
Tensor& clamp_(Tensor& self, const Tensor& min, const Tensor& max);
// self += value * t1 * t2 and self += value * t1 / t2.
Tensor& addcmul_(Tensor& self, const Tensor& t1, const Tensor& t2, const Scalar& value = 1);
Tensor& addcdiv_(Tensor& self, const Tensor& t1, const Tensor& t2, const Scalar& value = 1);
// self += weight * (end - self).
Tensor& lerp_(Tensor& self, const Tensor& end, const Scalar& weight);

// out= variants: `out` must already have the result's shape (no resizing) and a dtype the
// result can be cast to; it may not overlap the inputs.
Tensor& add_out(Tensor& out, const Tensor& a, const Tensor& b, const Scalar& alpha = 1);
Tensor& sub_out(Tensor& out, const Tensor& a, const Tensor& b, const Scalar& alpha = 1);
Tensor& mul_out(Tensor& out, const Tensor& a, const Tensor& b);
Tensor& div_out(Tensor& out, const Tensor& a, const Tensor& b);
Tensor& mm_out(Tensor& out, const Tensor& a, const Tensor& b);
Tensor& sum_out(Tensor& out, const Tensor& a, IntArrayRef dims = {}, bool keepdim = false);

// ---------------------------------------------------------------- reductions
// `dims` empty means every dim.
Tensor sum(const Tensor& a, IntArrayRef dims = {}, bool keepdim = false,
           std::optional<DType> dtype = {});
Tensor mean(const Tensor& a, IntArrayRef dims = {}, bool keepdim = false,
            std::optional<DType> dtype = {});
// correction 1 is the unbiased estimator.
Tensor var(const Tensor& a, IntArrayRef dims = {}, int64_t correction = 1, bool keepdim = false);
Tensor amax(const Tensor& a, IntArrayRef dims = {}, bool keepdim = false);
Tensor amin(const Tensor& a, IntArrayRef dims = {}, bool keepdim = false);
// Max/min over all elements.
Tensor max(const Tensor& a);
Tensor min(const Tensor& a);
// (values, indices) along `dim`; ties give the first index.
std::tuple<Tensor, Tensor> max(const Tensor& a, int64_t dim, bool keepdim = false);
std::tuple<Tensor, Tensor> min(const Tensor& a, int64_t dim, bool keepdim = false);
Tensor argmax(const Tensor& a, std::optional<int64_t> dim = {}, bool keepdim = false);
Tensor argmin(const Tensor& a, std::optional<int64_t> dim = {}, bool keepdim = false);
Tensor all(const Tensor& a, IntArrayRef dims = {}, bool keepdim = false);
Tensor any(const Tensor& a, IntArrayRef dims = {}, bool keepdim = false);
Tensor softmax(const Tensor& a, int64_t dim);
Tensor log_softmax(const Tensor& a, int64_t dim);

// Product over `dim` (all elements when none); integer and bool inputs give int64, as ATen.
Tensor prod(const Tensor& a, std::optional<int64_t> dim = {}, bool keepdim = false,
            std::optional<DType> dtype = {});
// Inclusive running sum along `dim`; integer and bool inputs give int64, as ATen.
Tensor cumsum(const Tensor& a, int64_t dim, std::optional<DType> dtype = {});
// (values, indices) sorted along `dim`. The sort is stable (equal elements keep their order)
// and NaN sorts as the largest value, as ATen's sort(stable=True).
std::tuple<Tensor, Tensor> sort(const Tensor& a, int64_t dim = -1, bool descending = false);
// The k largest (smallest) elements along `dim` with their indices, in sorted order when
// `sorted` (Note [topk order] in kiln/ops/sort_meta.cpp).
std::tuple<Tensor, Tensor> topk(const Tensor& a, int64_t k, int64_t dim = -1, bool largest = true,
                                bool sorted = true);
// ---------------------------------------------------------------- linear algebra
Tensor mm(const Tensor& a, const Tensor& b);
Tensor bmm(const Tensor& a, const Tensor& b);
// beta * self + alpha * (a @ b)
Tensor addmm(const Tensor& self, const Tensor& a, const Tensor& b, const Scalar& beta = 1,
             const Scalar& alpha = 1);
// NumPy matmul semantics: 1-D, 2-D and batched with broadcasting of batch dims.
Tensor matmul(const Tensor& a, const Tensor& b);
// x @ weight^T + bias; weight is [out, in], bias [out] or undefined.
Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias = {});
// Note [GELU epilogue]
// addmm_gelu(bias, mat1, mat2) is (gelu(z, tanh approximation), z) for z = mat1 @ mat2 + bias:
// mat1 [m, k], mat2 [k, n], bias an n-vector or undefined. On CUDA one cuBLASLt product computes
// both (epilogue GELU_AUX_BIAS) for float16 and bfloat16 when n is a multiple of 8; elsewhere
// (and for float32, where it measured slower) it is addmm then gelu. The preactivation z is what
// the backward needs (gelu_backward of z, then addmm's gradients). cuBLASLt's GELU is the tanh
// form, so this is PyTorch's gelu(approximate="tanh") (GPT-2's), not the exact erf form of gelu(x).
std::tuple<Tensor, Tensor> addmm_gelu(const Tensor& bias, const Tensor& mat1, const Tensor& mat2);
// gelu(linear(x, weight, bias), tanh approximation) through addmm_gelu: x [..., in].
Tensor linear_gelu(const Tensor& x, const Tensor& weight, const Tensor& bias = {});

// ---------------------------------------------------------------- neural-net functions
Tensor layer_norm(const Tensor& x, IntArrayRef normalized_shape, const Tensor& weight = {},
                  const Tensor& bias = {}, double eps = 1e-5);
Tensor rms_norm(const Tensor& x, IntArrayRef normalized_shape, const Tensor& weight = {},
                double eps = 1e-6);
// The gradient of layer_norm(x, normalized_shape, weight, bias, eps) with respect to x, given
// the gradient of its output, in one pass per row (what layer_norm's backward uses).
Tensor layer_norm_backward(const Tensor& grad, const Tensor& x, IntArrayRef normalized_shape,
                           const Tensor& weight = {}, double eps = 1e-5);
// The rows of weight at indices, as at::embedding. Row padding_idx (negative: none) gets no
// gradient; scale_grad_by_freq divides each row's gradient by how often its index occurs;
// sparse=true is refused (Kiln has no sparse tensors).
Tensor embedding(const Tensor& weight, const Tensor& indices, int64_t padding_idx = -1,
                 bool scale_grad_by_freq = false, bool sparse = false);
// Mean negative log-likelihood over targets != ignore_index. input is [N, C] log-probabilities.
Tensor nll_loss(const Tensor& log_probs, const Tensor& target, int64_t ignore_index = -100);
// log_softmax + nll_loss over the last dim of [N, C] logits.
Tensor cross_entropy(const Tensor& logits, const Tensor& target, int64_t ignore_index = -100);
// In training, zeroes each element with probability p and scales the rest by 1/(1-p).
Tensor dropout(const Tensor& x, double p, bool train = true, Generator* gen = nullptr);
// softmax(q k^T * scale + mask) v over [..., L, E] inputs. mask is a bool tensor (true = keep)
// or an additive float tensor; causal masks out keys after each query.
// On a device whose backend has flash_attention kernels of its own (CUDA) this runs
// flash_attention when it can: no attn_mask, key and value with query's leading dims and
// embedding size, a 16- or 32-bit float dtype, E <= 128. Elsewhere (the CPU, sim) it runs
// the math path: matmul, softmax, matmul.
Tensor scaled_dot_product_attention(const Tensor& q, const Tensor& k, const Tensor& v,
                                    const Tensor& attn_mask = {}, bool is_causal = false,
                                    std::optional<double> scale = {});
// Note [Fused attention]
// flash_attention(q, k, v) is softmax(q k^T * scale [causal: key j > query i masked]) v in one
// kernel that never holds the L x S scores (FlashAttention-2: tiles of queries and keys, an
// online softmax). It also returns the logsumexp of each query's scores ([..., L], float32, or
// float64 for float64 inputs), which its backward uses to recompute the probabilities;
// flash_attention_backward gives the gradients of q, k and v (the logsumexp output itself
// carries no gradient). q, k and v are [..., L or S, E] with the same leading dims. On CUDA
// the kernels take head dims up to 128 in float32 (exact, or with TF32 tensor cores where
// allow_tf32() is set), float16 and bfloat16 (tensor cores, float32 accumulation); float64 and
// wider heads run a composite of ops there that holds the scores (flash_attention_math).
std::tuple<Tensor, Tensor> flash_attention(const Tensor& q, const Tensor& k, const Tensor& v,
                                           bool is_causal = false,
                                           std::optional<double> scale = {});
std::tuple<Tensor, Tensor, Tensor> flash_attention_backward(
    const Tensor& grad_out, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
    const Tensor& logsumexp, bool is_causal = false, std::optional<double> scale = {});

// ---------------------------------------------------------------- views and shapes
// Views share storage with the input; writes through one are seen by the other.
Tensor view(const Tensor& t, IntArrayRef sizes);
// A view when the strides allow it, else a copy.
Tensor reshape(const Tensor& t, IntArrayRef sizes);
Tensor permute(const Tensor& t, IntArrayRef dims);
Tensor transpose(const Tensor& t, int64_t dim0, int64_t dim1);
// Transpose of a tensor of at most 2 dims.
Tensor t(const Tensor& t);
Tensor narrow(const Tensor& t, int64_t dim, int64_t start, int64_t length);
Tensor slice(const Tensor& t, int64_t dim, int64_t start, int64_t end, int64_t step = 1);
Tensor select(const Tensor& t, int64_t dim, int64_t index);
Tensor expand(const Tensor& t, IntArrayRef sizes);
Tensor expand_as(const Tensor& t, const Tensor& other);
Tensor squeeze(const Tensor& t, std::optional<int64_t> dim = {});
Tensor unsqueeze(const Tensor& t, int64_t dim);
// Drops the listed dims that have size 1 (others stay, as ATen's squeeze.dims).
Tensor squeeze(const Tensor& t, IntArrayRef dims);
// The diagonal of dims dim1 and dim2 (shifted by offset) as a view, its dim last.
Tensor diagonal(const Tensor& t, int64_t offset = 0, int64_t dim1 = 0, int64_t dim2 = 1);
// Reverses the listed dims (a copy).
Tensor flip(const Tensor& t, IntArrayRef dims);
// Tiles t `repeats[i]` times along dim i (repeats may have more dims than t: new leading dims).
Tensor repeat(const Tensor& t, IntArrayRef repeats);
Tensor flatten(const Tensor& t, int64_t start_dim = 0, int64_t end_dim = -1);
Tensor as_strided(const Tensor& t, IntArrayRef sizes, IntArrayRef strides,
                  std::optional<int64_t> storage_offset = {});
Tensor detach(const Tensor& t);
Tensor contiguous(const Tensor& t);
Tensor clone(const Tensor& t);
Tensor cat(const std::vector<Tensor>& tensors, int64_t dim = 0);
Tensor stack(const std::vector<Tensor>& tensors, int64_t dim = 0);
// Pieces of `split_size` along dim (the last may be smaller).
std::vector<Tensor> split(const Tensor& t, int64_t split_size, int64_t dim = 0);
std::vector<Tensor> split(const Tensor& t, IntArrayRef sizes, int64_t dim = 0);
std::vector<Tensor> chunk(const Tensor& t, int64_t chunks, int64_t dim = 0);

// ---------------------------------------------------------------- indexing
Tensor index_select(const Tensor& t, int64_t dim, const Tensor& index);
Tensor gather(const Tensor& t, int64_t dim, const Tensor& index);
// A copy of self with src added at index along dim (in-place variants below).
Tensor scatter_add(const Tensor& self, int64_t dim, const Tensor& index, const Tensor& src);
Tensor index_add(const Tensor& self, int64_t dim, const Tensor& index, const Tensor& source,
                 const Scalar& alpha = 1);
Tensor& scatter_add_(Tensor& self, int64_t dim, const Tensor& index, const Tensor& src);
Tensor& index_add_(Tensor& self, int64_t dim, const Tensor& index, const Tensor& source,
                   const Scalar& alpha = 1);
// Advanced indexing (ATen's index.Tensor): self at the index tensors, one per leading dim (an
// undefined tensor keeps its dim whole); int64/int32 indices broadcast together, a bool/uint8
// mask stands for its nonzero() positions (a host read). See Note [Advanced indexing].
Tensor index(const Tensor& self, const std::vector<Tensor>& indices);
// A copy of self with `values` written (accumulate: added) at the indexed positions.
Tensor index_put(const Tensor& self, const std::vector<Tensor>& indices, const Tensor& values,
                 bool accumulate = false);
Tensor& index_put_(Tensor& self, const std::vector<Tensor>& indices, const Tensor& values,
                   bool accumulate = false);
// A copy of self with src[p] (or `value`) written at index[p] along dim (a repeated position
// keeps one of its values, unspecified as in ATen); scatter_ in place.
Tensor scatter(const Tensor& self, int64_t dim, const Tensor& index, const Tensor& src);
Tensor scatter(const Tensor& self, int64_t dim, const Tensor& index, const Scalar& value);
Tensor& scatter_(Tensor& self, int64_t dim, const Tensor& index, const Tensor& src);
Tensor& scatter_(Tensor& self, int64_t dim, const Tensor& index, const Scalar& value);
// A copy of self with each src[p] reduced into the position index[p] names along dim, as
// torch.scatter_reduce: reduce "sum", "prod", "mean", "amax" or "amin"; include_self=false
// leaves self's value out where some index writes (Note [scatter_reduce]). scatter_reduce_ in
// place.
Tensor scatter_reduce(const Tensor& self, int64_t dim, const Tensor& index, const Tensor& src,
                      std::string_view reduce, bool include_self = true);
Tensor& scatter_reduce_(Tensor& self, int64_t dim, const Tensor& index, const Tensor& src,
                        std::string_view reduce, bool include_self = true);
// A copy of self with src written into self.select(dim, index) / self.slice(dim, start, end,
// step) (src has that view's shape).
Tensor select_scatter(const Tensor& self, const Tensor& src, int64_t dim, int64_t index);
Tensor slice_scatter(const Tensor& self, const Tensor& src, int64_t dim = 0,
                     std::optional<int64_t> start = {}, std::optional<int64_t> end = {},
                     int64_t step = 1);
// self where mask is false; where it is true, source's elements in order (mask broadcasts to
// self; source has at least as many elements as mask has trues).
Tensor masked_scatter(const Tensor& self, const Tensor& mask, const Tensor& source);
// The coordinates of self's nonzero elements, int64 [n, self.dim()] in row-major order. n
// depends on the data: a host read (a graph break under kiln::compile).
Tensor nonzero(const Tensor& self);
Tensor triu(const Tensor& t, int64_t diagonal = 0);
Tensor tril(const Tensor& t, int64_t diagonal = 0);
// num_classes -1 infers max + 1 from the data (a host read).
Tensor one_hot(const Tensor& t, int64_t num_classes = -1);

// ---------------------------------------------------------------- multi-tensor updates
void foreach_add_(const std::vector<Tensor>& self, const std::vector<Tensor>& other,
                  const Scalar& alpha = 1);
void foreach_mul_(const std::vector<Tensor>& self, const Scalar& scalar);
void foreach_mul_(const std::vector<Tensor>& self, const std::vector<Tensor>& other);
void foreach_lerp_(const std::vector<Tensor>& self, const std::vector<Tensor>& end,
                   const Scalar& weight);
void foreach_addcmul_(const std::vector<Tensor>& self, const std::vector<Tensor>& t1,
                      const std::vector<Tensor>& t2, const Scalar& value = 1);
void foreach_addcdiv_(const std::vector<Tensor>& self, const std::vector<Tensor>& t1,
                      const std::vector<Tensor>& t2, const Scalar& value = 1);
std::vector<Tensor> foreach_sqrt(const std::vector<Tensor>& self);
// One fused AdamW step (PyTorch's AdamW arithmetic) over parameters, gradients and both
// moment lists, in place. `steps` (0-d float64, one per parameter) count the steps taken and
// are incremented first; `lr` is a 0-d float64 tensor. Both live on the device, so a compiled
// step replays with the current values (PyTorch's "capturable" AdamW). When `found_inf` (0-d
// float32 beside lr) is given and nonzero on the device, nothing is written (a skipped step).
void foreach_adamw_(const std::vector<Tensor>& params, const std::vector<Tensor>& grads,
                    const std::vector<Tensor>& exp_avg, const std::vector<Tensor>& exp_avg_sq,
                    const std::vector<Tensor>& steps, const Tensor& lr, double beta1, double beta2,
                    double eps, double weight_decay, const Tensor& found_inf = {});
// Loss scaling (PyTorch's _amp_foreach_non_finite_check_and_unscale_): self[i] *= inv_scale
// (0-d float32) and found_inf (0-d float32) set to 1 when any element of any self[i] is inf or
// NaN (never reset to 0). Everything on found_inf's device; nothing is read on the host.
void amp_non_finite_check_and_unscale_(const std::vector<Tensor>& self, const Tensor& found_inf,
                                       const Tensor& inv_scale);
// PyTorch's _amp_update_scale_ on the device: when found_inf (0-d float32) is nonzero, scale
// (0-d float32) *= backoff_factor and growth_tracker (0-d int32) = 0; else the tracker counts
// up and on reaching growth_interval scale *= growth_factor (kept only if finite), tracker = 0.
void amp_update_scale_(const Tensor& scale, const Tensor& growth_tracker, const Tensor& found_inf,
                       double growth_factor, double backoff_factor, int64_t growth_interval);
void foreach_sqrt_(const std::vector<Tensor>& self);

// ---------------------------------------------------------------- operators
Tensor operator+(const Tensor& a, const Tensor& b);
Tensor operator+(const Tensor& a, const Scalar& b);
Tensor operator+(const Scalar& a, const Tensor& b);
Tensor operator-(const Tensor& a, const Tensor& b);
Tensor operator-(const Tensor& a, const Scalar& b);
Tensor operator-(const Scalar& a, const Tensor& b);
Tensor operator*(const Tensor& a, const Tensor& b);
Tensor operator*(const Tensor& a, const Scalar& b);
Tensor operator*(const Scalar& a, const Tensor& b);
Tensor operator/(const Tensor& a, const Tensor& b);
Tensor operator/(const Tensor& a, const Scalar& b);
Tensor operator/(const Scalar& a, const Tensor& b);
Tensor operator-(const Tensor& a);

// Whether a and b have the same shape and all elements satisfy |a - b| <= atol + rtol * |b|
// (NaNs equal when equal_nan).
bool allclose(const Tensor& a, const Tensor& b, double rtol = 1e-5, double atol = 1e-8,
              bool equal_nan = false);
bool equal(const Tensor& a, const Tensor& b);

}  // namespace kiln

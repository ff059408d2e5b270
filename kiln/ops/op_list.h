#pragma once
// Every op Kiln defines, in three X-macro lists. Adding an op here without its meta function
// and CPU kernel fails tests/ops/op_registry_test.cpp.
//
// KILN_FORALL_POINTWISE(_): _(name, ARGS, schema) defines three ops from one meta function and
//   one kernel per backend: `name` (returns a new tensor), `name_` (in place on the first
//   argument) and `name_out` (writes into a given `out`, its first argument).
// KILN_FORALL_STRUCTURED(_): like the above, without the in-place variant.
// KILN_FORALL_OTHER_OPS(_): _(name, kind, signature, schema), kernels written per op.
#include <optional>
#include <tuple>

#include "kiln/dispatch/op.h"

namespace kiln {
using TensorPair = std::tuple<Tensor, Tensor>;
using TensorTriple = std::tuple<Tensor, Tensor, Tensor>;
using TensorQuad = std::tuple<Tensor, Tensor, Tensor, Tensor>;
using OptScalar = std::optional<Scalar>;
using OptInt = std::optional<int64_t>;
using OptDouble = std::optional<double>;
using OptDType = std::optional<DType>;
}  // namespace kiln

namespace kiln::ops {

#define KILN_FORALL_POINTWISE(_)                                                           \
  _(add, (const Tensor&, const Tensor&, const Scalar&),                                    \
    "add(Tensor self, Tensor other, Scalar alpha=1)")                                      \
  _(sub, (const Tensor&, const Tensor&, const Scalar&),                                    \
    "sub(Tensor self, Tensor other, Scalar alpha=1)")                                      \
  _(mul, (const Tensor&, const Tensor&), "mul(Tensor self, Tensor other)")                 \
  _(div, (const Tensor&, const Tensor&), "div(Tensor self, Tensor other)")                 \
  _(pow, (const Tensor&, const Tensor&), "pow(Tensor self, Tensor exponent)")              \
  _(maximum, (const Tensor&, const Tensor&), "maximum(Tensor self, Tensor other)")         \
  _(minimum, (const Tensor&, const Tensor&), "minimum(Tensor self, Tensor other)")         \
  _(eq, (const Tensor&, const Tensor&), "eq(Tensor self, Tensor other)")                   \
  _(ne, (const Tensor&, const Tensor&), "ne(Tensor self, Tensor other)")                   \
  _(lt, (const Tensor&, const Tensor&), "lt(Tensor self, Tensor other)")                   \
  _(le, (const Tensor&, const Tensor&), "le(Tensor self, Tensor other)")                   \
  _(gt, (const Tensor&, const Tensor&), "gt(Tensor self, Tensor other)")                   \
  _(ge, (const Tensor&, const Tensor&), "ge(Tensor self, Tensor other)")                   \
  _(logical_and, (const Tensor&, const Tensor&), "logical_and(Tensor self, Tensor other)") \
  _(logical_or, (const Tensor&, const Tensor&), "logical_or(Tensor self, Tensor other)")   \
  _(logical_xor, (const Tensor&, const Tensor&), "logical_xor(Tensor self, Tensor other)") \
  _(atan2, (const Tensor&, const Tensor&), "atan2(Tensor self, Tensor other)")             \
  _(fmod, (const Tensor&, const Tensor&), "fmod(Tensor self, Tensor other)")               \
  _(remainder, (const Tensor&, const Tensor&), "remainder(Tensor self, Tensor other)")     \
  _(div_trunc, (const Tensor&, const Tensor&), "div_trunc(Tensor self, Tensor other)")     \
  _(div_floor, (const Tensor&, const Tensor&), "div_floor(Tensor self, Tensor other)")     \
  _(bitwise_and, (const Tensor&, const Tensor&), "bitwise_and(Tensor self, Tensor other)") \
  _(bitwise_or, (const Tensor&, const Tensor&), "bitwise_or(Tensor self, Tensor other)")   \
  _(bitwise_xor, (const Tensor&, const Tensor&), "bitwise_xor(Tensor self, Tensor other)") \
  _(bitwise_not, (const Tensor&), "bitwise_not(Tensor self)")                              \
  _(neg, (const Tensor&), "neg(Tensor self)")                                              \
  _(abs, (const Tensor&), "abs(Tensor self)")                                              \
  _(exp, (const Tensor&), "exp(Tensor self)")                                              \
  _(log, (const Tensor&), "log(Tensor self)")                                              \
  _(sqrt, (const Tensor&), "sqrt(Tensor self)")                                            \
  _(rsqrt, (const Tensor&), "rsqrt(Tensor self)")                                          \
  _(tanh, (const Tensor&), "tanh(Tensor self)")                                            \
  _(sigmoid, (const Tensor&), "sigmoid(Tensor self)")                                      \
  _(relu, (const Tensor&), "relu(Tensor self)")                                            \
  _(silu, (const Tensor&), "silu(Tensor self)")                                            \
  _(sin, (const Tensor&), "sin(Tensor self)")                                              \
  _(cos, (const Tensor&), "cos(Tensor self)")                                              \
  _(erf, (const Tensor&), "erf(Tensor self)")                                              \
  _(acos, (const Tensor&), "acos(Tensor self)")                                            \
  _(acosh, (const Tensor&), "acosh(Tensor self)")                                          \
  _(asin, (const Tensor&), "asin(Tensor self)")                                            \
  _(asinh, (const Tensor&), "asinh(Tensor self)")                                          \
  _(atan, (const Tensor&), "atan(Tensor self)")                                            \
  _(atanh, (const Tensor&), "atanh(Tensor self)")                                          \
  _(cosh, (const Tensor&), "cosh(Tensor self)")                                            \
  _(sinh, (const Tensor&), "sinh(Tensor self)")                                            \
  _(tan, (const Tensor&), "tan(Tensor self)")                                              \
  _(expm1, (const Tensor&), "expm1(Tensor self)")                                          \
  _(log1p, (const Tensor&), "log1p(Tensor self)")                                          \
  _(log2, (const Tensor&), "log2(Tensor self)")                                            \
  _(log10, (const Tensor&), "log10(Tensor self)")                                          \
  _(reciprocal, (const Tensor&), "reciprocal(Tensor self)")                                \
  _(ceil, (const Tensor&), "ceil(Tensor self)")                                            \
  _(floor, (const Tensor&), "floor(Tensor self)")                                          \
  _(round, (const Tensor&), "round(Tensor self)")                                          \
  _(trunc, (const Tensor&), "trunc(Tensor self)")                                          \
  _(sign, (const Tensor&), "sign(Tensor self)")                                            \
  _(isnan, (const Tensor&), "isnan(Tensor self)")                                          \
  _(isinf, (const Tensor&), "isinf(Tensor self)")                                          \
  _(hardtanh, (const Tensor&, const Scalar&, const Scalar&),                               \
    "hardtanh(Tensor self, Scalar min_val=-1, Scalar max_val=1)")                          \
  _(leaky_relu, (const Tensor&, const Scalar&),                                            \
    "leaky_relu(Tensor self, Scalar negative_slope=0.01)")                                 \
  _(elu, (const Tensor&, const Scalar&, const Scalar&, const Scalar&),                     \
    "elu(Tensor self, Scalar alpha=1, Scalar scale=1, Scalar input_scale=1)")              \
  _(logical_not, (const Tensor&), "logical_not(Tensor self)")                              \
  _(gelu, (const Tensor&, bool), "gelu(Tensor self, bool approximate_tanh=False)")         \
  _(clamp, (const Tensor&, const OptScalar&, const OptScalar&),                            \
    "clamp(Tensor self, Scalar? min=None, Scalar? max=None)")                              \
  _(where, (const Tensor&, const Tensor&, const Tensor&),                                  \
    "where(Tensor condition, Tensor self, Tensor other)")

#define KILN_FORALL_STRUCTURED(_)                                                                  \
  _(sum, (const Tensor&, IntArrayRef, bool, const OptDType&),                                      \
    "sum(Tensor self, int[] dim=[], bool keepdim=False, DType? dtype=None)")                       \
  _(mean, (const Tensor&, IntArrayRef, bool, const OptDType&),                                     \
    "mean(Tensor self, int[] dim=[], bool keepdim=False, DType? dtype=None)")                      \
  _(var, (const Tensor&, IntArrayRef, int64_t, bool),                                              \
    "var(Tensor self, int[] dim=[], int correction=1, bool keepdim=False)")                        \
  _(amax, (const Tensor&, IntArrayRef, bool),                                                      \
    "amax(Tensor self, int[] dim=[], bool keepdim=False)")                                         \
  _(amin, (const Tensor&, IntArrayRef, bool),                                                      \
    "amin(Tensor self, int[] dim=[], bool keepdim=False)")                                         \
  _(all, (const Tensor&, IntArrayRef, bool), "all(Tensor self, int[] dim=[], bool keepdim=False)") \
  _(any, (const Tensor&, IntArrayRef, bool), "any(Tensor self, int[] dim=[], bool keepdim=False)") \
  _(argmax, (const Tensor&, const OptInt&, bool),                                                  \
    "argmax(Tensor self, int? dim=None, bool keepdim=False)")                                      \
  _(argmin, (const Tensor&, const OptInt&, bool),                                                  \
    "argmin(Tensor self, int? dim=None, bool keepdim=False)")                                      \
  _(cumsum, (const Tensor&, int64_t, const OptDType&),                                             \
    "cumsum(Tensor self, int dim, DType? dtype=None)")                                             \
  _(prod, (const Tensor&, const OptInt&, bool, const OptDType&),                                   \
    "prod(Tensor self, int? dim=None, bool keepdim=False, DType? dtype=None)")                     \
  _(softmax, (const Tensor&, int64_t), "softmax(Tensor self, int dim)")                            \
  _(log_softmax, (const Tensor&, int64_t), "log_softmax(Tensor self, int dim)")                    \
  _(mm, (const Tensor&, const Tensor&), "mm(Tensor self, Tensor mat2)")                            \
  _(bmm, (const Tensor&, const Tensor&), "bmm(Tensor self, Tensor mat2)")                          \
  _(addmm, (const Tensor&, const Tensor&, const Tensor&, const Scalar&, const Scalar&),            \
    "addmm(Tensor self, Tensor mat1, Tensor mat2, Scalar beta=1, Scalar alpha=1)")                 \
  _(layer_norm, (const Tensor&, IntArrayRef, const Tensor&, const Tensor&, double),                \
    "layer_norm(Tensor input, int[] normalized_shape, Tensor? weight, Tensor? bias, "              \
    "float eps=1e-5)")                                                                             \
  _(rms_norm, (const Tensor&, IntArrayRef, const Tensor&, double),                                 \
    "rms_norm(Tensor input, int[] normalized_shape, Tensor? weight, float eps=1e-6)")              \
  _(embedding, (const Tensor&, const Tensor&, int64_t, bool, bool),                                \
    "embedding(Tensor weight, Tensor indices, int padding_idx=-1, bool scale_grad_by_freq=False, " \
    "bool sparse=False)")                                                                          \
  _(embedding_dense_backward, (const Tensor&, const Tensor&, int64_t, int64_t, bool),              \
    "embedding_dense_backward(Tensor grad_output, Tensor indices, int num_weights, int "           \
    "padding_idx, bool scale_grad_by_freq)")                                                       \
  _(nll_loss, (const Tensor&, const Tensor&, int64_t),                                             \
    "nll_loss(Tensor self, Tensor target, int ignore_index=-100)")                                 \
  _(cat, (const TensorList&, int64_t), "cat(Tensor[] tensors, int dim=0)")                         \
  _(index_select, (const Tensor&, int64_t, const Tensor&),                                         \
    "index_select(Tensor self, int dim, Tensor index)")                                            \
  _(gather, (const Tensor&, int64_t, const Tensor&), "gather(Tensor self, int dim, Tensor index)") \
  _(scatter_add, (const Tensor&, int64_t, const Tensor&, const Tensor&),                           \
    "scatter_add(Tensor self, int dim, Tensor index, Tensor src)")                                 \
  _(index_add, (const Tensor&, int64_t, const Tensor&, const Tensor&, const Scalar&),              \
    "index_add(Tensor self, int dim, Tensor index, Tensor source, Scalar alpha=1)")                \
  _(index, (const Tensor&, const TensorList&), "index(Tensor self, Tensor?[] indices)")            \
  _(index_put, (const Tensor&, const TensorList&, const Tensor&, bool),                            \
    "index_put(Tensor self, Tensor?[] indices, Tensor values, bool accumulate=False)")             \
  _(scatter, (const Tensor&, int64_t, const Tensor&, const Tensor&),                               \
    "scatter(Tensor self, int dim, Tensor index, Tensor src)")                                     \
  /* reduce: 0 sum, 1 prod, 2 mean, 3 amax, 4 amin (ATen's str; Note [scatter_reduce]) */          \
  _(scatter_reduce, (const Tensor&, int64_t, const Tensor&, const Tensor&, int64_t, bool),         \
    "scatter_reduce(Tensor self, int dim, Tensor index, Tensor src, int reduce, bool "             \
    "include_self=True)")                                                                          \
  _(select_scatter, (const Tensor&, const Tensor&, int64_t, int64_t),                              \
    "select_scatter(Tensor self, Tensor src, int dim, int index)")                                 \
  _(slice_scatter, (const Tensor&, const Tensor&, int64_t, const OptInt&, const OptInt&, int64_t), \
    "slice_scatter(Tensor self, Tensor src, int dim=0, int? start=None, int? end=None, int "       \
    "step=1)")                                                                                     \
  _(triu, (const Tensor&, int64_t), "triu(Tensor self, int diagonal=0)")                           \
  _(tril, (const Tensor&, int64_t), "tril(Tensor self, int diagonal=0)")                           \
  _(flip, (const Tensor&, IntArrayRef), "flip(Tensor self, int[] dims)")                           \
  _(repeat, (const Tensor&, IntArrayRef), "repeat(Tensor self, int[] repeats)")                    \
  _(elu_backward,                                                                                  \
    (const Tensor&, const Scalar&, const Scalar&, const Scalar&, bool, const Tensor&),             \
    "elu_backward(Tensor grad_output, Scalar alpha, Scalar scale, Scalar input_scale, bool "       \
    "is_result, Tensor self_or_result)")                                                           \
  _(one_hot, (const Tensor&, int64_t), "one_hot(Tensor self, int num_classes)")                    \
  _(gelu_backward, (const Tensor&, const Tensor&, bool),                                           \
    "gelu_backward(Tensor grad_output, Tensor self, bool approximate_tanh=False)")                 \
  _(threshold_backward, (const Tensor&, const Tensor&, const Scalar&),                             \
    "threshold_backward(Tensor grad_output, Tensor self, Scalar threshold)")                       \
  _(layer_norm_backward, (const Tensor&, const Tensor&, IntArrayRef, const Tensor&, double),       \
    "layer_norm_backward(Tensor grad_output, Tensor input, int[] normalized_shape, Tensor? "       \
    "weight, "                                                                                     \
    "float eps=1e-5)")

#define KILN_FORALL_OTHER_OPS(_)                                                                   \
  /* views: share storage, no kernel work; one kernel serves every backend */                      \
  _(view, View, Tensor(const Tensor&, IntArrayRef),                                                \
    "view(Tensor(a) self, int[] size) -> Tensor(a)")                                               \
  _(as_strided, View, Tensor(const Tensor&, IntArrayRef, IntArrayRef, int64_t),                    \
    "as_strided(Tensor(a) self, int[] size, int[] stride, int storage_offset) -> Tensor(a)")       \
  _(permute, View, Tensor(const Tensor&, IntArrayRef),                                             \
    "permute(Tensor(a) self, int[] dims) -> Tensor(a)")                                            \
  _(transpose, View, Tensor(const Tensor&, int64_t, int64_t),                                      \
    "transpose(Tensor(a) self, int dim0, int dim1) -> Tensor(a)")                                  \
  _(slice, View, Tensor(const Tensor&, int64_t, int64_t, int64_t, int64_t),                        \
    "slice(Tensor(a) self, int dim, int start, int end, int step=1) -> Tensor(a)")                 \
  _(select, View, Tensor(const Tensor&, int64_t, int64_t),                                         \
    "select(Tensor(a) self, int dim, int index) -> Tensor(a)")                                     \
  _(expand, View, Tensor(const Tensor&, IntArrayRef),                                              \
    "expand(Tensor(a) self, int[] size) -> Tensor(a)")                                             \
  _(squeeze, View, Tensor(const Tensor&, const OptInt&),                                           \
    "squeeze(Tensor(a) self, int? dim=None) -> Tensor(a)")                                         \
  _(unsqueeze, View, Tensor(const Tensor&, int64_t),                                               \
    "unsqueeze(Tensor(a) self, int dim) -> Tensor(a)")                                             \
  _(squeeze_dims, View, Tensor(const Tensor&, IntArrayRef),                                        \
    "squeeze_dims(Tensor(a) self, int[] dim) -> Tensor(a)")                                        \
  _(diagonal, View, Tensor(const Tensor&, int64_t, int64_t, int64_t),                              \
    "diagonal(Tensor(a) self, int offset=0, int dim1=0, int dim2=1) -> Tensor(a)")                 \
  _(alias, View, Tensor(const Tensor&), "alias(Tensor(a) self) -> Tensor(a)")                      \
  _(detach, View, Tensor(const Tensor&), "detach(Tensor(a) self) -> Tensor(a)")                    \
  /* factories: dispatch on the device argument */                                                 \
  _(empty, Factory, Tensor(IntArrayRef, DType, Device),                                            \
    "empty(int[] size, DType dtype, Device device) -> Tensor")                                     \
  _(full, Factory, Tensor(IntArrayRef, const Scalar&, DType, Device),                              \
    "full(int[] size, Scalar fill_value, DType dtype, Device device) -> Tensor")                   \
  _(arange, Factory, Tensor(const Scalar&, const Scalar&, const Scalar&, DType, Device),           \
    "arange(Scalar start, Scalar end, Scalar step, DType dtype, Device device) -> Tensor")         \
  _(linspace, Factory, Tensor(const Scalar&, const Scalar&, int64_t, DType, Device),               \
    "linspace(Scalar start, Scalar end, int steps, DType dtype, Device device) -> Tensor")         \
  _(rand, Factory, Tensor(IntArrayRef, Generator*, DType, Device),                                 \
    "rand(int[] size, Generator? generator, DType dtype, Device device) -> Tensor")                \
  _(randn, Factory, Tensor(IntArrayRef, Generator*, DType, Device),                                \
    "randn(int[] size, Generator? generator, DType dtype, Device device) -> Tensor")               \
  _(randint, Factory, Tensor(int64_t, int64_t, IntArrayRef, Generator*, DType, Device),            \
    "randint(int low, int high, int[] size, Generator? generator, DType dtype, Device device) -> " \
    "Tensor")                                                                                      \
  _(randperm, Factory, Tensor(int64_t, Generator*, DType, Device),                                 \
    "randperm(int n, Generator? generator, DType dtype, Device device) -> Tensor")                 \
  _(empty_strided, Factory, Tensor(IntArrayRef, IntArrayRef, DType, Device),                       \
    "empty_strided(int[] size, int[] stride, DType dtype, Device device) -> Tensor")               \
  /* copies and fills */                                                                           \
  _(copy_, InPlace, void(const Tensor&, const Tensor&),                                            \
    "copy_(Tensor(a!) self, Tensor src) -> ()")                                                    \
  _(fill_, InPlace, void(const Tensor&, const Scalar&),                                            \
    "fill_(Tensor(a!) self, Scalar value) -> ()")                                                  \
  _(to_copy, Functional, Tensor(const Tensor&, DType, Device),                                     \
    "to_copy(Tensor self, DType dtype, Device device) -> Tensor")                                  \
  /* ops with several outputs */                                                                   \
  _(max_dim, Functional, TensorPair(const Tensor&, int64_t, bool),                                 \
    "max_dim(Tensor self, int dim, bool keepdim=False) -> (Tensor values, Tensor indices)")        \
  _(min_dim, Functional, TensorPair(const Tensor&, int64_t, bool),                                 \
    "min_dim(Tensor self, int dim, bool keepdim=False) -> (Tensor values, Tensor indices)")        \
  _(nonzero, Functional, Tensor(const Tensor&), "nonzero(Tensor self) -> Tensor")                  \
  _(sort, Functional, TensorPair(const Tensor&, int64_t, bool),                                    \
    "sort(Tensor self, int dim=-1, bool descending=False) -> (Tensor values, Tensor indices)")     \
  _(topk, Functional, TensorPair(const Tensor&, int64_t, int64_t, bool, bool),                     \
    "topk(Tensor self, int k, int dim=-1, bool largest=True, bool sorted=True) -> (Tensor "        \
    "values, Tensor indices)")                                                                     \
  _(native_dropout, Functional, TensorPair(const Tensor&, double, Generator*),                     \
    "native_dropout(Tensor input, float p, Generator? generator) -> (Tensor out, Tensor mask)")    \
  /* fused attention (Note [Fused attention] in kiln/ops/ops.h) */                                 \
  _(flash_attention, Functional,                                                                   \
    TensorPair(const Tensor&, const Tensor&, const Tensor&, bool, double),                         \
    "flash_attention(Tensor query, Tensor key, Tensor value, bool is_causal, float scale) -> "     \
    "(Tensor out, Tensor logsumexp)")                                                              \
  _(flash_attention_backward, Functional,                                                          \
    TensorTriple(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&,        \
                 const Tensor&, bool, double),                                                     \
    "flash_attention_backward(Tensor grad_out, Tensor query, Tensor key, Tensor value, Tensor "    \
    "out, Tensor logsumexp, bool is_causal, float scale) -> (Tensor grad_query, Tensor "           \
    "grad_key, Tensor grad_value)")                                                                \
  /* convolution (Note [Convolution] in kiln/ops/conv_meta.cpp): 1-3 spatial dims, groups,         \
     transposed; bias_sizes empty for no bias, output_mask three 0/1 flags */                      \
  _(convolution, Functional,                                                                       \
    Tensor(const Tensor&, const Tensor&, const Tensor&, IntArrayRef, IntArrayRef, IntArrayRef,     \
           bool, IntArrayRef, int64_t),                                                            \
    "convolution(Tensor input, Tensor weight, Tensor? bias, int[] stride, int[] padding, int[] "   \
    "dilation, bool transposed, int[] output_padding, int groups) -> Tensor")                      \
  _(convolution_backward, Functional,                                                              \
    TensorTriple(const Tensor&, const Tensor&, const Tensor&, IntArrayRef, IntArrayRef,            \
                 IntArrayRef, IntArrayRef, bool, IntArrayRef, int64_t, IntArrayRef),               \
    "convolution_backward(Tensor grad_output, Tensor input, Tensor weight, int[] bias_sizes, "     \
    "int[] stride, int[] padding, int[] dilation, bool transposed, int[] output_padding, int "     \
    "groups, int[] output_mask) -> (Tensor grad_input, Tensor grad_weight, Tensor grad_bias)")     \
  /* pooling (Note [Pooling] in kiln/ops/pool_meta.cpp): batched [N, C, *spatial] or unbatched     \
     [C, *spatial]; an empty stride is the kernel size; indices are flat within a plane */         \
  _(max_pool2d_with_indices, Functional,                                                           \
    TensorPair(const Tensor&, IntArrayRef, IntArrayRef, IntArrayRef, IntArrayRef, bool),           \
    "max_pool2d_with_indices(Tensor self, int[] kernel_size, int[] stride=[], int[] "              \
    "padding=[0], int[] dilation=[1], bool ceil_mode=False) -> (Tensor out, Tensor indices)")      \
  _(max_pool2d_with_indices_backward, Functional,                                                  \
    Tensor(const Tensor&, const Tensor&, IntArrayRef, IntArrayRef, IntArrayRef, IntArrayRef, bool, \
           const Tensor&),                                                                         \
    "max_pool2d_with_indices_backward(Tensor grad_output, Tensor self, int[] kernel_size, "        \
    "int[] stride, int[] padding, int[] dilation, bool ceil_mode, Tensor indices) -> Tensor")      \
  _(max_pool3d_with_indices, Functional,                                                           \
    TensorPair(const Tensor&, IntArrayRef, IntArrayRef, IntArrayRef, IntArrayRef, bool),           \
    "max_pool3d_with_indices(Tensor self, int[] kernel_size, int[] stride=[], int[] "              \
    "padding=[0], int[] dilation=[1], bool ceil_mode=False) -> (Tensor out, Tensor indices)")      \
  _(max_pool3d_with_indices_backward, Functional,                                                  \
    Tensor(const Tensor&, const Tensor&, IntArrayRef, IntArrayRef, IntArrayRef, IntArrayRef, bool, \
           const Tensor&),                                                                         \
    "max_pool3d_with_indices_backward(Tensor grad_output, Tensor self, int[] kernel_size, "        \
    "int[] stride, int[] padding, int[] dilation, bool ceil_mode, Tensor indices) -> Tensor")      \
  _(avg_pool2d, Functional,                                                                        \
    Tensor(const Tensor&, IntArrayRef, IntArrayRef, IntArrayRef, bool, bool, const OptInt&),       \
    "avg_pool2d(Tensor self, int[] kernel_size, int[] stride=[], int[] padding=[0], bool "         \
    "ceil_mode=False, bool count_include_pad=True, int? divisor_override=None) -> Tensor")         \
  _(avg_pool2d_backward, Functional,                                                               \
    Tensor(const Tensor&, const Tensor&, IntArrayRef, IntArrayRef, IntArrayRef, bool, bool,        \
           const OptInt&),                                                                         \
    "avg_pool2d_backward(Tensor grad_output, Tensor self, int[] kernel_size, int[] stride, "       \
    "int[] padding, bool ceil_mode, bool count_include_pad, int? divisor_override) -> Tensor")     \
  _(avg_pool3d, Functional,                                                                        \
    Tensor(const Tensor&, IntArrayRef, IntArrayRef, IntArrayRef, bool, bool, const OptInt&),       \
    "avg_pool3d(Tensor self, int[] kernel_size, int[] stride=[], int[] padding=[0], bool "         \
    "ceil_mode=False, bool count_include_pad=True, int? divisor_override=None) -> Tensor")         \
  _(avg_pool3d_backward, Functional,                                                               \
    Tensor(const Tensor&, const Tensor&, IntArrayRef, IntArrayRef, IntArrayRef, bool, bool,        \
           const OptInt&),                                                                         \
    "avg_pool3d_backward(Tensor grad_output, Tensor self, int[] kernel_size, int[] stride, "       \
    "int[] padding, bool ceil_mode, bool count_include_pad, int? divisor_override) -> Tensor")     \
  _(adaptive_avg_pool2d, Functional, Tensor(const Tensor&, IntArrayRef),                           \
    "adaptive_avg_pool2d(Tensor self, int[] output_size) -> Tensor")                               \
  _(adaptive_avg_pool2d_backward, Functional, Tensor(const Tensor&, const Tensor&),                \
    "adaptive_avg_pool2d_backward(Tensor grad_output, Tensor self) -> Tensor")                     \
  _(adaptive_avg_pool3d, Functional, Tensor(const Tensor&, IntArrayRef),                           \
    "adaptive_avg_pool3d(Tensor self, int[] output_size) -> Tensor")                               \
  _(adaptive_avg_pool3d_backward, Functional, Tensor(const Tensor&, const Tensor&),                \
    "adaptive_avg_pool3d_backward(Tensor grad_output, Tensor self) -> Tensor")                     \
  /* padding and upsampling (Note [Padding and upsampling] in kiln/ops/pad_meta.cpp): pads are     \
   * (left, right) pairs from the last dim; batched [N, C, *spatial] or unbatched [C, *spatial]    \
   * (upsampling: [N, C, H, W]) */                                                                 \
  _(constant_pad_nd, Functional, Tensor(const Tensor&, IntArrayRef, const Scalar&),                \
    "constant_pad_nd(Tensor self, int[] pad, Scalar value=0) -> Tensor")                           \
  _(reflection_pad1d, Functional, Tensor(const Tensor&, IntArrayRef),                              \
    "reflection_pad1d(Tensor self, int[] padding) -> Tensor")                                      \
  _(reflection_pad1d_backward, Functional, Tensor(const Tensor&, const Tensor&, IntArrayRef),      \
    "reflection_pad1d_backward(Tensor grad_output, Tensor self, int[] padding) -> Tensor")         \
  _(reflection_pad2d, Functional, Tensor(const Tensor&, IntArrayRef),                              \
    "reflection_pad2d(Tensor self, int[] padding) -> Tensor")                                      \
  _(reflection_pad2d_backward, Functional, Tensor(const Tensor&, const Tensor&, IntArrayRef),      \
    "reflection_pad2d_backward(Tensor grad_output, Tensor self, int[] padding) -> Tensor")         \
  _(reflection_pad3d, Functional, Tensor(const Tensor&, IntArrayRef),                              \
    "reflection_pad3d(Tensor self, int[] padding) -> Tensor")                                      \
  _(reflection_pad3d_backward, Functional, Tensor(const Tensor&, const Tensor&, IntArrayRef),      \
    "reflection_pad3d_backward(Tensor grad_output, Tensor self, int[] padding) -> Tensor")         \
  _(replication_pad1d, Functional, Tensor(const Tensor&, IntArrayRef),                             \
    "replication_pad1d(Tensor self, int[] padding) -> Tensor")                                     \
  _(replication_pad1d_backward, Functional, Tensor(const Tensor&, const Tensor&, IntArrayRef),     \
    "replication_pad1d_backward(Tensor grad_output, Tensor self, int[] padding) -> Tensor")        \
  _(replication_pad2d, Functional, Tensor(const Tensor&, IntArrayRef),                             \
    "replication_pad2d(Tensor self, int[] padding) -> Tensor")                                     \
  _(replication_pad2d_backward, Functional, Tensor(const Tensor&, const Tensor&, IntArrayRef),     \
    "replication_pad2d_backward(Tensor grad_output, Tensor self, int[] padding) -> Tensor")        \
  _(replication_pad3d, Functional, Tensor(const Tensor&, IntArrayRef),                             \
    "replication_pad3d(Tensor self, int[] padding) -> Tensor")                                     \
  _(replication_pad3d_backward, Functional, Tensor(const Tensor&, const Tensor&, IntArrayRef),     \
    "replication_pad3d_backward(Tensor grad_output, Tensor self, int[] padding) -> Tensor")        \
  _(upsample_nearest2d, Functional,                                                                \
    Tensor(const Tensor&, IntArrayRef, const OptDouble&, const OptDouble&),                        \
    "upsample_nearest2d(Tensor self, int[] output_size, float? scales_h=None, float? "             \
    "scales_w=None) -> Tensor")                                                                    \
  _(upsample_nearest2d_backward, Functional,                                                       \
    Tensor(const Tensor&, IntArrayRef, IntArrayRef, const OptDouble&, const OptDouble&),           \
    "upsample_nearest2d_backward(Tensor grad_output, int[] output_size, int[] input_size, float? " \
    "scales_h=None, float? scales_w=None) -> Tensor")                                              \
  _(upsample_bilinear2d, Functional,                                                               \
    Tensor(const Tensor&, IntArrayRef, bool, const OptDouble&, const OptDouble&),                  \
    "upsample_bilinear2d(Tensor self, int[] output_size, bool align_corners, float? "              \
    "scales_h=None, float? scales_w=None) -> Tensor")                                              \
  _(upsample_bilinear2d_backward, Functional,                                                      \
    Tensor(const Tensor&, IntArrayRef, IntArrayRef, bool, const OptDouble&, const OptDouble&),     \
    "upsample_bilinear2d_backward(Tensor grad_output, int[] output_size, int[] input_size, bool "  \
    "align_corners, float? scales_h=None, float? scales_w=None) -> Tensor")                        \
  /* p-norm distances (Note [cdist and pdist] in kiln/ops/distance_meta.cpp): x1 [*, P, M] and     \
     x2 [*, R, M] give [*, P, R]; pdist's self [N, M] gives the N (N - 1) / 2 pairs i < j */       \
  _(cdist_forward, Functional, Tensor(const Tensor&, const Tensor&, double, const OptInt&),        \
    "cdist_forward(Tensor x1, Tensor x2, float p, int? compute_mode) -> Tensor")                   \
  _(cdist_backward, Functional,                                                                    \
    Tensor(const Tensor&, const Tensor&, const Tensor&, double, const Tensor&),                    \
    "cdist_backward(Tensor grad, Tensor x1, Tensor x2, float p, Tensor cdist) -> Tensor")          \
  _(pdist_forward, Functional, Tensor(const Tensor&, double),                                      \
    "pdist_forward(Tensor self, float p=2) -> Tensor")                                             \
  _(pdist_backward, Functional, Tensor(const Tensor&, const Tensor&, double, const Tensor&),       \
    "pdist_backward(Tensor grad, Tensor self, float p, Tensor pdist) -> Tensor")                   \
  /* sliding blocks (Note [im2col and col2im] in kiln/ops/fold_meta.cpp): im2col's self            \
     [N, C, H, W] gives [N, C kh kw, L]; col2im sums such columns into [N, C, *output_size] */     \
  _(im2col, Functional, Tensor(const Tensor&, IntArrayRef, IntArrayRef, IntArrayRef, IntArrayRef), \
    "im2col(Tensor self, int[] kernel_size, int[] dilation, int[] padding, int[] stride) -> "      \
    "Tensor")                                                                                      \
  _(col2im, Functional,                                                                            \
    Tensor(const Tensor&, IntArrayRef, IntArrayRef, IntArrayRef, IntArrayRef, IntArrayRef),        \
    "col2im(Tensor self, int[] output_size, int[] kernel_size, int[] dilation, int[] padding, "    \
    "int[] stride) -> Tensor")                                                                     \
  /* sampling at grid points (Note [grid_sampler_2d] in kiln/ops/grid_sample_meta.cpp): input      \
     [N, C, H, W], grid [N, OH, OW, 2]; modes as ATen's ints; output_mask two 0/1 flags */         \
  _(grid_sampler_2d, Functional, Tensor(const Tensor&, const Tensor&, int64_t, int64_t, bool),     \
    "grid_sampler_2d(Tensor input, Tensor grid, int interpolation_mode, int padding_mode, bool "   \
    "align_corners) -> Tensor")                                                                    \
  _(grid_sampler_2d_backward, Functional,                                                          \
    TensorPair(const Tensor&, const Tensor&, const Tensor&, int64_t, int64_t, bool, IntArrayRef),  \
    "grid_sampler_2d_backward(Tensor grad_output, Tensor input, Tensor grid, int "                 \
    "interpolation_mode, int padding_mode, bool align_corners, int[] output_mask) -> (Tensor "     \
    "grad_input, Tensor grad_grid)")                                                               \
  /* bags of embeddings (Note [embedding_bag] in kiln/ops/embedding_meta.cpp): mode 0 sum,         \
     1 mean, 2 max; (output, offset2bag, bag_size, max_indices) as ATen's _embedding_bag */        \
  _(embedding_bag, Functional,                                                                     \
    TensorQuad(const Tensor&, const Tensor&, const Tensor&, bool, int64_t, bool, const Tensor&,    \
               bool, int64_t),                                                                     \
    "embedding_bag(Tensor weight, Tensor indices, Tensor offsets, bool scale_grad_by_freq=False, " \
    "int mode=0, bool sparse=False, Tensor? per_sample_weights=None, bool "                        \
    "include_last_offset=False, int padding_idx=-1) -> (Tensor, Tensor, Tensor, Tensor)")          \
  /* normalization (Note [Batch, group and layer norm] in kiln/ops/norm_meta.cpp): batch norm's    \
     running stats are written in place; output_mask three 0/1 flags */                            \
  _(native_batch_norm_legit, Functional,                                                           \
    TensorTriple(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, bool,  \
                 double, double),                                                                  \
    "native_batch_norm_legit(Tensor input, Tensor? weight, Tensor? bias, Tensor(a!) "              \
    "running_mean, Tensor(b!) running_var, bool training, float momentum, float eps) -> (Tensor "  \
    "out, Tensor save_mean, Tensor save_rstd)")                                                    \
  _(native_batch_norm_legit_no_stats, Functional,                                                  \
    TensorTriple(const Tensor&, const Tensor&, const Tensor&, bool, double, double),               \
    "native_batch_norm_legit_no_stats(Tensor input, Tensor? weight, Tensor? bias, bool training, " \
    "float momentum, float eps) -> (Tensor out, Tensor save_mean, Tensor save_rstd)")              \
  _(native_batch_norm_legit_no_training, Functional,                                               \
    TensorTriple(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&,        \
                 double, double),                                                                  \
    "native_batch_norm_legit_no_training(Tensor input, Tensor? weight, Tensor? bias, Tensor "      \
    "running_mean, Tensor running_var, float momentum, float eps) -> (Tensor out, Tensor "         \
    "save_mean, Tensor save_rstd)")                                                                \
  _(native_batch_norm_backward, Functional,                                                        \
    TensorTriple(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&,        \
                 const Tensor&, const Tensor&, bool, double, IntArrayRef),                         \
    "native_batch_norm_backward(Tensor grad_out, Tensor input, Tensor? weight, Tensor? "           \
    "running_mean, Tensor? running_var, Tensor? save_mean, Tensor? save_invstd, bool train, "      \
    "float eps, int[] output_mask) -> (Tensor grad_input, Tensor grad_weight, Tensor grad_bias)")  \
  _(native_group_norm, Functional,                                                                 \
    TensorTriple(const Tensor&, const Tensor&, const Tensor&, int64_t, int64_t, int64_t, int64_t,  \
                 double),                                                                          \
    "native_group_norm(Tensor input, Tensor? weight, Tensor? bias, int N, int C, int HxW, int "    \
    "group, float eps) -> (Tensor out, Tensor mean, Tensor rstd)")                                 \
  _(native_group_norm_backward, Functional,                                                        \
    TensorTriple(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&,        \
                 int64_t, int64_t, int64_t, int64_t, IntArrayRef),                                 \
    "native_group_norm_backward(Tensor grad_out, Tensor input, Tensor mean, Tensor rstd, Tensor? " \
    "weight, int N, int C, int HxW, int group, int[] output_mask) -> (Tensor grad_input, Tensor "  \
    "grad_weight, Tensor grad_bias)")                                                              \
  _(native_layer_norm, Functional,                                                                 \
    TensorTriple(const Tensor&, IntArrayRef, const Tensor&, const Tensor&, double),                \
    "native_layer_norm(Tensor input, int[] normalized_shape, Tensor? weight, Tensor? bias, float " \
    "eps) -> (Tensor out, Tensor mean, Tensor rstd)")                                              \
  _(native_layer_norm_backward, Functional,                                                        \
    TensorTriple(const Tensor&, const Tensor&, IntArrayRef, const Tensor&, const Tensor&,          \
                 const Tensor&, const Tensor&, IntArrayRef),                                       \
    "native_layer_norm_backward(Tensor grad_out, Tensor input, int[] normalized_shape, Tensor "    \
    "mean, Tensor rstd, Tensor? weight, Tensor? bias, int[] output_mask) -> (Tensor grad_input, "  \
    "Tensor grad_weight, Tensor grad_bias)")                                                       \
  /* layer_norm's three gradients from one pass over grad_output and input (its autograd           \
     formula's op when weight or bias needs a gradient) */                                         \
  _(layer_norm_fused_backward, Functional,                                                         \
    TensorTriple(const Tensor&, const Tensor&, IntArrayRef, const Tensor&, double, IntArrayRef),   \
    "layer_norm_fused_backward(Tensor grad_output, Tensor input, int[] normalized_shape, "         \
    "Tensor? weight, float eps, int[] output_mask) -> (Tensor grad_input, Tensor grad_weight, "    \
    "Tensor grad_bias)")                                                                           \
  /* a product with bias and GELU (tanh) fused: cuBLASLt's epilogue on CUDA */                     \
  _(addmm_gelu, Functional, TensorPair(const Tensor&, const Tensor&, const Tensor&),               \
    "addmm_gelu(Tensor? bias, Tensor mat1, Tensor mat2) -> (Tensor out, Tensor preactivation)")    \
  /* multi-tensor (foreach) updates for optimizers */                                              \
  _(foreach_add_, InPlace, void(const TensorList&, const TensorList&, const Scalar&),              \
    "foreach_add_(Tensor(a!)[] self, Tensor[] other, Scalar alpha=1) -> ()")                       \
  _(foreach_mul_, InPlace, void(const TensorList&, const Scalar&),                                 \
    "foreach_mul_(Tensor(a!)[] self, Scalar scalar) -> ()")                                        \
  _(foreach_mul_list_, InPlace, void(const TensorList&, const TensorList&),                        \
    "foreach_mul_list_(Tensor(a!)[] self, Tensor[] other) -> ()")                                  \
  _(foreach_lerp_, InPlace, void(const TensorList&, const TensorList&, const Scalar&),             \
    "foreach_lerp_(Tensor(a!)[] self, Tensor[] end, Scalar weight) -> ()")                         \
  _(foreach_addcmul_, InPlace,                                                                     \
    void(const TensorList&, const TensorList&, const TensorList&, const Scalar&),                  \
    "foreach_addcmul_(Tensor(a!)[] self, Tensor[] tensor1, Tensor[] tensor2, Scalar value=1) -> "  \
    "()")                                                                                          \
  _(foreach_addcdiv_, InPlace,                                                                     \
    void(const TensorList&, const TensorList&, const TensorList&, const Scalar&),                  \
    "foreach_addcdiv_(Tensor(a!)[] self, Tensor[] tensor1, Tensor[] tensor2, Scalar value=1) -> "  \
    "()")                                                                                          \
  _(foreach_sqrt, Functional, TensorList(const TensorList&),                                       \
    "foreach_sqrt(Tensor[] self) -> Tensor[]")                                                     \
  _(foreach_sqrt_, InPlace, void(const TensorList&), "foreach_sqrt_(Tensor(a!)[] self) -> ()")     \
  _(foreach_adamw_, InPlace,                                                                       \
    void(const TensorList&, const TensorList&, const TensorList&, const TensorList&,               \
         const TensorList&, const Tensor&, double, double, double, double, const Tensor&),         \
    "foreach_adamw_(Tensor(a!)[] self, Tensor[] grads, Tensor(b!)[] exp_avg, "                     \
    "Tensor(c!)[] exp_avg_sq, Tensor(d!)[] steps, Tensor lr, float beta1, float beta2, "           \
    "float eps, float weight_decay, Tensor? found_inf=None) -> ()")                                \
  /* loss scaling for float16 (Note [Loss scaling on the device] in kiln/amp/grad_scaler.cpp) */   \
  _(amp_non_finite_check_and_unscale_, InPlace,                                                    \
    void(const TensorList&, const Tensor&, const Tensor&),                                         \
    "amp_non_finite_check_and_unscale_(Tensor(a!)[] self, Tensor(b!) found_inf, Tensor "           \
    "inv_scale) -> ()")                                                                            \
  _(amp_update_scale_, InPlace,                                                                    \
    void(const Tensor&, const Tensor&, const Tensor&, double, double, int64_t),                    \
    "amp_update_scale_(Tensor(a!) self, Tensor(b!) growth_tracker, Tensor found_inf, float "       \
    "growth_factor, float backoff_factor, int growth_interval) -> ()")                             \
  /* collectives (kiln/distributed, Note [Collectives are ops] in collective_kernels.cpp):         \
     `group` is a process group's id; `group_size` its size, so meta functions know shapes.        \
     In-place and out= forms name their functional form (variants set in op_list.cpp) */           \
  _(all_reduce, Functional, Tensor(const Tensor&, int64_t, int64_t),                               \
    "all_reduce(Tensor self, int reduce_op, int group) -> Tensor")                                 \
  _(all_reduce_, InPlace, void(const Tensor&, int64_t, int64_t),                                   \
    "all_reduce(Tensor(a!) self, int reduce_op, int group) -> ()")                                 \
  _(all_gather_into_tensor, Functional, Tensor(const Tensor&, int64_t, int64_t),                   \
    "all_gather_into_tensor(Tensor self, int group_size, int group) -> Tensor")                    \
  _(all_gather_into_tensor_out, Out, void(const Tensor&, const Tensor&, int64_t, int64_t),         \
    "out=all_gather_into_tensor(Tensor self, int group_size, int group) -> ()")                    \
  _(reduce_scatter_tensor, Functional, Tensor(const Tensor&, int64_t, int64_t, int64_t),           \
    "reduce_scatter_tensor(Tensor self, int reduce_op, int group_size, int group) -> Tensor")      \
  _(reduce_scatter_tensor_out, Out, void(const Tensor&, const Tensor&, int64_t, int64_t, int64_t), \
    "out=reduce_scatter_tensor(Tensor self, int reduce_op, int group_size, int group) -> ()")      \
  _(broadcast, Functional, Tensor(const Tensor&, int64_t, int64_t),                                \
    "broadcast(Tensor self, int src, int group) -> Tensor")                                        \
  _(broadcast_, InPlace, void(const Tensor&, int64_t, int64_t),                                    \
    "broadcast(Tensor(a!) self, int src, int group) -> ()")                                        \
  _(all_to_all_single, Functional, Tensor(const Tensor&, IntArrayRef, IntArrayRef, int64_t),       \
    "all_to_all_single(Tensor self, int[] output_split_sizes, int[] input_split_sizes, int "       \
    "group) -> Tensor")                                                                            \
  _(all_to_all_single_out, Out,                                                                    \
    void(const Tensor&, const Tensor&, IntArrayRef, IntArrayRef, int64_t),                         \
    "out=all_to_all_single(Tensor self, int[] output_split_sizes, int[] input_split_sizes, "       \
    "int group) -> ()")                                                                            \
  _(send, Functional, void(const Tensor&, int64_t, int64_t),                                       \
    "send(Tensor self, int dst, int group) -> ()")                                                 \
  _(recv_, InPlace, void(const Tensor&, int64_t, int64_t),                                         \
    "recv_(Tensor(a!) self, int src, int group) -> ()")                                            \
  _(barrier, Factory, void(Device, int64_t), "barrier(Device device, int group) -> ()")

#define KILN_EXPAND(...) __VA_ARGS__

#define KILN_DECLARE_POINTWISE(name, ARGS, schema) \
  extern TypedOp<Tensor ARGS> op_##name;           \
  extern TypedOp<void ARGS> op_##name##_;          \
  extern TypedOp<void(const Tensor&, KILN_EXPAND ARGS)> op_##name##_out;
#define KILN_DECLARE_STRUCTURED(name, ARGS, schema) \
  extern TypedOp<Tensor ARGS> op_##name;            \
  extern TypedOp<void(const Tensor&, KILN_EXPAND ARGS)> op_##name##_out;
#define KILN_DECLARE_OTHER(name, kind, sig, schema) extern TypedOp<sig> op_##name;

KILN_FORALL_POINTWISE(KILN_DECLARE_POINTWISE)
KILN_FORALL_STRUCTURED(KILN_DECLARE_STRUCTURED)
KILN_FORALL_OTHER_OPS(KILN_DECLARE_OTHER)

// Every op, for tests and tools that walk them all.
std::span<OpDef* const> all_ops();
// Looks an op up by name; nullptr if there is none.
const OpDef* find_op(std::string_view name);

}  // namespace kiln::ops

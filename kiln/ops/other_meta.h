#pragma once
// Meta functions of the ops in KILN_FORALL_OTHER_OPS that are not views. Internal: backends
// call them first, so validation happens before any write.
#include "kiln/ops/meta.h"

namespace kiln::meta {

void factory(const char* op, IntArrayRef sizes, DType dtype);
void arange(const Scalar& start, const Scalar& end, const Scalar& step, DType dtype);
int64_t arange_length(const Scalar& start, const Scalar& end, const Scalar& step);
void linspace(const Scalar& start, const Scalar& end, int64_t steps, DType dtype);
void randint(int64_t low, int64_t high, IntArrayRef sizes, DType dtype);
void copy_(const Tensor& self, const Tensor& src);
// `v` converts to `t` without overflow ("[op] value ... cannot be converted to ...").
void check_fits(const char* op, const Scalar& v, DType t);
void fill_(const Tensor& self, const Scalar& value);
TensorSpec to_copy(const Tensor& self, DType dtype, Device device);
TensorSpec max_dim(const Tensor& self, int64_t dim, bool keepdim);
TensorSpec min_dim(const Tensor& self, int64_t dim, bool keepdim);
// sort and topk (kiln/ops/sort_meta.cpp): the values' spec; the indices are int64 of its sizes.
TensorSpec sort(const Tensor& self, int64_t dim, bool descending);
TensorSpec topk(const Tensor& self, int64_t k, int64_t dim, bool largest, bool sorted);
TensorSpec native_dropout(const Tensor& input, double p, Generator* gen);
// flash_attention: query [..., L, E], key and value [..., S, E] with the same leading dims
// (no broadcasting), one floating dtype and one device, L, S, E >= 1, a finite scale. Returns
// the output's spec ([..., L, E]); the logsumexp is [..., L] in attention_stats_dtype.
TensorSpec flash_attention(const Tensor& q, const Tensor& k, const Tensor& v, bool is_causal,
                           double scale);
// The dtype of flash_attention's logsumexp: float64 for float64 inputs, else float32; its
// sizes: query's without the last dim.
DType attention_stats_dtype(DType input);
inline IntArrayRef attention_stats_sizes(const Tensor& q) {
  return q.sizes().subspan(0, static_cast<size_t>(q.dim() - 1));
}
// flash_attention_backward: the forward's arguments are valid, and grad_out, out and lse have
// the shapes and dtypes flash_attention gives them. Returns q's spec (dk and dv: k's and v's).
TensorSpec flash_attention_backward(const Tensor& grad_out, const Tensor& q, const Tensor& k,
                                    const Tensor& v, const Tensor& out, const Tensor& lse,
                                    bool is_causal, double scale);
// addmm_gelu: mat1 [m, k] and mat2 [k, n] of one floating dtype, bias undefined or an
// n-vector of that dtype, all on one device. Returns the spec of both outputs ([m, n]).
TensorSpec addmm_gelu(const Tensor& bias, const Tensor& mat1, const Tensor& mat2);
// foreach: lists of equal length whose i-th tensors have equal sizes and devices.
void foreach_lists(const char* op, std::initializer_list<const TensorList*> lists);
void foreach_float(const char* op, const TensorList& self);
// foreach_adamw_: the lists match and are of self's float dtype; steps are 0-d float64
// tensors and lr a 0-d float64 tensor on self's devices; the hyperparameters are in range.
// found_inf, when defined, is a 0-d float32 tensor on lr's device.
// (The values of lr and steps live on the device and are checked by the kernels.)
void foreach_adamw(const char* op, const TensorList& p, const TensorList& g, const TensorList& m,
                   const TensorList& v, const TensorList& steps, const Tensor& lr, double beta1,
                   double beta2, double eps, double wd, const Tensor& found_inf);
// A scalar applied to every tensor must fit each one's dtype (no float into an integer list).
void foreach_scalar(const char* op, const TensorList& self, const Scalar& s);

}  // namespace kiln::meta

namespace kiln::detail {
// addmm_gelu as two ops (addmm or mm, then gelu with the tanh approximation) after
// meta::addmm_gelu's checks: the CPU's kernel, and CUDA's where the epilogue does not apply.
TensorPair addmm_gelu_unfused(const Tensor& bias, const Tensor& mat1, const Tensor& mat2);
// flash_attention and its backward as a composite of ops (matmul, softmax's pieces, matmul) in
// float32, or float64 for float64 inputs, after the meta checks: for a backend's inputs its
// kernels do not take (CUDA: float64, head dims over 128). Holds the L x S scores in memory.
TensorPair flash_attention_math(const Tensor& q, const Tensor& k, const Tensor& v, bool causal,
                                double scale);
TensorTriple flash_attention_backward_math(const Tensor& grad_out, const Tensor& q, const Tensor& k,
                                           const Tensor& v, const Tensor& out, const Tensor& lse,
                                           bool causal, double scale);
}  // namespace kiln::detail

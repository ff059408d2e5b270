#pragma once
// Batch, group and layer norm: their meta functions, and the driver the CPU and CUDA kernels
// share (Note [Batch, group and layer norm] in norm_meta.cpp). Internal: backends call the
// drivers, which validate before anything is written.
#include "kiln/ops/meta.h"
#include "kiln/ops/op_list.h"

namespace kiln::meta {

// The dtype of a norm's statistics for an input dtype: float32 for the 16-bit floats, the
// dtype itself otherwise (ATen's accumulate type).
DType norm_stat_dtype(DType input);

// Shape checks of each op (the messages start with [batch_norm], [group_norm] or
// [layer_norm]); they return nothing, as the drivers compute the shapes themselves.
// `has_stats`: running stats are an argument (legit, no_training); they may then be undefined
// only in native_batch_norm_backward.
void batch_norm(const Tensor& input, const Tensor& weight, const Tensor& bias,
                const Tensor& running_mean, const Tensor& running_var, bool has_stats,
                bool training, double eps);
void batch_norm_backward(const Tensor& grad_out, const Tensor& input, const Tensor& weight,
                         const Tensor& running_mean, const Tensor& running_var,
                         const Tensor& save_mean, const Tensor& save_invstd, bool train, double eps,
                         IntArrayRef output_mask);
void group_norm(const Tensor& input, const Tensor& weight, const Tensor& bias, int64_t N, int64_t C,
                int64_t HxW, int64_t group, double eps);
void group_norm_backward(const Tensor& grad_out, const Tensor& input, const Tensor& mean,
                         const Tensor& rstd, const Tensor& weight, int64_t N, int64_t C,
                         int64_t HxW, int64_t group, IntArrayRef output_mask);
// Returns the number of leading (not normalised) dims.
int64_t native_layer_norm(const Tensor& input, IntArrayRef normalized_shape, const Tensor& weight,
                          const Tensor& bias, double eps);
int64_t native_layer_norm_backward(const Tensor& grad_out, const Tensor& input,
                                   IntArrayRef normalized_shape, const Tensor& mean,
                                   const Tensor& rstd, const Tensor& weight, const Tensor& bias,
                                   IntArrayRef output_mask);
// layer_norm_backward's checks under the name `op` (layer_norm_fused_backward shares them).
void check_layer_norm_backward(const char* op, const Tensor& grad, const Tensor& input,
                               IntArrayRef normalized_shape, const Tensor& weight, double eps);
void layer_norm_fused_backward(const Tensor& grad, const Tensor& input,
                               IntArrayRef normalized_shape, const Tensor& weight, double eps,
                               IntArrayRef output_mask);

}  // namespace kiln::meta

namespace kiln::detail {

// layer_norm_fused_backward's checks and results, shared by the backends: dx, dw and db as
// output_mask asks, on input's device (dw and db zeroed where there are no rows: sums of
// nothing), with the rows and the row length n.
struct LayerNormGrads {
  Tensor dx, dw, db;
  int64_t rows = 0, n = 0;
};
LayerNormGrads layer_norm_fused_backward_outputs(const Tensor& grad, const Tensor& input,
                                                 IntArrayRef normalized_shape, const Tensor& weight,
                                                 double eps, IntArrayRef output_mask);

// A backend's three norm kernels, on contiguous tensors viewed as [n, c, hw] (the input's
// dtype T; statistics and coefficients in norm_stat_dtype(T), contiguous).
struct NormKernels {
  // mean[j] and the biased variance var[j] of x[:, j, :], for each of the c channels.
  void (*moments)(const Tensor& x, int64_t n, int64_t c, int64_t hw, const Tensor& mean,
                  const Tensor& var);
  // sum_dy[j] = sum of dy[:, j, :], sum_dy_xmu[j] = sum of dy * (x - mean[j]) over the same
  // (mean undefined: 0).
  void (*dot)(const Tensor& dy, const Tensor& x, const Tensor& mean, int64_t n, int64_t c,
              int64_t hw, const Tensor& sum_dy, const Tensor& sum_dy_xmu);
  // out[i, j, k] = (a * p[q] + b * r[q] + s[q]) * w[k] + bias[k] with q = i * qi + j * qj, in
  // the statistics dtype, rounded once to out's dtype (that of a and b); an undefined b, s, w
  // or bias drops its term (w: 1).
  void (*apply)(const Tensor& out, const Tensor& a, const Tensor& p, const Tensor& b,
                const Tensor& r, const Tensor& s, const Tensor& w, const Tensor& bias, int64_t n,
                int64_t c, int64_t hw, int64_t qi, int64_t qj);
};

// The ops over a backend's kernels, after the meta checks.
TensorTriple run_batch_norm(const NormKernels& k, const Tensor& input, const Tensor& weight,
                            const Tensor& bias, const Tensor& running_mean,
                            const Tensor& running_var, bool has_stats, bool training,
                            double momentum, double eps);
TensorTriple run_batch_norm_backward(const NormKernels& k, const Tensor& grad_out,
                                     const Tensor& input, const Tensor& weight,
                                     const Tensor& running_mean, const Tensor& running_var,
                                     const Tensor& save_mean, const Tensor& save_invstd, bool train,
                                     double eps, IntArrayRef output_mask);
TensorTriple run_group_norm(const NormKernels& k, const Tensor& input, const Tensor& weight,
                            const Tensor& bias, int64_t N, int64_t C, int64_t HxW, int64_t group,
                            double eps);
TensorTriple run_group_norm_backward(const NormKernels& k, const Tensor& grad_out,
                                     const Tensor& input, const Tensor& mean, const Tensor& rstd,
                                     const Tensor& weight, int64_t N, int64_t C, int64_t HxW,
                                     int64_t group, IntArrayRef output_mask);
TensorTriple run_layer_norm(const NormKernels& k, const Tensor& input, IntArrayRef normalized_shape,
                            const Tensor& weight, const Tensor& bias, double eps);
TensorTriple run_layer_norm_backward(const NormKernels& k, const Tensor& grad_out,
                                     const Tensor& input, IntArrayRef normalized_shape,
                                     const Tensor& mean, const Tensor& rstd, const Tensor& weight,
                                     const Tensor& bias, IntArrayRef output_mask);

// The eight ops' kernels over a backend's NormKernels object (static storage), as plain
// functions a backend registers: &NormOps<kMyNorm>::batch_norm_legit, ...
template <const NormKernels& K>
struct NormOps {
  static TensorTriple batch_norm_legit(const Tensor& x, const Tensor& w, const Tensor& b,
                                       const Tensor& rm, const Tensor& rv, bool training,
                                       double momentum, double eps) {
    return run_batch_norm(K, x, w, b, rm, rv, true, training, momentum, eps);
  }
  static TensorTriple batch_norm_no_stats(const Tensor& x, const Tensor& w, const Tensor& b,
                                          bool training, double momentum, double eps) {
    return run_batch_norm(K, x, w, b, Tensor(), Tensor(), false, training, momentum, eps);
  }
  static TensorTriple batch_norm_no_training(const Tensor& x, const Tensor& w, const Tensor& b,
                                             const Tensor& rm, const Tensor& rv, double momentum,
                                             double eps) {
    return run_batch_norm(K, x, w, b, rm, rv, true, false, momentum, eps);
  }
  static TensorTriple batch_norm_backward(const Tensor& g, const Tensor& x, const Tensor& w,
                                          const Tensor& rm, const Tensor& rv, const Tensor& sm,
                                          const Tensor& si, bool train, double eps,
                                          IntArrayRef mask) {
    return run_batch_norm_backward(K, g, x, w, rm, rv, sm, si, train, eps, mask);
  }
  static TensorTriple group_norm(const Tensor& x, const Tensor& w, const Tensor& b, int64_t N,
                                 int64_t C, int64_t HxW, int64_t group, double eps) {
    return run_group_norm(K, x, w, b, N, C, HxW, group, eps);
  }
  static TensorTriple group_norm_backward(const Tensor& g, const Tensor& x, const Tensor& mean,
                                          const Tensor& rstd, const Tensor& w, int64_t N, int64_t C,
                                          int64_t HxW, int64_t group, IntArrayRef mask) {
    return run_group_norm_backward(K, g, x, mean, rstd, w, N, C, HxW, group, mask);
  }
  static TensorTriple layer_norm(const Tensor& x, IntArrayRef shape, const Tensor& w,
                                 const Tensor& b, double eps) {
    return run_layer_norm(K, x, shape, w, b, eps);
  }
  static TensorTriple layer_norm_backward(const Tensor& g, const Tensor& x, IntArrayRef shape,
                                          const Tensor& mean, const Tensor& rstd, const Tensor& w,
                                          const Tensor& b, IntArrayRef mask) {
    return run_layer_norm_backward(K, g, x, shape, mean, rstd, w, b, mask);
  }
};

}  // namespace kiln::detail

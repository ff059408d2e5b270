#pragma once
// Batch, group and layer normalization: ATen's core ops (native_batch_norm_legit and its
// no_stats and no_training forms, native_group_norm, native_layer_norm and their backward ops)
// and torch.nn.functional's batch_norm and group_norm over them (Note [Batch, group and layer
// norm] in kiln/ops/norm_meta.cpp). Undefined weight, bias or running stats mean none.
#include <tuple>

#include "kiln/core/tensor.h"

namespace kiln {

// Batch norm over [N, C, *] (rank >= 2), per channel C. With running stats: training
// normalises with the batch's statistics and updates running_mean/running_var in place
// (momentum, unbiased variance), eval normalises with them. Returns (out, save_mean,
// save_rstd); save_* are [C] in float32 for 16-bit inputs and empty in eval.
std::tuple<Tensor, Tensor, Tensor> native_batch_norm_legit(const Tensor& input,
                                                           const Tensor& weight, const Tensor& bias,
                                                           const Tensor& running_mean,
                                                           const Tensor& running_var, bool training,
                                                           double momentum, double eps);
std::tuple<Tensor, Tensor, Tensor> native_batch_norm_legit(const Tensor& input,
                                                           const Tensor& weight, const Tensor& bias,
                                                           bool training, double momentum,
                                                           double eps);
std::tuple<Tensor, Tensor, Tensor> native_batch_norm_legit_no_training(
    const Tensor& input, const Tensor& weight, const Tensor& bias, const Tensor& running_mean,
    const Tensor& running_var, double momentum, double eps);
// ATen's signature; output_mask: which of grad_input, grad_weight, grad_bias to compute.
std::tuple<Tensor, Tensor, Tensor> native_batch_norm_backward(
    const Tensor& grad_out, const Tensor& input, const Tensor& weight, const Tensor& running_mean,
    const Tensor& running_var, const Tensor& save_mean, const Tensor& save_invstd, bool train,
    double eps, IntArrayRef output_mask);

// Group norm of input [N, C, *] (N * C * HxW elements) in `group` groups of channels: (out,
// mean [N, group], rstd [N, group]).
std::tuple<Tensor, Tensor, Tensor> native_group_norm(const Tensor& input, const Tensor& weight,
                                                     const Tensor& bias, int64_t N, int64_t C,
                                                     int64_t HxW, int64_t group, double eps);
std::tuple<Tensor, Tensor, Tensor> native_group_norm_backward(
    const Tensor& grad_out, const Tensor& input, const Tensor& mean, const Tensor& rstd,
    const Tensor& weight, int64_t N, int64_t C, int64_t HxW, int64_t group,
    IntArrayRef output_mask);

// Layer norm with its statistics: (out, mean, rstd), mean and rstd shaped like input with the
// normalized dims kept as 1. layer_norm (ops.h) is the same without them, fused for training.
std::tuple<Tensor, Tensor, Tensor> native_layer_norm(const Tensor& input,
                                                     IntArrayRef normalized_shape,
                                                     const Tensor& weight, const Tensor& bias,
                                                     double eps);
std::tuple<Tensor, Tensor, Tensor> native_layer_norm_backward(
    const Tensor& grad_out, const Tensor& input, IntArrayRef normalized_shape, const Tensor& mean,
    const Tensor& rstd, const Tensor& weight, const Tensor& bias, IntArrayRef output_mask);
// layer_norm's (ops.h) gradients in one pass over grad_output and input, which recomputes the
// row statistics: (grad_input, grad_weight, grad_bias) as output_mask asks (undefined where it
// does not); grad_weight = sum(grad_output * xhat) and grad_bias = sum(grad_output) over the
// leading dims, normalized_shape-sized in input's dtype. Its autograd formula's op.
std::tuple<Tensor, Tensor, Tensor> layer_norm_fused_backward(const Tensor& grad_output,
                                                             const Tensor& input,
                                                             IntArrayRef normalized_shape,
                                                             const Tensor& weight, double eps,
                                                             IntArrayRef output_mask);

// torch.nn.functional.batch_norm: training uses the batch's statistics (and updates the running
// stats when given), eval the running stats (which must then be given).
Tensor batch_norm(const Tensor& input, const Tensor& running_mean, const Tensor& running_var,
                  const Tensor& weight = {}, const Tensor& bias = {}, bool training = false,
                  double momentum = 0.1, double eps = 1e-5);
// torch.nn.functional.group_norm: input [N, C, *], C divisible by num_groups.
Tensor group_norm(const Tensor& input, int64_t num_groups, const Tensor& weight = {},
                  const Tensor& bias = {}, double eps = 1e-5);

}  // namespace kiln

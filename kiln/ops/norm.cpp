// Batch, group and layer norm's public functions (Note [Batch, group and layer norm] in
// norm_meta.cpp).
#include "kiln/ops/norm.h"

#include "kiln/ops/op_list.h"

namespace kiln {

using Triple = std::tuple<Tensor, Tensor, Tensor>;

Triple native_batch_norm_legit(const Tensor& input, const Tensor& weight, const Tensor& bias,
                               const Tensor& running_mean, const Tensor& running_var, bool training,
                               double momentum, double eps) {
  return ops::op_native_batch_norm_legit(input, weight, bias, running_mean, running_var, training,
                                         momentum, eps);
}
Triple native_batch_norm_legit(const Tensor& input, const Tensor& weight, const Tensor& bias,
                               bool training, double momentum, double eps) {
  return ops::op_native_batch_norm_legit_no_stats(input, weight, bias, training, momentum, eps);
}
Triple native_batch_norm_legit_no_training(const Tensor& input, const Tensor& weight,
                                           const Tensor& bias, const Tensor& running_mean,
                                           const Tensor& running_var, double momentum, double eps) {
  return ops::op_native_batch_norm_legit_no_training(input, weight, bias, running_mean, running_var,
                                                     momentum, eps);
}
Triple native_batch_norm_backward(const Tensor& grad_out, const Tensor& input, const Tensor& weight,
                                  const Tensor& running_mean, const Tensor& running_var,
                                  const Tensor& save_mean, const Tensor& save_invstd, bool train,
                                  double eps, IntArrayRef output_mask) {
  return ops::op_native_batch_norm_backward(grad_out, input, weight, running_mean, running_var,
                                            save_mean, save_invstd, train, eps, output_mask);
}
Triple native_group_norm(const Tensor& input, const Tensor& weight, const Tensor& bias, int64_t N,
                         int64_t C, int64_t HxW, int64_t group, double eps) {
  return ops::op_native_group_norm(input, weight, bias, N, C, HxW, group, eps);
}
Triple native_group_norm_backward(const Tensor& grad_out, const Tensor& input, const Tensor& mean,
                                  const Tensor& rstd, const Tensor& weight, int64_t N, int64_t C,
                                  int64_t HxW, int64_t group, IntArrayRef output_mask) {
  return ops::op_native_group_norm_backward(grad_out, input, mean, rstd, weight, N, C, HxW, group,
                                            output_mask);
}
Triple native_layer_norm(const Tensor& input, IntArrayRef normalized_shape, const Tensor& weight,
                         const Tensor& bias, double eps) {
  return ops::op_native_layer_norm(input, normalized_shape, weight, bias, eps);
}
Triple native_layer_norm_backward(const Tensor& grad_out, const Tensor& input,
                                  IntArrayRef normalized_shape, const Tensor& mean,
                                  const Tensor& rstd, const Tensor& weight, const Tensor& bias,
                                  IntArrayRef output_mask) {
  return ops::op_native_layer_norm_backward(grad_out, input, normalized_shape, mean, rstd, weight,
                                            bias, output_mask);
}
Triple layer_norm_fused_backward(const Tensor& grad_output, const Tensor& input,
                                 IntArrayRef normalized_shape, const Tensor& weight, double eps,
                                 IntArrayRef output_mask) {
  return ops::op_layer_norm_fused_backward(grad_output, input, normalized_shape, weight, eps,
                                           output_mask);
}

Tensor batch_norm(const Tensor& input, const Tensor& running_mean, const Tensor& running_var,
                  const Tensor& weight, const Tensor& bias, bool training, double momentum,
                  double eps) {
  KILN_CHECK(running_mean.defined() == running_var.defined(),
             "[batch_norm] running_mean and running_var must both be given or both be None");
  if (!running_mean.defined())
    return std::get<0>(
        ops::op_native_batch_norm_legit_no_stats(input, weight, bias, training, momentum, eps));
  if (!training)
    return std::get<0>(ops::op_native_batch_norm_legit_no_training(
        input, weight, bias, running_mean, running_var, momentum, eps));
  return std::get<0>(ops::op_native_batch_norm_legit(input, weight, bias, running_mean, running_var,
                                                     true, momentum, eps));
}

Tensor group_norm(const Tensor& input, int64_t num_groups, const Tensor& weight, const Tensor& bias,
                  double eps) {
  KILN_CHECK(input.defined() && input.dim() >= 2,
             "[group_norm] input must be [N, C, *] (at least 2 dims), got shape {}",
             input.defined() ? input.sizes() : IntArrayRef());
  const int64_t N = input.size(0), C = input.size(1);
  int64_t hw = 1;
  for (int64_t i = 2; i < input.dim(); ++i) hw *= input.size(i);
  return std::get<0>(ops::op_native_group_norm(input, weight, bias, N, C, hw, num_groups, eps));
}

}  // namespace kiln

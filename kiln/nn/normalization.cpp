// BatchNorm1d/2d/3d and GroupNorm.
#include "kiln/nn/normalization.h"

#include "kiln/core/error.h"
#include "kiln/ops/ops.h"

namespace kiln::nn {

BatchNormNd::BatchNormNd(const char* name, int64_t min_dim, int64_t max_dim, int64_t num_features,
                         const BatchNormOptions& options, const Init& init)
    : num_features(num_features),
      options(options),
      name_(name),
      min_dim_(min_dim),
      max_dim_(max_dim) {
  KILN_CHECK(num_features > 0, "[{}] num_features must be positive, got {}", name, num_features);
  if (options.affine) {
    weight = ones({num_features}, init.dtype, init.device);
    bias = zeros({num_features}, init.dtype, init.device);
    register_parameter("weight", &weight);
    register_parameter("bias", &bias);
  }
  if (options.track_running_stats) {
    running_mean = zeros({num_features}, init.dtype, init.device);
    running_var = ones({num_features}, init.dtype, init.device);
    num_batches_tracked = zeros({}, kInt64, init.device);
    register_buffer("running_mean", &running_mean);
    register_buffer("running_var", &running_var);
    register_buffer("num_batches_tracked", &num_batches_tracked);
  }
}

void BatchNormNd::reset_running_stats() {
  if (!options.track_running_stats) return;
  running_mean.fill_(0);
  running_var.fill_(1);
  num_batches_tracked.fill_(0);
}

Tensor BatchNormNd::forward(const Tensor& x) {
  KILN_CHECK(x.defined() && x.dim() >= min_dim_ && x.dim() <= max_dim_,
             "[{}] expected a {}{}-D input, got shape {}", name_,
             min_dim_ == max_dim_ ? "" : fmt::format("{}-D or ", min_dim_), max_dim_,
             x.defined() ? x.sizes() : IntArrayRef());
  KILN_CHECK(x.size(1) == num_features, "[{}] expected {} channels (dim 1), got shape {}", name_,
             num_features, x.sizes());
  const bool training = is_training();
  // Training, or no running stats: the batch's statistics (updating the running stats when
  // tracked); eval with running stats: those.
  const bool use_batch = training || !options.track_running_stats;
  Tensor y = batch_norm(x, running_mean, running_var, weight, bias, use_batch, options.momentum,
                        options.eps);
  // Counted once the op has accepted the batch: a refused one leaves every buffer as it was.
  if (training && options.track_running_stats) add_(num_batches_tracked, 1);
  return y;
}

GroupNorm::GroupNorm(int64_t num_groups, int64_t num_channels, double eps, bool affine,
                     const Init& init)
    : num_groups(num_groups), num_channels(num_channels), eps(eps) {
  KILN_CHECK(num_groups > 0 && num_channels % num_groups == 0,
             "[GroupNorm] num_channels must be divisible by num_groups, got {} and {}",
             num_channels, num_groups);
  if (affine) {
    weight = ones({num_channels}, init.dtype, init.device);
    bias = zeros({num_channels}, init.dtype, init.device);
    register_parameter("weight", &weight);
    register_parameter("bias", &bias);
  }
}

Tensor GroupNorm::forward(const Tensor& x) {
  KILN_CHECK(x.defined() && x.dim() >= 2 && x.size(1) == num_channels,
             "[GroupNorm] expected input [N, {}, *], got shape {}", num_channels,
             x.defined() ? x.sizes() : IntArrayRef());
  return group_norm(x, num_groups, weight, bias, eps);
}

}  // namespace kiln::nn

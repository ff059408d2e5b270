#pragma once
// Normalization modules over batch and group norm (kiln/ops/norm.h): BatchNorm1d/2d/3d and
// GroupNorm, as torch.nn's. LayerNorm and RMSNorm live in layers.h.
#include "kiln/nn/layers.h"

namespace kiln::nn {

struct BatchNormOptions {
  double eps = 1e-5;
  double momentum = 0.1;  // running = (1 - momentum) * running + momentum * batch statistic
  bool affine = true;     // a learnable weight (ones) and bias (zeros)
  // running_mean (zeros), running_var (ones) and num_batches_tracked (int64 0) as buffers:
  // training updates them and eval normalises with them. Without them eval uses the batch's
  // statistics too, as PyTorch's.
  bool track_running_stats = true;
};

// Batch norm over [N, C, *] per channel; the subclasses fix the accepted ranks. Buffers land
// in state dicts and checkpoints; a compiled function that ran it is guarded by the training
// flag, and its replays update the running stats as eager calls do.
class BatchNormNd : public UnaryModule {
 public:
  BatchNormNd(const char* name, int64_t min_dim, int64_t max_dim, int64_t num_features,
              const BatchNormOptions& options, const Init& init);
  Tensor forward(const Tensor& x) override;
  // running_mean to zeros, running_var to ones, num_batches_tracked to 0.
  void reset_running_stats();
  Tensor weight, bias, running_mean, running_var, num_batches_tracked;
  int64_t num_features;
  BatchNormOptions options;

 private:
  const char* name_;
  int64_t min_dim_, max_dim_;
};

// [N, C] or [N, C, L].
class BatchNorm1d : public BatchNormNd {
 public:
  explicit BatchNorm1d(int64_t num_features, const BatchNormOptions& options = {},
                       const Init& init = {})
      : BatchNormNd("BatchNorm1d", 2, 3, num_features, options, init) {}
};
// [N, C, H, W].
class BatchNorm2d : public BatchNormNd {
 public:
  explicit BatchNorm2d(int64_t num_features, const BatchNormOptions& options = {},
                       const Init& init = {})
      : BatchNormNd("BatchNorm2d", 4, 4, num_features, options, init) {}
};
// [N, C, D, H, W].
class BatchNorm3d : public BatchNormNd {
 public:
  explicit BatchNorm3d(int64_t num_features, const BatchNormOptions& options = {},
                       const Init& init = {})
      : BatchNormNd("BatchNorm3d", 5, 5, num_features, options, init) {}
};

// Group norm of [N, C, *] in num_groups groups of channels, with a per-channel weight (ones)
// and bias (zeros) when affine. The same in train and eval.
class GroupNorm : public UnaryModule {
 public:
  GroupNorm(int64_t num_groups, int64_t num_channels, double eps = 1e-5, bool affine = true,
            const Init& init = {});
  Tensor forward(const Tensor& x) override;
  Tensor weight, bias;
  int64_t num_groups, num_channels;
  double eps;
};

}  // namespace kiln::nn

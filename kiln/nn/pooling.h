#pragma once
// Pooling modules: MaxPool2d, AvgPool2d and AdaptiveAvgPool2d, as torch.nn's, over the functional
// pooling in kiln/ops/pool.h (batched [N, C, H, W] or unbatched [C, H, W] inputs). Sizes given as
// one value apply to both spatial dims ({2} is 2x2); an empty stride is the kernel size. They
// hold no parameters.
#include <optional>
#include <vector>

#include "kiln/nn/layers.h"

namespace kiln::nn {

struct MaxPoolOptions {
  std::vector<int64_t> stride = {};
  std::vector<int64_t> padding = {0};
  std::vector<int64_t> dilation = {1};
  bool ceil_mode = false;
};

struct AvgPoolOptions {
  std::vector<int64_t> stride = {};
  std::vector<int64_t> padding = {0};
  bool ceil_mode = false;
  bool count_include_pad = true;
  std::optional<int64_t> divisor_override = std::nullopt;
};

// The max over each kernel_size window (max_pool2d).
class MaxPool2d : public UnaryModule {
 public:
  explicit MaxPool2d(std::vector<int64_t> kernel_size, const MaxPoolOptions& options = {});
  Tensor forward(const Tensor& x) override;
  std::vector<int64_t> kernel_size;
  MaxPoolOptions options;
};

// The mean over each kernel_size window (avg_pool2d).
class AvgPool2d : public UnaryModule {
 public:
  explicit AvgPool2d(std::vector<int64_t> kernel_size, const AvgPoolOptions& options = {});
  Tensor forward(const Tensor& x) override;
  std::vector<int64_t> kernel_size;
  AvgPoolOptions options;
};

// The mean over the windows that split each spatial dim into output_size parts
// (adaptive_avg_pool2d; {1} is global average pooling).
class AdaptiveAvgPool2d : public UnaryModule {
 public:
  explicit AdaptiveAvgPool2d(std::vector<int64_t> output_size);
  Tensor forward(const Tensor& x) override;
  std::vector<int64_t> output_size;
};

}  // namespace kiln::nn

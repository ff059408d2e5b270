#pragma once
// A small image classifier: conv–batch-norm–ReLU–max-pool blocks, then a linear head. What
// `kiln train --model cnn` trains on Fashion-MNIST and what the CNN benchmarks time.
#include <cstdint>
#include <memory>
#include <vector>

#include "kiln/nn/layers.h"

namespace kiln::nn {

struct CNNConfig {
  int64_t in_channels = 1;
  int64_t image_size = 28;  // square inputs [N, in_channels, image_size, image_size]
  // One block per entry: Conv2d(3x3, padding 1, no bias) -> BatchNorm2d -> ReLU ->
  // MaxPool2d(2), each halving the image (rounding down).
  std::vector<int64_t> channels = {32, 64};
  int64_t hidden = 128;   // Linear -> ReLU -> Dropout before the classifier; 0: none
  double dropout = 0.25;  // of the hidden layer
  int64_t classes = 10;
};

// Parameters "features.<i>..." (the blocks' modules in order, as one Sequential) and
// "classifier.<i>..." (Flatten, the hidden Linear, ReLU, Dropout, the output Linear).
class CNN : public UnaryModule {
 public:
  explicit CNN(const CNNConfig& config = {}, const Init& init = {});
  // Logits [N, classes] of images [N, in_channels, image_size, image_size].
  Tensor forward(const Tensor& images) override;
  const CNNConfig& config() const { return config_; }

 private:
  CNNConfig config_;
  std::shared_ptr<Sequential> features_, classifier_;
};

}  // namespace kiln::nn

#include "kiln/nn/cnn.h"

#include "kiln/core/error.h"
#include "kiln/nn/conv.h"
#include "kiln/nn/normalization.h"
#include "kiln/nn/pooling.h"

namespace kiln::nn {

CNN::CNN(const CNNConfig& c, const Init& init) : config_(c) {
  KILN_CHECK(c.in_channels > 0 && c.classes > 0 && c.hidden >= 0 && !c.channels.empty(),
             "[CNN] in_channels and classes must be positive, hidden >= 0 and channels not "
             "empty, got in_channels={} classes={} hidden={} channels={}",
             c.in_channels, c.classes, c.hidden, IntArrayRef(c.channels));
  KILN_CHECK(c.dropout >= 0 && c.dropout < 1, "[CNN] dropout must be in [0, 1), got {}", c.dropout);
  features_ = std::make_shared<Sequential>();
  int64_t in = c.in_channels, side = c.image_size;
  for (int64_t out : c.channels) {
    KILN_CHECK(out > 0, "[CNN] channels must be positive, got {}", IntArrayRef(c.channels));
    KILN_CHECK(side >= 2, "[CNN] a {}x{} image is too small for {} pooling blocks", c.image_size,
               c.image_size, c.channels.size());
    // No bias: the batch norm's shift takes its place.
    features_->push_back(std::make_shared<Conv2d>(
        in, out, std::vector<int64_t>{3}, ConvOptions{.padding = {1}, .bias = false}, init));
    features_->push_back(std::make_shared<BatchNorm2d>(out, BatchNormOptions{}, init));
    features_->push_back(std::make_shared<ReLU>());
    features_->push_back(std::make_shared<MaxPool2d>(std::vector<int64_t>{2}));
    in = out;
    side /= 2;
  }
  classifier_ = std::make_shared<Sequential>();
  classifier_->push_back(std::make_shared<Flatten>());
  int64_t width = in * side * side;
  if (c.hidden > 0) {
    classifier_->push_back(std::make_shared<Linear>(width, c.hidden, true, init));
    classifier_->push_back(std::make_shared<ReLU>());
    classifier_->push_back(std::make_shared<Dropout>(c.dropout));
    width = c.hidden;
  }
  classifier_->push_back(std::make_shared<Linear>(width, c.classes, true, init));
  register_module("features", features_);
  register_module("classifier", classifier_);
}

Tensor CNN::forward(const Tensor& images) { return (*classifier_)((*features_)(images)); }

}  // namespace kiln::nn

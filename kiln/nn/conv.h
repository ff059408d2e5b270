#pragma once
// Convolution modules: Conv1d/2d/3d and ConvTranspose1d/2d/3d, as torch.nn's, over the
// functional convolutions in kiln/ops/conv.h. Sizes given as one value apply to every spatial
// dim ({3} is 3x3 for Conv2d); otherwise give one value per dim. Weights and biases start at
// U(-1/sqrt(fan_in), 1/sqrt(fan_in)), PyTorch's default (kaiming_uniform with a = sqrt(5)).
#include <string>
#include <vector>

#include "kiln/nn/layers.h"

namespace kiln::nn {

struct ConvOptions {
  std::vector<int64_t> stride = {1};
  // Numbers, unless padding_str names "same" or "valid" (stride 1 for "same").
  std::vector<int64_t> padding = {0};
  std::string padding_str = {};
  std::vector<int64_t> dilation = {1};
  int64_t groups = 1;
  bool bias = true;
};

struct ConvTransposeOptions {
  std::vector<int64_t> stride = {1};
  std::vector<int64_t> padding = {0};
  std::vector<int64_t> output_padding = {0};
  std::vector<int64_t> dilation = {1};
  int64_t groups = 1;
  bool bias = true;
};

// One class for 1-3 spatial dims; Conv1d/2d/3d fix the count. Weight [out, in / groups, *k].
class ConvNd : public UnaryModule {
 public:
  ConvNd(int64_t spatial_dims, int64_t in_channels, int64_t out_channels,
         std::vector<int64_t> kernel_size, const ConvOptions& options, const Init& init);
  Tensor forward(const Tensor& x) override;
  Tensor weight, bias;
  int64_t spatial_dims;
  ConvOptions options;
};

// Weight [in, out / groups, *k], as torch.nn.ConvTranspose*d.
class ConvTransposeNd : public UnaryModule {
 public:
  ConvTransposeNd(int64_t spatial_dims, int64_t in_channels, int64_t out_channels,
                  std::vector<int64_t> kernel_size, const ConvTransposeOptions& options,
                  const Init& init);
  Tensor forward(const Tensor& x) override;
  Tensor weight, bias;
  int64_t spatial_dims;
  ConvTransposeOptions options;
};

#define KILN_CONV_MODULE(Name, Base, Options, dims)                                       \
  class Name : public Base {                                                              \
   public:                                                                                \
    Name(int64_t in_channels, int64_t out_channels, std::vector<int64_t> kernel_size,     \
         const Options& options = {}, const Init& init = {})                              \
        : Base(dims, in_channels, out_channels, std::move(kernel_size), options, init) {} \
  };
KILN_CONV_MODULE(Conv1d, ConvNd, ConvOptions, 1)
KILN_CONV_MODULE(Conv2d, ConvNd, ConvOptions, 2)
KILN_CONV_MODULE(Conv3d, ConvNd, ConvOptions, 3)
KILN_CONV_MODULE(ConvTranspose1d, ConvTransposeNd, ConvTransposeOptions, 1)
KILN_CONV_MODULE(ConvTranspose2d, ConvTransposeNd, ConvTransposeOptions, 2)
KILN_CONV_MODULE(ConvTranspose3d, ConvTransposeNd, ConvTransposeOptions, 3)
#undef KILN_CONV_MODULE

}  // namespace kiln::nn

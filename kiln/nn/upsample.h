#pragma once
// nn::Upsample, as torch.nn.Upsample, over interpolate (kiln/ops/pad.h): [N, C, L] inputs with
// mode "nearest" or "linear", [N, C, H, W] with "nearest" or "bilinear". It holds no parameters.
#include <optional>
#include <string>
#include <vector>

#include "kiln/nn/layers.h"

namespace kiln::nn {

struct UpsampleOptions {
  // Exactly one of size and scale_factor: one value for every spatial dim, or one per dim.
  std::optional<std::vector<int64_t>> size = std::nullopt;
  std::optional<std::vector<double>> scale_factor = std::nullopt;
  std::string mode = "nearest";  // "nearest", "linear" or "bilinear"
  // Only for the linear modes (false when none), as torch's.
  std::optional<bool> align_corners = std::nullopt;
};

class Upsample : public UnaryModule {
 public:
  // Checks the options (the input's rank is checked by interpolate).
  explicit Upsample(const UpsampleOptions& options);
  Tensor forward(const Tensor& x) override;
  UpsampleOptions options;
};

}  // namespace kiln::nn

// grid_sample over grid_sampler_2d (kiln/ops/grid_sample.h).
#include "kiln/ops/grid_sample.h"

#include "kiln/core/error.h"
#include "kiln/ops/op_list.h"

namespace kiln {

Tensor grid_sample(const Tensor& input, const Tensor& grid, std::string_view mode,
                   std::string_view padding_mode, bool align_corners) {
  int64_t interp = 0, pad = 0;
  if (mode == "bilinear")
    interp = 0;
  else if (mode == "nearest")
    interp = 1;
  else if (mode == "bicubic")
    interp = 2;
  else
    KILN_CHECK(false, "[grid_sample] mode must be 'bilinear', 'nearest' or 'bicubic', got '{}'",
               mode);
  if (padding_mode == "zeros")
    pad = 0;
  else if (padding_mode == "border")
    pad = 1;
  else if (padding_mode == "reflection")
    pad = 2;
  else
    KILN_CHECK(false,
               "[grid_sample] padding_mode must be 'zeros', 'border' or 'reflection', got '{}'",
               padding_mode);
  return ops::op_grid_sampler_2d(input, grid, interp, pad, align_corners);
}

}  // namespace kiln

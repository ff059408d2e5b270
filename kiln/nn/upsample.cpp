#include "kiln/nn/upsample.h"

#include <cmath>

#include "kiln/core/error.h"
#include "kiln/ops/pad.h"

namespace kiln::nn {

Upsample::Upsample(const UpsampleOptions& opt) : options(opt) {
  const char* m = "Upsample";
  KILN_CHECK(opt.size.has_value() != opt.scale_factor.has_value(),
             "[{}] exactly one of size and scale_factor must be given", m);
  if (opt.size) {
    KILN_CHECK(!opt.size->empty() && opt.size->size() <= 2,
               "[{}] size must have 1 or 2 values, got {}", m, IntArrayRef(*opt.size));
    for (int64_t s : *opt.size)
      KILN_CHECK(s > 0, "[{}] size must be positive, got {}", m, IntArrayRef(*opt.size));
  } else {
    KILN_CHECK(!opt.scale_factor->empty() && opt.scale_factor->size() <= 2,
               "[{}] scale_factor must have 1 or 2 values, got {}", m, opt.scale_factor->size());
    for (double f : *opt.scale_factor)
      KILN_CHECK(f > 0 && std::isfinite(f), "[{}] scale_factor must be positive, got {}", m, f);
  }
  const bool linear = opt.mode == "linear" || opt.mode == "bilinear";
  KILN_CHECK(linear || opt.mode == "nearest",
             "[{}] mode must be \"nearest\", \"linear\" or \"bilinear\", got \"{}\"", m, opt.mode);
  KILN_CHECK(linear || !opt.align_corners,
             "[{}] align_corners can only be set with mode \"linear\" or \"bilinear\", got \"{}\"",
             m, opt.mode);
}

Tensor Upsample::forward(const Tensor& x) {
  return interpolate(x, options.size, options.scale_factor, options.mode, options.align_corners);
}

}  // namespace kiln::nn

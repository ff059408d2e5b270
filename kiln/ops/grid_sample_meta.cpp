// grid_sampler_2d and its backward op: meta functions, meta kernels and the geometry the
// backends share.
#include "kiln/ops/grid_sample_meta.h"

#include "kiln/ops/structured.h"

namespace kiln {

// Note [grid_sampler_2d]
// grid_sampler_2d(input [N, C, H, W], grid [N, OH, OW, 2], interpolation_mode, padding_mode,
// align_corners) is ATen's (torch.nn.functional.grid_sample): output[n, c, i, j] samples plane
// (n, c) at grid[n, i, j] = (x, y) in [-1, 1] (x the width). The steps are ATen's GridSampler.h
// (kiln/ops/grid_sample_math.h): unnormalize to pixels (align_corners: -1 and 1 are the corner
// pixels' centres, ((x + 1) / 2) (W - 1); else their outer edges, ((x + 1) W - 1) / 2); then the
// padding mode: zeros (out-of-range taps read 0), border (clipped to [0, W - 1]) or reflection
// (reflected about the corner centres or edges, then clipped); then bilinear (the 4 neighbours),
// nearest (rounded half to even, as nearbyint) or bicubic (16 taps of Keys' cubic with
// A = -0.75, each tap padded on its own; bicubic unnormalizes without padding first). A
// coordinate that is not finite or past int's range reads 0, as ATen's. The backward op returns
// (grad_input, grad_grid) for the flags of output_mask (undefined where 0): grad_input adds each
// output gradient into the taps it read; grad_grid is the derivative through the weights and the
// coordinate steps (0 for nearest). Several grid points read one input pixel, so grad_input is a
// scatter: the CPU kernel runs one image per thread (the same bits every run), the CUDA kernel one
// grid point per thread with atomicAdd (as ATen's; the order of the adds, and so the last bits,
// may differ between runs). 16-bit inputs are computed in float32 and rounded once.

namespace meta {
namespace {

void check_modes(const char* op, int64_t interpolation_mode, int64_t padding_mode) {
  KILN_CHECK(interpolation_mode >= 0 && interpolation_mode <= 2,
             "[{}] interpolation_mode must be 0 (bilinear), 1 (nearest) or 2 (bicubic), got {}", op,
             interpolation_mode);
  KILN_CHECK(padding_mode >= 0 && padding_mode <= 2,
             "[{}] padding_mode must be 0 (zeros), 1 (border) or 2 (reflection), got {}", op,
             padding_mode);
}

}  // namespace

TensorSpec grid_sampler_2d(const Tensor& input, const Tensor& grid, int64_t interpolation_mode,
                           int64_t padding_mode, bool align_corners) {
  (void)align_corners;
  const char* op = "grid_sampler_2d";
  check_defined(op, input, "input");
  check_defined(op, grid, "grid");
  Device d = common_device(op, {&input, &grid});
  KILN_CHECK_TYPE(is_floating(input.dtype()),
                  "[{}] only supports floating-point dtypes, input got {}", op, input.dtype());
  KILN_CHECK_TYPE(input.dtype() == grid.dtype(),
                  "[{}] expected input and grid to have the same dtype, got {} and {}", op,
                  input.dtype(), grid.dtype());
  KILN_CHECK(input.dim() == 4 && grid.dim() == 4,
             "[{}] expected 4-D input and grid, got input sizes {} and grid sizes {}", op,
             input.sizes(), grid.sizes());
  KILN_CHECK(input.size(0) == grid.size(0),
             "[{}] expected input and grid to have the same batch size, got input sizes {} and "
             "grid sizes {}",
             op, input.sizes(), grid.sizes());
  KILN_CHECK(grid.size(3) == 2, "[{}] expected grid to have size 2 in its last dim, got sizes {}",
             op, grid.sizes());
  KILN_CHECK(input.size(2) > 0 && input.size(3) > 0,
             "[{}] expected input to have non-empty spatial dims, got sizes {}", op, input.sizes());
  check_modes(op, interpolation_mode, padding_mode);
  return {{input.size(0), input.size(1), grid.size(1), grid.size(2)}, input.dtype(), d};
}

void grid_sampler_2d_backward(const Tensor& grad_output, const Tensor& input, const Tensor& grid,
                              int64_t interpolation_mode, int64_t padding_mode, bool align_corners,
                              IntArrayRef output_mask) {
  const char* op = "grid_sampler_2d_backward";
  check_defined(op, grad_output, "grad_output");
  TensorSpec s = grid_sampler_2d(input, grid, interpolation_mode, padding_mode, align_corners);
  KILN_CHECK(grad_output.sizes() == IntArrayRef(s.sizes),
             "[{}] grad_output must have sizes {}, got {}", op, s.sizes, grad_output.sizes());
  KILN_CHECK_TYPE(grad_output.dtype() == s.dtype, "[{}] grad_output must be {}, got {}", op,
                  s.dtype, grad_output.dtype());
  common_device(op, {&grad_output, &input});
  KILN_CHECK(output_mask.size() == 2, "[{}] output_mask must have 2 flags, got {}", op,
             output_mask);
  for (int64_t m : output_mask)
    KILN_CHECK(m == 0 || m == 1, "[{}] output_mask flags must be 0 or 1, got {}", op, output_mask);
}

}  // namespace meta

namespace detail {

grid::Geom grid_geom(const Tensor& input, const Tensor& grid, int64_t interpolation_mode,
                     int64_t padding_mode, bool align_corners) {
  grid::Geom g;
  g.N = input.size(0);
  g.C = input.size(1);
  g.H = input.size(2);
  g.W = input.size(3);
  g.OH = grid.size(1);
  g.OW = grid.size(2);
  g.interp = static_cast<int>(interpolation_mode);
  g.padding = static_cast<int>(padding_mode);
  g.align = align_corners;
  return g;
}

}  // namespace detail

namespace {
Tensor meta_grid_sampler_2d(const Tensor& input, const Tensor& grid, int64_t interp, int64_t pad,
                            bool align) {
  TensorSpec s = meta::grid_sampler_2d(input, grid, interp, pad, align);
  return detail::empty_tensor(s.sizes, s.dtype, Device(kMeta));
}
std::tuple<Tensor, Tensor> meta_grid_sampler_2d_backward(const Tensor& grad_output,
                                                         const Tensor& input, const Tensor& grid,
                                                         int64_t interp, int64_t pad, bool align,
                                                         IntArrayRef output_mask) {
  meta::grid_sampler_2d_backward(grad_output, input, grid, interp, pad, align, output_mask);
  Tensor gi, gg;
  if (output_mask[0]) gi = detail::empty_tensor(input.sizes(), input.dtype(), Device(kMeta));
  if (output_mask[1]) gg = detail::empty_tensor(grid.sizes(), grid.dtype(), Device(kMeta));
  return {gi, gg};
}

template <class Sig>
void reg(TypedOp<Sig>& op, Sig* fn) {
  op.def.set_meta_raw(reinterpret_cast<void*>(fn));
  op.set_kernel(DispatchKey::Meta, fn);
}
const bool registered = [] {
  reg(ops::op_grid_sampler_2d, &meta_grid_sampler_2d);
  reg(ops::op_grid_sampler_2d_backward, &meta_grid_sampler_2d_backward);
  return true;
}();
}  // namespace

}  // namespace kiln

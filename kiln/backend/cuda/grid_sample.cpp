// CUDA kernels of grid_sampler_2d and its backward op: host glue (Note [grid_sampler_2d] in
// kiln/ops/grid_sample_meta.cpp). Operands are made contiguous in the accumulating type (float
// for the 16-bit floats), as on the CPU, and the results cast once.
#include "kiln/backend/cuda/grid_sample.h"
#include "kiln/backend/cuda/common.h"
#include "kiln/ops/grid_sample_meta.h"

namespace kiln::cuda {
namespace {

DType acc_of(DType t) { return t == kFloat64 ? kFloat64 : kFloat32; }
Tensor finished(const Tensor& out, DType dtype) {
  return out.dtype() == dtype ? out : contiguous_as(out, dtype);
}

Tensor grid_sampler_2d_kernel(const Tensor& input_, const Tensor& grid_, int64_t interp,
                              int64_t pad, bool align) {
  TensorSpec s = meta::grid_sampler_2d(input_, grid_, interp, pad, align);
  const detail::grid::Geom g = detail::grid_geom(input_, grid_, interp, pad, align);
  const DType acc = acc_of(s.dtype);
  Tensor input = contiguous_as(input_, acc), gr = contiguous_as(grid_, acc);
  Tensor out = empty_cuda(s.sizes, acc, s.device);
  launch_grid_sampler_2d(acc == kFloat64, input.impl()->data(), gr.impl()->data(),
                         out.impl()->data(), g, stream_for(out));
  check_launch("grid_sampler_2d");
  return finished(out, s.dtype);
}

std::tuple<Tensor, Tensor> grid_sampler_2d_backward_kernel(const Tensor& grad_output_,
                                                           const Tensor& input_,
                                                           const Tensor& grid_, int64_t interp,
                                                           int64_t pad, bool align,
                                                           IntArrayRef output_mask) {
  meta::grid_sampler_2d_backward(grad_output_, input_, grid_, interp, pad, align, output_mask);
  const detail::grid::Geom g = detail::grid_geom(input_, grid_, interp, pad, align);
  const DType acc = acc_of(input_.dtype());
  const Device d = input_.device();
  Tensor input = contiguous_as(input_, acc), gr = contiguous_as(grid_, acc);
  Tensor go = contiguous_as(grad_output_, acc);
  Tensor gin, ggrid = empty_cuda(grid_.sizes(), acc, d);
  cudaStream_t stream = stream_for(ggrid);
  if (output_mask[0]) {
    gin = empty_cuda(input_.sizes(), acc, d);
    KILN_CUDA_CHECK(cudaMemsetAsync(gin.impl()->data(), 0,
                                    static_cast<size_t>(gin.numel()) * itemsize(acc), stream));
  }
  launch_grid_sampler_2d_backward(acc == kFloat64, go.impl()->data(), input.impl()->data(),
                                  gr.impl()->data(), gin.defined() ? gin.impl()->data() : nullptr,
                                  ggrid.impl()->data(), g, stream);
  check_launch("grid_sampler_2d_backward");
  Tensor ri, rg;
  if (output_mask[0]) ri = finished(gin, input_.dtype());
  if (output_mask[1]) rg = finished(ggrid, grid_.dtype());
  return {ri, rg};
}

}  // namespace

KILN_CUDA_KERNELS(backend_kernel(ops::op_grid_sampler_2d, &grid_sampler_2d_kernel),
                  backend_kernel(ops::op_grid_sampler_2d_backward,
                                 &grid_sampler_2d_backward_kernel));

}  // namespace kiln::cuda

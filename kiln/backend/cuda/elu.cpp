// Host glue of the CUDA kernels of elu and elu_backward (elu.h), and of flip and repeat (their
// device-independent kernels in kiln/ops/flip_repeat.cpp, built from index_select and copies).
#include "kiln/backend/cuda/elu.h"
#include "kiln/backend/cuda/common.h"
#include "kiln/ops/flip_repeat.h"
#include "kiln/ops/structured.h"

namespace kiln::cuda {
namespace {

EluCoef coef(const Scalar& alpha, const Scalar& scale, const Scalar& input_scale) {
  return {alpha.to_double() * scale.to_double(), scale.to_double(), input_scale.to_double()};
}

void elu_impl(const Tensor& out, const Tensor& a, const Scalar& alpha, const Scalar& scale,
              const Scalar& input_scale) {
  with_result(out, a.dtype(), false, [&](const Tensor& r) {
    launch_elu(dt(a.dtype()), make_indexer<2>(r, {&a}), r.impl()->data(), operand(a),
               coef(alpha, scale, input_scale), stream_for(r));
    check_launch("elu");
  });
}

void elu_backward_impl(const Tensor& out, const Tensor& grad, const Scalar& alpha,
                       const Scalar& scale, const Scalar& input_scale, bool is_result,
                       const Tensor& x) {
  with_result(out, x.dtype(), false, [&](const Tensor& r) {
    launch_elu_backward(dt(x.dtype()), make_indexer<3>(r, {&grad, &x}), r.impl()->data(),
                        operand(grad), operand(x), coef(alpha, scale, input_scale), is_result,
                        stream_for(r));
    check_launch("elu_backward");
  });
}

}  // namespace

KILN_CUDA_POINTWISE(elu, &elu_impl);
KILN_CUDA_STRUCTURED(elu_backward, &elu_backward_impl);
KILN_CUDA_STRUCTURED(flip, &::kiln::detail::flip_impl);
KILN_CUDA_STRUCTURED(repeat, &::kiln::detail::repeat_impl);

}  // namespace kiln::cuda

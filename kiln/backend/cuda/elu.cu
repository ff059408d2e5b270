// CUDA kernels of elu and elu_backward, on the elementwise engine (loops.cuh).
#include "kiln/backend/cuda/elu.h"
#include "kiln/backend/cuda/loops.cuh"

namespace kiln::cuda {
namespace {

template <class T>
struct Elu {
  using F = acc_t<T>;
  F neg, pos, input;
  __device__ T operator()(T v) const {
    F x = cvt<F>(v);
    return cvt<T>(x > F(0) ? x * pos : expm1(x * input) * neg);
  }
};
template <class T>
struct EluBackward {
  using F = acc_t<T>;
  F neg, pos, input;
  bool is_result;
  __device__ T operator()(T gv, T xv) const {
    F g = cvt<F>(gv), x = cvt<F>(xv);
    if (x > F(0)) return cvt<T>(g * pos);
    return cvt<T>(is_result ? g * input * (x + neg) : g * input * neg * exp(x * input));
  }
};

}  // namespace

void launch_elu(Dt dt, const Indexer<2>& ix, void* out, const Operand& x, EluCoef c,
                cudaStream_t stream) {
  KILN_CUDA_DISPATCH_FLOAT(dt, [&] {
    using F = acc_t<scalar_t>;
    Elu<scalar_t> f{static_cast<F>(c.neg), static_cast<F>(c.pos), static_cast<F>(c.input)};
    launch_elementwise<scalar_t>(ix, out, f, stream, in_of<scalar_t>(x));
  });
}

void launch_elu_backward(Dt dt, const Indexer<3>& ix, void* out, const Operand& grad,
                         const Operand& x, EluCoef c, bool is_result, cudaStream_t stream) {
  KILN_CUDA_DISPATCH_FLOAT(dt, [&] {
    using F = acc_t<scalar_t>;
    EluBackward<scalar_t> f{static_cast<F>(c.neg), static_cast<F>(c.pos), static_cast<F>(c.input),
                            is_result};
    launch_elementwise<scalar_t, scalar_t, scalar_t>(ix, out, f, stream, in_of<scalar_t>(grad),
                                                     in_of<scalar_t>(x));
  });
}

}  // namespace kiln::cuda

// CPU kernels of elu and elu_backward, with ATen's coefficients: negcoef = alpha * scale,
// poscoef = scale, negiptcoef = input_scale.
#include <cmath>

#include "kiln/backend/cpu/loops.h"
#include "kiln/ops/structured.h"

namespace kiln::cpu {
namespace {

void elu_impl(const Tensor& out, const Tensor& a, const Scalar& alpha, const Scalar& scale,
              const Scalar& input_scale) {
  with_result_dtype(out, a.dtype(), [&](const Tensor& r) {
    KILN_DISPATCH_FLOAT_TYPES(a.dtype(), "elu", [&] {
      using T = scalar_t;
      using F = acc_t<T>;
      const F neg = static_cast<F>(alpha.to_double() * scale.to_double());
      const F pos = scale.to<F>(), in = input_scale.to<F>();
      elementwise<T, T>(r, {&a}, [=](T v) -> T {
        F x = v;
        return static_cast<T>(x > F(0) ? x * pos : std::expm1(x * in) * neg);
      });
    });
  });
}

void elu_backward_impl(const Tensor& out, const Tensor& grad, const Scalar& alpha,
                       const Scalar& scale, const Scalar& input_scale, bool is_result,
                       const Tensor& x) {
  with_result_dtype(out, x.dtype(), [&](const Tensor& r) {
    KILN_DISPATCH_FLOAT_TYPES(x.dtype(), "elu_backward", [&] {
      using T = scalar_t;
      using F = acc_t<T>;
      const F neg = static_cast<F>(alpha.to_double() * scale.to_double());
      const F pos = scale.to<F>(), in = input_scale.to<F>();
      elementwise<T, T, T>(r, {&grad, &x}, [=](T gv, T xv) -> T {
        F g = gv, v = xv;
        if (v > F(0)) return static_cast<T>(g * pos);
        return static_cast<T>(is_result ? g * in * (v + neg) : g * in * neg * std::exp(v * in));
      });
    });
  });
}

constexpr auto K = DispatchKey::CPU;
KILN_REGISTER_POINTWISE(elu, K, &elu_impl);
KILN_REGISTER_STRUCTURED(elu_backward, K, &elu_backward_impl);

}  // namespace
}  // namespace kiln::cpu

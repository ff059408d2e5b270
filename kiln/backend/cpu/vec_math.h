#pragma once
// Float exp, tanh and erf written without calls or branches, so that the compiler vectorises
// the loops that use them (libm's expf/tanhf/erff are scalar calls: in the GELU and softmax of a
// training step they took a quarter to a half of the time). Internal to backend/cpu.
//
// Accuracy against glibc over every 251st float (tests/backend/vec_math_test.cpp checks it):
// exp_f within 1 ulp, tanh_f within 2 ulp, erf_f within 6e-7 absolute (it is used only inside
// GELU, 0.5 x (1 + erf), where that is about one float32 ulp of the result). NaN propagates;
// +-inf give the limits. The loops vectorise only with -fno-trapping-math (see CMakeLists.txt).
#include <bit>
#include <cmath>
#include <cstdint>
#include <type_traits>

namespace kiln::cpu {

// e^x: x = n ln2 + r with |r| <= ln2 / 2, a degree-6 polynomial for e^r (Cephes' expf
// coefficients), and 2^n applied in two halves so that results near the overflow and underflow
// limits scale correctly.
inline float exp_f(float x) {
  float c = x < -104.0f ? -104.0f : (x > 89.0f ? 89.0f : x);
  float nf = (c * 1.44269504088896341f + 12582912.0f) - 12582912.0f;  // round to nearest
  float r = c - nf * 0.693359375f;
  r = r - nf * -2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  int32_t n = static_cast<int32_t>(nf);
  int32_t h = n / 2;
  float s1 = std::bit_cast<float>((h + 127) << 23);
  float s2 = std::bit_cast<float>((n - h + 127) << 23);
  float y = p * s1 * s2;
  return x != x ? x : y;
}

// tanh: an odd polynomial below |x| = 0.625 (Cephes' tanhf), 1 - 2 / (e^{2|x|} + 1) above.
inline float tanh_f(float x) {
  float a = x < 0 ? -x : x;
  float z = x * x;
  float small = ((((-5.70498872745e-3f * z + 2.06390887954e-2f) * z - 5.37397155531e-2f) * z +
                  1.33314422036e-1f) *
                     z -
                 3.33332819422e-1f) *
                    z * x +
                x;
  float big = 1.0f - 2.0f / (exp_f(2.0f * a) + 1.0f);
  big = x < 0 ? -big : big;
  return a < 0.625f ? small : big;
}

// erf: Abramowitz and Stegun 7.1.26, |error| <= 1.5e-7.
inline float erf_f(float x) {
  float a = x < 0 ? -x : x;
  float t = 1.0f / (1.0f + 0.3275911f * a);
  float p = ((((1.061405429f * t - 1.453152027f) * t + 1.421413741f) * t - 0.284496736f) * t +
             0.254829592f) *
            t;
  float y = 1.0f - p * exp_f(-a * a);
  y = x < 0 ? -y : y;
  return x != x ? x : y;
}

// The kernels' entry points: the vectorisable float versions, libm for double.
template <class F>
inline F exp_any(F x) {
  if constexpr (std::is_same_v<F, float>)
    return exp_f(x);
  else
    return std::exp(x);
}
template <class F>
inline F tanh_any(F x) {
  if constexpr (std::is_same_v<F, float>)
    return tanh_f(x);
  else
    return std::tanh(x);
}
template <class F>
inline F erf_any(F x) {
  if constexpr (std::is_same_v<F, float>)
    return erf_f(x);
  else
    return std::erf(x);
}

}  // namespace kiln::cpu

// CPU kernels of the multi-tensor (foreach) updates used by optimizers. Every list is validated
// before the first tensor is written.
#include <cmath>

#include "kiln/backend/cpu/loops.h"
#include "kiln/ops/other_meta.h"
#include "kiln/ops/structured.h"

// bool lists compute in int and convert back; the conversion of a product is intended.
#pragma GCC diagnostic ignored "-Wint-in-bool-context"

namespace kiln::cpu {
namespace {

void check_writable(const char* op, const TensorList& self,
                    std::initializer_list<const TensorList*> others) {
  for (size_t i = 0; i < self.size(); ++i) {
    const Tensor& t = self[i];
    KILN_CHECK_DEVICE(t.device().is_cpu(), "[{}] tensor {} is on {}, expected cpu", op, i,
                      t.device());
    std::vector<const Tensor*> ins;
    for (const TensorList* l : others) ins.push_back(&(*l)[i]);
    TensorSpec spec{Shape(t.sizes()), t.dtype(), t.device()};
    meta::check_inplace(op, t, spec, ArrayRef<const Tensor*>(ins.data(), ins.size()));
  }
}

// self[i] = f(self[i], a[i], ...) with every operand in self[i]'s dtype.
template <class... Lists, class Make>
void update(const char* op, const TensorList& self, Make make, const Lists&... lists) {
  for (size_t i = 0; i < self.size(); ++i) {
    const Tensor& s = self[i];
    if (s.numel() == 0) continue;
    DType t = s.dtype();
    std::array<Tensor, sizeof...(Lists)> cast{as_dtype(lists[i], t)...};
    KILN_DISPATCH_TYPES(t, op, [&] {
      using T = scalar_t;
      auto f = make(static_cast<T*>(nullptr));
      [&]<size_t... I>(std::index_sequence<I...>) {
        std::array<const Tensor*, sizeof...(Lists) + 1> ins{&s, &cast[I]...};
        elementwise<T, T, std::conditional_t<true, T, decltype(I)>...>(s, ins, f);
      }
      (std::index_sequence_for<Lists...>{});
    });
    s.impl()->storage()->bump_version();
  }
}

// The type arithmetic happens in; bool computes in int and converts back (nonzero is true).
template <class T>
using A = std::conditional_t<std::is_same_v<T, bool>, int, acc_t<T>>;

void add_(const TensorList& self, const TensorList& other, const Scalar& alpha) {
  meta::foreach_lists("foreach_add_", {&self, &other});
  meta::foreach_scalar("foreach_add_", self, alpha);
  check_writable("foreach_add_", self, {&other});
  update(
      "foreach_add_", self,
      [&](auto* tag) {
        using T = std::remove_pointer_t<decltype(tag)>;
        A<T> al = alpha.to<A<T>>();
        return [al](T x, T y) -> T { return static_cast<A<T>>(x) + al * static_cast<A<T>>(y); };
      },
      other);
}
void mul_(const TensorList& self, const Scalar& scalar) {
  meta::foreach_lists("foreach_mul_", {&self});
  meta::foreach_scalar("foreach_mul_", self, scalar);
  check_writable("foreach_mul_", self, {});
  update("foreach_mul_", self, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    A<T> c = scalar.to<A<T>>();
    return [c](T x) -> T { return static_cast<A<T>>(x) * c; };
  });
}
void mul_list_(const TensorList& self, const TensorList& other) {
  meta::foreach_lists("foreach_mul_list_", {&self, &other});
  check_writable("foreach_mul_list_", self, {&other});
  update(
      "foreach_mul_list_", self,
      [&](auto* tag) {
        using T = std::remove_pointer_t<decltype(tag)>;
        return [](T x, T y) -> T { return static_cast<A<T>>(x) * static_cast<A<T>>(y); };
      },
      other);
}
void lerp_(const TensorList& self, const TensorList& end, const Scalar& weight) {
  meta::foreach_lists("foreach_lerp_", {&self, &end});
  meta::foreach_float("foreach_lerp_", self);
  check_writable("foreach_lerp_", self, {&end});
  update(
      "foreach_lerp_", self,
      [&](auto* tag) {
        using T = std::remove_pointer_t<decltype(tag)>;
        A<T> w = weight.to<A<T>>();
        // PyTorch's formula: the endpoint nearer the weight anchors the sum, for exactness.
        return [w](T s, T e) -> T {
          A<T> x = s, y = e;
          bool small_weight;
          if constexpr (std::is_unsigned_v<A<T>>)
            small_weight = w < A<T>(1);  // never reached: lerp takes floats only
          else
            small_weight = std::abs(w) < A<T>(0.5);
          return small_weight ? x + w * (y - x) : y - (y - x) * (A<T>(1) - w);
        };
      },
      end);
}
void addcmul_(const TensorList& self, const TensorList& t1, const TensorList& t2,
              const Scalar& value) {
  meta::foreach_lists("foreach_addcmul_", {&self, &t1, &t2});
  meta::foreach_scalar("foreach_addcmul_", self, value);
  check_writable("foreach_addcmul_", self, {&t1, &t2});
  update(
      "foreach_addcmul_", self,
      [&](auto* tag) {
        using T = std::remove_pointer_t<decltype(tag)>;
        A<T> v = value.to<A<T>>();
        return [v](T s, T a, T b) -> T {
          return static_cast<A<T>>(s) + v * static_cast<A<T>>(a) * static_cast<A<T>>(b);
        };
      },
      t1, t2);
}
void addcdiv_(const TensorList& self, const TensorList& t1, const TensorList& t2,
              const Scalar& value) {
  meta::foreach_lists("foreach_addcdiv_", {&self, &t1, &t2});
  meta::foreach_float("foreach_addcdiv_", self);
  check_writable("foreach_addcdiv_", self, {&t1, &t2});
  update(
      "foreach_addcdiv_", self,
      [&](auto* tag) {
        using T = std::remove_pointer_t<decltype(tag)>;
        A<T> v = value.to<A<T>>();
        return [v](T s, T a, T b) -> T {
          return static_cast<A<T>>(s) + v * (static_cast<A<T>>(a) / static_cast<A<T>>(b));
        };
      },
      t1, t2);
}
void sqrt_(const TensorList& self) {
  meta::foreach_lists("foreach_sqrt_", {&self});
  meta::foreach_float("foreach_sqrt_", self);
  check_writable("foreach_sqrt_", self, {});
  update("foreach_sqrt_", self, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    return [](T x) -> T { return std::sqrt(static_cast<A<T>>(x)); };
  });
}
TensorList sqrt(const TensorList& self) {
  meta::foreach_lists("foreach_sqrt", {&self});
  TensorList out;
  out.reserve(self.size());
  for (const Tensor& t : self) out.push_back(ops::op_sqrt(t));
  return out;
}

// One pass over p, g, m, v per tensor (PyTorch's AdamW arithmetic), in float for 16-bit types.
struct AdamWStep {
  double decay, beta1, beta2, step_size, bc2_sqrt, eps;
};
template <class T>
inline void adamw_range(T* p, const T* g, T* m, T* v, int64_t begin, int64_t end,
                        const AdamWStep& s) {
  using C = A<T>;
  const C decay = s.decay, b1 = s.beta1, b2 = s.beta2, step_size = s.step_size,
          inv_bc2_sqrt = C(1) / s.bc2_sqrt, eps = s.eps;
  for (int64_t i = begin; i < end; ++i) {
    C gi = g[i];
    C mi = static_cast<C>(m[i]) + (C(1) - b1) * (gi - static_cast<C>(m[i]));
    C vi = static_cast<C>(v[i]) * b2 + (C(1) - b2) * gi * gi;
    C pi = static_cast<C>(p[i]) * decay;
    p[i] = static_cast<T>(pi - step_size * mi / (std::sqrt(vi) * inv_bc2_sqrt + eps));
    m[i] = static_cast<T>(mi);
    v[i] = static_cast<T>(vi);
  }
}
// The float32 loop is built twice, for AVX2 and for the baseline, and picked at load time
// (GCC function multiversioning): it is compute-bound on sqrt and division, which AVX2 does
// eight at a time.
__attribute__((target_clones("avx2", "default"))) void adamw_f32(float* p, const float* g, float* m,
                                                                 float* v, int64_t n,
                                                                 const AdamWStep& s) {
#pragma omp parallel for if (n > 65536) schedule(static)
  for (int64_t c = 0; c < n; c += 4096) adamw_range(p, g, m, v, c, std::min(n, c + 4096), s);
}
template <class T>
void adamw_tensor(T* p, const T* g, T* m, T* v, int64_t n, const AdamWStep& s) {
  if constexpr (std::is_same_v<T, float>) {
    adamw_f32(p, g, m, v, n, s);
  } else {
#pragma omp parallel for if (n > 65536) schedule(static)
    for (int64_t c = 0; c < n; c += 4096) adamw_range(p, g, m, v, c, std::min(n, c + 4096), s);
  }
}
void adamw_(const TensorList& p, const TensorList& g, const TensorList& m, const TensorList& v,
            const TensorList& steps, const Tensor& lr_t, double beta1, double beta2, double eps,
            double wd, const Tensor& found_inf) {
  const char* op = "foreach_adamw_";
  meta::foreach_adamw(op, p, g, m, v, steps, lr_t, beta1, beta2, eps, wd, found_inf);
  check_writable(op, p, {&g, &m, &v});
  check_writable(op, m, {&g, &v});
  check_writable(op, v, {&g});
  const double lr = *static_cast<const double*>(lr_t.impl()->data());
  KILN_CHECK(lr >= 0 && std::isfinite(lr), "[{}] lr must be finite and >= 0, got {}", op, lr);
  for (size_t i = 0; i < p.size(); ++i) {
    double taken = *static_cast<const double*>(steps[i].impl()->data());
    KILN_CHECK(taken >= 0 && taken == std::floor(taken),
               "[{}] steps[{}] must hold a whole number >= 0, got {}", op, i, taken);
    for (size_t j = 0; j < i; ++j)
      KILN_CHECK(steps[j].impl()->data() != steps[i].impl()->data(),
                 "[{}] steps[{}] and steps[{}] are the same tensor", op, j, i);
  }
  // A skipped step (GradScaler found an inf or NaN): nothing is written, steps included.
  if (found_inf.defined() && *static_cast<const float*>(found_inf.impl()->data()) != 0) return;
  for (size_t i = 0; i < p.size(); ++i) {
    double& step = *static_cast<double*>(steps[i].impl()->data());
    step += 1;
    steps[i].impl()->storage()->bump_version();
    double bc1 = 1 - std::pow(beta1, step);
    double bc2 = 1 - std::pow(beta2, step);
    AdamWStep s{1 - lr * wd, beta1, beta2, lr / bc1, std::sqrt(bc2), eps};
    // Strided tensors are updated through contiguous copies.
    bool direct = p[i].is_contiguous() && m[i].is_contiguous() && v[i].is_contiguous();
    Tensor pc = direct ? p[i] : p[i].contiguous(), mc = direct ? m[i] : m[i].contiguous(),
           vc = direct ? v[i] : v[i].contiguous(), gc = g[i].contiguous();
    KILN_DISPATCH_FLOAT_TYPES(p[i].dtype(), op, [&] {
      using T = scalar_t;
      adamw_tensor<T>(pc.data<T>(), gc.data<T>(), mc.data<T>(), vc.data<T>(), pc.numel(), s);
    });
    if (!direct) {
      Tensor(p[i]).copy_(pc);
      Tensor(m[i]).copy_(mc);
      Tensor(v[i]).copy_(vc);
    }
    for (const TensorList* l : {&p, &m, &v}) (*l)[i].impl()->storage()->bump_version();
  }
}

const bool registered = [] {
  constexpr auto K = DispatchKey::CPU;
  ops::op_foreach_adamw_.set_kernel(K, &adamw_);
  ops::op_foreach_add_.set_kernel(K, &add_);
  ops::op_foreach_mul_.set_kernel(K, &mul_);
  ops::op_foreach_mul_list_.set_kernel(K, &mul_list_);
  ops::op_foreach_lerp_.set_kernel(K, &lerp_);
  ops::op_foreach_addcmul_.set_kernel(K, &addcmul_);
  ops::op_foreach_addcdiv_.set_kernel(K, &addcdiv_);
  ops::op_foreach_sqrt_.set_kernel(K, &sqrt_);
  ops::op_foreach_sqrt.set_kernel(K, &sqrt);
  return true;
}();

}  // namespace
}  // namespace kiln::cpu

// CPU kernels for copies, fills, casts and factories, and the engine's shared helpers.
#include <omp.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <numbers>

#include "kiln/backend/cpu/loops.h"
#include "kiln/ops/other_meta.h"
#include "kiln/ops/structured.h"

namespace kiln::cpu {

int omp_threads() { return omp_get_num_threads(); }
}  // namespace kiln::cpu

namespace kiln {
namespace {
// The largest thread count asked of OpenMP on any thread: the process's default when libkiln
// loads (OMP_NUM_THREADS or the cores: what a thread's first team gets), then every
// set_num_threads (see largest_thread_team).
std::atomic<int> g_largest_thread_team{omp_get_max_threads()};
}  // namespace

void set_num_threads(int n) {
  KILN_CHECK(n >= 1, "[set_num_threads] expected at least 1 thread, got {}", n);
  int seen = g_largest_thread_team.load();
  while (n > seen && !g_largest_thread_team.compare_exchange_weak(seen, n)) {
  }
  omp_set_num_threads(n);
}
int get_num_threads() { return omp_get_max_threads(); }

int cpu::largest_thread_team() { return g_largest_thread_team.load(); }
}  // namespace kiln

namespace kiln::cpu {
int omp_thread() { return omp_get_thread_num(); }

Tensor empty_cpu(IntArrayRef sizes, DType dtype) {
  return detail::empty_tensor(sizes, dtype, Device(kCPU));
}

void copy_kernel(const Tensor& dst, const Tensor& src) {
  if (dst.numel() == 0) return;
  if (dst.dtype() == src.dtype() && dst.is_contiguous() && src.is_contiguous() &&
      dst.numel() == src.numel()) {
    std::memcpy(dst.impl()->data(), src.impl()->data(), dst.nbytes());
    return;
  }
  KILN_DISPATCH_TYPES(dst.dtype(), "copy_", [&] {
    using O = scalar_t;
    KILN_DISPATCH_TYPES(src.dtype(), "copy_", [&] {
      using I = scalar_t;
      elementwise<O, I>(dst, {&src}, [](I x) -> O {
        if constexpr (std::is_same_v<O, bool>)
          return static_cast<float>(x) != 0.0f;
        else if constexpr (std::is_same_v<O, Half> || std::is_same_v<O, BFloat16>)
          return O(static_cast<float>(x));
        else
          return static_cast<O>(static_cast<acc_t<I>>(x));
      });
    });
  });
}

Tensor as_dtype(const Tensor& t, DType dtype) {
  if (t.dtype() == dtype) return t;
  Tensor out = empty_cpu(t.sizes(), dtype);
  copy_kernel(out, t);
  return out;
}

Tensor operand_as(const Tensor& t, DType dtype) {
  if (t.dtype() == dtype) return t;
  if (t.dim() != 0) return as_dtype(t, dtype);
  thread_local Tensor scratch[kNumDTypes];
  Tensor& s = scratch[static_cast<int>(dtype)];
  // Held elsewhere (the other operand of the same call): make a fresh one.
  Tensor out = s.defined() && s.impl()->use_count() == 1 ? s : (s = empty_cpu({}, dtype));
  Scalar v = KILN_DISPATCH_TYPES(t.dtype(), "operand_as", [&]() -> Scalar {
    return Scalar(*static_cast<const scalar_t*>(t.impl()->data()));
  });
  KILN_DISPATCH_TYPES(dtype, "operand_as",
                      [&] { *static_cast<scalar_t*>(out.impl()->data()) = v.to<scalar_t>(); });
  return out;
}

Tensor contiguous_as(const Tensor& t, DType dtype) {
  if (t.dtype() == dtype && t.is_contiguous()) return t;
  Tensor out = empty_cpu(t.sizes(), dtype);
  copy_kernel(out, t);
  return out;
}

namespace {

void check_host(const char* op, const Tensor& t) {
  KILN_CHECK_DEVICE(t.device().is_cpu(), "[{}] expected a cpu tensor, got one on {}", op,
                    t.device());
}

void cpu_copy_(const Tensor& self, const Tensor& src) {
  meta::copy_(self, src);
  check_host("copy_", self);
  check_host("copy_", src);
  copy_kernel(self, src);
  self.impl()->storage()->bump_version();
}

void fill_kernel(const Tensor& self, const Scalar& value) {
  KILN_DISPATCH_TYPES(self.dtype(), "fill_", [&] {
    scalar_t v = value.to<scalar_t>();
    elementwise<scalar_t>(self, {}, [v]() { return v; });
  });
}

void cpu_fill_(const Tensor& self, const Scalar& value) {
  meta::fill_(self, value);
  fill_kernel(self, value);
  self.impl()->storage()->bump_version();
}

Tensor cpu_to_copy(const Tensor& self, DType dtype, Device device) {
  TensorSpec s = meta::to_copy(self, dtype, device);
  if (device.is_cpu()) {
    Tensor out = empty_cpu(s.sizes, dtype);
    copy_kernel(out, self);
    return out;
  }
  Tensor out = detail::empty_tensor(s.sizes, dtype, device);
  if (device.is_meta()) return out;
  // Another device: stage a contiguous host buffer of the right dtype, then copy the bytes.
  Tensor host = as_dtype(self, dtype).contiguous();
  DeviceInterface* iface = device_interface(device.type());
  iface->copy_bytes(out.impl()->data(), true, host.impl()->data(), false, host.nbytes(),
                    device.index());
  return out;
}

Tensor cpu_empty(IntArrayRef sizes, DType dtype, Device) {
  meta::factory("empty", sizes, dtype);
  return empty_cpu(sizes, dtype);
}

Tensor cpu_full(IntArrayRef sizes, const Scalar& value, DType dtype, Device) {
  meta::factory("full", sizes, dtype);
  meta::check_fits("full", value, dtype);
  Tensor out = empty_cpu(sizes, dtype);
  fill_kernel(out, value);
  return out;
}

Tensor cpu_arange(const Scalar& start, const Scalar& end, const Scalar& step, DType dtype, Device) {
  meta::arange(start, end, step, dtype);
  int64_t n = meta::arange_length(start, end, step);
  Tensor out = empty_cpu({n}, dtype);
  KILN_DISPATCH_TYPES(dtype, "arange", [&] {
    scalar_t* p = static_cast<scalar_t*>(out.impl()->data());
    if (is_floating(dtype)) {
      // start + step * i as one fused multiply-add, in PyTorch's CPU accumulation type (double
      // for float32/float64, float for the 16-bit types), so values match it bit for bit.
      using A = std::conditional_t<sizeof(scalar_t) == 2, float, double>;
      A s = static_cast<A>(start.to_double()), st = static_cast<A>(step.to_double());
      for (int64_t i = 0; i < n; ++i)
        p[i] = static_cast<scalar_t>(std::fma(st, static_cast<A>(i), s));
    } else {
      int64_t s = start.to_int(), st = step.to_int();
      for (int64_t i = 0; i < n; ++i) p[i] = static_cast<scalar_t>(s + st * i);
    }
  });
  return out;
}

Tensor cpu_linspace(const Scalar& start, const Scalar& end, int64_t steps, DType dtype, Device) {
  meta::linspace(start, end, steps, dtype);
  Tensor out = empty_cpu({steps}, dtype);
  KILN_DISPATCH_TYPES(dtype, "linspace", [&] {
    using A =
        std::conditional_t<std::is_floating_point_v<acc_t<scalar_t>>, acc_t<scalar_t>, double>;
    scalar_t* p = static_cast<scalar_t*>(out.impl()->data());
    A s = static_cast<A>(start.to_double()), e = static_cast<A>(end.to_double());
    if (steps == 1) p[0] = static_cast<scalar_t>(s);
    if (steps <= 1) return;
    A step = (e - s) / static_cast<A>(steps - 1);
    // Symmetric like PyTorch: the second half counts back from `end`.
    int64_t half = steps / 2;
    for (int64_t i = 0; i < steps; ++i)
      p[i] = static_cast<scalar_t>(i < half ? std::fma(step, static_cast<A>(i), s)
                                            : std::fma(-step, static_cast<A>(steps - i - 1), e));
  });
  return out;
}

// See Note [Philox layout] in kiln/core/generator.h: element i of a draw reads fixed lanes of
// fixed blocks, so the values do not depend on how the loop is split across threads.
template <class F>
void philox_fill(int64_t n, int per_block, Generator* gen, F store) {
  Generator& g = gen ? *gen : default_generator();
  uint64_t seed = g.seed();
  int64_t blocks = (n + per_block - 1) / per_block;
  uint64_t base = g.advance(static_cast<uint64_t>(blocks) * 4);
#pragma omp parallel for if (n > kGrainSize)
  for (int64_t b = 0; b < blocks; ++b) {
    auto r = philox4x32(base + static_cast<uint64_t>(b), 0, seed);
    for (int j = 0; j < per_block; ++j) {
      int64_t i = b * per_block + j;
      if (i < n) store(i, r, j);
    }
  }
}
inline double u53(uint32_t hi, uint32_t lo) {
  return static_cast<double>(((static_cast<uint64_t>(hi) << 32) | lo) >> 11) * 0x1.0p-53;
}
inline float u24(uint32_t x) { return static_cast<float>(x >> 8) * 0x1.0p-24f; }

Tensor cpu_rand(IntArrayRef sizes, Generator* gen, DType dtype, Device) {
  meta::factory("rand", sizes, dtype);
  KILN_CHECK_TYPE(is_floating(dtype), "[rand] expected a floating-point dtype, got {}", dtype);
  Tensor out = empty_cpu(sizes, dtype);
  KILN_DISPATCH_FLOAT_TYPES(dtype, "rand", [&] {
    scalar_t* p = static_cast<scalar_t*>(out.impl()->data());
    if constexpr (std::is_same_v<scalar_t, double>) {
      philox_fill(out.numel(), 2, gen, [&](int64_t i, const std::array<uint32_t, 4>& r, int j) {
        p[i] = u53(r[2 * j], r[2 * j + 1]);
      });
    } else {
      philox_fill(out.numel(), 4, gen, [&](int64_t i, const std::array<uint32_t, 4>& r, int j) {
        // Values that round up to 1 in a 16-bit type are folded back below 1.
        scalar_t v = scalar_t(u24(r[j]));
        p[i] = static_cast<float>(v) >= 1.0f ? scalar_t(0.0f) : v;
      });
    }
  });
  return out;
}

Tensor cpu_randn(IntArrayRef sizes, Generator* gen, DType dtype, Device) {
  meta::factory("randn", sizes, dtype);
  KILN_CHECK_TYPE(is_floating(dtype), "[randn] expected a floating-point dtype, got {}", dtype);
  Tensor out = empty_cpu(sizes, dtype);
  constexpr double two_pi = 2 * std::numbers::pi;
  KILN_DISPATCH_FLOAT_TYPES(dtype, "randn", [&] {
    scalar_t* p = static_cast<scalar_t*>(out.impl()->data());
    // Box-Muller on (0, 1] x [0, 1): one normal per pair of uniforms.
    if constexpr (std::is_same_v<scalar_t, double>) {
      philox_fill(out.numel(), 1, gen, [&](int64_t i, const std::array<uint32_t, 4>& r, int) {
        double u1 = 1.0 - u53(r[0], r[1]), u2 = u53(r[2], r[3]);
        p[i] = std::sqrt(-2.0 * std::log(u1)) * std::cos(two_pi * u2);
      });
    } else {
      philox_fill(out.numel(), 2, gen, [&](int64_t i, const std::array<uint32_t, 4>& r, int j) {
        double u1 = 1.0 - u24(r[2 * j]), u2 = u24(r[2 * j + 1]);
        p[i] = static_cast<scalar_t>(
            static_cast<float>(std::sqrt(-2.0 * std::log(u1)) * std::cos(two_pi * u2)));
      });
    }
  });
  return out;
}

Tensor cpu_randint(int64_t low, int64_t high, IntArrayRef sizes, Generator* gen, DType dtype,
                   Device) {
  meta::randint(low, high, sizes, dtype);
  Tensor out = empty_cpu(sizes, dtype);
  uint64_t range = static_cast<uint64_t>(high) - static_cast<uint64_t>(low);
  KILN_DISPATCH_TYPES(dtype, "randint", [&] {
    scalar_t* p = static_cast<scalar_t*>(out.impl()->data());
    philox_fill(out.numel(), 2, gen, [&](int64_t i, const std::array<uint32_t, 4>& r, int j) {
      uint64_t x = (static_cast<uint64_t>(r[2 * j]) << 32) | r[2 * j + 1];
      p[i] = static_cast<scalar_t>(static_cast<int64_t>(static_cast<uint64_t>(low) + x % range));
    });
  });
  return out;
}

const bool registered = [] {
  constexpr auto K = DispatchKey::CPU;
  ops::op_copy_.set_kernel(K, &cpu_copy_);
  ops::op_fill_.set_kernel(K, &cpu_fill_);
  ops::op_to_copy.set_kernel(K, &cpu_to_copy);
  ops::op_empty.set_kernel(K, &cpu_empty);
  ops::op_full.set_kernel(K, &cpu_full);
  ops::op_arange.set_kernel(K, &cpu_arange);
  ops::op_linspace.set_kernel(K, &cpu_linspace);
  ops::op_rand.set_kernel(K, &cpu_rand);
  ops::op_randn.set_kernel(K, &cpu_randn);
  ops::op_randint.set_kernel(K, &cpu_randint);
  return true;
}();

}  // namespace

// Used by other CPU files for dropout masks.
void philox_uniform(const Tensor& out, Generator* gen) {
  float* p = static_cast<float*>(out.impl()->data());
  philox_fill(out.numel(), 4, gen,
              [&](int64_t i, const std::array<uint32_t, 4>& r, int j) { p[i] = u24(r[j]); });
}

}  // namespace kiln::cpu

// Kernels of the random and range factories. Each random kernel runs one thread per Philox
// block and reproduces the CPU's draws bit for bit (Note [Philox layout] in
// kiln/core/generator.h); see the transforms below for where float math may still differ.
#include <type_traits>

#include "kiln/backend/cuda/loops.cuh"
#include "kiln/backend/cuda/random.h"

namespace kiln::cuda {
namespace {

struct Lanes {
  uint32_t v[4];
};

// kiln::philox4x32 (kiln/core/generator.cpp) on the device: the same rounds, constants and
// counter/key packing, so block `counter` under `key` has the same four lanes.
__device__ __forceinline__ Lanes philox4x32(uint64_t counter_lo, uint64_t counter_hi,
                                            uint64_t key) {
  constexpr uint32_t kMul0 = 0xD2511F53u, kMul1 = 0xCD9E8D57u;
  constexpr uint32_t kWeyl0 = 0x9E3779B9u, kWeyl1 = 0xBB67AE85u;
  uint32_t c0 = static_cast<uint32_t>(counter_lo), c1 = static_cast<uint32_t>(counter_lo >> 32);
  uint32_t c2 = static_cast<uint32_t>(counter_hi), c3 = static_cast<uint32_t>(counter_hi >> 32);
  uint32_t k0 = static_cast<uint32_t>(key), k1 = static_cast<uint32_t>(key >> 32);
#pragma unroll
  for (int round = 0; round < 10; ++round) {
    uint32_t hi0 = __umulhi(kMul0, c0), lo0 = kMul0 * c0;
    uint32_t hi1 = __umulhi(kMul1, c2), lo1 = kMul1 * c2;
    c0 = hi1 ^ c1 ^ k0;
    c1 = lo1;
    c2 = hi0 ^ c3 ^ k1;
    c3 = lo0;
    k0 += kWeyl0;
    k1 += kWeyl1;
  }
  return {{c0, c1, c2, c3}};
}

// The CPU's uniforms (kiln/backend/cpu/common.cpp): 53 bits in [0, 1) and 24 bits in [0, 1);
// both are exact, so they match the CPU bit for bit.
__device__ __forceinline__ double u53(uint32_t hi, uint32_t lo) {
  return static_cast<double>(((static_cast<uint64_t>(hi) << 32) | lo) >> 11) * 0x1.0p-53;
}
__device__ __forceinline__ float u24(uint32_t x) { return static_cast<float>(x >> 8) * 0x1.0p-24f; }

// Box-Muller in double on (0, 1] x [0, 1), as the CPU. CUDA's double log and cos are not
// correctly rounded (glibc's nearly always are), so float64 normals differ from the CPU's in
// the last bits (measured on an H100: 15% of values, at most 3 ulp); the float, float16 and
// bfloat16 normals, rounded through float, matched the CPU's exactly (1M values each).
__device__ __forceinline__ double box_muller(double u1, double u2) {
  constexpr double kTwoPi = 2 * 3.14159265358979323846;
  return ::sqrt(-2.0 * ::log(u1)) * ::cos(kTwoPi * u2);
}

// Element i of a draw of n values reads block (offset + i / PerBlock), lanes by i % PerBlock:
// thread b computes block b and stores its (up to) PerBlock values with store(i, lanes, j).
template <int PerBlock, class Store>
__global__ void __launch_bounds__(kBlock) philox_kernel(int64_t n, PhiloxArgs ph, Store store) {
  int64_t b = static_cast<int64_t>(blockIdx.x) * kBlock + threadIdx.x;
  if (b * PerBlock >= n) return;
  // The device state is read here, when the kernel runs, so graph replays draw fresh values.
  uint64_t seed = ph.state ? ph.state[0] : ph.seed;
  uint64_t offset = ph.state ? ph.state[1] : ph.offset;
  Lanes r = philox4x32(offset + static_cast<uint64_t>(b), 0, seed);
#pragma unroll
  for (int j = 0; j < PerBlock; ++j) {
    int64_t i = b * PerBlock + j;
    if (i < n) store(i, r, j);
  }
}

template <int PerBlock, class Store>
void launch_philox(int64_t n, PhiloxArgs ph, Store store, cudaStream_t stream) {
  if (n == 0) return;
  int64_t blocks = (n + PerBlock - 1) / PerBlock;
  int64_t grid = (blocks + kBlock - 1) / kBlock;
  philox_kernel<PerBlock, Store><<<static_cast<unsigned>(grid), kBlock, 0, stream>>>(n, ph, store);
}

// rand, 16- and 32-bit floats: 4 per block; values that round up to 1 fold back to 0.
template <class T>
struct RandFloat {
  T* out;
  __device__ void operator()(int64_t i, const Lanes& r, int j) const {
    T v = cvt<T>(u24(r.v[j]));
    out[i] = cvt<float>(v) >= 1.0f ? cvt<T>(0.0f) : v;
  }
};
// rand, double: 2 per block.
struct RandDouble {
  double* out;
  __device__ void operator()(int64_t i, const Lanes& r, int j) const {
    out[i] = u53(r.v[2 * j], r.v[2 * j + 1]);
  }
};
// randn, 16- and 32-bit floats: 2 per block, computed in double and rounded through float.
template <class T>
struct RandnFloat {
  T* out;
  __device__ void operator()(int64_t i, const Lanes& r, int j) const {
    double u1 = 1.0 - u24(r.v[2 * j]), u2 = u24(r.v[2 * j + 1]);
    out[i] = cvt<T>(static_cast<float>(box_muller(u1, u2)));
  }
};
// randn, double: 1 per block.
struct RandnDouble {
  double* out;
  __device__ void operator()(int64_t i, const Lanes& r, int) const {
    out[i] = box_muller(1.0 - u53(r.v[0], r.v[1]), u53(r.v[2], r.v[3]));
  }
};
// randint: 2 per block, 64 bits each, reduced modulo the range.
template <class T>
struct Randint {
  T* out;
  uint64_t low;
  uint64_t range;
  __device__ void operator()(int64_t i, const Lanes& r, int j) const {
    uint64_t x = (static_cast<uint64_t>(r.v[2 * j]) << 32) | r.v[2 * j + 1];
    out[i] = cvt<T>(static_cast<int64_t>(low + x % range));
  }
};
// native_dropout: 4 per block (a float uniform each), kept where u >= p.
template <class T>
struct Dropout {
  const T* x;
  T* out;
  bool* mask;
  double p;
  acc_t<T> scale;
  __device__ void operator()(int64_t i, const Lanes& r, int j) const {
    bool keep = static_cast<double>(u24(r.v[j])) >= p;
    mask[i] = keep;
    out[i] = cvt<T>(keep ? cvt<acc_t<T>>(x[i]) * scale : acc_t<T>(0));
  }
};

template <class T>
void rand_typed(void* out, int64_t n, PhiloxArgs ph, cudaStream_t stream) {
  if constexpr (std::is_same_v<T, double>) {
    launch_philox<2>(n, ph, RandDouble{static_cast<double*>(out)}, stream);
  } else {
    launch_philox<4>(n, ph, RandFloat<T>{static_cast<T*>(out)}, stream);
  }
}
template <class T>
void randn_typed(void* out, int64_t n, PhiloxArgs ph, cudaStream_t stream) {
  if constexpr (std::is_same_v<T, double>) {
    launch_philox<1>(n, ph, RandnDouble{static_cast<double*>(out)}, stream);
  } else {
    launch_philox<2>(n, ph, RandnFloat<T>{static_cast<T*>(out)}, stream);
  }
}

__global__ void advance_kernel(uint64_t* state, uint64_t blocks) { state[1] += blocks; }

// A in {float, double}: a * b + c rounded once, like std::fma on the CPU.
template <class A>
__device__ __forceinline__ A fused(A a, A b, A c) {
  if constexpr (std::is_same_v<A, float>) {
    return fmaf(a, b, c);
  } else {
    return ::fma(a, b, c);
  }
}

// out is (n,): start + step * i, as kiln/backend/cpu/common.cpp's arange computes it.
template <class T>
__global__ void __launch_bounds__(kBlock)
    arange_kernel(int64_t n, T* out, double fstart, double fstep, int64_t istart, int64_t istep) {
  int64_t i = static_cast<int64_t>(blockIdx.x) * kBlock + threadIdx.x;
  if (i >= n) return;
  if constexpr (is_floating_v<T>) {
    using A = std::conditional_t<sizeof(T) == 2, float, double>;
    out[i] = cvt<T>(fused(static_cast<A>(fstep), static_cast<A>(i), static_cast<A>(fstart)));
  } else {
    // Wrapping int64 arithmetic (the CPU's signed overflow is undefined; this is what it does).
    uint64_t v =
        static_cast<uint64_t>(istart) + static_cast<uint64_t>(istep) * static_cast<uint64_t>(i);
    out[i] = cvt<T>(static_cast<int64_t>(v));
  }
}

// The CPU's linspace arithmetic type: the float type's acc_t, double for integers.
template <class T>
using linspace_acc_t = std::conditional_t<is_floating_v<T>, acc_t<T>, double>;

// out is (steps,), steps >= 1: symmetric like the CPU's, the second half counted back from e.
template <class T>
__global__ void __launch_bounds__(kBlock)
    linspace_kernel(int64_t steps, T* out, linspace_acc_t<T> s, linspace_acc_t<T> e,
                    linspace_acc_t<T> step) {
  using A = linspace_acc_t<T>;
  int64_t i = static_cast<int64_t>(blockIdx.x) * kBlock + threadIdx.x;
  if (i >= steps) return;
  A v = steps == 1      ? s
        : i < steps / 2 ? fused(step, static_cast<A>(i), s)
                        : fused(-step, static_cast<A>(steps - i - 1), e);
  if constexpr (std::is_same_v<T, uint8_t>) {
    // Through int64, as x86's double -> uint8_t conversion truncates (CUDA's would saturate).
    out[i] = static_cast<uint8_t>(static_cast<int64_t>(v));
  } else {
    out[i] = cvt<T>(v);
  }
}

unsigned grid_for(int64_t n) { return static_cast<unsigned>((n + kBlock - 1) / kBlock); }

}  // namespace

void launch_rand(Dt d, void* out, int64_t n, PhiloxArgs ph, cudaStream_t stream) {
  KILN_CUDA_DISPATCH_FLOAT(d, [&] { rand_typed<scalar_t>(out, n, ph, stream); });
}

void launch_randn(Dt d, void* out, int64_t n, PhiloxArgs ph, cudaStream_t stream) {
  KILN_CUDA_DISPATCH_FLOAT(d, [&] { randn_typed<scalar_t>(out, n, ph, stream); });
}

void launch_randint(Dt d, void* out, int64_t n, int64_t low, uint64_t range, PhiloxArgs ph,
                    cudaStream_t stream) {
  KILN_CUDA_DISPATCH_ALL(d, [&] {
    Randint<scalar_t> store{static_cast<scalar_t*>(out), static_cast<uint64_t>(low), range};
    launch_philox<kRandintPerBlock>(n, ph, store, stream);
  });
}

void launch_dropout(Dt d, const void* x, void* out, bool* mask, int64_t n, double p, PhiloxArgs ph,
                    cudaStream_t stream) {
  KILN_CUDA_DISPATCH_FLOAT(d, [&] {
    using F = acc_t<scalar_t>;
    F scale = p >= 1 ? F(0) : static_cast<F>(1.0 / (1.0 - p));
    Dropout<scalar_t> store{static_cast<const scalar_t*>(x), static_cast<scalar_t*>(out), mask, p,
                            scale};
    launch_philox<kDropoutPerBlock>(n, ph, store, stream);
  });
}

void advance_philox(uint64_t* state, uint64_t blocks, cudaStream_t stream) {
  advance_kernel<<<1, 1, 0, stream>>>(state, blocks);
}

void launch_arange(Dt d, void* out, int64_t n, double fstart, double fstep, int64_t istart,
                   int64_t istep, cudaStream_t stream) {
  if (n == 0) return;
  KILN_CUDA_DISPATCH_ALL(d, [&] {
    arange_kernel<scalar_t><<<grid_for(n), kBlock, 0, stream>>>(n, static_cast<scalar_t*>(out),
                                                                fstart, fstep, istart, istep);
  });
}

void launch_linspace(Dt d, void* out, int64_t steps, double start, double end,
                     cudaStream_t stream) {
  if (steps == 0) return;
  KILN_CUDA_DISPATCH_ALL(d, [&] {
    using A = linspace_acc_t<scalar_t>;
    A s = static_cast<A>(start), e = static_cast<A>(end);
    // The step is computed here, on the host, exactly as the CPU kernel does.
    A step = steps > 1 ? (e - s) / static_cast<A>(steps - 1) : A(0);
    linspace_kernel<scalar_t>
        <<<grid_for(steps), kBlock, 0, stream>>>(steps, static_cast<scalar_t*>(out), s, e, step);
  });
}

}  // namespace kiln::cuda

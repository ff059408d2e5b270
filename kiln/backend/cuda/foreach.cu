// CUDA multi-tensor (foreach) kernels: one launch over a table of tensors, each block one chunk
// of one tensor (found by binary search in the chunk prefix sums), 16-byte vector accesses
// where every pointer of the tensor allows them. The arithmetic is that of the CPU kernels
// (foreach.cpp), operation by operation: the _rn intrinsics keep nvcc from fusing a multiply
// and an add into an FMA, which would round differently.
#include <type_traits>

#include "kiln/backend/cuda/foreach.h"
#include "kiln/backend/cuda/loops.cuh"

namespace kiln::cuda {
namespace {

constexpr int kThreads = 256;

// The type the ops compute in: bool computes in int (nonzero converts back to true).
template <class T>
using fe_acc_t = std::conditional_t<std::is_same_v<T, bool>, int, acc_t<T>>;

template <class C>
__device__ __forceinline__ C add(C a, C b) {
  if constexpr (std::is_same_v<C, float>)
    return __fadd_rn(a, b);
  else if constexpr (std::is_same_v<C, double>)
    return __dadd_rn(a, b);
  else
    return static_cast<C>(a + b);
}
template <class C>
__device__ __forceinline__ C sub(C a, C b) {
  if constexpr (std::is_same_v<C, float>)
    return __fsub_rn(a, b);
  else if constexpr (std::is_same_v<C, double>)
    return __dsub_rn(a, b);
  else
    return static_cast<C>(a - b);
}
template <class C>
__device__ __forceinline__ C mul(C a, C b) {
  if constexpr (std::is_same_v<C, float>)
    return __fmul_rn(a, b);
  else if constexpr (std::is_same_v<C, double>)
    return __dmul_rn(a, b);
  else
    return static_cast<C>(a * b);
}
template <class C>
__device__ __forceinline__ C div(C a, C b) {  // floating C only
  if constexpr (std::is_same_v<C, float>)
    return __fdiv_rn(a, b);
  else
    return __ddiv_rn(a, b);
}
template <class C>
__device__ __forceinline__ C sqrt_rn(C a) {  // floating C only
  if constexpr (std::is_same_v<C, float>)
    return __fsqrt_rn(a);
  else
    return __dsqrt_rn(a);
}

template <class C>
C scalar_as(const ForeachScalar& s) {
  if constexpr (std::is_same_v<C, double>)
    return s.f64;
  else if constexpr (std::is_same_v<C, float>)
    return s.f32;
  else
    return static_cast<C>(s.i);
}

// Element functors: x holds one element of each list (as C); the kernel reads the lists in
// kReads and writes back those in kWrites. begin() sets per-tensor state; false skips the block.
template <class C>
struct Stateless {
  template <int L>
  __device__ bool begin(const ForeachTable<L>&, int) {
    return true;
  }
};
template <class C>
struct AddOp : Stateless<C> {
  static constexpr unsigned kReads = 3, kWrites = 1;
  C alpha;
  __device__ void operator()(C (&x)[2]) const { x[0] = add(x[0], mul(alpha, x[1])); }
};
template <class C>
struct MulOp : Stateless<C> {
  static constexpr unsigned kReads = 1, kWrites = 1;
  C c;
  __device__ void operator()(C (&x)[1]) const { x[0] = mul(x[0], c); }
};
template <class C>
struct MulListOp : Stateless<C> {
  static constexpr unsigned kReads = 3, kWrites = 1;
  __device__ void operator()(C (&x)[2]) const { x[0] = mul(x[0], x[1]); }
};
template <class C>
struct LerpOp : Stateless<C> {
  static constexpr unsigned kReads = 3, kWrites = 1;
  C w;
  // PyTorch's formula: the endpoint nearer the weight anchors the sum, for exactness.
  __device__ void operator()(C (&x)[2]) const {
    C d = sub(x[1], x[0]);
    x[0] = (w < C(0) ? -w : w) < C(0.5) ? add(x[0], mul(w, d)) : sub(x[1], mul(d, sub(C(1), w)));
  }
};
template <class C>
struct AddcmulOp : Stateless<C> {
  static constexpr unsigned kReads = 7, kWrites = 1;
  C v;
  __device__ void operator()(C (&x)[3]) const { x[0] = add(x[0], mul(mul(v, x[1]), x[2])); }
};
template <class C>
struct AddcdivOp : Stateless<C> {
  static constexpr unsigned kReads = 7, kWrites = 1;
  C v;
  __device__ void operator()(C (&x)[3]) const { x[0] = add(x[0], mul(v, div(x[1], x[2]))); }
};
template <class C>
struct SqrtOp : Stateless<C> {
  static constexpr unsigned kReads = 1, kWrites = 1;
  __device__ void operator()(C (&x)[1]) const { x[0] = sqrt_rn(x[0]); }
};
template <class C>
struct SqrtOutOp : Stateless<C> {
  static constexpr unsigned kReads = 2, kWrites = 1;
  __device__ void operator()(C (&x)[2]) const { x[0] = sqrt_rn(x[1]); }
};

// AdamW as the CPU's adamw_range: the per-tensor constants come from the step and lr on the
// device, in double, then the element update runs in C.
template <class C>
struct AdamWOp {
  static constexpr unsigned kReads = 15, kWrites = 13;  // reads p, g, m, v; writes p, m, v
  AdamWArgs args;
  C decay, b1, b2, step_size, inv_bc2_sqrt, eps;
  __device__ bool begin(const ForeachTable<5>& tab, int t) {
    if (*args.flag) return false;
    // The step kernel runs after this one, so every block reads the old step here.
    double step = __dadd_rn(*static_cast<const double*>(tab.ptr[4][t]), 1.0);
    double lr = *args.lr;
    double bc1 = __dsub_rn(1.0, pow(args.beta1, step));
    double bc2 = __dsub_rn(1.0, pow(args.beta2, step));
    decay = static_cast<C>(__dsub_rn(1.0, __dmul_rn(lr, args.weight_decay)));
    b1 = static_cast<C>(args.beta1);
    b2 = static_cast<C>(args.beta2);
    step_size = static_cast<C>(__ddiv_rn(lr, bc1));
    inv_bc2_sqrt = static_cast<C>(__ddiv_rn(1.0, __dsqrt_rn(bc2)));
    eps = static_cast<C>(args.eps);
    return true;
  }
  // x = {p, g, m, v}; x[4] (the step) is unused.
  __device__ void operator()(C (&x)[5]) const {
    C g = x[1];
    C m = add(x[2], mul(sub(C(1), b1), sub(g, x[2])));
    C v = add(mul(x[3], b2), mul(mul(sub(C(1), b2), g), g));
    C p = mul(x[0], decay);
    x[0] = sub(p, div(mul(step_size, m), add(mul(sqrt_rn(v), inv_bc2_sqrt), eps)));
    x[2] = m;
    x[3] = v;
  }
};

template <class T>
struct alignas(16) Vec {
  static constexpr int kSize = static_cast<int>(16 / sizeof(T));
  T v[kSize];
};

// Block b handles chunk b - chunk_start[t] of tensor t, the last t with chunk_start[t] <= b.
template <class T, int L, class F>
__global__ void __launch_bounds__(kThreads)
    foreach_kernel(const __grid_constant__ ForeachTable<L> tab, F f) {
  using C = fe_acc_t<T>;
  constexpr int V = Vec<T>::kSize;
  constexpr unsigned kUsed = F::kReads | F::kWrites;
  const int64_t b = blockIdx.x;
  int lo = 0, hi = tab.n - 1;
  while (lo < hi) {
    int mid = (lo + hi + 1) / 2;
    if (tab.chunk_start[mid] <= b)
      lo = mid;
    else
      hi = mid - 1;
  }
  const int t = lo;
  F g = f;
  if (!g.begin(tab, t)) return;
  const int64_t begin = (b - tab.chunk_start[t]) * kForeachChunk;
  const int64_t count = min(kForeachChunk, tab.numel[t] - begin);
  T* p[L];
  bool aligned = true;
#pragma unroll
  for (int l = 0; l < L; ++l) {
    p[l] = (kUsed >> l & 1) ? static_cast<T*>(tab.ptr[l][t]) + begin : nullptr;
    if (kUsed >> l & 1) aligned = aligned && reinterpret_cast<uintptr_t>(p[l]) % 16 == 0;
  }
  int64_t tail = 0;
  if (aligned) {
    const int64_t nvec = count / V;
    for (int64_t i = threadIdx.x; i < nvec; i += kThreads) {
      Vec<T> in[L];
#pragma unroll
      for (int l = 0; l < L; ++l)
        if (F::kReads >> l & 1) in[l] = reinterpret_cast<const Vec<T>*>(p[l])[i];
#pragma unroll
      for (int j = 0; j < V; ++j) {
        C x[L] = {};
#pragma unroll
        for (int l = 0; l < L; ++l)
          if (F::kReads >> l & 1) x[l] = cvt<C>(in[l].v[j]);
        g(x);
#pragma unroll
        for (int l = 0; l < L; ++l)
          if (F::kWrites >> l & 1) in[l].v[j] = cvt<T>(x[l]);
      }
#pragma unroll
      for (int l = 0; l < L; ++l)
        if (F::kWrites >> l & 1) reinterpret_cast<Vec<T>*>(p[l])[i] = in[l];
    }
    tail = nvec * V;
  }
  for (int64_t i = tail + threadIdx.x; i < count; i += kThreads) {
    C x[L] = {};
#pragma unroll
    for (int l = 0; l < L; ++l)
      if (F::kReads >> l & 1) x[l] = cvt<C>(p[l][i]);
    g(x);
#pragma unroll
    for (int l = 0; l < L; ++l)
      if (F::kWrites >> l & 1) p[l][i] = cvt<T>(x[l]);
  }
}

template <class T, int L, class F>
void run(const ForeachTable<L>& tab, F f, cudaStream_t stream) {
  auto blocks = static_cast<unsigned>(tab.chunk_start[tab.n]);
  if (blocks == 0) return;
  foreach_kernel<T, L, F><<<blocks, kThreads, 0, stream>>>(tab, f);
}

// Checks lr and the steps; see launch_adamw_check.
__global__ void __launch_bounds__(kThreads)
    adamw_check_kernel(const __grid_constant__ StepTable steps, const double* lr,
                       const float* found_inf, int* flag, bool first, int* err, int lr_code,
                       int step_code) {
  const double l = *lr;
  const bool lr_bad = !(l >= 0 && isfinite(l));
  bool step_bad = false;
  for (int i = static_cast<int>(threadIdx.x); i < steps.n; i += kThreads) {
    double s = *steps.step[i];
    step_bad = step_bad || !(s >= 0 && s == floor(s));
  }
  step_bad = __syncthreads_or(step_bad) != 0;
  if (threadIdx.x != 0) return;
  if (lr_bad || step_bad) {
    *flag = 1;
    atomicCAS(err, 0, lr_bad ? lr_code : step_code);
  } else if (found_inf != nullptr && *found_inf != 0.f) {
    *flag = 1;  // a skipped step, not an error
  } else if (first) {
    *flag = 0;
  }
}

__global__ void __launch_bounds__(kThreads)
    adamw_steps_kernel(const __grid_constant__ StepTable steps, const int* flag) {
  if (*flag) return;
  for (int i = static_cast<int>(threadIdx.x); i < steps.n; i += kThreads)
    *steps.step[i] = __dadd_rn(*steps.step[i], 1.0);
}

}  // namespace

template <int L>
void launch_foreach(ForeachOp op, Dt dt, const ForeachTable<L>& tab, const ForeachScalar& s,
                    cudaStream_t stream) {
  if constexpr (L == 1) {
    if (op == ForeachOp::Mul)
      KILN_CUDA_DISPATCH_ALL(dt, [&] {
        using C = fe_acc_t<scalar_t>;
        run<scalar_t>(tab, MulOp<C>{{}, scalar_as<C>(s)}, stream);
      })
    else if (op == ForeachOp::Sqrt)
      KILN_CUDA_DISPATCH_FLOAT(dt, [&] { run<scalar_t>(tab, SqrtOp<acc_t<scalar_t>>{}, stream); })
  } else if constexpr (L == 2) {
    if (op == ForeachOp::Add)
      KILN_CUDA_DISPATCH_ALL(dt, [&] {
        using C = fe_acc_t<scalar_t>;
        run<scalar_t>(tab, AddOp<C>{{}, scalar_as<C>(s)}, stream);
      })
    else if (op == ForeachOp::MulList)
      KILN_CUDA_DISPATCH_ALL(dt,
                             [&] { run<scalar_t>(tab, MulListOp<fe_acc_t<scalar_t>>{}, stream); })
    else if (op == ForeachOp::Lerp)
      KILN_CUDA_DISPATCH_FLOAT(dt, [&] {
        using C = acc_t<scalar_t>;
        run<scalar_t>(tab, LerpOp<C>{{}, scalar_as<C>(s)}, stream);
      })
    else if (op == ForeachOp::SqrtOut)
      KILN_CUDA_DISPATCH_FLOAT(dt,
                               [&] { run<scalar_t>(tab, SqrtOutOp<acc_t<scalar_t>>{}, stream); })
  } else {
    if (op == ForeachOp::Addcmul)
      KILN_CUDA_DISPATCH_ALL(dt, [&] {
        using C = fe_acc_t<scalar_t>;
        run<scalar_t>(tab, AddcmulOp<C>{{}, scalar_as<C>(s)}, stream);
      })
    else if (op == ForeachOp::Addcdiv)
      KILN_CUDA_DISPATCH_FLOAT(dt, [&] {
        using C = acc_t<scalar_t>;
        run<scalar_t>(tab, AddcdivOp<C>{{}, scalar_as<C>(s)}, stream);
      })
  }
}
template void launch_foreach<1>(ForeachOp, Dt, const ForeachTable<1>&, const ForeachScalar&,
                                cudaStream_t);
template void launch_foreach<2>(ForeachOp, Dt, const ForeachTable<2>&, const ForeachScalar&,
                                cudaStream_t);
template void launch_foreach<3>(ForeachOp, Dt, const ForeachTable<3>&, const ForeachScalar&,
                                cudaStream_t);

void launch_adamw_check(const StepTable& steps, const double* lr, const float* found_inf, int* flag,
                        bool first, int* err, int lr_code, int step_code, cudaStream_t stream) {
  adamw_check_kernel<<<1, kThreads, 0, stream>>>(steps, lr, found_inf, flag, first, err, lr_code,
                                                 step_code);
}

void launch_adamw(Dt dt, const ForeachTable<5>& tab, const AdamWArgs& args, cudaStream_t stream) {
  KILN_CUDA_DISPATCH_FLOAT(dt, [&] {
    using C = acc_t<scalar_t>;
    AdamWOp<C> f{};
    f.args = args;
    run<scalar_t>(tab, f, stream);
  })
}

void launch_adamw_steps(const StepTable& steps, const int* flag, cudaStream_t stream) {
  adamw_steps_kernel<<<1, kThreads, 0, stream>>>(steps, flag);
}

}  // namespace kiln::cuda

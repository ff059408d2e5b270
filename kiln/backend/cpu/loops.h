#pragma once
// The CPU elementwise engine: broadcasting, strided operands, dim coalescing, a contiguous fast
// path the compiler vectorises, and OpenMP for large tensors. Internal to backend/cpu.
#include <array>
#include <tuple>
#include <utility>
#include <vector>

#include "kiln/core/error.h"
#include "kiln/core/tensor.h"

namespace kiln::cpu {

// Elements per OpenMP task below which a loop runs on one thread.
inline constexpr int64_t kGrainSize = 32768;
inline constexpr int kMaxLoopDims = 16;

// N operands (0 is the output) viewed over the output's shape. Dims are stored innermost
// first; strides are in bytes, 0 where an input is broadcast.
template <int N>
struct Loop {
  int ndim = 0;
  int64_t numel = 1;
  std::array<int64_t, kMaxLoopDims> sizes{};
  std::array<std::array<int64_t, kMaxLoopDims>, N> strides{};
  std::array<char*, N> data{};
};

// Whether `t` broadcasts to out's shape: what a meta function guarantees a loop's inputs.
inline bool broadcasts_to(const Tensor& t, const Tensor& out) {
  if (t.dim() > out.dim()) return false;
  for (int64_t d = 1; d <= t.dim(); ++d) {
    int64_t s = t.sizes()[t.dim() - d];
    if (s != 1 && s != out.sizes()[out.dim() - d]) return false;
  }
  return true;
}

// Builds the loop for writing `out` from `inputs` (each broadcastable to out's shape).
template <int N>
Loop<N> make_loop(const Tensor& out, const std::array<const Tensor*, N - 1>& inputs) {
  // See Note [Debug asserts] in kiln/core/error.h.
  for (const Tensor* t : inputs)
    KILN_DEBUG_ASSERT(broadcasts_to(*t, out),
                      "[elementwise] an input of shape {} does not broadcast to out's shape {}",
                      t->sizes(), out.sizes());
  Loop<N> l;
  int nd = static_cast<int>(out.dim());
  KILN_CHECK(nd <= kMaxLoopDims,
             "[elementwise] strided or broadcast operands with {} dims are not supported (at "
             "most {}); make them contiguous first",
             nd, kMaxLoopDims);
  l.ndim = nd;
  l.numel = out.numel();
  l.data[0] = static_cast<char*>(out.impl()->data());
  for (int d = 0; d < nd; ++d) {
    l.sizes[d] = out.sizes()[nd - 1 - d];
    l.strides[0][d] = out.strides()[nd - 1 - d] * static_cast<int64_t>(out.itemsize());
  }
  for (int k = 1; k < N; ++k) {
    const Tensor& t = *inputs[k - 1];
    l.data[k] = static_cast<char*>(t.impl()->data());
    int tnd = static_cast<int>(t.dim());
    for (int d = 0; d < nd; ++d) {
      int td = tnd - 1 - d;
      l.strides[k][d] = (td >= 0 && t.sizes()[td] != 1)
                            ? t.strides()[td] * static_cast<int64_t>(t.itemsize())
                            : 0;
    }
  }
  // Drop size-1 dims, then merge dim d+1 into d wherever every operand allows it.
  int w = 0;
  for (int d = 0; d < l.ndim; ++d) {
    if (l.sizes[d] == 1) continue;
    l.sizes[w] = l.sizes[d];
    for (int k = 0; k < N; ++k) l.strides[k][w] = l.strides[k][d];
    ++w;
  }
  l.ndim = w;
  if (l.ndim > 1) {
    int c = 0;
    for (int d = 1; d < l.ndim; ++d) {
      bool can = true;
      for (int k = 0; k < N; ++k) can = can && l.strides[k][d] == l.strides[k][c] * l.sizes[c];
      if (can) {
        l.sizes[c] *= l.sizes[d];
      } else {
        ++c;
        l.sizes[c] = l.sizes[d];
        for (int k = 0; k < N; ++k) l.strides[k][c] = l.strides[k][d];
      }
    }
    l.ndim = c + 1;
  }
  return l;
}

int omp_threads();
int omp_thread();
// The most threads an OpenMP team of this process may have had: the default thread count or
// the largest set_num_threads since (a thread's pool keeps the idle threads of such a team).
int largest_thread_team();

// Calls inner(ptrs, strides, n) for runs of the innermost dim covering flat indices
// [begin, end) of the loop, in order.
template <int N, class Inner>
void loop_range(const Loop<N>& l, int64_t begin, int64_t end, Inner&& inner) {
  KILN_DEBUG_ASSERT(0 <= begin && end <= l.numel,
                    "[elementwise] range [{}, {}) of a {}-element loop", begin, end, l.numel);
  if (begin >= end) return;
  if (l.ndim == 0) {
    if (begin < end) {
      std::array<int64_t, N> st{};
      inner(l.data, st, int64_t{1});
    }
    return;
  }
  std::array<int64_t, kMaxLoopDims> idx{};
  int64_t rem = begin;
  for (int d = 0; d < l.ndim; ++d) {
    idx[d] = rem % l.sizes[d];
    rem /= l.sizes[d];
  }
  std::array<int64_t, N> inner_st;
  for (int k = 0; k < N; ++k) inner_st[k] = l.strides[k][0];
  int64_t pos = begin;
  while (pos < end) {
    std::array<char*, N> p = l.data;
    for (int k = 0; k < N; ++k)
      for (int d = 0; d < l.ndim; ++d) p[k] += idx[d] * l.strides[k][d];
    int64_t n = std::min(l.sizes[0] - idx[0], end - pos);
    inner(p, inner_st, n);
    pos += n;
    idx[0] += n;
    for (int d = 0; d < l.ndim - 1 && idx[d] == l.sizes[d]; ++d) {
      idx[d] = 0;
      ++idx[d + 1];
    }
  }
}

// Splits [0, n) into one contiguous range per OpenMP thread and calls run(begin, end).
template <class F>
void parallel_range(int64_t n, F&& run) {
#pragma omp parallel
  {
    int nt = omp_threads(), t = omp_thread();
    int64_t chunk = (n + nt - 1) / nt;
    int64_t b = std::min<int64_t>(n, t * chunk), e = std::min<int64_t>(n, b + chunk);
    if (b < e) run(b, e);
  }
}

// Runs loop_range over the whole loop, split across threads when it is large.
template <int N, class Inner>
void loop_parallel(const Loop<N>& l, Inner&& inner) {
  int64_t n = l.numel;
  if (n < kGrainSize) {
    loop_range(l, 0, n, inner);
    return;
  }
  parallel_range(n, [&](int64_t b, int64_t e) { loop_range(l, b, e, inner); });
}
inline bool same_sizes(const Tensor& a, const Tensor& b) {
  if (a.dim() != b.dim()) return false;
  for (int64_t i = 0; i < a.dim(); ++i)
    if (a.sizes()[i] != b.sizes()[i]) return false;
  return true;
}

// Note [AVX2 clones]
// The contiguous runs of elementwise ops are where their time goes, so that loop is built twice,
// for AVX2 and for baseline x86-64, and the loader picks one (GCC's target_clones: each clone is
// a local symbol, so no AVX2 code can leak into inline functions shared with the rest of the
// program). Clang does not support it on templates; elsewhere the loop is built once.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define KILN_AVX2_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define KILN_AVX2_CLONES
#endif

// o[i] = f(in[i]...) for i < n, all contiguous.
template <class Out, class F, class... In>
KILN_AVX2_CLONES void contiguous_run(Out* o, const F& f, int64_t n, const In*... in) {
  for (int64_t i = 0; i < n; ++i) o[i] = f(in[i]...);
}
// o[i] = f(a[i], b) or f(b, a[i]): one operand broadcast along the run.
template <class Out, class F, class A, class B>
KILN_AVX2_CLONES void run_scalar_right(Out* o, const F& f, int64_t n, const A* a, B b) {
  for (int64_t i = 0; i < n; ++i) o[i] = f(a[i], b);
}
template <class Out, class F, class A, class B>
KILN_AVX2_CLONES void run_scalar_left(Out* o, const F& f, int64_t n, A a, const B* b) {
  for (int64_t i = 0; i < n; ++i) o[i] = f(a, b[i]);
}

// Applies out[i] = f(in0[i], in1[i], ...) with the given element types. Inputs must already
// have type In (the callers cast them first).
template <class Out, class... In, class F>
void elementwise(const Tensor& out, const std::array<const Tensor*, sizeof...(In)>& inputs, F f) {
  constexpr int N = sizeof...(In) + 1;
  // See Note [Debug asserts] in kiln/core/error.h: the element types are the operands' own
  // (callers cast first), and every operand has bytes.
  constexpr std::array<size_t, sizeof...(In)> in_bytes{sizeof(In)...};
  KILN_DEBUG_ASSERT(out.itemsize() == sizeof(Out),
                    "[elementwise] out is {}, but the kernel writes {}-byte elements", out.dtype(),
                    sizeof(Out));
  for (size_t k = 0; k < inputs.size(); ++k)
    KILN_DEBUG_ASSERT(inputs[k]->itemsize() == in_bytes[k],
                      "[elementwise] input {} is {}, but the kernel reads {}-byte elements", k,
                      inputs[k]->dtype(), in_bytes[k]);
  if (out.numel() == 0) return;
  KILN_DEBUG_ASSERT(out.impl()->data() != nullptr, "[elementwise] out has no data");
  for (size_t k = 0; k < inputs.size(); ++k)
    KILN_DEBUG_ASSERT(inputs[k]->impl()->data() != nullptr, "[elementwise] input {} has no data",
                      k);
  // Fast path: every operand contiguous with out's shape, so one flat loop does it.
  bool flat = out.is_contiguous();
  for (const Tensor* t : inputs) flat = flat && t->is_contiguous() && same_sizes(*t, out);
  if (flat) {
    Out* o = static_cast<Out*>(out.impl()->data());
    int64_t n = out.numel();
    [&]<size_t... I>(std::index_sequence<I...>) {
      std::tuple<const In*...> in{static_cast<const In*>(inputs[I]->impl()->data())...};
      auto run = [&](int64_t b, int64_t e) {
        contiguous_run(o + b, f, e - b, (std::get<I>(in) + b)...);
      };
      if (n < kGrainSize) {
        run(0, n);
        return;
      }
      parallel_range(n, run);
    }
    (std::index_sequence_for<In...>{});
    return;
  }
  Loop<N> l = make_loop<N>(out, inputs);
  loop_parallel(l, [&](const std::array<char*, N>& p, const std::array<int64_t, N>& st, int64_t n) {
    [&]<size_t... I>(std::index_sequence<I...>) {
      Out* o = reinterpret_cast<Out*>(p[0]);
      bool contiguous = st[0] == sizeof(Out) && ((st[I + 1] == sizeof(In)) && ...);
      if (contiguous) {
        contiguous_run(o, f, n, reinterpret_cast<const In*>(p[I + 1])...);
        return;
      }
      // A binary op with one side broadcast along the run: hoist it out of the loop.
      if constexpr (sizeof...(In) == 2) {
        using A = std::tuple_element_t<0, std::tuple<In...>>;
        using B = std::tuple_element_t<1, std::tuple<In...>>;
        if (st[0] == sizeof(Out) && st[1] == sizeof(A) && st[2] == 0) {
          run_scalar_right(o, f, n, reinterpret_cast<const A*>(p[1]),
                           *reinterpret_cast<const B*>(p[2]));
          return;
        }
        if (st[0] == sizeof(Out) && st[1] == 0 && st[2] == sizeof(B)) {
          run_scalar_left(o, f, n, *reinterpret_cast<const A*>(p[1]),
                          reinterpret_cast<const B*>(p[2]));
          return;
        }
      }
      for (int64_t i = 0; i < n; ++i)
        *reinterpret_cast<Out*>(p[0] + i * st[0]) =
            f(*reinterpret_cast<const In*>(p[I + 1] + i * st[I + 1])...);
    }
    (std::index_sequence_for<In...>{});
  });
}

// Casting strided copy: dst[i] = static_cast<dst type>(src[i]), src broadcast to dst's shape.
// Both on the host.
void copy_kernel(const Tensor& dst, const Tensor& src);

// `t` in dtype `dtype` on the host, converting (and allocating) only if needed.
Tensor as_dtype(const Tensor& t, DType dtype);
// as_dtype for a kernel's temporary operand: a 0-d tensor (a wrapped number, mostly) is cast
// into a per-thread scratch tensor instead of a new allocation. Only for values dropped before
// the kernel returns.
Tensor operand_as(const Tensor& t, DType dtype);

// Runs `compute(result)` where result is `out` itself when it has dtype `dtype` and no
// overlap, else a temporary of dtype `dtype` whose values are then cast into `out`.
template <class F>
void with_result_dtype(const Tensor& out, DType dtype, F compute);

Tensor empty_cpu(IntArrayRef sizes, DType dtype);

template <class F>
void with_result_dtype(const Tensor& out, DType dtype, F compute) {
  if (out.dtype() == dtype) {
    compute(out);
    return;
  }
  Tensor tmp = empty_cpu(out.sizes(), dtype);
  compute(tmp);
  copy_kernel(out, tmp);
}

}  // namespace kiln::cpu

namespace kiln::cpu {

// Runs `compute(result)` on a contiguous tensor of out's shape and dtype `dtype`: out itself
// when it already is one, else a temporary whose values are then copied (and cast) into out.
template <class F>
void with_contiguous_result(const Tensor& out, DType dtype, F compute) {
  if (out.dtype() == dtype && out.is_contiguous()) {
    compute(out);
    return;
  }
  Tensor tmp = empty_cpu(out.sizes(), dtype);
  compute(tmp);
  copy_kernel(out, tmp);
}

// `t` as a contiguous host tensor of dtype `dtype` (no copy when it already is one).
Tensor contiguous_as(const Tensor& t, DType dtype);

// Index values as int64, each checked against [0, bound) before the caller writes anything.
std::vector<int64_t> checked_indices(const char* op, const Tensor& index, int64_t bound,
                                     const char* what);

}  // namespace kiln::cpu

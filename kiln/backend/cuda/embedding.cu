// CUDA kernels of embedding_dense_backward and embedding_bag (see embedding.h).
#include "kiln/backend/cuda/embedding.h"
#include "kiln/backend/cuda/kernel_args.h"
#include "kiln/backend/cuda/thread_per_element.cuh"

namespace kiln::cuda {
namespace {

__global__ void __launch_bounds__(kBlock)
    counts_kernel(const int64_t* idx, int64_t n, int64_t num_weights, int* count) {
  int64_t i = thread_index();
  if (i >= n) return;
  int64_t v = idx[i];
  if (v >= 0 && v < num_weights) atomicAdd(count + v, 1);
}

template <class A>
__global__ void __launch_bounds__(kBlock)
    dense_backward_kernel(const A* grad, const int64_t* idx, const int* count, A* acc, int64_t n,
                          int64_t D, int64_t num_weights, int64_t padding_idx, int* err, int code) {
  int64_t t = thread_index();
  if (t >= n * D) return;
  int64_t i = t / D, j = t % D;
  int64_t v = idx[i];
  if (v < 0 || v >= num_weights) {
    report(err, code);
    return;
  }
  if (v == padding_idx) return;
  A g = grad[t];
  if (count) g = g * (A(1) / static_cast<A>(count[v]));
  atomicAdd(acc + v * D + j, g);
}

template <class A>
__global__ void __launch_bounds__(kBlock)
    bag_kernel(const A* w, const int64_t* idx, const int64_t* offs, const A* psw, A* out,
               int64_t* offset2bag, int64_t* bag_size, int64_t* max_indices, EmbeddingBagArgs a,
               int* err, int bad_index, int bad_offsets) {
  const int64_t cols = a.dim > 0 ? a.dim : 1;
  int64_t t = thread_index();
  if (t >= a.bags * cols) return;
  const int64_t b = t / cols, j = t % cols;
  const int64_t start = offs[b], end = b + 1 < a.noffs ? offs[b + 1] : a.n;
  const bool last = b == a.bags - 1;
  if (start < 0 || end < start || end > a.n || (b == 0 && start != 0) ||
      (last && a.include_last && end != a.n)) {
    report(err, bad_offsets);
    return;
  }
  A acc = 0;
  int64_t count = 0, mi = 0;
  for (int64_t i = start; i < end; ++i) {
    if (j == 0) offset2bag[i] = b;
    const int64_t v = idx[i];
    if (v < 0 || v >= a.weights) {
      report(err, bad_index);
      continue;
    }
    if (v == a.padding_idx) continue;
    if (j < a.dim) {
      const A x = w[v * a.dim + j];
      if (a.mode == 2) {
        if (count == 0 || x > acc) {
          acc = x;
          mi = v;
        }
      } else {
        acc += psw ? x * psw[i] : x;
      }
    }
    ++count;
  }
  if (j == 0) bag_size[b] = count;
  if (j >= a.dim) return;
  if (a.mode == 1 && count > 0) acc /= static_cast<A>(count);
  out[b * a.dim + j] = acc;
  if (a.mode == 2) max_indices[b * a.dim + j] = mi;
}

}  // namespace

void launch_embedding_counts(const int64_t* idx, int64_t n, int64_t num_weights, int* count,
                             cudaStream_t stream) {
  if (n == 0) return;
  counts_kernel<<<blocks_for(n), kBlock, 0, stream>>>(idx, n, num_weights, count);
}

void launch_embedding_dense_backward(bool dbl, const void* grad, const int64_t* idx,
                                     const int* count, void* acc, int64_t n, int64_t D,
                                     int64_t num_weights, int64_t padding_idx, int* err, int code,
                                     cudaStream_t stream) {
  if (n * D == 0) return;
  auto run = [&](auto z) {
    using A = decltype(z);
    dense_backward_kernel<A><<<blocks_for(n * D), kBlock, 0, stream>>>(
        static_cast<const A*>(grad), idx, count, static_cast<A*>(acc), n, D, num_weights,
        padding_idx, err, code);
  };
  if (dbl)
    run(double{});
  else
    run(float{});
}

void launch_embedding_bag(bool dbl, const void* weight, const int64_t* idx, const int64_t* offs,
                          const void* psw, void* out, int64_t* offset2bag, int64_t* bag_size,
                          int64_t* max_indices, const EmbeddingBagArgs& a, int* err, int bad_index,
                          int bad_offsets, cudaStream_t stream) {
  const int64_t threads = a.bags * (a.dim > 0 ? a.dim : 1);
  if (threads == 0) return;
  auto run = [&](auto z) {
    using A = decltype(z);
    bag_kernel<A><<<blocks_for(threads), kBlock, 0, stream>>>(
        static_cast<const A*>(weight), idx, offs, static_cast<const A*>(psw), static_cast<A*>(out),
        offset2bag, bag_size, max_indices, a, err, bad_index, bad_offsets);
  };
  if (dbl)
    run(double{});
  else
    run(float{});
}

}  // namespace kiln::cuda

#pragma once
// What the host glue of the CUDA kernels shares: error checks, the current stream, the
// elementwise operand descriptions, dtype helpers, and how kernels are listed for the backend.
// Internal to kiln/backend/cuda (the only place CUDA headers are included).
#include <cuda_runtime.h>

#include <array>
#include <exception>
#include <initializer_list>
#include <vector>

#include "kiln/backend/backend.h"
#include "kiln/backend/cuda/kernel_args.h"
#include "kiln/core/tensor.h"
#include "kiln/core/tensor_impl.h"
#include "kiln/ops/meta.h"
#include "kiln/ops/op_list.h"
#include "kiln/ops/structured.h"

// Throws a DeviceError naming the call and CUDA's error when `expr` fails.
#define KILN_CUDA_CHECK(expr) ::kiln::cuda::check_cuda((expr), #expr)

namespace kiln::cuda {

void check_cuda(cudaError_t err, const char* what);
// After a kernel launch: a launch error (bad configuration, no kernel image) names the op.
void check_launch(const char* op);

// The calling thread's current stream on device `index` (what kernels are enqueued on), and
// makes `index` the thread's current CUDA device first.
cudaStream_t current_stream(int index);
inline cudaStream_t stream_for(const Tensor& t) { return current_stream(t.device().index()); }
// Whether the calling thread is capturing a graph on device `index`'s current stream.
bool capturing(int index);

// A driver function through the runtime's driver entry point (as of CUDA `version`: 12000 for
// 12.0; a function added later needs its version), or nullptr: linking libcuda would make
// libkiln_cuda unloadable where no driver is installed (CI builds it there, and its tests skip).
void* driver_function(const char* name, int version = 12000);

// Keeps `stream` busy for `ns` nanoseconds of the device's clock (one thread spinning), so that
// the work the host queues behind it meanwhile runs back to back, as a replay would run it
// (Note [Timing cuDNN plans] in cudnn_graph.cpp).
void hold_stream(cudaStream_t stream, uint64_t ns);

// Errors found by kernels in data the host cannot check without waiting (an index out of
// range): a kernel that finds one skips its write and sets the device's error word, once, with
// atomicCAS(word, 0, code); the next synchronize or copy to the host of that device raises the
// message registered for the code as an IndexError. error_code() registers a message (call it
// once, at static initialisation, e.g. `static const int kBadIndex = error_code("[embedding]
// an index is out of range [0, num_embeddings)")`).
int* error_word(int index);
int error_code(const char* message);
// A failure found off the device's streams (an NCCL collective its deadline aborted, nccl.cpp;
// a host task that threw): the next synchronize or copy to the host of device `index` raises
// `error` (the first one posted, once) instead of returning results that are not valid.
void post_device_error(int index, std::exception_ptr error);
// The device's default generator as the kernels see it: {seed, offset} in device memory. A
// random kernel reads both when it runs (so a replayed graph draws fresh numbers) and the op
// then advances the offset on the device with advance_philox() (see random.cu).
uint64_t* philox_state(int index);

inline Dt dt(DType d) { return static_cast<Dt>(static_cast<int>(d)); }
inline bool is_host_scalar(const Tensor& t) { return t.dim() == 0 && t.device().is_cpu(); }

// An input of an elementwise kernel: device data, or the value of a 0-d cpu tensor.
Operand operand(const Tensor& t);
// Operands 1..N-1 (`inputs`, each broadcastable to out) over out's shape, coalesced.
template <int N>
Indexer<N> make_indexer(const Tensor& out, const std::array<const Tensor*, N - 1>& inputs);

// A new contiguous tensor on `device`, from its caching allocator.
Tensor empty_cuda(IntArrayRef sizes, DType dtype, Device device);
// Casting strided copy on the device: dst = src (broadcast to dst's shape, cast to its dtype).
// src may be a 0-d cpu tensor (a fill).
void copy_kernel(const Tensor& dst, const Tensor& src);
// `t` in dtype `dtype` (a cast on the device, only when needed); 0-d cpu tensors as they are.
Tensor as_dtype(const Tensor& t, DType dtype);
// `t` contiguous in dtype `dtype` (a copy only when needed).
Tensor contiguous_as(const Tensor& t, DType dtype);
// Runs compute(r) with r = out when out has dtype `dtype` (and, if `contiguous`, is
// contiguous), else a temporary whose values are then copied (and cast) into out.
template <class F>
void with_result(const Tensor& out, DType dtype, bool contiguous, F compute) {
  if (out.dtype() == dtype && (!contiguous || out.is_contiguous())) {
    compute(out);
    return;
  }
  Tensor tmp = empty_cuda(out.sizes(), dtype, out.device());
  compute(tmp);
  copy_kernel(out, tmp);
}

// Kernels the backend registers when it loads (kiln::load_backend("cuda")): each file adds
// its own with the macros below, at static initialisation of libkiln_cuda.so.
std::vector<BackendKernel>& kernel_list();
struct KernelAdder {
  KernelAdder(std::initializer_list<BackendKernel> ks) {
    kernel_list().insert(kernel_list().end(), ks.begin(), ks.end());
  }
};

}  // namespace kiln::cuda

// __COUNTER__, not __LINE__: one line may expand several (an X-macro list such as
// KILN_CUDA_FLOAT_UNARY_OPS).
#define KILN_CUDA_KERNELS(...)                                                          \
  static const ::kiln::cuda::KernelAdder KILN_CONCAT(kiln_cuda_kernels_, __COUNTER__) { \
    __VA_ARGS__                                                                         \
  }
// A pointwise op's functional, in-place and out= kernels from one impl (see structured.h).
#define KILN_CUDA_POINTWISE(name, impl)                                                   \
  KILN_CUDA_KERNELS(                                                                      \
      ::kiln::backend_kernel(                                                             \
          ::kiln::ops::op_##name,                                                         \
          &::kiln::detail::Structured<decltype(::kiln::ops::op_##name)::Sig>::functional< \
              &::kiln::meta::name, impl>),                                                \
      ::kiln::backend_kernel(                                                             \
          ::kiln::ops::op_##name##_,                                                      \
          &::kiln::detail::Structured<decltype(::kiln::ops::op_##name)::Sig>::inplace<    \
              ::kiln::ops::op_##name##_, &::kiln::meta::name, impl>),                     \
      ::kiln::backend_kernel(                                                             \
          ::kiln::ops::op_##name##_out,                                                   \
          &::kiln::detail::Structured<decltype(::kiln::ops::op_##name)::Sig>::out<        \
              ::kiln::ops::op_##name##_out, &::kiln::meta::name, impl, true>))
// A structured op's functional and out= kernels from one impl.
#define KILN_CUDA_STRUCTURED(name, impl)                                                  \
  KILN_CUDA_KERNELS(                                                                      \
      ::kiln::backend_kernel(                                                             \
          ::kiln::ops::op_##name,                                                         \
          &::kiln::detail::Structured<decltype(::kiln::ops::op_##name)::Sig>::functional< \
              &::kiln::meta::name, impl>),                                                \
      ::kiln::backend_kernel(                                                             \
          ::kiln::ops::op_##name##_out,                                                   \
          &::kiln::detail::Structured<decltype(::kiln::ops::op_##name)::Sig>::out<        \
              ::kiln::ops::op_##name##_out, &::kiln::meta::name, impl>))

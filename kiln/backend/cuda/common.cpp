// The host side of the elementwise engine and the dtype helpers shared by every CUDA kernel.
#include "kiln/backend/cuda/common.h"

#include <cmath>

#include "kiln/backend/cpu/loops.h"
#include "kiln/backend/cuda/elementwise.h"
#include "kiln/ops/other_meta.h"

namespace kiln::cuda {

namespace detail {
cudaError_t launch_hold(cudaStream_t stream, uint64_t ns);  // hold_kernel.cu
}  // namespace detail

void hold_stream(cudaStream_t stream, uint64_t ns) {
  KILN_CUDA_CHECK(detail::launch_hold(stream, ns));
}

void* driver_function(const char* name, int version) {
  void* p = nullptr;
  cudaDriverEntryPointQueryResult q{};
  if (cudaGetDriverEntryPointByVersion(name, &p, version, cudaEnableDefault, &q) != cudaSuccess ||
      q != cudaDriverEntryPointSuccess)
    p = nullptr;
  return p;
}

Operand operand(const Tensor& t) {
  Operand o;
  if (!is_host_scalar(t)) {
    o.data = t.impl()->data();
    return o;
  }
  o.scalar = true;
  KILN_DISPATCH_TYPES(t.dtype(), "cuda operand", [&] {
    scalar_t v = *static_cast<const scalar_t*>(t.impl()->data());
    if constexpr (std::is_integral_v<scalar_t>) {
      o.i = static_cast<int64_t>(v);
      o.f = static_cast<double>(v);
    } else {
      o.f = static_cast<double>(static_cast<acc_t<scalar_t>>(v));
      o.i = std::isfinite(o.f) && std::abs(o.f) < 9.2e18 ? static_cast<int64_t>(o.f) : 0;
    }
  });
  return o;
}

template <int N>
Indexer<N> make_indexer(const Tensor& out, const std::array<const Tensor*, N - 1>& inputs) {
  // The CPU engine's coalescing (byte strides, innermost first), then element strides.
  cpu::Loop<N> l = cpu::make_loop<N>(out, inputs);
  KILN_CHECK(l.ndim <= kMaxDims,
             "[cuda] strided operands with {} dims that cannot be merged are not supported (at "
             "most {}); make them contiguous first",
             l.ndim, kMaxDims);
  // See Note [Debug asserts] in kiln/core/error.h: what launch_elementwise (loops.cuh) assumes.
  KILN_DEBUG_ASSERT(fits_grid(l.numel), "[cuda] {} elements exceed one launch's grid", l.numel);
  Indexer<N> ix;
  ix.ndim = l.ndim;
  ix.numel = l.numel;
  ix.contiguous = l.ndim <= 1;
  for (int d = 0; d < l.ndim; ++d) ix.sizes[d] = l.sizes[d];
  for (int k = 0; k < N; ++k) {
    const Tensor& t = k == 0 ? out : *inputs[k - 1];
    const bool host = k > 0 && is_host_scalar(t);
    const int64_t item = static_cast<int64_t>(t.itemsize());
    KILN_DEBUG_ASSERT(host || t.impl()->data() != nullptr || l.numel == 0,
                      "[cuda] operand {} has no device data", k);
    for (int d = 0; d < l.ndim; ++d) {
      KILN_DEBUG_ASSERT(l.strides[k][d] % item == 0,
                        "[cuda] operand {}: byte stride {} is not a multiple of its {}-byte items",
                        k, l.strides[k][d], item);
      ix.strides[k][d] = host ? 0 : l.strides[k][d] / item;
      if (!host && d == 0 && ix.strides[k][0] != 1) ix.contiguous = false;
    }
  }
  return ix;
}
template Indexer<2> make_indexer<2>(const Tensor&, const std::array<const Tensor*, 1>&);
template Indexer<3> make_indexer<3>(const Tensor&, const std::array<const Tensor*, 2>&);
template Indexer<4> make_indexer<4>(const Tensor&, const std::array<const Tensor*, 3>&);

Tensor empty_cuda(IntArrayRef sizes, DType dtype, Device device) {
  return kiln::detail::empty_tensor(sizes, dtype, device);
}

void copy_kernel(const Tensor& dst, const Tensor& src) {
  if (dst.numel() == 0) return;
  KILN_DEBUG_ASSERT(is_host_scalar(src) || src.device() == dst.device(),
                    "[copy_] a device copy from {} to {}", src.device(), dst.device());
  Indexer<2> ix = make_indexer<2>(dst, {&src});
  launch_copy(dt(dst.dtype()), dt(src.dtype()), ix, dst.impl()->data(), operand(src),
              stream_for(dst));
  check_launch("copy_");
}

Tensor as_dtype(const Tensor& t, DType dtype) {
  if (t.dtype() == dtype || is_host_scalar(t)) return t;
  Tensor out = empty_cuda(t.sizes(), dtype, t.device());
  copy_kernel(out, t);
  return out;
}

Tensor contiguous_as(const Tensor& t, DType dtype) {
  if (t.dtype() == dtype && t.is_contiguous()) return t;
  Tensor out = empty_cuda(t.sizes(), dtype, t.device());
  copy_kernel(out, t);
  return out;
}

}  // namespace kiln::cuda

#pragma once
// Plain argument structs shared by the CUDA kernels (.cu, compiled by nvcc) and their host
// glue (.cpp): no Kiln and no CUDA headers, so nvcc never parses Kiln's headers. Internal to
// kiln/backend/cuda.
#include <cstdint>

namespace kiln::cuda {

// Dims a strided operand may have after coalescing (kiln shapes can be longer; contiguous
// dims merge, so only truly strided layouts of more dims are refused).
inline constexpr int kMaxDims = 8;

// Threads per block of the one-thread-per-element kernels (elementwise, index, blas helpers).
inline constexpr int kBlock = 256;
// Whether a one-thread-per-element launch over n elements fits the grid (gridDim.x is at most
// 2^31 - 1): what the host glue debug-asserts before launching (kiln/core/error.h, Note [Debug
// asserts]), since a kernel cannot report it.
constexpr bool fits_grid(int64_t n) {
  return n >= 0 && (n + kBlock - 1) / kBlock < (int64_t{1} << 31);
}

// The current device's multiprocessors (132 when the query fails: an H100's); it sizes the
// grids of kernels that split their work over one wave of blocks. In reduce.cu.
int sm_count();

// The element types, numbered as kiln::DType (checked by a static_assert in common.cpp).
enum class Dt : int { Bool, UInt8, Int32, Int64, Float16, BFloat16, Float32, Float64 };

// N operands (0 is the output) viewed over the output's shape: dims innermost first, strides
// in elements, 0 where an operand is broadcast. `contiguous`: every non-scalar operand is
// contiguous with the output's shape, so flat index i is element i of each.
template <int N>
struct Indexer {
  int ndim = 0;
  bool contiguous = true;
  int64_t numel = 0;
  int64_t sizes[kMaxDims] = {};
  int64_t strides[N][kMaxDims] = {};
};

// One input operand: device data, or a number from the host (a 0-d cpu tensor, mostly a
// wrapped Python-style number) passed by value with the launch.
struct Operand {
  const void* data = nullptr;
  bool scalar = false;
  double f = 0;   // the number as a double (floating compute types)
  int64_t i = 0;  // and as an integer (integer and bool compute types)
};

}  // namespace kiln::cuda

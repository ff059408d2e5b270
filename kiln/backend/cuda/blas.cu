// CUDA kernels beside cuBLASLt for the matrix products: a tiled integer GEMM and the scaling of
// an empty sum's result.
#include "kiln/backend/cuda/blas.h"
#include "kiln/backend/cuda/loops.cuh"

namespace kiln::cuda {
namespace {

constexpr int kTile = 16;
constexpr unsigned kMaxGridYZ = 65535;

// y (batch, m, n) = alpha * a @ b + beta * y, one kTile x kTile output tile per block and
// iteration; blocks stride over row tiles (grid y) and batches (grid z) beyond the grid limits.
template <class T>
__global__ void __launch_bounds__(kTile* kTile)
    int_gemm_kernel(MatArg a, MatArg b, T* y, int64_t batch, int64_t m, int64_t n, int64_t k,
                    int64_t alpha, int64_t beta) {
  __shared__ int64_t ta[kTile][kTile + 1];
  __shared__ int64_t tb[kTile][kTile + 1];
  const T* pa = static_cast<const T*>(a.data);
  const T* pb = static_cast<const T*>(b.data);
  const int tx = static_cast<int>(threadIdx.x), ty = static_cast<int>(threadIdx.y);
  const int64_t col = static_cast<int64_t>(blockIdx.x) * kTile + tx;
  const int64_t row_tiles = (m + kTile - 1) / kTile;
  for (int64_t bi = blockIdx.z; bi < batch; bi += gridDim.z) {
    for (int64_t rt = blockIdx.y; rt < row_tiles; rt += gridDim.y) {
      const int64_t row = rt * kTile + ty;
      int64_t s = 0;
      for (int64_t k0 = 0; k0 < k; k0 += kTile) {
        int64_t ka = k0 + tx, kb = k0 + ty;
        ta[ty][tx] = row < m && ka < k
                         ? static_cast<int64_t>(
                               pa[bi * a.batch_stride + row * a.row_stride + ka * a.col_stride])
                         : 0;
        tb[ty][tx] = kb < k && col < n
                         ? static_cast<int64_t>(
                               pb[bi * b.batch_stride + kb * b.row_stride + col * b.col_stride])
                         : 0;
        __syncthreads();
#pragma unroll
        for (int kk = 0; kk < kTile; ++kk) s += ta[ty][kk] * tb[kk][tx];
        __syncthreads();
      }
      if (row < m && col < n) {
        T* out = y + (bi * m + row) * n + col;
        int64_t prev = beta != 0 ? static_cast<int64_t>(*out) * beta : 0;
        *out = static_cast<T>(alpha * s + prev);
      }
    }
  }
}

template <class T>
__global__ void scale_kernel(T* y, int64_t n, double beta) {
  using A = acc_t<T>;
  const A bv = static_cast<A>(beta);
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    y[i] = bv == A(0) ? cvt<T>(A(0)) : cvt<T>(cvt<A>(y[i]) * bv);
}

}  // namespace

void launch_int_gemm(Dt dt, const MatArg& a, const MatArg& b, void* y, int64_t batch, int64_t m,
                     int64_t n, int64_t k, int64_t alpha, int64_t beta, cudaStream_t stream) {
  if (batch == 0 || m == 0 || n == 0) return;
  dim3 block(kTile, kTile);
  int64_t row_tiles = (m + kTile - 1) / kTile;
  dim3 grid(static_cast<unsigned>((n + kTile - 1) / kTile),
            static_cast<unsigned>(row_tiles < kMaxGridYZ ? row_tiles : kMaxGridYZ),
            static_cast<unsigned>(batch < kMaxGridYZ ? batch : kMaxGridYZ));
  auto go = [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    int_gemm_kernel<T>
        <<<grid, block, 0, stream>>>(a, b, static_cast<T*>(y), batch, m, n, k, alpha, beta);
  };
  switch (dt) {
    case Dt::UInt8:
      go(static_cast<uint8_t*>(nullptr));
      break;
    case Dt::Int32:
      go(static_cast<int32_t*>(nullptr));
      break;
    case Dt::Int64:
      go(static_cast<int64_t*>(nullptr));
      break;
    default:
      break;
  }
}

void launch_scale(Dt dt, void* y, int64_t n, double beta, cudaStream_t stream) {
  if (n == 0) return;
  int64_t blocks = (n + kBlock - 1) / kBlock;
  unsigned grid = static_cast<unsigned>(blocks < 65536 ? blocks : 65536);
  KILN_CUDA_DISPATCH_ALL(dt, [&] {
    scale_kernel<scalar_t><<<grid, kBlock, 0, stream>>>(static_cast<scalar_t*>(y), n, beta);
  })
}

}  // namespace kiln::cuda

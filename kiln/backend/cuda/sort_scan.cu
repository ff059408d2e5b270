// CUDA kernels of sort, topk, cumsum and prod, on CUB: sort is DeviceSegmentedSort's stable
// sort of order-preserving unsigned keys with the row positions as values, then a gather of
// the values; cumsum is DeviceScan's inclusive scan keyed by row; prod is DeviceSegmentedReduce.
#include <thrust/iterator/counting_iterator.h>
#include <thrust/iterator/transform_iterator.h>
#include <cub/device/device_scan.cuh>
#include <cub/device/device_segmented_reduce.cuh>
#include <cub/device/device_segmented_sort.cuh>

#include <algorithm>

#include "kiln/backend/cuda/sort_scan.h"

namespace kiln::cuda {
namespace {

constexpr int kThreads = 256;
constexpr size_t kAlign = 256;
size_t aligned(size_t b) { return (b + kAlign - 1) / kAlign * kAlign; }
unsigned grid_for(int64_t n) {
  return static_cast<unsigned>(std::clamp<int64_t>((n + kThreads - 1) / kThreads, 1, 65535));
}

// Note [Sort keys]
// Each element becomes an unsigned key whose order is the elements' order: integers flip their
// sign bit; floats flip every bit when negative and only the sign bit otherwise, after -0 is
// made +0 (so equal elements have equal keys and the stable sort keeps them in row order) and
// every NaN is made the largest key (NaN sorts last ascending and first descending, as ATen).
// The values are then gathered from the input by the sorted positions, so NaN payloads and
// the sign of zero come through unchanged.
template <class K, bool kFloat, bool kSigned, K kAbs, K kInf>
struct KeyOf {
  __device__ K operator()(K raw) const {
    constexpr K kSign = static_cast<K>(K(1) << (sizeof(K) * 8 - 1));
    if constexpr (kFloat) {
      if ((raw & kAbs) > kInf) return static_cast<K>(~K(0));
      if ((raw & kAbs) == 0) raw = 0;
      return (raw & kSign) ? static_cast<K>(~raw) : static_cast<K>(raw | kSign);
    } else if constexpr (kSigned) {
      return static_cast<K>(raw ^ kSign);
    } else {
      return raw;
    }
  }
};

template <class K, class F>
__global__ void keys_kernel(const K* x, K* keys, int64_t* pos, int64_t total, int64_t n, F f) {
  for (int64_t i = blockIdx.x * int64_t{kThreads} + threadIdx.x; i < total;
       i += int64_t{gridDim.x} * kThreads) {
    keys[i] = f(x[i]);
    pos[i] = i % n;
  }
}
__global__ void offsets_kernel(int64_t* off, int64_t rows, int64_t n) {
  for (int64_t r = blockIdx.x * int64_t{kThreads} + threadIdx.x; r <= rows;
       r += int64_t{gridDim.x} * kThreads)
    off[r] = r * n;
}
template <class K>
__global__ void gather_kernel(const K* x, K* values, const int64_t* pos, int64_t total, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{kThreads} + threadIdx.x; i < total;
       i += int64_t{gridDim.x} * kThreads)
    values[i] = x[(i / n) * n + pos[i]];
}

// Calls f(KeyOf<...>{}) for dtype dt.
template <class F>
void with_key(Dt dt, F f) {
  switch (dt) {
    case Dt::Bool:
    case Dt::UInt8:
      return f(KeyOf<uint8_t, false, false, 0, 0>{});
    case Dt::Int32:
      return f(KeyOf<uint32_t, false, true, 0, 0>{});
    case Dt::Int64:
      return f(KeyOf<uint64_t, false, true, 0, 0>{});
    case Dt::Float16:
      return f(KeyOf<uint16_t, true, false, 0x7fff, 0x7c00>{});
    case Dt::BFloat16:
      return f(KeyOf<uint16_t, true, false, 0x7fff, 0x7f80>{});
    case Dt::Float32:
      return f(KeyOf<uint32_t, true, false, 0x7fffffffu, 0x7f800000u>{});
    case Dt::Float64:
      return f(KeyOf<uint64_t, true, false, 0x7fffffffffffffffull, 0x7ff0000000000000ull>{});
  }
}
template <class KeyF>
struct KeyType;
template <class K, bool A, bool B, K C, K D>
struct KeyType<KeyOf<K, A, B, C, D>> {
  using type = K;
};

struct SortPlan {
  size_t offsets, pos, keys_in, keys_out, temp, total;
};
template <class K>
SortPlan plan_sort(int64_t rows, int64_t n, bool descending) {
  SortPlan p{};
  const int64_t total = rows * n;
  p.offsets = 0;
  p.pos = aligned(sizeof(int64_t) * static_cast<size_t>(rows + 1));
  p.keys_in = p.pos + aligned(sizeof(int64_t) * static_cast<size_t>(total));
  p.keys_out = p.keys_in + aligned(sizeof(K) * static_cast<size_t>(total));
  p.temp = p.keys_out + aligned(sizeof(K) * static_cast<size_t>(total));
  size_t temp = 0;
  const int64_t* off = nullptr;
  if (descending) {
    cub::DeviceSegmentedSort::StableSortPairsDescending(
        nullptr, temp, static_cast<const K*>(nullptr), static_cast<K*>(nullptr),
        static_cast<const int64_t*>(nullptr), static_cast<int64_t*>(nullptr), total, rows, off,
        off + 1);
  } else {
    cub::DeviceSegmentedSort::StableSortPairs(
        nullptr, temp, static_cast<const K*>(nullptr), static_cast<K*>(nullptr),
        static_cast<const int64_t*>(nullptr), static_cast<int64_t*>(nullptr), total, rows, off,
        off + 1);
  }
  p.total = p.temp + aligned(temp);
  return p;
}

}  // namespace

size_t sort_workspace_bytes(Dt dt, int64_t rows, int64_t n) {
  size_t bytes = 0;
  with_key(dt, [&](auto key) {
    using K = typename KeyType<decltype(key)>::type;
    bytes = std::max(plan_sort<K>(rows, n, false).total, plan_sort<K>(rows, n, true).total);
  });
  return bytes;
}

void launch_sort(Dt dt, const void* x, void* values, int64_t* indices, int64_t rows, int64_t n,
                 bool descending, void* workspace, cudaStream_t stream) {
  const int64_t total = rows * n;
  if (total == 0) return;
  with_key(dt, [&](auto key) {
    using K = typename KeyType<decltype(key)>::type;
    SortPlan p = plan_sort<K>(rows, n, descending);
    char* ws = static_cast<char*>(workspace);
    auto* off = reinterpret_cast<int64_t*>(ws + p.offsets);
    auto* pos = reinterpret_cast<int64_t*>(ws + p.pos);
    auto* keys_in = reinterpret_cast<K*>(ws + p.keys_in);
    auto* keys_out = reinterpret_cast<K*>(ws + p.keys_out);
    offsets_kernel<<<grid_for(rows + 1), kThreads, 0, stream>>>(off, rows, n);
    keys_kernel<<<grid_for(total), kThreads, 0, stream>>>(static_cast<const K*>(x), keys_in, pos,
                                                          total, n, key);
    size_t temp = p.total - p.temp;
    if (descending) {
      cub::DeviceSegmentedSort::StableSortPairsDescending(
          ws + p.temp, temp, keys_in, keys_out, pos, indices, total, rows, off, off + 1, stream);
    } else {
      cub::DeviceSegmentedSort::StableSortPairs(ws + p.temp, temp, keys_in, keys_out, pos, indices,
                                                total, rows, off, off + 1, stream);
    }
    gather_kernel<<<grid_for(total), kThreads, 0, stream>>>(
        static_cast<const K*>(x), static_cast<K*>(values), indices, total, n);
  });
}

namespace {
struct RowOf {
  int64_t n;
  __host__ __device__ int64_t operator()(int64_t i) const { return i / n; }
};
struct Add {
  template <class T>
  __host__ __device__ T operator()(T a, T b) const {
    return a + b;
  }
};
struct Mul {
  template <class T>
  __host__ __device__ T operator()(T a, T b) const {
    return a * b;
  }
};
struct Same {
  __host__ __device__ bool operator()(int64_t a, int64_t b) const { return a == b; }
};
template <class F>
void with_acc(Dt acc, F f) {
  switch (acc) {
    case Dt::Float32:
      return f(float{});
    case Dt::Float64:
      return f(double{});
    default:
      return f(int64_t{});
  }
}
// cumsum: rows x n elements scanned, restarting at each row (the key is the row).
template <class A>
size_t scan(void* temp, size_t bytes, const A* x, A* y, int64_t rows, int64_t n,
            cudaStream_t stream) {
  (void)rows;
  auto keys = thrust::make_transform_iterator(thrust::counting_iterator<int64_t>(0), RowOf{n});
  cub::DeviceScan::InclusiveScanByKey(temp, bytes, keys, x, y, Add{}, rows * n, Same{}, stream);
  return bytes;
}
}  // namespace

size_t cumsum_workspace_bytes(Dt acc, int64_t rows, int64_t n) {
  size_t bytes = 0;
  with_acc(acc, [&](auto a) {
    using A = decltype(a);
    bytes = scan<A>(nullptr, 0, nullptr, nullptr, rows, std::max<int64_t>(n, 1), nullptr);
  });
  return bytes;
}
void launch_cumsum(Dt acc, const void* x, void* y, int64_t rows, int64_t n, void* workspace,
                   cudaStream_t stream) {
  if (rows * n == 0) return;
  with_acc(acc, [&](auto a) {
    using A = decltype(a);
    size_t bytes = scan<A>(nullptr, 0, nullptr, nullptr, rows, n, stream);
    scan<A>(workspace, bytes, static_cast<const A*>(x), static_cast<A*>(y), rows, n, stream);
  });
}

namespace {
template <class A>
size_t segmented_prod(void* temp, size_t bytes, const A* x, A* y, int64_t rows, int64_t n,
                      cudaStream_t stream) {
  auto begin = thrust::make_transform_iterator(
      thrust::counting_iterator<int64_t>(0), [n] __host__ __device__(int64_t r) { return r * n; });
  cub::DeviceSegmentedReduce::Reduce(temp, bytes, x, y, rows, begin, begin + 1, Mul{}, A(1),
                                     stream);
  return bytes;
}
}  // namespace

size_t prod_workspace_bytes(Dt acc, int64_t rows, int64_t n) {
  size_t bytes = 0;
  with_acc(acc, [&](auto a) {
    using A = decltype(a);
    bytes = segmented_prod<A>(nullptr, 0, nullptr, nullptr, rows, n, nullptr);
  });
  return bytes;
}
void launch_prod(Dt acc, const void* x, void* y, int64_t rows, int64_t n, void* workspace,
                 cudaStream_t stream) {
  if (rows == 0) return;
  with_acc(acc, [&](auto a) {
    using A = decltype(a);
    size_t bytes = segmented_prod<A>(nullptr, 0, nullptr, nullptr, rows, n, stream);
    segmented_prod<A>(workspace, bytes, static_cast<const A*>(x), static_cast<A*>(y), rows, n,
                      stream);
  });
}

}  // namespace kiln::cuda

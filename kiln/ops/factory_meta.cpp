// Meta functions and meta-device kernels of randperm and empty_strided, and the tensor every
// backend's empty_strided returns.
#include "kiln/ops/factory_meta.h"

#include <vector>

#include "kiln/core/device.h"
#include "kiln/core/storage.h"
#include "kiln/core/tensor_impl.h"
#include "kiln/ops/op_list.h"

namespace kiln {

// Note [randperm]
// randperm(n) is the stable ascending argsort of n keys drawn as randint(0, 2^63 - 1, {n}): the
// positions of the keys in sorted order. Each backend runs its own randint and stable sort
// (CPU: std::stable_sort; CUDA: CUB's stable segmented sort), and both are exact functions of
// the generator's (seed, offset) (Note [Philox layout] in kiln/core/generator.h), so a
// permutation is the same on every device for the same generator state, draws on the device
// where the result lives (a CUDA draw from the default generator reads and advances the
// device's own state, so it captures into a graph), and advances the generator as randint of n
// does: ceil(n / 2) Philox blocks. Two equal 63-bit keys (probability about n^2 / 2^64) keep
// their index order. The permutation is computed in int64 and converted to `dtype` last. A
// sequential Fisher-Yates shuffle (kiln/data's Note [Epoch permutations]) would need one thread
// on a GPU; sorting random keys is ATen's CUDA method too.

namespace meta {

void randperm(int64_t n, DType dtype) {
  KILN_CHECK(n >= 0, "[randperm] n must be non-negative, got {}", n);
  KILN_CHECK_TYPE(dtype != kBool, "[randperm] dtype bool is not supported (n {})", n);
  // The largest value, n - 1, must be exact in dtype: floats hold integers up to 2^digits.
  int64_t most = 0;
  switch (dtype) {
    case kUInt8:
      most = 255;
      break;
    case kInt32:
      most = INT32_MAX;
      break;
    case kInt64:
      most = INT64_MAX;
      break;
    case kFloat16:
      most = int64_t{1} << 11;
      break;
    case kBFloat16:
      most = int64_t{1} << 8;
      break;
    case kFloat32:
      most = int64_t{1} << 24;
      break;
    default:
      most = int64_t{1} << 53;
      break;
  }
  KILN_CHECK(n - 1 <= most, "[randperm] n {} is too large for dtype {} (values up to {} are exact)",
             n, dtype, most);
}

int64_t empty_strided(IntArrayRef sizes, IntArrayRef strides, DType) {
  KILN_CHECK(sizes.size() == strides.size(),
             "[empty_strided] got {} sizes [{}] but {} strides [{}]", sizes.size(),
             fmt::join(sizes, ", "), strides.size(), fmt::join(strides, ", "));
  (void)checked_numel(sizes, "empty_strided");
  for (int64_t s : strides)
    KILN_CHECK(s >= 0, "[empty_strided] negative stride in strides [{}] (sizes [{}])",
               fmt::join(strides, ", "), fmt::join(sizes, ", "));
  int64_t last = 0;
  for (size_t i = 0; i < sizes.size(); ++i) {
    if (sizes[i] == 0) return 0;
    int64_t step = 0;
    KILN_CHECK(!__builtin_mul_overflow(sizes[i] - 1, strides[i], &step) &&
                   !__builtin_add_overflow(last, step, &last),
               "[empty_strided] storage size overflows for sizes [{}] and strides [{}]",
               fmt::join(sizes, ", "), fmt::join(strides, ", "));
  }
  return last + 1;
}

}  // namespace meta

namespace detail {
Tensor empty_strided_tensor(IntArrayRef sizes, IntArrayRef strides, DType dtype, Device device) {
  int64_t elements = meta::empty_strided(sizes, strides, dtype);
  size_t nbytes = 0;
  KILN_CHECK(!__builtin_mul_overflow(static_cast<size_t>(elements), itemsize(dtype), &nbytes),
             "[empty_strided] {} elements of {} overflow the byte count", elements, dtype);
  Allocator* alloc = nullptr;
  if (device.is_cpu()) {
    alloc = cpu_allocator();
  } else if (!device.is_meta()) {
    DeviceInterface* iface = device_interface(device.type());
    KILN_CHECK_DEVICE(iface != nullptr, "[empty_strided] no backend is loaded for device {}",
                      device);
    if (device.index() < 0) device = Device(device.type(), 0);
    alloc = iface->allocator(device.index());
  }
  auto storage = make_ref<StorageImpl>(nbytes, device, alloc);
  return Tensor(make_ref<TensorImpl>(std::move(storage), dtype, sizes, strides, 0));
}

Tensor randperm_by_sort(DispatchKey key, int64_t n, Generator* gen, DType dtype, Device device) {
  meta::randperm(n, dtype);
  Tensor keys = ops::op_randint.call_at(key, 0, INT64_MAX, IntArrayRef(&n, 1), gen, kInt64, device);
  Tensor perm = std::get<1>(ops::op_sort.call_at(key, keys, 0, false));
  return dtype == kInt64 ? perm : ops::op_to_copy.call_at(key, perm, dtype, device);
}
}  // namespace detail

namespace {
Tensor meta_randperm(int64_t n, Generator*, DType dtype, Device d) {
  meta::randperm(n, dtype);
  return detail::empty_strided_tensor(IntArrayRef(&n, 1), std::vector<int64_t>{1}, dtype, d);
}
Tensor any_empty_strided(IntArrayRef sizes, IntArrayRef strides, DType dtype, Device d) {
  return detail::empty_strided_tensor(sizes, strides, dtype, d);
}

template <class Sig>
void reg(TypedOp<Sig>& op, Sig* fn) {
  op.def.set_meta_raw(reinterpret_cast<void*>(fn));
  op.set_kernel(DispatchKey::Meta, fn);
}
const bool registered = [] {
  reg(ops::op_randperm, &meta_randperm);
  reg(ops::op_empty_strided, &any_empty_strided);
  ops::op_empty_strided.def.set_uninitialized(true);
  return true;
}();
}  // namespace

}  // namespace kiln

#include "tests/ops/torch_bridge.h"

#include <cstring>

#include "kiln/core/error.h"
#include "kiln/ops/ops.h"

namespace kiln::test {

at::ScalarType to_aten(DType dtype) {
  switch (dtype) {
    case kBool:
      return at::kBool;
    case kUInt8:
      return at::kByte;
    case kInt32:
      return at::kInt;
    case kInt64:
      return at::kLong;
    case kFloat16:
      return at::kHalf;
    case kBFloat16:
      return at::kBFloat16;
    case kFloat32:
      return at::kFloat;
    case kFloat64:
      return at::kDouble;
  }
  KILN_THROW(Type, "[torch_bridge] unknown dtype {}", static_cast<int>(dtype));
}

DType from_aten(at::ScalarType dtype) {
  switch (dtype) {
    case at::kBool:
      return kBool;
    case at::kByte:
      return kUInt8;
    case at::kInt:
      return kInt32;
    case at::kLong:
      return kInt64;
    case at::kHalf:
      return kFloat16;
    case at::kBFloat16:
      return kBFloat16;
    case at::kFloat:
      return kFloat32;
    case at::kDouble:
      return kFloat64;
    default:
      break;
  }
  KILN_THROW(Type, "[torch_bridge] ATen dtype {} has no Kiln equivalent", c10::toString(dtype));
}

at::Tensor to_aten(const Tensor& t) {
  KILN_CHECK_DEVICE(t.device().is_cpu(), "[torch_bridge] expected a cpu tensor, got one on {}",
                    t.device());
  std::vector<int64_t> sizes(t.sizes().begin(), t.sizes().end());
  auto options = at::TensorOptions().dtype(to_aten(t.dtype()));
  if (t.numel() == 0) return at::empty(sizes, options);
  std::vector<int64_t> strides(t.strides().begin(), t.strides().end());
  return at::from_blob(t.data_ptr(), sizes, strides, options).clone(at::MemoryFormat::Contiguous);
}

std::vector<at::Tensor> to_aten(const std::vector<Tensor>& ts) {
  std::vector<at::Tensor> out;
  out.reserve(ts.size());
  for (const Tensor& t : ts) out.push_back(t.defined() ? to_aten(t) : at::Tensor());
  return out;
}

Tensor from_aten(const at::Tensor& t) {
  at::Tensor c = t.contiguous();
  Shape sizes(IntArrayRef(c.sizes().data(), c.sizes().size()));
  Tensor out = empty(sizes, from_aten(c.scalar_type()), Device(kCPU));
  if (c.numel() > 0) std::memcpy(out.data_ptr(), c.data_ptr(), out.nbytes());
  return out;
}

}  // namespace kiln::test

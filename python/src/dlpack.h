#pragma once
// The DLPack ABI (https://github.com/dmlc/dlpack, version 1.0): the structs a producer and a
// consumer share through Python capsules. Declared here because Debian's libdlpack-dev is 0.6,
// which has neither the versioned struct PyTorch 2.x exchanges nor kDLBool.
#include <cstdint>

namespace kiln::python::dlpack {

struct Version {
  uint32_t major, minor;
};
enum DeviceType : int32_t { kCPU = 1, kCUDA = 2, kCUDAHost = 3 };
struct Device {
  int32_t device_type;
  int32_t device_id;
};
enum TypeCode : uint8_t { kInt = 0, kUInt = 1, kFloat = 2, kBfloat = 4, kBool = 6 };
struct DataType {
  uint8_t code;
  uint8_t bits;
  uint16_t lanes;
};
struct Tensor {
  void* data;
  Device device;
  int32_t ndim;
  DataType dtype;
  int64_t* shape;
  int64_t* strides;  // in elements; null means row-major
  uint64_t byte_offset;
};
// The legacy (unversioned) form, capsule name "dltensor" ("used_dltensor" once consumed).
struct ManagedTensor {
  Tensor dl_tensor;
  void* manager_ctx;
  void (*deleter)(ManagedTensor* self);
};
inline constexpr uint64_t kFlagReadOnly = 1;
inline constexpr uint64_t kFlagIsCopied = 2;
// The versioned form, capsule name "dltensor_versioned" ("used_dltensor_versioned").
struct ManagedTensorVersioned {
  Version version;
  void* manager_ctx;
  void (*deleter)(ManagedTensorVersioned* self);
  uint64_t flags;
  Tensor dl_tensor;
};

}  // namespace kiln::python::dlpack

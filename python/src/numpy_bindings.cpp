// Zero-copy exchange with NumPy: kiln.from_numpy(array) and Tensor.numpy() share memory.
#include <pybind11/numpy.h>

#include "bindings.h"

#include "kiln/core/error.h"
#include "kiln/core/storage.h"
#include "kiln/core/tensor_impl.h"
#include "kiln/ops/ops.h"

namespace kiln::python {
namespace {

// Note [Borrowing a NumPy array's memory]
// A CPU storage normally owns bytes from an allocator. To view an array's bytes, the storage
// is given an allocator of its own that hands out the array's pointer once and, when the
// storage dies, drops its reference to the array (with the GIL) and deletes itself. So the
// array lives as long as any tensor viewing it, and nothing is copied.
class BorrowedArray final : public Allocator {
 public:
  BorrowedArray(void* data, py::object owner) : data_(data), owner_(std::move(owner)) {}
  void* allocate(size_t) override { return data_; }
  void deallocate(void*, size_t) override {
    if (Py_IsInitialized()) {
      py::gil_scoped_acquire gil;
      owner_ = py::object();
    } else {
      owner_.release();  // the interpreter is gone: nothing left to drop
    }
    delete this;
  }

 private:
  void* data_;
  py::object owner_;
};

DType dtype_of_array(const py::array& a) {
  char kind = a.dtype().kind();
  size_t size = static_cast<size_t>(a.itemsize());
  if (kind == 'b') return kBool;
  if (kind == 'u' && size == 1) return kUInt8;
  if (kind == 'i' && size == 4) return kInt32;
  if (kind == 'i' && size == 8) return kInt64;
  if (kind == 'f' && size == 2) return kFloat16;
  if (kind == 'f' && size == 4) return kFloat32;
  if (kind == 'f' && size == 8) return kFloat64;
  throw TypeError(fmt::format(
      "[from_numpy] NumPy dtype {} has no Kiln dtype (bool, uint8, int32, int64, float16, "
      "float32, float64)",
      py::str(a.dtype()).cast<std::string>()));
}

const char* numpy_name(DType d) {
  switch (d) {
    case DType::Bool:
      return "bool";
    case DType::UInt8:
      return "uint8";
    case DType::Int32:
      return "int32";
    case DType::Int64:
      return "int64";
    case DType::Float16:
      return "float16";
    case DType::Float32:
      return "float32";
    case DType::Float64:
      return "float64";
    case DType::BFloat16:
      break;
  }
  throw TypeError("[numpy] NumPy has no bfloat16: convert with .float() first");
}

Tensor from_numpy(py::array a) {
  DType dtype = dtype_of_array(a);
  const int64_t item = static_cast<int64_t>(a.itemsize());
  Shape sizes, strides;
  int64_t extent = 1;  // elements the view reaches, from its first one
  for (py::ssize_t i = 0; i < a.ndim(); ++i) {
    int64_t stride = a.strides(i);
    if (stride < 0 || stride % item != 0)
      throw ValueError(fmt::format(
          "[from_numpy] stride {} of dim {} is {} (in bytes): Kiln needs non-negative strides "
          "that are multiples of the item size {}; pass numpy.ascontiguousarray(a)",
          stride, i, stride < 0 ? "negative" : "not a multiple of the item size", item));
    sizes.push_back(a.shape(i));
    strides.push_back(stride / item);
    extent += (a.shape(i) - 1) * (stride / item);
  }
  if (a.size() == 0) return empty(sizes.span(), dtype, Device(kCPU));
  auto* alloc = new BorrowedArray(const_cast<void*>(a.data()), a);
  auto storage = make_ref<StorageImpl>(static_cast<size_t>(extent * item), Device(kCPU), alloc);
  return Tensor(make_ref<TensorImpl>(std::move(storage), dtype, sizes.span(), strides.span(), 0));
}

py::array to_numpy(const Tensor& t, bool force) {
  Tensor src = t;
  if (t.requires_grad()) {
    if (!force)
      throw Error(
          "[numpy] the tensor requires grad: call tensor.detach().numpy() (or numpy(force=True))");
    src = t.detach();
  }
  if (!t.device().is_cpu()) {
    if (!force)
      throw TypeError(
          fmt::format("[numpy] the tensor is on {}: copy it to the host with .cpu() first (or "
                      "numpy(force=True))",
                      t.device().str()));
    src = src.to(Device(kCPU));
  }
  py::dtype dt(numpy_name(src.dtype()));
  std::vector<py::ssize_t> shape, strides;
  for (int64_t i = 0; i < src.dim(); ++i) {
    shape.push_back(src.sizes()[size_t(i)]);
    strides.push_back(src.strides()[size_t(i)] * static_cast<int64_t>(src.itemsize()));
  }
  // The array keeps a Tensor alive (a capsule owning a copy of the handle): same memory.
  auto* keep = new Tensor(src);
  py::capsule owner(keep, [](void* p) { delete static_cast<Tensor*>(p); });
  // data_ptr() raises for a DTensor (no bytes of its own) and marks a host read for compile.
  return py::array(dt, shape, strides, src.numel() ? src.data_ptr() : nullptr, owner);
}

}  // namespace

void bind_numpy(py::module_& m, py::class_<Tensor>& tensor) {
  m.def("from_numpy", &from_numpy, py::arg("array"),
        "A CPU tensor sharing the array's memory (writes through either are seen by the other).");
  tensor
      .def("numpy", &to_numpy, py::kw_only(), py::arg("force") = false,
           "A NumPy array sharing this CPU tensor's memory; force=True copies from other "
           "devices and drops autograd.")
      .def(
          "__array__",
          [](const Tensor& t, py::object dtype) {
            py::array a = to_numpy(t.requires_grad() ? t.detach() : t, false);
            return dtype.is_none() ? a : py::array(a.attr("astype")(dtype));
          },
          py::arg("dtype") = py::none());
}

}  // namespace kiln::python

// DLPack exchange: Tensor.__dlpack__ / __dlpack_device__ and kiln.from_dlpack, sharing memory
// with PyTorch (2.x's versioned capsules and 1.13's legacy ones), NumPy, CuPy and others, on
// the CPU and on CUDA (Note [DLPack and streams]).
#include "dlpack.h"

#include <memory>

#include "bindings.h"

#include "kiln/core/error.h"
#include "kiln/core/storage.h"
#include "kiln/core/tensor_impl.h"
#include "kiln/ops/ops.h"

namespace kiln::python {
namespace {

dlpack::DataType dl_dtype(DType d) {
  uint8_t bits = static_cast<uint8_t>(itemsize(d) * 8);
  switch (d) {
    case DType::Bool:
      return {dlpack::kBool, 8, 1};
    case DType::UInt8:
      return {dlpack::kUInt, 8, 1};
    case DType::Int32:
    case DType::Int64:
      return {dlpack::kInt, bits, 1};
    case DType::BFloat16:
      return {dlpack::kBfloat, 16, 1};
    case DType::Float16:
    case DType::Float32:
    case DType::Float64:
      return {dlpack::kFloat, bits, 1};
  }
  throw InternalError("[dlpack] bug: unhandled dtype");
}

DType kiln_dtype(dlpack::DataType t) {
  if (t.lanes != 1)
    throw TypeError(
        fmt::format("[from_dlpack] vector types (lanes {}) have no Kiln dtype", t.lanes));
  if (t.code == dlpack::kBool && t.bits == 8) return kBool;
  if (t.code == dlpack::kUInt && t.bits == 8) return kUInt8;
  if (t.code == dlpack::kInt && t.bits == 32) return kInt32;
  if (t.code == dlpack::kInt && t.bits == 64) return kInt64;
  if (t.code == dlpack::kFloat && t.bits == 16) return kFloat16;
  if (t.code == dlpack::kFloat && t.bits == 32) return kFloat32;
  if (t.code == dlpack::kFloat && t.bits == 64) return kFloat64;
  if (t.code == dlpack::kBfloat && t.bits == 16) return kBFloat16;
  throw TypeError(fmt::format("[from_dlpack] DLPack type code {} with {} bits has no Kiln dtype",
                              t.code, t.bits));
}

// Note [DLPack and streams]
// A CUDA tensor's memory is shared, but the work that writes it runs on some stream, so each
// side tells the other which stream it will use, as the DLPack protocol (the Python array API's
// __dlpack__) prescribes. The consumer passes its stream to __dlpack__ (an int: 1 the legacy
// default stream, 2 the per-thread one, else a cudaStream_t; -1 asks for no synchronisation;
// None means the legacy default); the producer makes that stream wait for the work it has
// queued on its own, with an event, so no host wait is needed. Kiln's stream handles are
// cudaStream_t values (kiln/backend/cuda/device.cpp), so the consumer's stream is used through
// the device interface as it is. Importing, Kiln passes its current stream to the producer.
// Memory a consumer still reads when the producer frees it is the usual DLPack caveat: keep the
// producer's tensor alive while queued work reads the shared one.

// The DLPack device of a Kiln device: cpu, or a cuda device when the CUDA backend serves it.
dlpack::Device dl_device_of(Device d, const char* op) {
  if (d.is_cpu()) return {dlpack::kCPU, 0};
  if (d.type() == kCUDA) return {dlpack::kCUDA, d.index()};
  throw NotImplementedError(fmt::format(
      "[{}] DLPack exchange of {} tensors: only cpu and cuda devices have a DLPack device type "
      "(copy with .cpu() first)",
      op, device_type_name(d.type())));
}

// Makes `consumer` (a DLPack stream value) wait for the work queued so far on the current
// stream of `d`.
void order_after_current_stream(Device d, int64_t consumer) {
  DeviceInterface* iface = device_interface(d.type());
  const int index = d.index();
  const uint64_t ours = iface->current_stream(index);
  // The legacy default stream is 1 in DLPack and 0 (nullptr) as Kiln's handle.
  const uint64_t theirs = consumer == 1 && ours == 0 ? 0 : static_cast<uint64_t>(consumer);
  if (theirs == ours) return;
  const uint64_t event = iface->create_event(index);
  iface->record_event(index, event, ours);
  iface->stream_wait_event(index, theirs, event);
  iface->destroy_event(index, event);  // CUDA releases it once the wait is done with it
}

// What a capsule owns: the tensor handle (keeping its storage alive) and the shape/strides
// arrays the DLTensor points at.
template <class Managed>
struct Export {
  Managed managed{};
  Tensor tensor;
  std::vector<int64_t> shape, strides;
};

template <class Managed>
Managed* make_export(const Tensor& t) {
  auto* e = new Export<Managed>();
  e->tensor = t;
  for (int64_t i = 0; i < t.dim(); ++i) {
    e->shape.push_back(t.sizes()[size_t(i)]);
    e->strides.push_back(t.strides()[size_t(i)]);
  }
  dlpack::Tensor& dl = e->managed.dl_tensor;
  dl.data = device_address(t, "__dlpack__");
  dl.device = dl_device_of(t.device(), "__dlpack__");
  dl.ndim = static_cast<int32_t>(t.dim());
  dl.dtype = dl_dtype(t.dtype());
  dl.shape = e->shape.data();
  dl.strides = e->strides.data();
  dl.byte_offset = 0;
  e->managed.manager_ctx = e;
  e->managed.deleter = [](Managed* m) { delete static_cast<Export<Managed>*>(m->manager_ctx); };
  return &e->managed;
}

// A capsule's destructor: a capsule nobody consumed still owns its tensor.
template <class Managed>
void capsule_destructor(PyObject* capsule) {
  const char* unused =
      std::is_same_v<Managed, dlpack::ManagedTensor> ? "dltensor" : "dltensor_versioned";
  if (PyCapsule_IsValid(capsule, unused)) {
    auto* m = static_cast<Managed*>(PyCapsule_GetPointer(capsule, unused));
    if (m && m->deleter) m->deleter(m);
  } else {
    PyErr_Clear();
  }
}

py::object to_dlpack(const Tensor& t, py::object stream, py::object max_version,
                     py::object dl_device, py::object copy) {
  const dlpack::Device here = dl_device_of(t.device(), "__dlpack__");
  const bool copying = !copy.is_none() && copy.cast<bool>();
  Tensor src = t.requires_grad() ? t.detach() : t;
  if (!dl_device.is_none()) {
    auto want = dl_device.cast<std::pair<int, int>>();
    if (want.first != here.device_type || want.second != here.device_id) {
      if (want.first != dlpack::kCPU || !copying)
        throw py::buffer_error(fmt::format(
            "[__dlpack__] dl_device ({}, {}) differs from the tensor's ({}, {}): Kiln exports to "
            "another device only as a copy to the cpu (copy=True)",
            want.first, want.second, here.device_type, here.device_id));
      src = src.to(Device(kCPU));  // waits for the device: the copy is complete when it returns
      stream = py::none();
      copy = py::bool_(false);  // `src` is already the copy
    }
  }
  if (src.device().is_cpu()) {
    if (!stream.is_none() && stream.cast<int64_t>() != -1)
      throw ValueError(fmt::format("[__dlpack__] stream must be None for a cpu tensor, got {}",
                                   py::str(stream).cast<std::string>()));
  } else {
    const int64_t s = stream.is_none() ? 1 : stream.cast<int64_t>();  // None: legacy default
    if (s == 0)
      throw ValueError(
          "[__dlpack__] stream 0 is ambiguous for a cuda tensor (DLPack): pass 1 "
          "for the legacy default stream, 2 for the per-thread one, or a stream");
    if (s != -1) order_after_current_stream(src.device(), s);
  }
  if (!copy.is_none() && copy.cast<bool>()) src = src.clone();
  bool versioned = !max_version.is_none() && max_version.cast<std::pair<int, int>>().first >= 1;
  if (versioned) {
    auto* m = make_export<dlpack::ManagedTensorVersioned>(src);
    m->version = {1, 0};
    m->flags = copying ? dlpack::kFlagIsCopied : 0;
    return py::reinterpret_steal<py::object>(PyCapsule_New(
        m, "dltensor_versioned", &capsule_destructor<dlpack::ManagedTensorVersioned>));
  }
  auto* m = make_export<dlpack::ManagedTensor>(src);
  return py::reinterpret_steal<py::object>(
      PyCapsule_New(m, "dltensor", &capsule_destructor<dlpack::ManagedTensor>));
}

// Note [Borrowing a DLPack tensor]: as for NumPy (Note [Borrowing a NumPy array's memory]), the
// storage gets an allocator of its own that returns the producer's pointer once and calls the
// producer's deleter when the storage dies.
template <class Managed>
class BorrowedDLPack final : public Allocator {
 public:
  BorrowedDLPack(void* data, Managed* managed) : data_(data), managed_(managed) {}
  void* allocate(size_t) override { return data_; }
  void deallocate(void*, size_t) override {
    if (managed_->deleter) {
      if (Py_IsInitialized()) {
        py::gil_scoped_acquire gil;  // a Python producer's deleter may touch Python objects
        managed_->deleter(managed_);
      } else {
        managed_->deleter(managed_);
      }
    }
    delete this;
  }

 private:
  void* data_;
  Managed* managed_;
};

// The Kiln device of a DLPack device: cpu (or pinned host memory), or cuda when Kiln's CUDA
// backend is loaded (and "cuda" is not an alias of another type).
Device kiln_device_of(dlpack::Device d) {
  if (d.device_type == dlpack::kCPU || d.device_type == dlpack::kCUDAHost) return Device(kCPU);
  if (d.device_type == dlpack::kCUDA && device_interface(kCUDA) != nullptr &&
      find_device_type("cuda") == kCUDA)
    return Device(kCUDA, d.device_id);
  throw NotImplementedError(fmt::format(
      "[from_dlpack] DLPack device type {} (id {}): Kiln imports cpu tensors, and cuda tensors "
      "once its CUDA backend is loaded (kiln.load_backend('cuda'))",
      d.device_type, d.device_id));
}

template <class Managed>
Tensor import_managed(Managed* m) {
  const dlpack::Tensor& dl = m->dl_tensor;
  Device device;
  try {
    device = kiln_device_of(dl.device);
  } catch (...) {
    if (m->deleter) m->deleter(m);
    throw;
  }
  DType dtype;
  try {
    dtype = kiln_dtype(dl.dtype);
  } catch (...) {
    if (m->deleter) m->deleter(m);
    throw;
  }
  Shape sizes, strides;
  int64_t extent = 1, numel = 1;
  for (int32_t i = 0; i < dl.ndim; ++i) sizes.push_back(dl.shape[i]);
  std::vector<int64_t> row_major(size_t(dl.ndim), 1);  // what a null strides means
  for (int32_t i = dl.ndim - 2; i >= 0; --i)
    row_major[size_t(i)] = row_major[size_t(i) + 1] * dl.shape[i + 1];
  for (int32_t i = 0; i < dl.ndim; ++i)
    strides.push_back(dl.strides ? dl.strides[i] : row_major[size_t(i)]);
  for (int32_t i = 0; i < dl.ndim; ++i) {
    numel *= sizes[size_t(i)];
    if (strides[size_t(i)] < 0) {
      if (m->deleter) m->deleter(m);
      throw ValueError(fmt::format("[from_dlpack] stride {} of dim {} is negative: not supported",
                                   strides[size_t(i)], i));
    }
    extent += (sizes[size_t(i)] - 1) * strides[size_t(i)];
  }
  char* base = static_cast<char*>(dl.data) + dl.byte_offset;
  if (numel == 0) {
    if (m->deleter) m->deleter(m);
    return empty(sizes.span(), dtype, device);
  }
  auto* alloc = new BorrowedDLPack<Managed>(base, m);
  auto storage =
      make_ref<StorageImpl>(static_cast<size_t>(extent) * itemsize(dtype), device, alloc);
  return Tensor(make_ref<TensorImpl>(std::move(storage), dtype, sizes.span(), strides.span(), 0));
}

// The stream a producer should order its work before, for a tensor on `device` (DLPack's
// values: 1 for the legacy default stream); None for the cpu.
py::object consumer_stream(py::object obj) {
  if (!py::hasattr(obj, "__dlpack_device__")) return py::none();
  auto dev = obj.attr("__dlpack_device__")().cast<std::pair<int, int>>();
  if (dev.first != dlpack::kCUDA) return py::none();
  if (device_interface(kCUDA) == nullptr)  // loads it, once (kiln.load_backend is idempotent)
    py::module_::import("kiln").attr("load_backend")("cuda");
  Device d = kiln_device_of({dlpack::kCUDA, dev.second});
  const uint64_t ours = device_interface(d.type())->current_stream(d.index());
  return py::int_(ours == 0 ? 1 : ours);
}

Tensor from_dlpack(py::object obj) {
  py::object capsule;
  if (PyCapsule_CheckExact(obj.ptr())) {
    capsule = obj;
  } else if (py::hasattr(obj, "__dlpack__")) {
    py::object stream = consumer_stream(obj);
    try {
      capsule = obj.attr("__dlpack__")(py::arg("stream") = stream,
                                       py::arg("max_version") = py::make_tuple(1, 0));
    } catch (py::error_already_set& e) {
      if (!e.matches(PyExc_TypeError)) throw;  // an older producer without max_version
      capsule = obj.attr("__dlpack__")(py::arg("stream") = stream);
    }
  } else {
    throw TypeError(
        fmt::format("[from_dlpack] expected an object with __dlpack__ or a DLPack capsule, got {}",
                    py::str(py::type::handle_of(obj).attr("__name__")).cast<std::string>()));
  }
  PyObject* c = capsule.ptr();
  if (PyCapsule_IsValid(c, "dltensor_versioned")) {
    auto* m =
        static_cast<dlpack::ManagedTensorVersioned*>(PyCapsule_GetPointer(c, "dltensor_versioned"));
    if (m->version.major > 1) {
      throw NotImplementedError(fmt::format("[from_dlpack] DLPack version {}.{}: Kiln reads 1.x",
                                            m->version.major, m->version.minor));
    }
    PyCapsule_SetName(c, "used_dltensor_versioned");
    return import_managed(m);
  }
  if (PyCapsule_IsValid(c, "dltensor")) {
    auto* m = static_cast<dlpack::ManagedTensor*>(PyCapsule_GetPointer(c, "dltensor"));
    PyCapsule_SetName(c, "used_dltensor");
    return import_managed(m);
  }
  throw ValueError("[from_dlpack] the capsule is not an unused DLPack tensor (already consumed?)");
}

}  // namespace

void bind_dlpack(py::module_& m, py::class_<Tensor>& tensor) {
  tensor
      .def("__dlpack__", &to_dlpack, py::kw_only(), py::arg("stream") = py::none(),
           py::arg("max_version") = py::none(), py::arg("dl_device") = py::none(),
           py::arg("copy") = py::none(),
           "A DLPack capsule sharing this tensor's memory (versioned when max_version >= 1.0).")
      .def("__dlpack_device__", [](const Tensor& t) {
        dlpack::Device d = dl_device_of(t.device(), "__dlpack_device__");
        return py::make_tuple(static_cast<int>(d.device_type), d.device_id);
      });
  m.def("from_dlpack", &from_dlpack, py::arg("tensor"),
        "A tensor sharing the memory of a DLPack producer (torch.Tensor, numpy.ndarray, ...).");
}

}  // namespace kiln::python

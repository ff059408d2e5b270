// The `kiln._kiln` extension module: Kiln's C++ API for Python. python/kiln/__init__.py
// re-exports it with the parts written in Python (context managers, nn, optim).
#include "bindings.h"
#include "op_bindings.h"

#include "kiln/core/error.h"
#include "kiln/core/generator.h"
#include "kiln/ops/ops.h"

namespace kiln::python {
namespace {

// kiln.Error and its subclasses, made by bind_errors.
struct ErrorTypes {
  py::handle base, device, compile, distributed, internal;
};
ErrorTypes g_errors;

void bind_errors(py::module_& m) {
  // Note [Errors in Python]: ValueError, TypeError, IndexError and NotImplementedError become
  // Python's own; the rest become subclasses of kiln.Error, itself a RuntimeError. The message
  // is Kiln's ("[op] what is wrong, with the values").
  static py::exception<Error> base(m, "Error", PyExc_RuntimeError);
  static py::exception<DeviceError> device(m, "DeviceError", base.ptr());
  static py::exception<CompileError> compile(m, "CompileError", base.ptr());
  static py::exception<DistributedError> distributed(m, "DistributedError", base.ptr());
  static py::exception<InternalError> internal(m, "InternalError", base.ptr());
  g_errors = {base, device, compile, distributed, internal};
  // Kiln's errors; anything else goes on to pybind11's own translators.
  py::register_exception_translator([](std::exception_ptr p) {
    if (!set_kiln_error(p)) std::rethrow_exception(p);
  });
}

}  // namespace

bool set_kiln_error(std::exception_ptr p) {
  try {
    if (p) std::rethrow_exception(p);
  } catch (const ValueError& e) {
    PyErr_SetString(PyExc_ValueError, e.what());
  } catch (const TypeError& e) {
    PyErr_SetString(PyExc_TypeError, e.what());
  } catch (const IndexError& e) {
    PyErr_SetString(PyExc_IndexError, e.what());
  } catch (const NotImplementedError& e) {
    PyErr_SetString(PyExc_NotImplementedError, e.what());
  } catch (const DeviceError& e) {
    PyErr_SetString(g_errors.device.ptr(), e.what());
  } catch (const CompileError& e) {
    PyErr_SetString(g_errors.compile.ptr(), e.what());
  } catch (const DistributedError& e) {
    PyErr_SetString(g_errors.distributed.ptr(), e.what());
  } catch (const InternalError& e) {
    PyErr_SetString(g_errors.internal.ptr(), e.what());
  } catch (const Error& e) {
    PyErr_SetString(g_errors.base.ptr(), e.what());
  } catch (...) {
    return false;
  }
  return true;
}

void set_python_error(std::exception_ptr p) {
  if (set_kiln_error(p)) return;
  try {
    std::rethrow_exception(p);
  } catch (py::error_already_set& e) {
    e.restore();
  } catch (const py::builtin_exception& e) {
    e.set_error();
  } catch (const std::bad_alloc& e) {
    PyErr_SetString(PyExc_MemoryError, e.what());
  } catch (const std::exception& e) {
    PyErr_SetString(PyExc_RuntimeError, e.what());
  } catch (...) {
    PyErr_SetString(PyExc_SystemError, "kiln: an unknown C++ exception");
  }
}

void bind_core(py::module_& m) {
  bind_errors(m);

  py::enum_<DType> dtype(m, "dtype", "An element type: kiln.float32, kiln.int64, ...");
  for (DType d : {kBool, kUInt8, kInt32, kInt64, kFloat16, kBFloat16, kFloat32, kFloat64})
    dtype.value(std::string(name(d)).c_str(), d);
  dtype.def_property_readonly("is_floating_point", [](DType d) { return is_floating(d); })
      .def_property_readonly("itemsize", [](DType d) { return itemsize(d); });
  // Replacing (not overloading) the enum's own __repr__ and __str__: kiln.float32, as torch's.
  for (const char* attr : {"__repr__", "__str__"})
    dtype.attr(attr) = py::cpp_function([](DType d) { return fmt::format("kiln.{}", name(d)); },
                                        py::name(attr), py::is_method(dtype));
  for (DType d : {kBool, kUInt8, kInt32, kInt64, kFloat16, kBFloat16, kFloat32, kFloat64})
    m.attr(std::string(name(d)).c_str()) = d;
  m.attr("half") = kFloat16;
  m.attr("float") = kFloat32;
  m.attr("double") = kFloat64;
  m.attr("long") = kInt64;
  m.attr("int") = kInt32;
  m.def("get_default_dtype", &default_dtype);
  m.def("set_default_dtype", &set_default_dtype, py::arg("dtype"));
  m.def("promote_types", &promote_types, py::arg("a"), py::arg("b"));

  py::class_<Device>(m, "device", "A device: kiln.device('cpu'), kiln.device('cuda', 1).")
      .def(py::init([](const std::string& spec) { return Device(spec); }), py::arg("spec"))
      .def(py::init([](const std::string& type, int index) { return Device(type, index); }),
           py::arg("type"), py::arg("index"))
      .def_property_readonly("type", [](Device d) { return d.str().substr(0, d.str().find(':')); })
      .def_property_readonly("index",
                             [](Device d) -> py::object {
                               std::string s = d.str();
                               size_t colon = s.find(':');
                               if (colon == std::string::npos) return py::none();
                               return py::int_(std::stoi(s.substr(colon + 1)));
                             })
      .def("__repr__", [](Device d) { return fmt::format("device(type='{}')", d.str()); })
      .def("__str__", &Device::str)
      .def("__eq__",
           [](Device a, py::handle b) {
             return (py::isinstance<Device>(b) || py::isinstance<py::str>(b)) && a == to_device(b);
           })
      .def("__hash__", [](Device d) { return std::hash<Device>()(d); });
  py::implicitly_convertible<py::str, Device>();
  m.def("get_default_device", &default_device);
  m.def(
      "set_default_device", [](py::handle d) { set_default_device(to_device(d)); },
      py::arg("device"));

  py::class_<Generator>(m, "Generator", "A Philox generator: (seed, offset) replays exactly.")
      .def(py::init<uint64_t>(), py::arg("seed") = 0)
      .def(
          "manual_seed",
          [](Generator& g, uint64_t s) -> Generator& {
            g.set_seed(s);
            return g;
          },
          py::arg("seed"), py::return_value_policy::reference)
      .def("initial_seed", &Generator::seed)
      .def_property("offset", &Generator::offset, &Generator::set_offset);
  m.def(
      "manual_seed", [](uint64_t s) { manual_seed(s); }, py::arg("seed"));
  m.def("default_generator", &default_generator, py::return_value_policy::reference);
  m.def("set_num_threads", &set_num_threads, py::arg("n"));
  m.def("get_num_threads", &get_num_threads);
  m.def("set_flush_denormal", &set_flush_denormal, py::arg("mode"),
        "Flushes denormal floats to zero on the CPU (results and inputs), as PyTorch's "
        "torch.set_flush_denormal; returns whether the CPU supports it. Off by default.");
  m.def("set_allow_tf32", &set_allow_tf32, py::arg("allow"),
        "Lets float32 products and convolutions on a GPU use TF32 tensor cores (PyTorch's "
        "torch.backends.cuda.matmul.allow_tf32); off by default. `kiln bench` turns it on.");
  m.def("get_allow_tf32", [] { return allow_tf32(); });
  m.def(
      "device_count",
      [](const std::string& type) -> int {
        int t = find_device_type(type);
        DeviceInterface* iface = t < 0 ? nullptr : device_interface(static_cast<DeviceType>(t));
        return iface ? iface->device_count() : 0;
      },
      py::arg("type"),
      "How many devices of a type are present: 0 for a type whose backend is not loaded "
      "(kiln.device_count('cuda') after kiln.load_backend('cuda')).");
  m.def(
      "synchronize",
      [](py::object d) {
        py::gil_scoped_release nogil;
        if (d.is_none())
          synchronize_all_devices();
        else
          synchronize(to_device(d));
      },
      py::arg("device") = py::none());
}

PYBIND11_MODULE(_kiln, m) {
  m.doc() = "Kiln: a deep-learning runtime whose host overhead disappears.";
  bind_core(m);
  py::class_<Tensor> tensor = bind_tensor(m);
  bind_numpy(m, tensor);
  bind_dlpack(m, tensor);
  bind_composites(m, tensor);
  bind_ops(m, tensor, composite_names());
  bind_autograd(m);
  bind_compile(m);
  bind_nn(m);
  bind_distributed_and_backends(m);
  bind_amp(m);
  bind_streams(m);
  bind_parallel(m);
  m.def("_op_signatures", &op_stub_lines, py::arg("methods"),
        "'name|python signature|schema' per generated function (or method): for the .pyi stubs.");
}

}  // namespace kiln::python

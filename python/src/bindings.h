#pragma once
// The parts of the `kiln` extension module, one per binding file; module.cpp calls them in order.
#include "convert.h"

namespace kiln::python {

void bind_core(py::module_& m);                                 // errors, dtype, device, Generator
py::class_<Tensor> bind_tensor(py::module_& m);                 // kiln.Tensor and its operators
void bind_composites(py::module_& m, py::handle tensor_class);  // ops that are not in the op list
void bind_numpy(py::module_& m, py::class_<Tensor>& tensor);    // NumPy and DLPack exchange
void bind_autograd(py::module_& m);                             // kiln.autograd, grad modes
void bind_compile(py::module_& m);                              // kiln.compile
void bind_nn(py::module_& m);  // kiln.nn C++ modules, kiln.optim, kiln.save/load
void bind_dlpack(py::module_& m, py::class_<Tensor>& tensor);  // DLPack exchange
void bind_distributed_and_backends(py::module_& m);  // distributed, dtensor, backends, profiler
void bind_amp(py::module_& m);                       // kiln.amp: autocast, GradScaler
void bind_streams(py::module_& m);                   // kiln.Stream, kiln.Event, kiln.stream
void bind_parallel(py::module_& m);  // kiln.parallel's C++ side: DDP, tensor parallel, FSDP

// Sets the Python error for a Kiln error (Note [Errors in Python] in module.cpp); false for any
// other exception.
bool set_kiln_error(std::exception_ptr p);
// Sets the Python error for any exception, as pybind11's translators would: for code that
// CPython calls without pybind11's dispatcher (Note [Operators without pybind11's dispatcher]).
void set_python_error(std::exception_ptr p);

// The op-list names that bind_composites defines with a friendlier signature.
const std::vector<std::string>& composite_names();

}  // namespace kiln::python

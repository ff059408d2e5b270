#pragma once
// Python values <-> Kiln values, shared by every binding file of the `kiln` module.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>  // in every file: type casters must agree across translation units

#include "tensor_caster.h"  // likewise: one Python object per tensor

#include "kiln/core/device.h"
#include "kiln/core/dtype.h"
#include "kiln/core/scalar.h"
#include "kiln/core/tensor.h"

namespace kiln::python {
namespace py = pybind11;

// A Python bool, int or float (or a 1-element tensor's value) as a Scalar; TypeError naming
// `what` otherwise.
Scalar to_scalar(py::handle v, const char* what);
// Whether `v` is a Python number (bool, int, float) or a NumPy scalar.
bool is_number(py::handle v);
// An int or a sequence of ints as sizes; TypeError naming `what` otherwise.
Shape to_shape(py::handle v, const char* what);
// A device from a kiln.device or a string ("cpu", "cuda:1").
Device to_device(py::handle v);
// A Python number as a 0-d CPU tensor that promotes like PyTorch's wrapped numbers.
Tensor wrapped_number(const Scalar& s);
// A Tensor argument: a kiln.Tensor, or a number (a wrapped number). TypeError otherwise.
Tensor to_tensor_arg(py::handle v, const char* op, const char* what);

// A tensor from nested Python lists/tuples of numbers (or a number: 0-d), with the dtype
// inferred as PyTorch infers it (bool, int64, or the default float dtype) unless given.
Tensor tensor_from_data(py::handle data, std::optional<DType> dtype, Device device);
// The elements as nested Python lists (a number for a 0-d tensor).
py::object to_list(const Tensor& t);
// A Scalar as the Python number of its kind.
py::object scalar_to_python(const Scalar& s);
// The address of the first element on the tensor's device, as PyTorch's data_ptr() (a device
// address for a cuda tensor; Tensor::data_ptr() gives host data only). A DTensor has none.
void* device_address(const Tensor& t, const char* op);

}  // namespace kiln::python

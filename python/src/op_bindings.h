#pragma once
// The ops of the op list (kiln/ops/op_list.h), bound to Python from their schemas: one generic
// caller reads each op's parsed schema (kiln/dispatch/schema.h) and its PythonExposure, so a new
// op in the list is in `kiln` (and in its .pyi stub) without a line here.
#include <string>

#include "convert.h"

namespace kiln::python {

// Binds every exposed op as `kiln.<name>` (and, for FunctionAndMethod ops, `Tensor.<name>`),
// except the names in `skip`, which the hand-written bindings define.
void bind_ops(py::module_& m, py::handle tensor_class, const std::vector<std::string>& skip);

// The .pyi stub lines of the generated functions and methods (kiln._stub_lines()).
std::vector<std::string> op_stub_lines(bool methods);

}  // namespace kiln::python

// One Python object per tensor: making and forgetting wrappers (Note [One Python object per
// tensor] in tensor_caster.h).
#include "tensor_caster.h"

#include <stdexcept>

namespace kiln::python {
namespace py = pybind11;
namespace {

destructor g_pybind11_dealloc = nullptr;  // what pybind11 gave kiln.Tensor

using Base = py::detail::type_caster_base<Tensor>;  // pybind11's caster: makes a wrapper

void forget_then_dealloc(PyObject* self) {
  auto* inst = reinterpret_cast<py::detail::instance*>(self);
  py::detail::value_and_holder vh = inst->get_value_and_holder(nullptr, false);
  const Tensor* t = vh && vh.holder_constructed() ? vh.value_ptr<Tensor>() : nullptr;
  if (t && t->impl() && t->impl()->python_object() == self) t->impl()->set_python_object(nullptr);
  g_pybind11_dealloc(self);
}

py::handle remember(TensorImpl* impl, py::handle wrapper) {
  if (impl && wrapper) impl->set_python_object(wrapper.ptr());
  return wrapper;
}

}  // namespace

py::handle new_tensor_wrapper(const Tensor& t) {
  return remember(t.impl(), Base::cast(t, py::return_value_policy::copy, {}));
}

py::handle new_tensor_wrapper(Tensor&& t) {
  TensorImpl* impl = t.impl();  // before the handle moves into the wrapper
  return remember(impl, Base::cast(std::move(t), py::return_value_policy::move, {}));
}

void forget_tensor_wrappers_on_dealloc(PyHeapTypeObject* type) {
  // Called before PyType_Ready, which would copy the deallocator from the base type
  // (pybind11_object's) into a type that has none of its own yet.
  PyTypeObject* t = &type->ht_type;
  g_pybind11_dealloc = t->tp_dealloc ? t->tp_dealloc : t->tp_base->tp_dealloc;
  if (!g_pybind11_dealloc) throw std::runtime_error("kiln.Tensor: pybind11 gave no deallocator");
  t->tp_dealloc = forget_then_dealloc;
}

}  // namespace kiln::python

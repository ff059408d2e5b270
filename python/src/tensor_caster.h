#pragma once
// How a kiln::Tensor becomes a Python object: one object per tensor (included by convert.h, so
// that every binding file converts tensors the same way).
//
// Note [One Python object per tensor]
// Python compares objects by identity first: `t.grad is t.grad`, a parameter as a dict key or a
// set member found again through a later `model.parameters()`, `a.add_(b) is a`. A Tensor is a
// handle, and pybind11 would make a new wrapper for every handle returned. So a TensorImpl keeps
// a borrowed pointer to the wrapper that holds it while that wrapper lives
// (TensorImpl::python_object), and returning a tensor gives that wrapper again when there is
// one; otherwise a new wrapper is made and recorded. The Tensor type's deallocator forgets the
// wrapper before pybind11 destroys it. Nothing keeps a wrapper alive for C++: a tensor that only
// C++ holds gets a fresh wrapper next time (PyTorch also resurrects the old one, to keep
// attributes set on it from Python; kiln.Tensor takes no such attributes). The pointer is read
// and written under the GIL only, by this caster and the deallocator. The invariant that makes
// the borrowed pointer safe: a wrapper's Tensor never changes impl (bindings return self
// instead of assigning a new handle to it, and pybind11 may not move a Tensor out of an
// unreferenced wrapper: move_if_unreferenced below), so the impl a wrapper recorded itself in
// is the one whose slot it clears. An undefined Tensor has no impl and gets a wrapper each time.
// The cost is a load and a branch per returned tensor and a store per new wrapper: nothing
// measurable against `a + b`'s ~400 ns (bench/python_op_bench.py).
#include <pybind11/pybind11.h>

#include "kiln/core/tensor.h"
#include "kiln/core/tensor_impl.h"

namespace kiln::python {

// A new wrapper holding `t` (a copy of the handle, or the handle moved), recorded in its impl.
pybind11::handle new_tensor_wrapper(const Tensor& t);
pybind11::handle new_tensor_wrapper(Tensor&& t);

// Makes kiln.Tensor's deallocator forget each wrapper in its impl first (bind_tensor passes it
// to pybind11::custom_type_setup).
void forget_tensor_wrappers_on_dealloc(PyHeapTypeObject* type);

// The wrapper of `t` if one lives (a new reference), else a null handle.
inline pybind11::handle existing_tensor_wrapper(const Tensor& t) {
  const TensorImpl* impl = t.impl();
  if (!impl || !impl->python_object()) return {};
  return pybind11::handle(static_cast<PyObject*>(impl->python_object())).inc_ref();
}

}  // namespace kiln::python

namespace pybind11::detail {

// Loading is pybind11's own; casting to Python reuses the tensor's wrapper (Note above). Every
// return value policy gives an owning wrapper: a Tensor is a handle, copied cheaply.
template <>
class type_caster<kiln::Tensor> : public type_caster_base<kiln::Tensor> {
 public:
  static handle cast(const kiln::Tensor& t, return_value_policy, handle) {
    if (handle h = kiln::python::existing_tensor_wrapper(t)) return h;
    return kiln::python::new_tensor_wrapper(t);
  }
  static handle cast(kiln::Tensor&& t, return_value_policy, handle) {
    if (handle h = kiln::python::existing_tensor_wrapper(t)) return h;
    return kiln::python::new_tensor_wrapper(std::move(t));
  }
  static handle cast(const kiln::Tensor* t, return_value_policy policy, handle parent) {
    if (!t) return none().release();
    return cast(*t, policy, parent);
  }
};

// `obj.cast<Tensor>()` of an object nothing else refers to would move the handle out of the
// wrapper, leaving the wrapper without its impl and the impl pointing at a wrapper that dies
// without clearing it (the Note's invariant). A Tensor is a handle: copying it is as cheap.
template <>
struct move_if_unreferenced<kiln::Tensor, void> : std::false_type {};

}  // namespace pybind11::detail

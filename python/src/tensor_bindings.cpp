// kiln.Tensor: properties, conversions, Python operators and indexing. The ops of the op list
// are added as methods by op_bindings.cpp; what is here is what Python needs beyond them.
#include "bindings.h"

#include <deque>

#include "kiln/autograd/autograd.h"
#include "kiln/core/error.h"
#include "kiln/dtensor/dtensor.h"
#include "kiln/ops/indexing.h"
#include "kiln/ops/ops.h"

namespace kiln::python {
namespace {

// Note [Operators without pybind11's dispatcher]
// `a + b` on small tensors is almost all binding overhead, and BENCHMARKS.md's python_op wants
// it at most half of PyTorch's. pybind11's dispatcher (overload records, argument casters,
// keep-alive bookkeeping) is a large share of it, so the Python operators are plain CPython
// METH_FASTCALL methods (def_operator): they read the tensor straight out of the instance and
// set Python errors themselves (set_python_error). They are still ordinary `__add__`,
// `__radd__`, ... methods that CPython's slots call, so the binary-operator protocol (reflected
// operators, NotImplemented, subclasses) is CPython's own.

// The Tensor a kiln.Tensor instance holds (`o` must be one: a method descriptor of the type
// checks its self, and the operand callers check with is_tensor).
const Tensor& tensor_in(PyObject* o) {
  auto* inst = reinterpret_cast<py::detail::instance*>(o);
  return *inst->get_value_and_holder(nullptr, false).value_ptr<Tensor>();
}
PyTypeObject* g_tensor_type = nullptr;
bool is_tensor(PyObject* o) { return PyObject_TypeCheck(o, g_tensor_type); }

// The other operand of an operator: a Tensor, a number (a wrapped number, promoting as in
// PyTorch), or undefined for anything else (the operator returns NotImplemented, so Python
// tries the reflected one).
Tensor operand(PyObject* other) {
  if (is_tensor(other)) return tensor_in(other);
  if (is_number(other)) return wrapped_number(to_scalar(other, "operator"));
  return Tensor();
}

using BinaryTT = Tensor (*)(const Tensor&, const Tensor&);

// Operands (in elements, both together) from which an operator releases the GIL.
constexpr int64_t kReleaseGilElements = 4096;

template <BinaryTT fn, bool reflected = false>
PyObject* binary(PyObject* self_obj, PyObject* other) {
  const Tensor& self = tensor_in(self_obj);
  Tensor o = operand(other);
  if (!o.defined()) Py_RETURN_NOTIMPLEMENTED;
  // Note [Releasing the GIL for small operands]: handing the GIL over costs about as much as
  // an elementwise op on a few thousand elements; below that the op runs holding it.
  if (self.numel() + o.numel() < kReleaseGilElements)
    return py::cast(reflected ? fn(o, self) : fn(self, o)).release().ptr();
  Tensor r;
  {
    py::gil_scoped_release nogil;
    r = reflected ? fn(o, self) : fn(self, o);
  }
  return py::cast(std::move(r)).release().ptr();
}

using InplaceTT = Tensor& (*)(Tensor&, const Tensor&);
template <InplaceTT fn>
PyObject* inplace(PyObject* self_obj, PyObject* other) {
  Tensor& self = const_cast<Tensor&>(tensor_in(self_obj));
  Tensor o = operand(other);
  if (!o.defined()) Py_RETURN_NOTIMPLEMENTED;
  {
    py::gil_scoped_release nogil;
    fn(self, o);
  }
  Py_INCREF(self_obj);
  return self_obj;
}

// `op` as a METH_FASTCALL method of one argument, its exceptions set as Python errors.
using OperatorFn = PyObject* (*)(PyObject*, PyObject*);
template <OperatorFn op>
PyObject* operator_method(PyObject* self, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs != 1) {
    PyErr_Format(PyExc_TypeError, "expected 1 argument, got %zd", nargs);
    return nullptr;
  }
  try {
    return op(self, args[0]);
  } catch (...) {
    set_python_error(std::current_exception());
    return nullptr;
  }
}

// Adds `op` to kiln.Tensor as the method `name` (Note [Operators without pybind11's
// dispatcher]).
template <OperatorFn op>
void def_operator(py::class_<Tensor>& t, const char* name) {
  static std::deque<PyMethodDef> defs;  // CPython keeps pointers to them
  PyMethodDef& d = defs.emplace_back();
  d.ml_name = name;
  d.ml_meth = reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(&operator_method<op>));
  d.ml_flags = METH_FASTCALL;
  d.ml_doc = "A Python operator on a Tensor and a Tensor or a number.";
  auto* type = reinterpret_cast<PyTypeObject*>(t.ptr());
  py::object descr = py::reinterpret_steal<py::object>(PyDescr_NewMethod(type, &d));
  if (!descr) throw py::error_already_set();
  t.attr(name) = descr;
}

Tensor add2(const Tensor& a, const Tensor& b) { return add(a, b); }
Tensor sub2(const Tensor& a, const Tensor& b) { return sub(a, b); }
Tensor floordiv2(const Tensor& a, const Tensor& b) { return div(a, b, "floor"); }
Tensor& add_2(Tensor& a, const Tensor& b) { return add_(a, b); }
Tensor& sub_2(Tensor& a, const Tensor& b) { return sub_(a, b); }

// Python's index expression as TensorIndex values (kiln/ops/indexing.h).
TensorIndex to_index(py::handle k) {
  if (py::isinstance<py::bool_>(k)) return TensorIndex(k.cast<bool>());
  if (py::isinstance<py::int_>(k)) return TensorIndex(k.cast<int64_t>());
  if (k.is_none()) return TensorIndex(indexing::None);
  if (k.ptr() == Py_Ellipsis) return TensorIndex(indexing::Ellipsis);
  if (py::isinstance<py::slice>(k)) {
    auto part = [&](const char* name) -> std::optional<int64_t> {
      py::object v = k.attr(name);
      if (v.is_none()) return std::nullopt;
      return py::int_(v).cast<int64_t>();
    };
    return TensorIndex(indexing::Slice(part("start"), part("stop"), part("step")));
  }
  if (py::isinstance<Tensor>(k)) return TensorIndex(k.cast<Tensor>());
  if (py::isinstance<py::list>(k))
    return TensorIndex(tensor_from_data(k, std::nullopt, Device(kCPU)));
  if (py::hasattr(k, "__index__"))
    return TensorIndex(py::int_(py::reinterpret_borrow<py::object>(k)).cast<int64_t>());
  throw IndexError(fmt::format(
      "[index] only integers, slices, None, Ellipsis, bools, lists and Tensors are valid "
      "indices, got {}",
      py::str(py::type::handle_of(k).attr("__name__")).cast<std::string>()));
}

std::vector<TensorIndex> to_indices(py::handle key) {
  std::vector<TensorIndex> out;
  if (py::isinstance<py::tuple>(key))
    for (py::handle k : key.cast<py::tuple>()) out.push_back(to_index(k));
  else
    out.push_back(to_index(key));
  return out;
}

// to(dtype), to(device), to(device, dtype), to(other tensor), with dtype=, device=, copy=.
Tensor to_impl(const Tensor& t, py::args args, py::kwargs kwargs) {
  std::optional<DType> dtype;
  std::optional<Device> device;
  bool copy = false;
  auto take = [&](py::handle v) {
    if (py::isinstance<DType>(v))
      dtype = v.cast<DType>();
    else if (py::isinstance<Device>(v) || py::isinstance<py::str>(v))
      device = to_device(v);
    else if (py::isinstance<Tensor>(v)) {
      dtype = v.cast<const Tensor&>().dtype();
      device = v.cast<const Tensor&>().device();
    } else {
      throw TypeError(
          fmt::format("[to] expected a dtype, a device or a Tensor, got {}",
                      py::str(py::type::handle_of(v).attr("__name__")).cast<std::string>()));
    }
  };
  for (py::handle a : args) take(a);
  for (auto [k, v] : kwargs) {
    std::string key = k.cast<std::string>();
    if (key == "copy")
      copy = v.cast<bool>();
    else if (key == "dtype" && !v.is_none())
      dtype = v.cast<DType>();
    else if (key == "device" && !v.is_none())
      device = to_device(v);
    else if (key != "dtype" && key != "device" && key != "non_blocking")
      throw TypeError(fmt::format("[to] got an unexpected keyword argument '{}'", key));
  }
  py::gil_scoped_release nogil;
  Tensor r = t;
  if (device) r = r.to(*device, copy);
  if (dtype) r = r.to(*dtype, copy && !device);
  if (copy && !device && !dtype) r = r.clone();
  return r;
}

py::tuple shape_of(const Tensor& t) {
  py::tuple s(static_cast<size_t>(t.dim()));
  for (int64_t i = 0; i < t.dim(); ++i) s[size_t(i)] = t.sizes()[size_t(i)];
  return s;
}

// A Python callable kept by C++ (hooks): taken and dropped with the GIL held.
struct PyFunction {
  std::shared_ptr<py::object> fn;
  explicit PyFunction(py::object f)
      : fn(new py::object(std::move(f)), [](py::object* o) {
          if (!Py_IsInitialized()) return;  // interpreter gone at exit: leak rather than crash
          py::gil_scoped_acquire gil;
          delete o;
        }) {}
};

}  // namespace

py::class_<Tensor> bind_tensor(py::module_& m) {
  py::class_<Tensor> t(m, "Tensor", "An n-dimensional array on a device, with autograd.",
                       py::custom_type_setup(forget_tensor_wrappers_on_dealloc));
  t.def_property_readonly("shape", &shape_of)
      .def(
          "size",
          [](const Tensor& t, py::object dim) -> py::object {
            if (dim.is_none()) return shape_of(t);
            return py::int_(t.size(dim.cast<int64_t>()));
          },
          py::arg("dim") = py::none())
      .def(
          "stride",
          [](const Tensor& t, py::object dim) -> py::object {
            if (!dim.is_none()) return py::int_(t.stride(dim.cast<int64_t>()));
            py::tuple s(static_cast<size_t>(t.dim()));
            for (int64_t i = 0; i < t.dim(); ++i) s[size_t(i)] = t.strides()[size_t(i)];
            return s;
          },
          py::arg("dim") = py::none())
      .def("dim", &Tensor::dim)
      .def_property_readonly("ndim", &Tensor::dim)
      .def("numel", &Tensor::numel)
      .def("element_size", &Tensor::itemsize)
      .def_property_readonly("nbytes", &Tensor::nbytes)
      .def_property_readonly("dtype", &Tensor::dtype)
      .def_property_readonly("device", &Tensor::device)
      .def("is_contiguous", &Tensor::is_contiguous)
      .def("storage_offset", &Tensor::storage_offset)
      .def_property_readonly("is_floating_point_",
                             [](const Tensor& t) { return is_floating(t.dtype()); })
      .def("is_floating_point", [](const Tensor& t) { return is_floating(t.dtype()); })
      .def("data_ptr",
           [](const Tensor& t) {
             return reinterpret_cast<uintptr_t>(device_address(t, "data_ptr"));
           })
      .def("__repr__",
           [](const Tensor& t) {
             py::gil_scoped_release nogil;
             if (!dtensor::is_dtensor(t)) return t.str();
             // A DTensor prints its spec and this rank's local tensor (no collective).
             return fmt::format("DTensor({}, local={})", dtensor::spec_of(t)->str(),
                                dtensor::to_local(t).str());
           })
      .def("__len__",
           [](const Tensor& t) {
             if (t.dim() == 0) throw TypeError("[len] len() of a 0-d tensor");
             return t.size(0);
           })
      .def("item",
           [](const Tensor& t) {
             Scalar s;
             {
               py::gil_scoped_release nogil;
               s = t.item();
             }
             return scalar_to_python(s);
           })
      .def("tolist", &to_list)
      .def("__bool__",
           [](const Tensor& t) {
             if (t.numel() != 1)
               throw ValueError(fmt::format(
                   "[bool] the truth value of a tensor with {} elements is ambiguous", t.numel()));
             return t.item().to_bool();
           })
      .def("__float__", [](const Tensor& t) { return t.item().to_double(); })
      .def("__int__", [](const Tensor& t) { return t.item().to_int(); })
      .def("__index__",
           [](const Tensor& t) {
             if (is_floating(t.dtype()) || t.numel() != 1)
               throw TypeError("[index] only integer tensors of a single element can be an index");
             return t.item().to_int();
           })
      .def("__hash__", [](const Tensor& t) { return reinterpret_cast<uintptr_t>(t.impl()); })
      .def("is_same", &Tensor::is_same, py::arg("other"),
           "Whether both refer to the same tensor (the same as `is`: one object per tensor).")
      // conversions
      .def("to", &to_impl)
      .def("cpu", [](const Tensor& t) { return t.to(Device(kCPU)); })
      .def(
          "cuda", [](const Tensor& t, int index) { return t.to(Device("cuda", index)); },
          py::arg("device") = 0)
      .def("float", [](const Tensor& t) { return t.to(kFloat32); })
      .def("double", [](const Tensor& t) { return t.to(kFloat64); })
      .def("half", [](const Tensor& t) { return t.to(kFloat16); })
      .def("bfloat16", [](const Tensor& t) { return t.to(kBFloat16); })
      .def("long", [](const Tensor& t) { return t.to(kInt64); })
      .def("int", [](const Tensor& t) { return t.to(kInt32); })
      .def("bool", [](const Tensor& t) { return t.to(kBool); })
      .def("type_as", [](const Tensor& t, const Tensor& o) { return t.to(o.dtype()); })
      .def("contiguous", [](const Tensor& t) { return t.contiguous(); })
      .def("clone", [](const Tensor& t) { return t.clone(); })
      .def("zero_",
           [](py::object self) {
             self.cast<Tensor&>().zero_();
             return self;
           })
      // autograd
      .def_property("requires_grad", &Tensor::requires_grad,
                    [](const Tensor& t, bool on) { t.requires_grad_(on); })
      .def(
          "requires_grad_",
          [](py::object self, bool on) {
            self.cast<const Tensor&>().requires_grad_(on);
            return self;
          },
          py::arg("requires_grad") = true)
      .def_property(
          "grad",
          [](const Tensor& t) -> py::object {
            const Tensor& g = t.grad();
            if (!g.defined()) return py::none();
            return py::cast(g);
          },
          [](const Tensor& t, py::object g) {
            t.set_grad(g.is_none() ? Tensor() : g.cast<Tensor>());
          })
      .def_property_readonly("is_leaf", &Tensor::is_leaf)
      .def_property_readonly("grad_fn",
                             [](const Tensor& t) -> py::object {
                               std::string n = t.grad_fn_name();
                               if (n.empty()) return py::none();
                               return py::str(n);
                             })
      .def("retain_grad", &Tensor::retain_grad)
      .def(
          "backward",
          [](const Tensor& t, py::object gradient, bool retain_graph) {
            Tensor g = gradient.is_none() ? Tensor() : gradient.cast<Tensor>();
            py::gil_scoped_release nogil;
            t.backward(g, retain_graph);
          },
          py::arg("gradient") = py::none(), py::arg("retain_graph") = false)
      .def(
          "register_hook",
          [](const Tensor& t, py::object fn) {
            PyFunction f(std::move(fn));
            autograd::register_hook(t, [f](const Tensor& g) -> Tensor {
              py::gil_scoped_acquire gil;
              py::object r = (*f.fn)(g);
              return r.is_none() ? Tensor() : r.cast<Tensor>();
            });
          },
          py::arg("hook"),
          "Calls hook(grad) when this tensor's gradient is computed; a Tensor it returns replaces "
          "the gradient.")
      // indexing
      .def("__getitem__",
           [](const Tensor& t, py::handle key) {
             std::vector<TensorIndex> idx = to_indices(key);
             py::gil_scoped_release nogil;
             return indexing::get_item(t, idx);
           })
      .def("__setitem__",
           [](Tensor& t, py::handle key, py::handle value) {
             std::vector<TensorIndex> idx = to_indices(key);
             Tensor v = py::isinstance<Tensor>(value)
                            ? value.cast<Tensor>()
                            : (is_number(value) ? scalar_tensor(to_scalar(value, "setitem"),
                                                                t.dtype(), t.device())
                                                : tensor_from_data(value, t.dtype(), t.device()));
             py::gil_scoped_release nogil;
             indexing::set_item(t, idx, v);
           })
      // operators
      .def("__neg__", [](const Tensor& t) { return neg(t); })
      .def("__pos__", [](const Tensor& t) { return t; })
      .def("__abs__", [](const Tensor& t) { return abs(t); })
      .def("__invert__", [](const Tensor& t) { return bitwise_not(t); });
  // The binary and in-place operators (Note [Operators without pybind11's dispatcher]).
  g_tensor_type = reinterpret_cast<PyTypeObject*>(t.ptr());
  def_operator<&binary<add2>>(t, "__add__");
  def_operator<&binary<add2, true>>(t, "__radd__");
  def_operator<&inplace<add_2>>(t, "__iadd__");
  def_operator<&binary<sub2>>(t, "__sub__");
  def_operator<&binary<sub2, true>>(t, "__rsub__");
  def_operator<&inplace<sub_2>>(t, "__isub__");
  def_operator<&binary<mul>>(t, "__mul__");
  def_operator<&binary<mul, true>>(t, "__rmul__");
  def_operator<&inplace<mul_>>(t, "__imul__");
  def_operator<&binary<div>>(t, "__truediv__");
  def_operator<&binary<div, true>>(t, "__rtruediv__");
  def_operator<&inplace<div_>>(t, "__itruediv__");
  def_operator<&binary<floordiv2>>(t, "__floordiv__");
  def_operator<&binary<floordiv2, true>>(t, "__rfloordiv__");
  def_operator<&binary<remainder>>(t, "__mod__");
  def_operator<&binary<remainder, true>>(t, "__rmod__");
  def_operator<&binary<pow>>(t, "__pow__");
  def_operator<&binary<pow, true>>(t, "__rpow__");
  def_operator<&inplace<pow_>>(t, "__ipow__");
  def_operator<&binary<matmul>>(t, "__matmul__");
  def_operator<&binary<matmul, true>>(t, "__rmatmul__");
  def_operator<&binary<bitwise_and>>(t, "__and__");
  def_operator<&binary<bitwise_and, true>>(t, "__rand__");
  def_operator<&inplace<bitwise_and_>>(t, "__iand__");
  def_operator<&binary<bitwise_or>>(t, "__or__");
  def_operator<&binary<bitwise_or, true>>(t, "__ror__");
  def_operator<&inplace<bitwise_or_>>(t, "__ior__");
  def_operator<&binary<bitwise_xor>>(t, "__xor__");
  def_operator<&binary<bitwise_xor, true>>(t, "__rxor__");
  def_operator<&inplace<bitwise_xor_>>(t, "__ixor__");
  def_operator<&binary<eq>>(t, "__eq__");
  def_operator<&binary<ne>>(t, "__ne__");
  def_operator<&binary<lt>>(t, "__lt__");
  def_operator<&binary<le>>(t, "__le__");
  def_operator<&binary<gt>>(t, "__gt__");
  def_operator<&binary<ge>>(t, "__ge__");
  return t;
}

}  // namespace kiln::python

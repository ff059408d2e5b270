// kiln.Tensor: properties, conversions, Python operators and indexing. The ops of the op list
// are added as methods by op_bindings.cpp; what is here is what Python needs beyond them.
#include "bindings.h"

#include "kiln/autograd/autograd.h"
#include "kiln/core/error.h"
#include "kiln/dtensor/dtensor.h"
#include "kiln/ops/indexing.h"
#include "kiln/ops/ops.h"

namespace kiln::python {
namespace {

using BinaryTT = Tensor (*)(const Tensor&, const Tensor&);

// Operands (in elements, both together) from which an operator releases the GIL.
constexpr int64_t kReleaseGilElements = 4096;

// A binary operator: the other operand is a Tensor or a number (a wrapped number, promoting as
// in PyTorch); anything else gives NotImplemented, so Python tries the reflected operator.
template <BinaryTT fn, bool reflected = false>
py::object binary(const Tensor& self, py::handle other) {
  Tensor o;
  if (py::isinstance<Tensor>(other))
    o = other.cast<const Tensor&>();
  else if (is_number(other))
    o = wrapped_number(to_scalar(other, "operator"));
  else
    return py::reinterpret_borrow<py::object>(Py_NotImplemented);
  // Note [Releasing the GIL for small operands]: handing the GIL over costs about as much as
  // an elementwise op on a few thousand elements; below that the op runs holding it.
  if (self.numel() + o.numel() < kReleaseGilElements)
    return py::cast(reflected ? fn(o, self) : fn(self, o));
  Tensor r;
  {
    py::gil_scoped_release nogil;
    r = reflected ? fn(o, self) : fn(self, o);
  }
  return py::cast(std::move(r));
}

using InplaceTT = Tensor& (*)(Tensor&, const Tensor&);
template <InplaceTT fn>
py::object inplace(py::object self_obj, py::handle other) {
  Tensor& self = self_obj.cast<Tensor&>();
  Tensor o;
  if (py::isinstance<Tensor>(other))
    o = other.cast<const Tensor&>();
  else if (is_number(other))
    o = wrapped_number(to_scalar(other, "operator"));
  else
    return py::reinterpret_borrow<py::object>(Py_NotImplemented);
  {
    py::gil_scoped_release nogil;
    fn(self, o);
  }
  return self_obj;
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
      .def("__add__", &binary<add2>)
      .def("__radd__", &binary<add2, true>)
      .def("__iadd__", &inplace<add_2>)
      .def("__sub__", &binary<sub2>)
      .def("__rsub__", &binary<sub2, true>)
      .def("__isub__", &inplace<sub_2>)
      .def("__mul__", &binary<mul>)
      .def("__rmul__", &binary<mul, true>)
      .def("__imul__", &inplace<mul_>)
      .def("__truediv__", &binary<div>)
      .def("__rtruediv__", &binary<div, true>)
      .def("__itruediv__", &inplace<div_>)
      .def("__floordiv__", &binary<floordiv2>)
      .def("__rfloordiv__", &binary<floordiv2, true>)
      .def("__mod__", &binary<remainder>)
      .def("__rmod__", &binary<remainder, true>)
      .def("__pow__", &binary<pow>)
      .def("__rpow__", &binary<pow, true>)
      .def("__ipow__", &inplace<pow_>)
      .def("__matmul__", &binary<matmul>)
      .def("__rmatmul__", &binary<matmul, true>)
      .def("__and__", &binary<bitwise_and>)
      .def("__rand__", &binary<bitwise_and, true>)
      .def("__iand__", &inplace<bitwise_and_>)
      .def("__or__", &binary<bitwise_or>)
      .def("__ror__", &binary<bitwise_or, true>)
      .def("__ior__", &inplace<bitwise_or_>)
      .def("__xor__", &binary<bitwise_xor>)
      .def("__rxor__", &binary<bitwise_xor, true>)
      .def("__ixor__", &inplace<bitwise_xor_>)
      .def("__eq__", &binary<eq>)
      .def("__ne__", &binary<ne>)
      .def("__lt__", &binary<lt>)
      .def("__le__", &binary<le>)
      .def("__gt__", &binary<gt>)
      .def("__ge__", &binary<ge>)
      .def("__neg__", [](const Tensor& t) { return neg(t); })
      .def("__pos__", [](const Tensor& t) { return t; })
      .def("__abs__", [](const Tensor& t) { return abs(t); })
      .def("__invert__", [](const Tensor& t) { return bitwise_not(t); });
  return t;
}

}  // namespace kiln::python

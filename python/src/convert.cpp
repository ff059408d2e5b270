#include "convert.h"

#include <cmath>
#include <vector>

#include "kiln/core/error.h"
#include "kiln/ops/ops.h"

namespace kiln::python {

bool is_number(py::handle v) {
  if (py::isinstance<py::bool_>(v) || py::isinstance<py::int_>(v) || py::isinstance<py::float_>(v))
    return true;
  // NumPy scalars (numpy.float32(1), numpy.int64(2)), when NumPy is there at all.
  // Leaked on purpose: a static py::object would be released after the interpreter is gone.
  static py::handle numpy_generic = []() -> py::handle {
    try {
      return py::object(py::module_::import("numpy").attr("generic")).release();
    } catch (py::error_already_set&) {
      return py::handle();
    }
  }();
  return numpy_generic && py::isinstance(v, numpy_generic);
}

Scalar to_scalar(py::handle v, const char* what) {
  if (py::isinstance<py::bool_>(v)) return Scalar(v.cast<bool>());
  if (py::isinstance<py::int_>(v)) return Scalar(v.cast<int64_t>());
  if (py::isinstance<py::float_>(v)) return Scalar(v.cast<double>());
  if (py::isinstance<Tensor>(v)) return v.cast<const Tensor&>().item();
  if (is_number(v)) {
    py::object numpy = py::module_::import("numpy");
    if (py::isinstance(v, numpy.attr("bool_"))) return Scalar(v.attr("item")().cast<bool>());
    if (py::isinstance(v, numpy.attr("integer"))) return Scalar(v.attr("item")().cast<int64_t>());
    return Scalar(v.attr("item")().cast<double>());
  }
  throw TypeError(
      fmt::format("[{}] expected a number, got {}", what,
                  py::str(py::type::handle_of(v).attr("__name__")).cast<std::string>()));
}

Shape to_shape(py::handle v, const char* what) {
  Shape s;
  if (py::isinstance<py::int_>(v) && !py::isinstance<py::bool_>(v)) {
    s.push_back(v.cast<int64_t>());
    return s;
  }
  if (py::isinstance<py::sequence>(v) && !py::isinstance<py::str>(v)) {
    for (py::handle e : v.cast<py::sequence>()) {
      if (!py::isinstance<py::int_>(e) || py::isinstance<py::bool_>(e)) {
        if (!py::hasattr(e, "__index__"))
          throw TypeError(
              fmt::format("[{}] expected a sequence of ints, got an element of type {}", what,
                          py::str(py::type::handle_of(e).attr("__name__")).cast<std::string>()));
      }
      s.push_back(py::int_(py::reinterpret_borrow<py::object>(e)).cast<int64_t>());
    }
    return s;
  }
  throw TypeError(
      fmt::format("[{}] expected an int or a sequence of ints, got {}", what,
                  py::str(py::type::handle_of(v).attr("__name__")).cast<std::string>()));
}

Device to_device(py::handle v) {
  if (py::isinstance<Device>(v)) return v.cast<Device>();
  if (py::isinstance<py::str>(v)) return Device(v.cast<std::string>());
  throw TypeError(
      fmt::format("[device] expected a kiln.device or a string, got {}",
                  py::str(py::type::handle_of(v).attr("__name__")).cast<std::string>()));
}

Tensor wrapped_number(const Scalar& s) {
  Tensor t = scalar_tensor(s, s.dtype(), Device(kCPU));
  t.impl()->set_wrapped_number(true);
  return t;
}

Tensor to_tensor_arg(py::handle v, const char* op, const char* what) {
  if (py::isinstance<Tensor>(v)) return v.cast<Tensor>();
  if (is_number(v)) return wrapped_number(to_scalar(v, op));
  throw TypeError(
      fmt::format("[{}] argument '{}' must be a Tensor or a number, got {}", op, what,
                  py::str(py::type::handle_of(v).attr("__name__")).cast<std::string>()));
}

namespace {

// Walks nested sequences: records the shape from the first element of each level, checks every
// level agrees, and collects the leaves in row-major order.
struct Flattener {
  Shape shape;
  std::vector<Scalar> values;
  bool any_float = false, all_bool = true;

  void walk(py::handle v, size_t depth) {
    if (py::isinstance<py::sequence>(v) && !py::isinstance<py::str>(v)) {
      py::sequence seq = v.cast<py::sequence>();
      int64_t n = static_cast<int64_t>(seq.size());
      if (depth == shape.size()) {
        if (!values.empty())
          throw ValueError(fmt::format(
              "[tensor] ragged nested sequence: a sequence at depth {} where a number was found "
              "before",
              depth));
        shape.push_back(n);
      } else if (depth > shape.size() || shape[depth] != n) {
        throw ValueError(
            fmt::format("[tensor] ragged nested sequence: expected length {} at depth {}, got {}",
                        depth < shape.size() ? shape[depth] : 0, depth, n));
      }
      for (py::handle e : seq) walk(e, depth + 1);
      return;
    }
    if (depth != shape.size())
      throw ValueError(fmt::format(
          "[tensor] ragged nested sequence: a number at depth {} where sequences of depth {} "
          "were found",
          depth, shape.size()));
    Scalar s = to_scalar(v, "tensor");
    any_float |= s.is_floating();
    all_bool &= s.is_bool();
    values.push_back(s);
  }
};

template <class T>
Tensor fill_host(const Flattener& f, DType dtype) {
  std::vector<T> data;
  data.reserve(f.values.size());
  for (const Scalar& s : f.values) data.push_back(s.to<T>());
  Tensor t = from_vector<T>(data, f.shape.span());  // a number comes out as [1]
  if (f.shape.empty()) t = t.view(IntArrayRef{});
  return t.to(dtype);
}

}  // namespace

Tensor tensor_from_data(py::handle data, std::optional<DType> dtype, Device device) {
  Flattener f;
  f.walk(data, 0);
  DType inferred = f.values.empty() ? default_dtype()
                   : f.any_float    ? default_dtype()
                   : f.all_bool     ? kBool
                                    : kInt64;
  DType want = dtype.value_or(inferred);
  // Gather in the widest type of the data's category, then cast once.
  Tensor t =
      f.any_float || is_floating(want)
          ? fill_host<double>(f, want)
          : (want == kBool || f.all_bool ? fill_host<bool>(f, want) : fill_host<int64_t>(f, want));
  return device == Device(kCPU) ? t : t.to(device);
}

py::object scalar_to_python(const Scalar& s) {
  if (s.is_bool()) return py::bool_(s.to_bool());
  if (s.is_integral()) return py::int_(s.to_int());
  return py::float_(s.to_double());
}

namespace {
py::object list_level(const std::vector<py::object>& flat, IntArrayRef sizes, size_t dim,
                      size_t& pos) {
  if (dim == sizes.size()) return flat[pos++];
  py::list out(static_cast<size_t>(sizes[dim]));
  for (int64_t i = 0; i < sizes[dim]; ++i)
    out[static_cast<size_t>(i)] = list_level(flat, sizes, dim + 1, pos);
  return out;
}
}  // namespace

py::object to_list(const Tensor& t) {
  Tensor host = t.device() == Device(kCPU) ? t : t.to(Device(kCPU));
  std::vector<py::object> flat;
  flat.reserve(static_cast<size_t>(host.numel()));
  if (is_floating(host.dtype())) {
    for (double v : host.to_vector<double>()) flat.push_back(py::float_(v));
  } else if (host.dtype() == kBool) {
    for (bool v : host.to_vector<bool>()) flat.push_back(py::bool_(v));
  } else {
    for (int64_t v : host.to_vector<int64_t>()) flat.push_back(py::int_(v));
  }
  size_t pos = 0;
  return list_level(flat, host.sizes(), 0, pos);
}

void* device_address(const Tensor& t, const char* op) {
  if (t.key_set().has(DispatchKey::Sharded))
    throw ValueError(fmt::format(
        "[{}] a DTensor has no data of its own: use kiln.dtensor.to_local(t) for this rank's shard",
        op));
  if (t.device().is_cpu()) return t.numel() ? t.data_ptr() : t.impl()->data();  // a host read
  return t.impl()->data();
}

}  // namespace kiln::python

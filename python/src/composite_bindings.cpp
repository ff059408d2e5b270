// Functions of kiln/ops/ops.h that are not single ops of the op list (composites such as
// matmul, linear and cross_entropy), or that Python calls with a friendlier signature than the
// op's schema (factories taking sizes as *args, div's rounding_mode, max's three forms).
#include <optional>

#include "bindings.h"

#include "kiln/core/error.h"
#include "kiln/ops/op_list.h"
#include "kiln/ops/ops.h"

namespace kiln::python {
namespace {

// Factory sizes: zeros(2, 3), zeros((2, 3)), zeros([2, 3]).
Shape sizes_of(py::args size, const char* op) {
  if (size.size() == 1 && !py::isinstance<py::int_>(size[0])) return to_shape(size[0], op);
  return to_shape(size, op);
}
std::optional<DType> opt_dtype(py::handle d) {
  if (d.is_none()) return std::nullopt;
  return d.cast<DType>();
}
std::optional<Device> opt_device(py::handle d) {
  if (d.is_none()) return std::nullopt;
  return to_device(d);
}
Generator* opt_generator(py::handle g) { return g.is_none() ? nullptr : g.cast<Generator*>(); }
Tensor finish(Tensor t, bool requires_grad) {
  if (requires_grad) t.requires_grad_(true);
  return t;
}

// A factory of sizes: fn(sizes, dtype, device).
template <Tensor (*fn)(IntArrayRef, std::optional<DType>, std::optional<Device>)>
void def_sized(py::module_& m, const char* name, const char* doc) {
  m.def(
      name,
      [name](py::args size, py::object dtype, py::object device, bool requires_grad) {
        return finish(fn(sizes_of(size, name).span(), opt_dtype(dtype), opt_device(device)),
                      requires_grad);
      },
      py::kw_only(), py::arg("dtype") = py::none(), py::arg("device") = py::none(),
      py::arg("requires_grad") = false, doc);
}

// A random factory of sizes: fn(sizes, generator, dtype, device).
template <Tensor (*fn)(IntArrayRef, Generator*, std::optional<DType>, std::optional<Device>)>
void def_random(py::module_& m, const char* name, const char* doc) {
  m.def(
      name,
      [name](py::args size, py::object generator, py::object dtype, py::object device,
             bool requires_grad) {
        return finish(fn(sizes_of(size, name).span(), opt_generator(generator), opt_dtype(dtype),
                         opt_device(device)),
                      requires_grad);
      },
      py::kw_only(), py::arg("generator") = py::none(), py::arg("dtype") = py::none(),
      py::arg("device") = py::none(), py::arg("requires_grad") = false, doc);
}

// fn(t) -> Tensor as kiln.name(t) and t.name().
// `f` as kiln.name(t, ...) and t.name(...); `extra` are the py::arg of the parameters after
// the first.
template <class F, class... Extra>
void def_both(py::module_& m, py::handle cls, const char* name, F f, const char* doc,
              const Extra&... extra) {
  m.def(name, f, doc, py::arg("input"), extra...);
  cls.attr(name) = py::cpp_function(f, py::name(name), py::is_method(cls), doc, extra...);
}

}  // namespace

const std::vector<std::string>& composite_names() {
  static const std::vector<std::string> names = {
      "empty",    "full", "arange",  "linspace", "rand", "randn", "randint",
      "randperm", "div",  "squeeze", "clamp",    "max",  "min"};
  return names;
}

void bind_composites(py::module_& m, py::handle cls) {
  // ---- factories
  def_sized<empty>(m, "empty", "Uninitialised memory: kiln.empty(2, 3, dtype=kiln.float32).");
  def_sized<zeros>(m, "zeros",
                   "kiln.zeros(2, 3): zeros of the default dtype on the default device.");
  def_sized<ones>(m, "ones", "kiln.ones(2, 3).");
  def_random<rand>(m, "rand", "Uniform in [0, 1): kiln.rand(2, 3, generator=g).");
  def_random<randn>(m, "randn", "Standard normal: kiln.randn(2, 3, generator=g).");
  m.def(
      "full",
      [](py::handle size, py::handle value, py::object dtype, py::object device,
         bool requires_grad) {
        Scalar v = to_scalar(value, "full");
        std::optional<DType> d = opt_dtype(dtype);
        if (!d && !v.is_floating()) d = v.dtype();  // full((2,), 7) is int64, as in PyTorch
        return finish(full(to_shape(size, "full").span(), v, d, opt_device(device)), requires_grad);
      },
      py::arg("size"), py::arg("fill_value"), py::kw_only(), py::arg("dtype") = py::none(),
      py::arg("device") = py::none(), py::arg("requires_grad") = false);
  m.def(
      "randint",
      [](int64_t low, py::object high, py::object size, py::object generator, py::object dtype,
         py::object device) {
        if (size.is_none()) {  // randint(high, size)
          if (high.is_none())
            throw TypeError("[randint] expected randint(low, high, size) or randint(high, size)");
          size = high;
          high = py::int_(low);
          low = 0;
        }
        return randint(low, high.cast<int64_t>(), to_shape(size, "randint").span(),
                       opt_generator(generator), opt_dtype(dtype), opt_device(device));
      },
      py::arg("low"), py::arg("high"), py::arg("size") = py::none(), py::kw_only(),
      py::arg("generator") = py::none(), py::arg("dtype") = py::none(),
      py::arg("device") = py::none());
  m.def(
      "randperm",
      [](int64_t n, py::object generator, py::object dtype, py::object device) {
        return ops::op_randperm(n, opt_generator(generator), opt_dtype(dtype).value_or(kInt64),
                                opt_device(device).value_or(default_device()));
      },
      py::arg("n"), py::kw_only(), py::arg("generator") = py::none(), py::arg("dtype") = py::none(),
      py::arg("device") = py::none());
  m.def(
      "arange",
      [](py::handle a, py::object b, py::handle step, py::object dtype, py::object device,
         bool requires_grad) {
        Tensor r = b.is_none()
                       ? arange(to_scalar(a, "arange"), opt_dtype(dtype), opt_device(device))
                       : arange(to_scalar(a, "arange"), to_scalar(b, "arange"),
                                to_scalar(step, "arange"), opt_dtype(dtype), opt_device(device));
        return finish(r, requires_grad);
      },
      py::arg("start"), py::arg("end") = py::none(), py::arg("step") = 1, py::kw_only(),
      py::arg("dtype") = py::none(), py::arg("device") = py::none(),
      py::arg("requires_grad") = false);
  m.def(
      "linspace",
      [](py::handle a, py::handle b, int64_t steps, py::object dtype, py::object device) {
        return linspace(to_scalar(a, "linspace"), to_scalar(b, "linspace"), steps, opt_dtype(dtype),
                        opt_device(device));
      },
      py::arg("start"), py::arg("end"), py::arg("steps"), py::kw_only(),
      py::arg("dtype") = py::none(), py::arg("device") = py::none());
  m.def(
      "tensor",
      [](py::handle data, py::object dtype, py::object device, bool requires_grad) {
        if (py::isinstance<Tensor>(data)) {
          const Tensor& t = data.cast<const Tensor&>();
          return finish(t.to(opt_dtype(dtype).value_or(t.dtype()))
                            .to(opt_device(device).value_or(t.device()), true)
                            .detach(),
                        requires_grad);
        }
        if (py::hasattr(data, "__array_interface__")) {  // a NumPy array: copied
          py::object from_numpy = py::module_::import("kiln._kiln").attr("from_numpy");
          Tensor t = from_numpy(py::module_::import("numpy").attr("ascontiguousarray")(data))
                         .cast<Tensor>();
          return finish(t.to(opt_dtype(dtype).value_or(t.dtype()))
                            .to(opt_device(device).value_or(default_device()), true),
                        requires_grad);
        }
        return finish(
            tensor_from_data(data, opt_dtype(dtype), opt_device(device).value_or(default_device())),
            requires_grad);
      },
      py::arg("data"), py::kw_only(), py::arg("dtype") = py::none(), py::arg("device") = py::none(),
      py::arg("requires_grad") = false,
      "A tensor copied from nested lists, numbers, a NumPy array or a Tensor; the dtype is "
      "inferred as PyTorch infers it.");
  for (const char* name : {"zeros_like", "ones_like", "empty_like", "rand_like", "randn_like"}) {
    std::string n = name;
    m.def(
        name,
        [n](const Tensor& t, py::object dtype) {
          Tensor r = n == "zeros_like"   ? zeros_like(t)
                     : n == "ones_like"  ? ones_like(t)
                     : n == "empty_like" ? empty_like(t)
                     : n == "rand_like"  ? rand_like(t)
                                         : randn_like(t);
          return dtype.is_none() ? r : r.to(dtype.cast<DType>());
        },
        py::arg("input"), py::kw_only(), py::arg("dtype") = py::none());
  }
  m.def(
      "full_like",
      [](const Tensor& t, py::handle v) { return full_like(t, to_scalar(v, "full_like")); },
      py::arg("input"), py::arg("fill_value"));

  // ---- ops with a friendlier Python signature than their schema
  def_both(
      m, cls, "div",
      [](const Tensor& a, py::handle b, py::object rounding_mode) {
        Tensor o = to_tensor_arg(b, "div", "other");
        std::optional<std::string_view> mode;
        std::string s;
        if (!rounding_mode.is_none()) {
          s = rounding_mode.cast<std::string>();
          mode = s;
        }
        py::gil_scoped_release nogil;
        return div(a, o, mode);
      },
      "div(input, other, *, rounding_mode=None): true division, or 'trunc' / 'floor'.",
      py::arg("other"), py::kw_only(), py::arg("rounding_mode") = py::none());
  def_both(
      m, cls, "squeeze",
      [](const Tensor& t, py::object dim) {
        if (dim.is_none()) return squeeze(t);
        if (py::isinstance<py::int_>(dim))
          return squeeze(t, std::optional<int64_t>(dim.cast<int64_t>()));
        return squeeze(t, to_shape(dim, "squeeze").span());
      },
      "squeeze(input, dim=None): drops dims of size 1 (all, one, or a list).",
      py::arg("dim") = py::none());
  def_both(
      m, cls, "clamp",
      [](const Tensor& t, py::object min, py::object max) {
        if (py::isinstance<Tensor>(min) || py::isinstance<Tensor>(max)) {
          if (min.is_none() || max.is_none())
            throw TypeError("[clamp] tensor bounds need both min and max");
          return clamp(t, to_tensor_arg(min, "clamp", "min"), to_tensor_arg(max, "clamp", "max"));
        }
        std::optional<Scalar> lo, hi;
        if (!min.is_none()) lo = to_scalar(min, "clamp");
        if (!max.is_none()) hi = to_scalar(max, "clamp");
        return clamp(t, lo, hi);
      },
      "clamp(input, min=None, max=None): numbers or tensors as bounds.",
      py::arg("min") = py::none(), py::arg("max") = py::none());
  for (bool is_max : {true, false}) {
    const char* name = is_max ? "max" : "min";
    def_both(
        m, cls, name,
        [is_max](const Tensor& t, py::object dim, bool keepdim) -> py::object {
          if (dim.is_none()) return py::cast(is_max ? max(t) : min(t));
          if (py::isinstance<Tensor>(dim))
            return py::cast(is_max ? maximum(t, dim.cast<Tensor>())
                                   : minimum(t, dim.cast<Tensor>()));
          auto [v, i] =
              is_max ? max(t, dim.cast<int64_t>(), keepdim) : min(t, dim.cast<int64_t>(), keepdim);
          return py::make_tuple(v, i);
        },
        "max(input), max(input, dim, keepdim=False) -> (values, indices), max(input, other).",
        py::arg("dim") = py::none(), py::arg("keepdim") = false);
  }

  // ---- composites of ops.h
  def_both(
      m, cls, "matmul",
      [](const Tensor& a, const Tensor& b) {
        py::gil_scoped_release nogil;
        return matmul(a, b);
      },
      "Matrix product with broadcasting over batch dims.", py::arg("other"));
  def_both(
      m, cls, "reshape",
      [](const Tensor& t, py::args shape) { return reshape(t, sizes_of(shape, "reshape").span()); },
      "A view when the strides allow, else a copy.");
  def_both(
      m, cls, "flatten",
      [](const Tensor& t, int64_t start_dim, int64_t end_dim) {
        return flatten(t, start_dim, end_dim);
      },
      "Flattens dims start_dim..end_dim into one.", py::arg("start_dim") = 0,
      py::arg("end_dim") = -1);
  def_both(m, cls, "narrow", &narrow, "narrow(input, dim, start, length): a view.", py::arg("dim"),
           py::arg("start"), py::arg("length"));
  def_both(
      m, cls, "t", [](const Tensor& x) { return kiln::t(x); }, "Transposes a 2-D tensor.");
  def_both(m, cls, "expand_as", &expand_as, "A view of input with other's shape.",
           py::arg("other"));
  def_both(
      m, cls, "masked_fill",
      [](const Tensor& t, const Tensor& mask, py::handle v) {
        return masked_fill(t, mask, to_scalar(v, "masked_fill"));
      },
      "masked_fill(input, mask, value): value where mask is true.", py::arg("mask"),
      py::arg("value"));
  def_both(
      m, cls, "split",
      [](const Tensor& t, py::handle size, int64_t dim) {
        if (py::isinstance<py::int_>(size)) return split(t, size.cast<int64_t>(), dim);
        return split(t, to_shape(size, "split").span(), dim);
      },
      "split(input, split_size_or_sections, dim=0) -> list of views.",
      py::arg("split_size_or_sections"), py::arg("dim") = 0);
  def_both(m, cls, "chunk", &chunk, "chunk(input, chunks, dim=0) -> list of views.",
           py::arg("chunks"), py::arg("dim") = 0);
  m.def("stack", &stack, py::arg("tensors"), py::arg("dim") = 0);
  m.def("linear", &linear, py::arg("input"), py::arg("weight"), py::arg("bias") = Tensor());
  m.def(
      "cross_entropy",
      [](const Tensor& logits, const Tensor& target, int64_t ignore_index) {
        py::gil_scoped_release nogil;
        return cross_entropy(logits, target, ignore_index);
      },
      py::arg("input"), py::arg("target"), py::arg("ignore_index") = -100);
  m.def(
      "dropout",
      [](const Tensor& x, double p, bool training, py::object generator) {
        return dropout(x, p, training, opt_generator(generator));
      },
      py::arg("input"), py::arg("p") = 0.5, py::arg("training") = true, py::kw_only(),
      py::arg("generator") = py::none());
  m.def(
      "scaled_dot_product_attention",
      [](const Tensor& q, const Tensor& k, const Tensor& v, py::object attn_mask, bool is_causal,
         py::object scale) {
        Tensor mask = attn_mask.is_none() ? Tensor() : attn_mask.cast<Tensor>();
        std::optional<double> s;
        if (!scale.is_none()) s = scale.cast<double>();
        py::gil_scoped_release nogil;
        return scaled_dot_product_attention(q, k, v, mask, is_causal, s);
      },
      py::arg("query"), py::arg("key"), py::arg("value"), py::arg("attn_mask") = py::none(),
      py::arg("is_causal") = false, py::kw_only(), py::arg("scale") = py::none());
}

}  // namespace kiln::python

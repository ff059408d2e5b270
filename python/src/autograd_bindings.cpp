// kiln.autograd (grad, backward, grad modes) and kiln.compile.
#include "bindings.h"

#include <memory>

#include "kiln/autograd/autograd.h"
#include "kiln/compile/compile.h"
#include "kiln/core/error.h"

namespace kiln::python {
namespace {

TensorList tensors_of(py::handle v, const char* what) {
  if (py::isinstance<Tensor>(v)) return {v.cast<Tensor>()};
  TensorList out;
  for (py::handle e : v.cast<py::sequence>()) {
    if (e.is_none())
      out.emplace_back();
    else if (py::isinstance<Tensor>(e))
      out.push_back(e.cast<Tensor>());
    else
      throw TypeError(
          fmt::format("[{}] expected Tensors, got {}", what,
                      py::str(py::type::handle_of(e).attr("__name__")).cast<std::string>()));
  }
  return out;
}

// RAII guards as Python context managers: entered and left on one thread.
template <class Guard>
struct GuardBox {
  std::unique_ptr<Guard> guard;
};

}  // namespace

void bind_autograd(py::module_& m) {
  py::module_ ag = m.def_submodule("autograd", "Reverse-mode automatic differentiation.");
  ag.def(
      "grad",
      [](py::handle outputs, py::handle inputs, py::object grad_outputs, bool retain_graph,
         bool allow_unused) {
        TensorList outs = tensors_of(outputs, "grad"), ins = tensors_of(inputs, "grad");
        TensorList seeds = grad_outputs.is_none() ? TensorList{} : tensors_of(grad_outputs, "grad");
        TensorList r;
        {
          py::gil_scoped_release nogil;
          r = autograd::grad(outs, ins, seeds, retain_graph, allow_unused);
        }
        py::tuple out(r.size());
        for (size_t i = 0; i < r.size(); ++i) out[i] = r[i].defined() ? py::cast(r[i]) : py::none();
        return out;
      },
      py::arg("outputs"), py::arg("inputs"), py::arg("grad_outputs") = py::none(),
      py::arg("retain_graph") = false, py::arg("allow_unused") = false,
      "The gradients of outputs with respect to inputs (a tuple), not accumulated into .grad.");
  ag.def(
      "backward",
      [](py::handle outputs, py::object grad_outputs, bool retain_graph) {
        TensorList outs = tensors_of(outputs, "backward");
        TensorList seeds =
            grad_outputs.is_none() ? TensorList{} : tensors_of(grad_outputs, "backward");
        py::gil_scoped_release nogil;
        autograd::backward(outs, seeds, retain_graph);
      },
      py::arg("tensors"), py::arg("grad_tensors") = py::none(), py::arg("retain_graph") = false);
  m.def("is_grad_enabled", &autograd::is_grad_enabled);
  m.def("_set_grad_enabled", &autograd::set_grad_enabled, py::arg("enabled"));
  m.def("is_inference_mode_enabled", &autograd::is_inference_mode_enabled);

  using InferenceBox = GuardBox<autograd::InferenceModeGuard>;
  py::class_<InferenceBox>(m, "_InferenceModeGuard")
      .def(py::init<>())
      .def("__enter__",
           [](InferenceBox& b) { b.guard = std::make_unique<autograd::InferenceModeGuard>(); })
      .def("__exit__", [](InferenceBox& b, py::args) { b.guard.reset(); });
  using AnomalyBox = GuardBox<autograd::AnomalyModeGuard>;
  py::class_<AnomalyBox>(
      ag, "detect_anomaly",
      "with kiln.autograd.detect_anomaly(): backward names the op that made a NaN.")
      .def(py::init<>())
      .def("__enter__",
           [](AnomalyBox& b) { b.guard = std::make_unique<autograd::AnomalyModeGuard>(true); })
      .def("__exit__", [](AnomalyBox& b, py::args) { b.guard.reset(); });
}

void bind_compile(py::module_& m) {
  py::class_<CompiledFunction>(
      m, "CompiledFunction", "A function traced once per guard set and replayed without dispatch.")
      .def("__call__",
           [](CompiledFunction& f, py::args args) -> py::object {
             TensorList in;
             for (py::handle a : args) {
               if (!py::isinstance<Tensor>(a))
                 throw TypeError(fmt::format(
                     "[compile] a compiled function takes Tensors; argument {} is {} (Python "
                     "values are "
                     "frozen at trace time: close over them or pass them as tensors)",
                     in.size(),
                     py::str(py::type::handle_of(a).attr("__name__")).cast<std::string>()));
               in.push_back(a.cast<Tensor>());
             }
             TensorList out;
             {
               py::gil_scoped_release nogil;
               out = f(in);
             }
             if (out.size() == 1) return py::cast(out[0]);
             return py::cast(out);
           })
      .def("explain", &CompiledFunction::explain)
      .def("miss_reasons", &CompiledFunction::miss_reasons)
      .def("graph", &CompiledFunction::graph_str, py::arg("entry") = 0)
      .def_property_readonly("eager_calls", &CompiledFunction::eager_calls);

  m.def(
      "_compile",
      [](py::function fn, std::string name, int recompile_limit, bool piecewise, bool capture) {
        // Note [Compiling a Python function]: the function runs (with the GIL) only when Kiln
        // traces or runs eagerly; replays touch no Python. Whatever Python values steer it are
        // frozen into the trace: compile guards only the tensors passed in.
        auto holder =
            std::shared_ptr<py::function>(new py::function(std::move(fn)), [](py::function* p) {
              if (!Py_IsInitialized()) return;
              py::gil_scoped_acquire gil;
              delete p;
            });
        CompileOptions opts;
        opts.name = name;
        opts.recompile_limit = recompile_limit;
        opts.piecewise = piecewise;
        opts.capture = capture;
        return compile(
            [holder](std::span<const Tensor> in) -> TensorList {
              py::gil_scoped_acquire gil;
              py::tuple args(in.size());
              for (size_t i = 0; i < in.size(); ++i) args[i] = py::cast(in[i]);
              py::object r = (*holder)(*args);
              if (py::isinstance<Tensor>(r)) return {r.cast<Tensor>()};
              if (r.is_none()) return {};
              return tensors_of(r, "compile");
            },
            std::move(opts));
      },
      py::arg("fn"), py::arg("name") = "compiled", py::arg("recompile_limit") = 8,
      py::arg("piecewise") = false, py::arg("capture") = true);
}

}  // namespace kiln::python

// kiln.amp: autocast as a context manager and the float16 loss scaler.
#include "bindings.h"

#include <memory>

#include "kiln/amp/autocast.h"
#include "kiln/amp/grad_scaler.h"
#include "kiln/optim/optimizer.h"

namespace kiln::python {

void bind_amp(py::module_& m) {
  py::module_ amp = m.def_submodule("amp", "Mixed precision: autocast and loss scaling.");
  // The guard is made on __enter__ and dropped on __exit__, on the thread of the with block.
  struct Autocast {
    Device device;
    DType dtype;
    bool enabled;
    std::unique_ptr<amp::AutocastGuard> guard;
  };
  py::class_<Autocast>(amp, "autocast",
                       "with kiln.amp.autocast('cpu', kiln.bfloat16): products in 16 bit, "
                       "reductions, norms and losses in float32 (docs/mixed_precision.md).")
      .def(py::init([](py::handle device, DType dtype, bool enabled) {
             return Autocast{to_device(device), dtype, enabled, nullptr};
           }),
           py::arg("device"), py::arg("dtype") = kBFloat16, py::arg("enabled") = true)
      .def("__enter__",
           [](py::object self) {
             Autocast& a = self.cast<Autocast&>();
             a.guard = std::make_unique<amp::AutocastGuard>(a.device, a.dtype, a.enabled);
             return self;
           })
      .def("__exit__", [](Autocast& a, py::args) { a.guard.reset(); });
  py::class_<amp::GradScaler>(amp, "GradScaler",
                              "Loss scaling for float16 with the overflow check on the device.")
      .def(py::init([](py::handle device, double init_scale, double growth_factor,
                       double backoff_factor, int64_t growth_interval, bool enabled) {
             amp::GradScalerOptions o{init_scale, growth_factor, backoff_factor, growth_interval,
                                      enabled};
             return new amp::GradScaler(to_device(device), o);
           }),
           py::arg("device") = "cpu", py::arg("init_scale") = 65536.0,
           py::arg("growth_factor") = 2.0, py::arg("backoff_factor") = 0.5,
           py::arg("growth_interval") = 2000, py::arg("enabled") = true)
      .def("scale", &amp::GradScaler::scale, py::arg("loss"))
      .def("unscale_", &amp::GradScaler::unscale_, py::arg("optimizer"))
      .def(
          "step",
          [](amp::GradScaler& s, optim::Optimizer& o) {
            py::gil_scoped_release nogil;
            s.step(o);
          },
          py::arg("optimizer"))
      .def("update", &amp::GradScaler::update)
      .def("get_scale", &amp::GradScaler::get_scale)
      .def("is_enabled", &amp::GradScaler::is_enabled)
      .def("state_dict",
           [](const amp::GradScaler& s) {
             py::dict d;
             for (const auto& [k, v] : s.state_dict()) d[py::str(k)] = v;
             return d;
           })
      .def(
          "load_state_dict",
          [](amp::GradScaler& s, py::dict state) {
            optim::StateDict sd;
            for (auto [k, v] : state) sd.emplace_back(k.cast<std::string>(), v.cast<Tensor>());
            s.load_state_dict(sd);
          },
          py::arg("state_dict"));
}

}  // namespace kiln::python

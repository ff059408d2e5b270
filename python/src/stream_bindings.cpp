// kiln.Stream, kiln.Event and `with kiln.stream(s):` (kiln/core/stream.h), after PyTorch's
// torch.cuda.Stream / Event / stream(): the work a thread queues goes to its device's current
// stream, and events order streams and the host. On the CPU everything has already happened.
#include <memory>

#include "bindings.h"

#include "kiln/core/error.h"
#include "kiln/core/stream.h"

namespace kiln::python {
namespace {

// `with kiln.stream(s):` — a StreamGuard for the block.
struct StreamScope {
  Stream stream;
  std::unique_ptr<StreamGuard> guard;
};

}  // namespace

void bind_streams(py::module_& m) {
  py::class_<Stream>(m, "Stream", "A stream of a device (kiln.Stream(device) makes a new one).")
      .def(py::init([](py::handle device) { return Stream::create(to_device(device)); }),
           py::arg("device"))
      .def_static(
          "current", [](py::handle device) { return Stream::current(to_device(device)); },
          py::arg("device"), "This thread's current stream of a device.")
      .def_static(
          "default", [](py::handle device) { return Stream::default_stream(to_device(device)); },
          py::arg("device"))
      .def_property_readonly("device", &Stream::device)
      .def_property_readonly("handle", &Stream::id,
                             "The device's own handle (a cudaStream_t's value on cuda; what "
                             "PyTorch's cuda_stream and DLPack's stream argument carry).")
      .def("synchronize",
           [](const Stream& s) {
             py::gil_scoped_release nogil;
             s.synchronize();
           })
      .def("__eq__", [](const Stream& a, const Stream& b) { return a == b; })
      .def("__hash__", [](const Stream& s) { return std::hash<uint64_t>()(s.id()); })
      .def("__repr__", [](const Stream& s) {
        return fmt::format("Stream(device={}, handle={:#x})", s.device().str(), s.id());
      });

  py::class_<StreamScope>(m, "stream",
                          "`with kiln.stream(s):` makes `s` its device's current stream on this "
                          "thread for the block (the previous one comes back after it).")
      .def(py::init([](const Stream& s) {
             return StreamScope{s, nullptr};
           }),
           py::arg("stream"))
      .def("__enter__",
           [](StreamScope& scope) {
             if (scope.guard)
               throw ValueError("[stream] this kiln.stream scope is already entered");
             scope.guard = std::make_unique<StreamGuard>(scope.stream);
             return scope.stream;
           })
      .def("__exit__", [](StreamScope& scope, py::args) { scope.guard.reset(); });

  py::class_<Event>(m, "Event", "An event of a device: marks a point a stream has reached.")
      .def(py::init([](py::handle device) { return std::make_unique<Event>(to_device(device)); }),
           py::arg("device"))
      .def(
          "record",
          [](Event& e, py::handle stream) {
            if (stream.is_none())
              e.record();
            else
              e.record(stream.cast<const Stream&>());
          },
          py::arg("stream") = py::none(), "Marks the point the stream (default: current) reached.")
      .def("wait", &Event::wait, py::arg("stream"), "Makes `stream` wait for the event.")
      .def("synchronize",
           [](const Event& e) {
             py::gil_scoped_release nogil;
             e.synchronize();
           })
      .def("query", &Event::query, "Whether the stream has reached the event.")
      .def_property_readonly("device", &Event::device);
}

}  // namespace kiln::python

// kiln.distributed (launch under mpirun, the world group, collectives), kiln.dtensor (meshes,
// placements, DTensors), backends (load_backend, alias_device) and the profiler.
#include "bindings.h"

#include <fstream>
#include <map>
#include <memory>

#include "kiln/backend/backend.h"
#include "kiln/core/error.h"
#include "kiln/distributed/collectives.h"
#include "kiln/distributed/init.h"
#include "kiln/distributed/process_group.h"
#include "kiln/dtensor/device_mesh.h"
#include "kiln/dtensor/dtensor.h"
#include "kiln/dtensor/redistribute.h"
#include "kiln/profiler/profiler.h"

namespace kiln::python {
namespace {

namespace dist = kiln::distributed;
namespace dt = kiln::dtensor;
using dist::ProcessGroup;

const ProcessGroup* group_of(py::handle g) {
  return g.is_none() ? nullptr : g.cast<const ProcessGroup*>();
}

dt::Placements placements_of(py::handle ps) {
  dt::Placements out;
  for (py::handle p : ps.cast<py::sequence>()) out.push_back(p.cast<dt::Placement>());
  return out;
}

void bind_distributed(py::module_& m) {
  py::module_ d =
      m.def_submodule("distributed", "Process groups and collectives (launch with mpirun).");
  py::enum_<dist::ReduceOp>(d, "ReduceOp")
      .value("SUM", dist::ReduceOp::Sum)
      .value("AVG", dist::ReduceOp::Avg)
      .value("MAX", dist::ReduceOp::Max)
      .value("MIN", dist::ReduceOp::Min)
      .value("PRODUCT", dist::ReduceOp::Product);
  py::class_<ProcessGroup, std::unique_ptr<ProcessGroup, py::nodelete>>(d, "ProcessGroup")
      .def_property_readonly("name", &ProcessGroup::name)
      .def("rank", &ProcessGroup::rank)
      .def("size", &ProcessGroup::size)
      .def_property_readonly("world_ranks", &ProcessGroup::world_ranks)
      .def("__repr__", [](const ProcessGroup& g) {
        return fmt::format("ProcessGroup({}, rank {} of {})", g.name(), g.rank(), g.size());
      });
  d.def(
      "init",
      [] {
        py::gil_scoped_release nogil;
        dist::init();
      },
      "Initialises once: MPI under mpirun, else a world of one.");
  d.def("is_initialized", &dist::is_initialized);
  d.def("get_rank", &dist::rank);
  d.def("get_world_size", &dist::world_size);
  d.def("get_local_rank", &dist::local_rank);
  d.def("world", &dist::world, py::return_value_policy::reference);
  d.def(
      "all_reduce",
      [](const Tensor& t, dist::ReduceOp op, py::handle g) {
        const ProcessGroup* pg = group_of(g);
        py::gil_scoped_release nogil;
        return dist::all_reduce(t, op, pg);
      },
      py::arg("tensor"), py::arg("op") = dist::ReduceOp::Sum, py::arg("group") = py::none(),
      "The reduction over the group's ranks, as a new tensor (differentiable, compilable).");
  d.def(
      "all_reduce_",
      [](const Tensor& t, dist::ReduceOp op, py::handle g) {
        const ProcessGroup* pg = group_of(g);
        py::gil_scoped_release nogil;
        dist::all_reduce_(t, op, pg);
      },
      py::arg("tensor"), py::arg("op") = dist::ReduceOp::Sum, py::arg("group") = py::none());
  d.def(
      "all_gather_into_tensor",
      [](const Tensor& t, py::handle g) {
        const ProcessGroup* pg = group_of(g);
        py::gil_scoped_release nogil;
        return dist::all_gather_into_tensor(t, pg);
      },
      py::arg("tensor"), py::arg("group") = py::none(),
      "The ranks' tensors concatenated along dim 0.");
  d.def(
      "reduce_scatter_tensor",
      [](const Tensor& t, dist::ReduceOp op, py::handle g) {
        const ProcessGroup* pg = group_of(g);
        py::gil_scoped_release nogil;
        return dist::reduce_scatter_tensor(t, op, pg);
      },
      py::arg("tensor"), py::arg("op") = dist::ReduceOp::Sum, py::arg("group") = py::none());
  d.def(
      "broadcast",
      [](const Tensor& t, int src, py::handle g) {
        const ProcessGroup* pg = group_of(g);
        py::gil_scoped_release nogil;
        return dist::broadcast(t, src, pg);
      },
      py::arg("tensor"), py::arg("src"), py::arg("group") = py::none());
  d.def(
      "barrier",
      [](py::handle g) {
        const ProcessGroup* pg = group_of(g);
        py::gil_scoped_release nogil;
        dist::barrier(pg);
      },
      py::arg("group") = py::none());
}

void bind_dtensor(py::module_& m) {
  py::module_ d = m.def_submodule("dtensor", "Distributed tensors over device meshes.");
  py::class_<dt::Placement>(d, "Placement")
      .def("is_shard", [](const dt::Placement& p) { return p.is_shard(); })
      .def("is_replicate", &dt::Placement::is_replicate)
      .def("is_partial", &dt::Placement::is_partial)
      .def_property_readonly("dim", &dt::Placement::dim)
      .def("__repr__", &dt::Placement::str)
      .def("__eq__", [](const dt::Placement& a, const dt::Placement& b) { return a == b; });
  d.def(
      "Shard", [](int64_t dim) { return dt::Placement(dt::Shard(dim)); }, py::arg("dim"));
  d.def("Replicate", [] { return dt::Placement(dt::Replicate()); });
  d.def(
      "Partial", [](dist::ReduceOp op) { return dt::Placement(dt::Partial(op)); },
      py::arg("reduce_op") = dist::ReduceOp::Sum);
  py::class_<dt::DeviceMesh, std::unique_ptr<dt::DeviceMesh, py::nodelete>>(d, "DeviceMesh")
      .def_property_readonly("device", &dt::DeviceMesh::device)
      .def_property_readonly("ndim", &dt::DeviceMesh::ndim)
      .def_property_readonly("shape",
                             [](const dt::DeviceMesh& mesh) {
                               return std::vector<int64_t>(mesh.shape().begin(),
                                                           mesh.shape().end());
                             })
      .def("size", [](const dt::DeviceMesh& mesh) { return mesh.size(); })
      .def_property_readonly("mesh_dim_names", &dt::DeviceMesh::dim_names)
      .def(
          "get_group", [](const dt::DeviceMesh& mesh, int64_t dim) { return &mesh.group(dim); },
          py::arg("mesh_dim") = 0, py::return_value_policy::reference)
      .def("get_coordinate",
           [](const dt::DeviceMesh& mesh) {
             return std::vector<int64_t>(mesh.coordinate().begin(), mesh.coordinate().end());
           })
      .def("__repr__", &dt::DeviceMesh::str);
  d.def(
      "init_device_mesh",
      [](py::handle device, py::handle shape, std::vector<std::string> names) {
        Device dev = to_device(device);
        Shape s = to_shape(shape, "init_device_mesh");
        py::gil_scoped_release nogil;
        return &dt::init_device_mesh(dev, s.span(), std::move(names));
      },
      py::arg("device"), py::arg("mesh_shape"), py::kw_only(),
      py::arg("mesh_dim_names") = std::vector<std::string>{}, py::return_value_policy::reference,
      "A mesh over the whole world (collective: every rank calls it with the same arguments).");
  d.def(
      "distribute_tensor",
      [](const Tensor& t, const dt::DeviceMesh& mesh, py::handle placements) {
        dt::Placements ps = placements_of(placements);
        py::gil_scoped_release nogil;
        return dt::distribute_tensor(t, mesh, ps);
      },
      py::arg("tensor"), py::arg("device_mesh"), py::arg("placements"),
      "Lays out a tensor that every rank holds whole over the mesh.");
  d.def(
      "from_local",
      [](const Tensor& local, const dt::DeviceMesh& mesh, py::handle placements) {
        return dt::from_local(local, mesh, placements_of(placements));
      },
      py::arg("local_tensor"), py::arg("device_mesh"), py::arg("placements"));
  d.def(
      "redistribute",
      [](const Tensor& t, py::handle placements) {
        dt::Placements ps = placements_of(placements);
        py::gil_scoped_release nogil;
        return dt::redistribute(t, ps);
      },
      py::arg("dtensor"), py::arg("placements"));
  d.def(
      "full_tensor",
      [](const Tensor& t) {
        py::gil_scoped_release nogil;
        return dt::full_tensor(t);
      },
      py::arg("dtensor"));
  d.def("to_local", &dt::to_local, py::arg("dtensor"));
  d.def("is_dtensor", &dt::is_dtensor, py::arg("tensor"));
  d.def(
      "placements",
      [](const Tensor& t) {
        if (!dt::is_dtensor(t)) throw TypeError("[placements] not a DTensor");
        const auto* spec = dt::spec_of(t);
        return std::vector<dt::Placement>(spec->placements().begin(), spec->placements().end());
      },
      py::arg("dtensor"));
}

void bind_backends_and_profiler(py::module_& m) {
  m.def(
      "load_backend",
      [](const std::string& name) {
        // Loading a plugin twice is an error in C++; from Python (notebooks, several test modules)
        // loading one that is already there by name is a no-op.
        static std::map<std::string, std::string> loaded;
        if (auto it = loaded.find(name); it != loaded.end()) return it->second;
        std::string type = Device(load_backend(name)).str();
        type = type.substr(0, type.find(':'));
        loaded[name] = type;
        return type;
      },
      py::arg("name_or_path"),
      "Loads a backend plugin (\"sim\", \"cuda\", or a path) once; returns its device type's "
      "name.");
  m.def("alias_device", &alias_device, py::arg("alias"), py::arg("target"),
        "Makes `alias` stand for `target` everywhere: kiln.alias_device('cuda', 'sim').");
  py::module_ prof = m.def_submodule("profiler", "Timeline events as a Chrome trace.");
  // The session records while the `with` block runs; on leaving it, its events are kept and
  // the session (and the recording) ends.
  struct Box {
    std::unique_ptr<profiler::Session> session;
    std::string json;
    std::vector<std::string> names;
  };
  py::class_<Box>(prof, "profile",
                  "with kiln.profiler.profile() as p: ...; p.save_chrome_trace(path)")
      .def(py::init<>())
      .def("__enter__",
           [](py::object self) {
             Box& b = self.cast<Box&>();
             if (b.session) throw ValueError("[profiler] the profile is already recording");
             b.session = std::make_unique<profiler::Session>();
             return self;
           })
      .def("__exit__",
           [](Box& b, py::args) {
             if (!b.session) return;
             b.json = b.session->chrome_trace_json();
             b.names.clear();
             for (const auto& e : b.session->events()) b.names.push_back(e.name);
             b.session.reset();
           })
      .def("chrome_trace_json",
           [](const Box& b) { return b.session ? b.session->chrome_trace_json() : b.json; })
      .def(
          "save_chrome_trace",
          [](const Box& b, const std::string& path) {
            std::ofstream f(path);
            f << (b.session ? b.session->chrome_trace_json() : b.json);
            if (!f) throw Error(fmt::format("[profiler] cannot write {}", path));
          },
          py::arg("path"))
      .def(
          "event_names", [](const Box& b) { return b.names; },
          "The names of the events recorded (after the with block).");
}

}  // namespace

void bind_distributed_and_backends(py::module_& m) {
  bind_distributed(m);
  bind_dtensor(m);
  bind_backends_and_profiler(m);
}

}  // namespace kiln::python

// kiln._kiln.parallel: DDP, the tensor-parallel styles and plans, loss parallel and FSDP of
// kiln/parallel, for C++ modules. python/kiln/parallel.py builds the user API on these: it
// resolves plans over Python module trees and hands a Python module's tensors to DDP through
// ModuleTensors. See Note [Python modules under DDP].
#include "bindings.h"

#include <deque>
#include <memory>
#include <tuple>

#include "kiln/core/error.h"
#include "kiln/distributed/process_group.h"
#include "kiln/dtensor/device_mesh.h"
#include "kiln/nn/transformer.h"
#include "kiln/parallel/ddp.h"
#include "kiln/parallel/fsdp.h"
#include "kiln/parallel/tensor_parallel.h"

namespace kiln::python {
namespace {

namespace par = kiln::parallel;
using dtensor::DeviceMesh;
using dtensor::Placement;

// Note [Python modules under DDP]
// DistributedDataParallel works on an nn::Module: it reads the parameters (and buffers) by name,
// broadcasts them in place, points each .grad at a view of its bucket and hooks the parameters'
// gradient accumulation. A kiln.nn.Module written in Python has no C++ object, so the Python
// side gathers its named parameters and buffers into a ModuleTensors, a C++ module that
// registers the very same tensors (the same TensorImpls: copies of the handles). Everything DDP
// does to them is then seen by the Python module, and its forward needs no change. A module
// that later swaps a parameter for another tensor (Module.to) leaves DDP on the old one: wrap
// the module after moving it, as PyTorch requires too.
class ModuleTensors final : public nn::Module {
 public:
  ModuleTensors(const nn::NamedTensors& params, const nn::NamedTensors& buffers) {
    for (const auto& [name, t] : params) {
      if (!t.defined())
        throw ValueError("[DistributedDataParallel] parameter " + name + " is None");
      register_parameter(name, &params_.emplace_back(t));
    }
    for (const auto& [name, t] : buffers) register_buffer(name, &buffers_.emplace_back(t));
  }

 private:
  std::deque<Tensor> params_, buffers_;  // stable addresses for the registered pointers
};

std::optional<Placement> placement_of(py::handle p, const char* what) {
  if (p.is_none()) return std::nullopt;
  if (py::isinstance<py::tuple>(p) || py::isinstance<py::list>(p)) {
    auto seq = p.cast<py::sequence>();
    if (seq.size() != 1)
      throw ValueError(
          fmt::format("[{}] layouts of {} inputs: Kiln's styles take one tensor in "
                      "and one out",
                      what, seq.size()));
    return seq[0].cast<Placement>();
  }
  return p.cast<Placement>();
}

// A NoSync or LossParallel scope as a Python context manager.
template <class Scope>
struct ScopeBox {
  std::unique_ptr<Scope> scope;
};

using StylePtr = std::shared_ptr<par::ParallelStyle>;
template <class S>
using StyleClass = py::class_<S, par::ParallelStyle, std::shared_ptr<S>>;

void bind_ddp(py::module_& p) {
  py::class_<ModuleTensors, nn::Module, std::shared_ptr<ModuleTensors>>(
      p, "ModuleTensors", "A Python module's parameters and buffers as a C++ module (for DDP).")
      .def(py::init<const nn::NamedTensors&, const nn::NamedTensors&>(), py::arg("parameters"),
           py::arg("buffers"));

  using NoSyncBox = ScopeBox<par::DistributedDataParallel::NoSync>;
  py::class_<NoSyncBox>(p, "_NoSync")
      .def("__enter__", [](NoSyncBox& b) { return &b; })
      .def("__exit__", [](NoSyncBox& b, py::args) { b.scope.reset(); });

  py::class_<par::DistributedDataParallel>(p, "_DDP")
      .def(py::init([](std::shared_ptr<nn::Module> module, py::handle group, int64_t cap,
                       int64_t first_cap, bool broadcast_buffers) {
             par::DDPOptions o;
             if (!group.is_none()) o.group = group.cast<const distributed::ProcessGroup*>();
             o.bucket_cap_bytes = cap;
             o.first_bucket_cap_bytes = first_cap;
             o.broadcast_buffers = broadcast_buffers;
             py::gil_scoped_release nogil;  // collective: checks and broadcasts
             return std::make_unique<par::DistributedDataParallel>(*module, o);
           }),
           py::arg("module"), py::arg("group"), py::arg("bucket_cap_bytes"),
           py::arg("first_bucket_cap_bytes"), py::arg("broadcast_buffers"), py::keep_alive<1, 2>())
      .def("no_sync",
           [](par::DistributedDataParallel& d) {
             return NoSyncBox{std::unique_ptr<par::DistributedDataParallel::NoSync>(
                 new par::DistributedDataParallel::NoSync(d.no_sync()))};
           })
      .def_property_readonly("sync_enabled", &par::DistributedDataParallel::sync_enabled)
      .def("zero_grad", &par::DistributedDataParallel::zero_grad)
      .def_property_readonly("buckets",
                             [](const par::DistributedDataParallel& d) {
                               py::list out;
                               for (const auto& b : d.buckets()) {
                                 py::dict e;
                                 e["dtype"] = b.dtype;
                                 e["device"] = b.device;
                                 e["numel"] = b.numel;
                                 e["reduced_numel"] = b.reduced_numel;
                                 e["params"] = b.params;
                                 out.append(e);
                               }
                               return out;
                             })
      .def_property_readonly("stats", [](const par::DistributedDataParallel& d) {
        const auto& s = d.stats();
        py::dict e;
        e["syncs"] = s.syncs;
        e["bytes"] = s.bytes;
        e["overlap_ms"] = s.overlap_ms;
        e["wait_ms"] = s.wait_ms;
        e["comm_ms"] = s.comm_ms;
        return e;
      });
}

void bind_tensor_parallel(py::module_& p) {
  py::class_<par::ParallelStyle, StylePtr>(p, "ParallelStyle", "How one module is parallelized.")
      .def_property_readonly("name", &par::ParallelStyle::name)
      .def("__repr__", &par::ParallelStyle::name);
  StyleClass<par::ColwiseParallel>(p, "ColwiseParallel",
                                   "Linear: weight and bias Shard(0); Embedding: weight Shard(1).")
      .def(py::init([](py::handle in, py::handle out, bool local, int64_t fused) {
             return std::make_shared<par::ColwiseParallel>(
                 par::ColwiseOptions{placement_of(in, "ColwiseParallel"),
                                     placement_of(out, "ColwiseParallel"), local, fused});
           }),
           py::kw_only(), py::arg("input_layouts") = py::none(),
           py::arg("output_layouts") = py::none(), py::arg("use_local_output") = true,
           py::arg("fused_chunks") = 1);
  StyleClass<par::RowwiseParallel>(
      p, "RowwiseParallel", "Linear: weight Shard(1), bias Replicate; Embedding: weight Shard(0).")
      .def(py::init([](py::handle in, py::handle out, bool local) {
             return std::make_shared<par::RowwiseParallel>(par::RowwiseOptions{
                 placement_of(in, "RowwiseParallel"), placement_of(out, "RowwiseParallel"), local});
           }),
           py::kw_only(), py::arg("input_layouts") = py::none(),
           py::arg("output_layouts") = py::none(), py::arg("use_local_output") = true);
  StyleClass<par::SequenceParallel>(p, "SequenceParallel",
                                    "Norms and dropout on activations sharded along the sequence.")
      .def(py::init([](int64_t dim, bool local) {
             return std::make_shared<par::SequenceParallel>(
                 par::SequenceParallelOptions{dim, local});
           }),
           py::kw_only(), py::arg("sequence_dim") = 1, py::arg("use_local_output") = false);
  StyleClass<par::PrepareModuleInput>(p, "PrepareModuleInput",
                                      "Converts a module's input to the layout it wants.")
      .def(py::init([](py::handle in, py::handle desired, bool local) {
             return std::make_shared<par::PrepareModuleInput>(
                 par::PrepareInputOptions{placement_of(in, "PrepareModuleInput"),
                                          placement_of(desired, "PrepareModuleInput"), local});
           }),
           py::kw_only(), py::arg("input_layouts") = py::none(),
           py::arg("desired_input_layouts") = py::none(), py::arg("use_local_output") = false);
  StyleClass<par::PrepareModuleOutput>(p, "PrepareModuleOutput",
                                       "Converts a module's output to the layout wanted after it.")
      .def(py::init([](py::handle out, py::handle desired, bool local) {
             return std::make_shared<par::PrepareModuleOutput>(
                 par::PrepareOutputOptions{placement_of(out, "PrepareModuleOutput"),
                                           placement_of(desired, "PrepareModuleOutput"), local});
           }),
           py::kw_only(), py::arg("output_layouts") = py::none(),
           py::arg("desired_output_layouts") = py::none(), py::arg("use_local_output") = true);

  p.def(
      "_named_modules",
      [](py::object self) {
        py::list out;
        for (auto& [path, m] : self.cast<nn::Module&>().named_modules())
          out.append(
              py::make_tuple(path, py::cast(m, py::return_value_policy::reference_internal, self)));
        return out;
      },
      py::arg("module"),
      "(path, module) of a built-in module and its submodules, depth first (each kept alive "
      "by the module).");
  p.def(
      "_apply_styles",
      [](const std::vector<std::tuple<std::string, std::string, nn::Module*, StylePtr>>& todo,
         const DeviceMesh& mesh) {
        std::vector<par::StyleTarget> targets;
        for (const auto& [path, pattern, m, style] : todo)
          targets.push_back({path, pattern, m, style});
        py::gil_scoped_release nogil;  // collective
        par::apply_parallel_styles(targets, mesh);
      },
      py::arg("targets"), py::arg("mesh"));
  p.def(
      "_parallelize",
      [](nn::Module& module, const DeviceMesh& mesh,
         const std::vector<std::pair<std::string, StylePtr>>& plan) {
        par::ParallelizePlan cpp(plan.begin(), plan.end());
        py::gil_scoped_release nogil;  // collective
        par::parallelize_module(module, mesh, cpp);
      },
      py::arg("module"), py::arg("mesh"), py::arg("plan"));
  p.def(
      "gpt_tensor_parallel_plan",
      [](const nn::GPT& gpt, const DeviceMesh& mesh) {
        std::vector<std::pair<std::string, StylePtr>> out;
        for (auto& [path, style] : par::gpt_tensor_parallel_plan(gpt.config(), mesh))
          out.emplace_back(path, std::const_pointer_cast<par::ParallelStyle>(style));
        return out;
      },
      py::arg("gpt"), py::arg("mesh"),
      "Megatron-style plan for kiln.nn.GPT: (path, style) pairs for parallelize_module.");

  using LossBox = ScopeBox<par::LossParallel>;
  py::class_<LossBox>(p, "loss_parallel",
                      "`with loss_parallel():` cross-entropy over class-sharded DTensor logits "
                      "without gathering them (run backward inside too).")
      .def(py::init([] { return LossBox{}; }))
      .def("__enter__",
           [](LossBox& b) {
             b.scope = std::make_unique<par::LossParallel>();
             return &b;
           })
      .def("__exit__", [](LossBox& b, py::args) { b.scope.reset(); });
  p.def(
      "loss_parallel_cross_entropy",
      [](const Tensor& logits, const Tensor& target, int64_t ignore_index) {
        py::gil_scoped_release nogil;
        return par::loss_parallel_cross_entropy(logits, target, ignore_index);
      },
      py::arg("logits"), py::arg("target"), py::arg("ignore_index") = -100);
}

void bind_fsdp(py::module_& p) {
  py::class_<par::MixedPrecisionPolicy>(p, "MixedPrecisionPolicy",
                                        "FSDP's gather, reduce and output dtypes.")
      .def(py::init([](std::optional<DType> param, std::optional<DType> reduce,
                       std::optional<DType> output, bool cast_inputs) {
             return par::MixedPrecisionPolicy{param, reduce, output, cast_inputs};
           }),
           py::kw_only(), py::arg("param_dtype") = py::none(), py::arg("reduce_dtype") = py::none(),
           py::arg("output_dtype") = py::none(), py::arg("cast_forward_inputs") = true)
      .def_readonly("param_dtype", &par::MixedPrecisionPolicy::param_dtype)
      .def_readonly("reduce_dtype", &par::MixedPrecisionPolicy::reduce_dtype)
      .def_readonly("output_dtype", &par::MixedPrecisionPolicy::output_dtype)
      .def_readonly("cast_forward_inputs", &par::MixedPrecisionPolicy::cast_forward_inputs);
  p.def(
      "_fully_shard",
      [](nn::Module& module, const DeviceMesh& mesh, bool reshard, bool prefetch,
         const par::MixedPrecisionPolicy& mp) {
        par::FullyShardOptions o{reshard, prefetch, mp};
        py::gil_scoped_release nogil;  // collective
        par::fully_shard(module, mesh, o);
      },
      py::arg("module"), py::arg("mesh"), py::arg("reshard_after_forward"), py::arg("prefetch"),
      py::arg("mp_policy"));
  p.def("is_fully_sharded", &par::is_fully_sharded, py::arg("module"));
  p.def("fully_sharded_parameters", &par::fully_sharded_parameters, py::arg("module"));
}

}  // namespace

void bind_parallel(py::module_& m) {
  py::module_ p = m.def_submodule("parallel", "DDP, tensor parallel and FSDP (C++ side).");
  bind_ddp(p);
  bind_tensor_parallel(p);
  bind_fsdp(p);
}

}  // namespace kiln::python

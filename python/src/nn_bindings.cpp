// kiln.nn's built-in modules (the C++ modules of kiln/nn), kiln.optim and kiln.save/load.
// python/kiln/nn.py adds kiln.nn.Module for Python subclasses, which may hold these.
#include "bindings.h"

#include "kiln/io/safetensors.h"
#include "kiln/nn/checkpoint.h"
#include "kiln/nn/cnn.h"
#include "kiln/nn/conv.h"
#include "kiln/nn/embedding_bag.h"
#include "kiln/nn/layers.h"
#include "kiln/nn/normalization.h"
#include "kiln/nn/pooling.h"
#include "kiln/nn/transformer.h"
#include "kiln/nn/upsample.h"
#include "kiln/optim/optimizer.h"

namespace kiln::python {
namespace {

using nn::Module;
using nn::UnaryModule;
template <class M>
using Class = py::class_<M, UnaryModule, std::shared_ptr<M>>;

py::list named_list(const nn::NamedTensors& named) {
  py::list out;
  for (const auto& [name, t] : named) out.append(py::make_tuple(name, t));
  return out;
}
nn::NamedTensors from_mapping(py::handle state) {
  nn::NamedTensors out;
  for (auto [k, v] : state.cast<py::dict>())
    out.emplace_back(k.cast<std::string>(), v.cast<Tensor>());
  return out;
}
py::dict to_dict(const nn::NamedTensors& named) {
  py::dict d;
  for (const auto& [name, t] : named) d[py::str(name)] = t;
  return d;
}
nn::Init init_of(py::handle generator, py::handle dtype, py::handle device) {
  nn::Init init;
  if (!generator.is_none()) init.gen = generator.cast<Generator*>();
  if (!dtype.is_none()) init.dtype = dtype.cast<DType>();
  if (!device.is_none()) init.device = to_device(device);
  return init;
}
std::vector<int64_t> ints(py::handle v, const char* what) {
  Shape s = to_shape(v, what);
  return {s.begin(), s.end()};
}
// The keyword arguments every parameter-making module takes.
#define KILN_INIT_ARGS \
  py::arg("generator") = py::none(), py::arg("dtype") = py::none(), py::arg("device") = py::none()

// Conv1d/2d/3d: kernel_size, stride, padding (numbers or "same"/"valid") and dilation as an int
// or one per spatial dim.
template <class M>
void def_conv(py::module_& nn, const char* name) {
  Class<M>(nn, name, "Convolution; weight [out, in / groups, *kernel].")
      .def(py::init([name](int64_t in, int64_t out, py::handle kernel, py::handle stride,
                           py::handle padding, py::handle dilation, int64_t groups, bool bias,
                           py::handle g, py::handle d, py::handle dev) {
             nn::ConvOptions o;
             o.stride = ints(stride, name);
             if (py::isinstance<py::str>(padding))
               o.padding_str = padding.cast<std::string>();
             else
               o.padding = ints(padding, name);
             o.dilation = ints(dilation, name);
             o.groups = groups;
             o.bias = bias;
             return std::make_shared<M>(in, out, ints(kernel, name), o, init_of(g, d, dev));
           }),
           py::arg("in_channels"), py::arg("out_channels"), py::arg("kernel_size"),
           py::arg("stride") = 1, py::arg("padding") = 0, py::arg("dilation") = 1,
           py::arg("groups") = 1, py::arg("bias") = true, py::kw_only(), KILN_INIT_ARGS)
      .def_readwrite("weight", &M::weight)
      .def_readwrite("bias", &M::bias);
}

template <class M>
void def_conv_transpose(py::module_& nn, const char* name) {
  Class<M>(nn, name, "Transposed convolution; weight [in, out / groups, *kernel].")
      .def(py::init([name](int64_t in, int64_t out, py::handle kernel, py::handle stride,
                           py::handle padding, py::handle output_padding, int64_t groups, bool bias,
                           py::handle dilation, py::handle g, py::handle d, py::handle dev) {
             nn::ConvTransposeOptions o;
             o.stride = ints(stride, name);
             o.padding = ints(padding, name);
             o.output_padding = ints(output_padding, name);
             o.dilation = ints(dilation, name);
             o.groups = groups;
             o.bias = bias;
             return std::make_shared<M>(in, out, ints(kernel, name), o, init_of(g, d, dev));
           }),
           py::arg("in_channels"), py::arg("out_channels"), py::arg("kernel_size"),
           py::arg("stride") = 1, py::arg("padding") = 0, py::arg("output_padding") = 0,
           py::arg("groups") = 1, py::arg("bias") = true, py::arg("dilation") = 1, py::kw_only(),
           KILN_INIT_ARGS)
      .def_readwrite("weight", &M::weight)
      .def_readwrite("bias", &M::bias);
}

template <class M>
void def_batch_norm(py::module_& nn, const char* name) {
  Class<M>(nn, name, "Batch norm per channel; running statistics as buffers.")
      .def(py::init([](int64_t c, double eps, double momentum, bool affine, bool track,
                       py::handle g, py::handle d, py::handle dev) {
             nn::BatchNormOptions o{eps, momentum, affine, track};
             return std::make_shared<M>(c, o, init_of(g, d, dev));
           }),
           py::arg("num_features"), py::arg("eps") = 1e-5, py::arg("momentum") = 0.1,
           py::arg("affine") = true, py::arg("track_running_stats") = true, py::kw_only(),
           KILN_INIT_ARGS);
}

void bind_modules(py::module_& nn) {
  py::class_<Module, std::shared_ptr<Module>>(nn, "_CppModule",
                                              "A module implemented in C++ (kiln/nn).")
      .def("named_parameters", [](const Module& m) { return named_list(m.named_parameters()); })
      .def("parameters", &Module::parameters)
      .def("named_buffers", [](const Module& m) { return named_list(m.named_buffers()); })
      .def("state_dict", [](const Module& m) { return to_dict(m.state_dict()); })
      .def(
          "load_state_dict",
          [](Module& m, py::handle state, bool strict) {
            m.load_state_dict(from_mapping(state), strict);
          },
          py::arg("state_dict"), py::arg("strict") = true)
      .def("num_parameters", &Module::num_parameters)
      .def(
          "train",
          [](py::object self, bool on) {
            self.cast<Module&>().train(on);
            return self;
          },
          py::arg("mode") = true)
      .def("eval",
           [](py::object self) {
             self.cast<Module&>().eval();
             return self;
           })
      .def_property_readonly("training", &Module::is_training)
      .def(
          "to",
          [](py::object self, py::handle arg) {
            Module& m = self.cast<Module&>();
            if (py::isinstance<DType>(arg))
              m.to(arg.cast<DType>());
            else
              m.to(to_device(arg));
            return self;
          },
          py::arg("device_or_dtype"))
      .def("zero_grad", &Module::zero_grad, py::arg("set_to_none") = false)
      .def("__repr__", [](const Module& m) { return m.type_name() + "()"; });
  py::class_<UnaryModule, Module, std::shared_ptr<UnaryModule>>(nn, "_CppUnaryModule")
      .def(
          "forward",
          [](UnaryModule& m, const Tensor& x) {
            py::gil_scoped_release nogil;
            return m(x);
          },
          py::arg("input"))
      .def(
          "__call__",
          [](UnaryModule& m, const Tensor& x) {
            py::gil_scoped_release nogil;
            return m(x);
          },
          py::arg("input"));

  Class<nn::Linear>(nn, "Linear", "y = x W^T + b, W [out, in] ~ U(-1/sqrt(in), 1/sqrt(in)).")
      .def(py::init(
               [](int64_t in, int64_t out, bool bias, py::handle g, py::handle d, py::handle dev) {
                 return std::make_shared<nn::Linear>(in, out, bias, init_of(g, d, dev));
               }),
           py::arg("in_features"), py::arg("out_features"), py::arg("bias") = true, py::kw_only(),
           KILN_INIT_ARGS)
      .def_readwrite("weight", &nn::Linear::weight)
      .def_readwrite("bias", &nn::Linear::bias);
  Class<nn::Embedding>(nn, "Embedding", "Rows of a [num, dim] table picked by integer indices.")
      .def(py::init([](int64_t num, int64_t dim, std::optional<int64_t> padding_idx, py::handle g,
                       py::handle d, py::handle dev) {
             return std::make_shared<nn::Embedding>(num, dim, init_of(g, d, dev), padding_idx);
           }),
           py::arg("num_embeddings"), py::arg("embedding_dim"), py::arg("padding_idx") = py::none(),
           py::kw_only(), KILN_INIT_ARGS)
      .def_readwrite("weight", &nn::Embedding::weight);
  Class<nn::LayerNorm>(nn, "LayerNorm", "Normalises over the last dim.")
      .def(py::init(
               [](int64_t dim, double eps, bool bias, py::handle g, py::handle d, py::handle dev) {
                 return std::make_shared<nn::LayerNorm>(dim, eps, bias, init_of(g, d, dev));
               }),
           py::arg("normalized_shape"), py::arg("eps") = 1e-5, py::arg("bias") = true,
           py::kw_only(), KILN_INIT_ARGS);
  Class<nn::RMSNorm>(nn, "RMSNorm", "x / rms(x) * weight over the last dim.")
      .def(py::init([](int64_t dim, double eps, py::handle g, py::handle d, py::handle dev) {
             return std::make_shared<nn::RMSNorm>(dim, eps, init_of(g, d, dev));
           }),
           py::arg("normalized_shape"), py::arg("eps") = 1e-6, py::kw_only(), KILN_INIT_ARGS);
  Class<nn::Dropout>(nn, "Dropout", "Zeroes elements with probability p in training.")
      .def(py::init([](double p) { return std::make_shared<nn::Dropout>(p); }), py::arg("p") = 0.5);
  Class<nn::GELU>(nn, "GELU")
      .def(py::init([](std::string approximate) {
             return std::make_shared<nn::GELU>(approximate == "tanh");
           }),
           py::arg("approximate") = "none");
  Class<nn::SiLU>(nn, "SiLU").def(py::init<>());
  Class<nn::ReLU>(nn, "ReLU").def(py::init<>());
  Class<nn::LeakyReLU>(nn, "LeakyReLU").def(py::init<double>(), py::arg("negative_slope") = 0.01);
  Class<nn::ELU>(nn, "ELU").def(py::init<double>(), py::arg("alpha") = 1.0);
  Class<nn::Hardtanh>(nn, "Hardtanh")
      .def(py::init<double, double>(), py::arg("min_val") = -1.0, py::arg("max_val") = 1.0);
  Class<nn::Flatten>(nn, "Flatten")
      .def(py::init<int64_t, int64_t>(), py::arg("start_dim") = 1, py::arg("end_dim") = -1);
  def_conv<nn::Conv1d>(nn, "Conv1d");
  def_conv<nn::Conv2d>(nn, "Conv2d");
  def_conv<nn::Conv3d>(nn, "Conv3d");
  def_conv_transpose<nn::ConvTranspose1d>(nn, "ConvTranspose1d");
  def_conv_transpose<nn::ConvTranspose2d>(nn, "ConvTranspose2d");
  def_conv_transpose<nn::ConvTranspose3d>(nn, "ConvTranspose3d");
  def_batch_norm<nn::BatchNorm1d>(nn, "BatchNorm1d");
  def_batch_norm<nn::BatchNorm2d>(nn, "BatchNorm2d");
  def_batch_norm<nn::BatchNorm3d>(nn, "BatchNorm3d");
  Class<nn::Upsample>(nn, "Upsample", "As torch.nn.Upsample: nearest, linear or bilinear.")
      .def(py::init([](py::handle size, py::handle scale_factor, std::string mode,
                       std::optional<bool> align_corners) {
             nn::UpsampleOptions o;
             if (!size.is_none()) o.size = ints(size, "Upsample");
             if (!scale_factor.is_none()) {
               std::vector<double> f;
               if (py::isinstance<py::sequence>(scale_factor))
                 for (py::handle v : scale_factor.cast<py::sequence>())
                   f.push_back(v.cast<double>());
               else
                 f.push_back(scale_factor.cast<double>());
               o.scale_factor = f;
             }
             o.mode = std::move(mode);
             o.align_corners = align_corners;
             return std::make_shared<nn::Upsample>(o);
           }),
           py::arg("size") = py::none(), py::arg("scale_factor") = py::none(),
           py::arg("mode") = "nearest", py::arg("align_corners") = py::none());
  Class<nn::EmbeddingBag>(nn, "EmbeddingBag", "Sums, means or maxes of bags of embedding rows.")
      .def(py::init([](int64_t num, int64_t dim, std::string mode, bool include_last_offset,
                       std::optional<int64_t> padding_idx, py::handle g, py::handle d,
                       py::handle dev) {
             nn::EmbeddingBagOptions o;
             o.mode = std::move(mode);
             o.include_last_offset = include_last_offset;
             o.padding_idx = padding_idx;
             return std::make_shared<nn::EmbeddingBag>(num, dim, o, init_of(g, d, dev));
           }),
           py::arg("num_embeddings"), py::arg("embedding_dim"), py::arg("mode") = "mean",
           py::arg("include_last_offset") = false, py::arg("padding_idx") = py::none(),
           py::kw_only(), KILN_INIT_ARGS);
  Class<nn::CNN>(nn, "CNN", "The Fashion-MNIST classifier of kiln train --model cnn.")
      .def(py::init([](int64_t in_channels, int64_t image_size, std::vector<int64_t> channels,
                       int64_t hidden, double dropout, int64_t classes, py::handle g, py::handle d,
                       py::handle dev) {
             nn::CNNConfig c{in_channels, image_size, std::move(channels),
                             hidden,      dropout,    classes};
             return std::make_shared<nn::CNN>(c, init_of(g, d, dev));
           }),
           py::arg("in_channels") = 1, py::arg("image_size") = 28,
           py::arg("channels") = std::vector<int64_t>{32, 64}, py::arg("hidden") = 128,
           py::arg("dropout") = 0.25, py::arg("classes") = 10, py::kw_only(), KILN_INIT_ARGS);
  Class<nn::CausalSelfAttention>(nn, "CausalSelfAttention")
      .def(py::init([](int64_t width, int64_t heads, bool bias, py::handle g, py::handle d,
                       py::handle dev) {
             return std::make_shared<nn::CausalSelfAttention>(width, heads, bias,
                                                              init_of(g, d, dev));
           }),
           py::arg("width"), py::arg("heads"), py::arg("bias") = true, py::kw_only(),
           KILN_INIT_ARGS);
  Class<nn::MLP>(nn, "MLP", "The transformer's Linear(4w) -> GELU -> Linear(w).")
      .def(py::init([](int64_t width, bool bias, py::handle g, py::handle d, py::handle dev) {
             return std::make_shared<nn::MLP>(width, bias, init_of(g, d, dev));
           }),
           py::arg("width"), py::arg("bias") = true, py::kw_only(), KILN_INIT_ARGS);
  Class<nn::Block>(nn, "Block", "A pre-norm transformer block.")
      .def(py::init([](int64_t width, int64_t heads, bool bias, py::handle g, py::handle d,
                       py::handle dev) {
             return std::make_shared<nn::Block>(width, heads, bias, init_of(g, d, dev));
           }),
           py::arg("width"), py::arg("heads"), py::arg("bias") = true, py::kw_only(),
           KILN_INIT_ARGS);
  Class<nn::GroupNorm>(nn, "GroupNorm")
      .def(py::init([](int64_t groups, int64_t c, double eps, bool affine, py::handle g,
                       py::handle d, py::handle dev) {
             return std::make_shared<nn::GroupNorm>(groups, c, eps, affine, init_of(g, d, dev));
           }),
           py::arg("num_groups"), py::arg("num_channels"), py::arg("eps") = 1e-5,
           py::arg("affine") = true, py::kw_only(), KILN_INIT_ARGS);
  Class<nn::MaxPool2d>(nn, "MaxPool2d")
      .def(py::init([](py::handle kernel, py::handle stride, py::handle padding) {
             nn::MaxPoolOptions o;
             if (!stride.is_none()) o.stride = ints(stride, "MaxPool2d");
             o.padding = ints(padding, "MaxPool2d");
             return std::make_shared<nn::MaxPool2d>(ints(kernel, "MaxPool2d"), o);
           }),
           py::arg("kernel_size"), py::arg("stride") = py::none(), py::arg("padding") = 0);
  Class<nn::AvgPool2d>(nn, "AvgPool2d")
      .def(py::init([](py::handle kernel, py::handle stride, py::handle padding) {
             nn::AvgPoolOptions o;
             if (!stride.is_none()) o.stride = ints(stride, "AvgPool2d");
             o.padding = ints(padding, "AvgPool2d");
             return std::make_shared<nn::AvgPool2d>(ints(kernel, "AvgPool2d"), o);
           }),
           py::arg("kernel_size"), py::arg("stride") = py::none(), py::arg("padding") = 0);
  Class<nn::AdaptiveAvgPool2d>(nn, "AdaptiveAvgPool2d")
      .def(py::init([](py::handle size) {
             return std::make_shared<nn::AdaptiveAvgPool2d>(ints(size, "AdaptiveAvgPool2d"));
           }),
           py::arg("output_size"));
  Class<nn::GPT>(nn, "GPT", "A GPT-2 style language model (nanoGPT's names).")
      .def(py::init([](int64_t vocab, int64_t context, int64_t width, int64_t layers, int64_t heads,
                       bool bias, py::handle g, py::handle d, py::handle dev) {
             nn::GPTConfig c{vocab, context, width, layers, heads, bias};
             return std::make_shared<nn::GPT>(c, init_of(g, d, dev));
           }),
           py::arg("vocab_size") = 256, py::arg("context") = 128, py::arg("width") = 128,
           py::arg("layers") = 4, py::arg("heads") = 4, py::arg("bias") = true, py::kw_only(),
           KILN_INIT_ARGS)
      .def(
          "loss",
          [](nn::GPT& m, const Tensor& idx, const Tensor& targets) {
            py::gil_scoped_release nogil;
            return m.loss(idx, targets);
          },
          py::arg("idx"), py::arg("targets"));
}

void bind_optim(py::module_& optim) {
  py::class_<optim::Optimizer>(optim, "Optimizer", "An optimizer over a list of parameters.")
      .def("step",
           [](optim::Optimizer& o) {
             py::gil_scoped_release nogil;
             o.step();
           })
      .def("zero_grad", &optim::Optimizer::zero_grad, py::arg("set_to_none") = false)
      .def_property("lr", &optim::Optimizer::lr, &optim::Optimizer::set_lr)
      .def_property_readonly("steps", &optim::Optimizer::steps)
      .def("state_dict", [](const optim::Optimizer& o) { return to_dict(o.state_dict()); })
      .def(
          "load_state_dict",
          [](optim::Optimizer& o, py::handle s) { o.load_state_dict(from_mapping(s)); },
          py::arg("state_dict"));
  py::class_<optim::SGD, optim::Optimizer>(optim, "SGD",
                                           "PyTorch's SGD (momentum, dampening, Nesterov).")
      .def(py::init([](TensorList params, double lr, double momentum, double dampening, double wd,
                       bool nesterov) {
             return new optim::SGD(std::move(params), {lr, momentum, dampening, wd, nesterov});
           }),
           py::arg("params"), py::arg("lr") = 1e-2, py::arg("momentum") = 0.0,
           py::arg("dampening") = 0.0, py::arg("weight_decay") = 0.0, py::arg("nesterov") = false);
  py::class_<optim::AdamW, optim::Optimizer>(optim, "AdamW",
                                             "AdamW in one fused multi-tensor kernel a step.")
      .def(py::init([](TensorList params, double lr, std::pair<double, double> betas, double eps,
                       double wd) {
             return new optim::AdamW(std::move(params), {lr, betas.first, betas.second, eps, wd});
           }),
           py::arg("params"), py::arg("lr") = 1e-3, py::arg("betas") = std::make_pair(0.9, 0.999),
           py::arg("eps") = 1e-8, py::arg("weight_decay") = 1e-2);
  py::class_<optim::WarmupCosineLR>(
      optim, "WarmupCosineLR", "Linear warm-up to max_lr, then cosine decay to min_lr at total.")
      .def(py::init([](double max_lr, double min_lr, int64_t warmup, int64_t total) {
             return optim::WarmupCosineLR{max_lr, min_lr, warmup, total};
           }),
           py::arg("max_lr"), py::arg("min_lr"), py::arg("warmup"), py::arg("total"))
      .def("__call__", &optim::WarmupCosineLR::operator(), py::arg("step"));
  optim.def(
      "clip_grad_norm_",
      [](TensorList params, double max_norm) {
        py::gil_scoped_release nogil;
        return optim::clip_grad_norm_(params, max_norm);
      },
      py::arg("parameters"), py::arg("max_norm"),
      "Scales gradients to a total norm of at most max_norm (no host read).");
}

}  // namespace

void bind_nn(py::module_& m) {
  py::module_ nn = m.def_submodule("nn", "Built-in modules (C++); kiln.nn.Module for Python ones.");
  bind_modules(nn);
  nn.def(
      "checkpoint",
      [](py::function fn, py::args inputs, std::vector<Generator*> generators) {
        // Note [Checkpointing a Python function]: fn runs in forward and again in backward, each
        // time with the GIL, on the saved inputs; it must compute the same thing both times.
        TensorList in;
        for (py::handle a : inputs) in.push_back(a.cast<Tensor>());
        auto holder =
            std::shared_ptr<py::function>(new py::function(std::move(fn)), [](py::function* p) {
              if (!Py_IsInitialized()) return;
              py::gil_scoped_acquire gil;
              delete p;
            });
        auto single = std::make_shared<bool>(false);  // fn returned one Tensor (not a list)
        auto run = [holder, single](const TensorList& xs) -> TensorList {
          py::gil_scoped_acquire gil;
          py::tuple args(xs.size());
          for (size_t i = 0; i < xs.size(); ++i) args[i] = py::cast(xs[i]);
          py::object r = (*holder)(*args);
          if (py::isinstance<Tensor>(r)) {
            *single = true;
            return {r.cast<Tensor>()};
          }
          return r.cast<TensorList>();
        };
        nn::CheckpointOptions o;
        o.generators = std::move(generators);
        TensorList out;
        {
          py::gil_scoped_release nogil;
          out = nn::checkpoint(std::function<TensorList(const TensorList&)>(run), in, o);
        }
        if (*single && out.size() == 1) return py::cast(out[0]);
        return py::cast(out);
      },
      py::arg("function"), py::kw_only(), py::arg("generators") = std::vector<Generator*>{},
      "checkpoint(fn, *inputs): runs fn without keeping its intermediates; backward runs it "
      "again.");
  py::module_ optim = m.def_submodule("optim", "Optimizers.");
  bind_optim(optim);
  m.def(
      "save",
      [](py::handle state, const std::string& path) {
        nn::NamedTensors tensors = from_mapping(state);
        py::gil_scoped_release nogil;
        io::save_safetensors(tensors, path);
      },
      py::arg("state_dict"), py::arg("path"), "Writes a dict of tensors as a safetensors file.");
  m.def(
      "load",
      [](const std::string& path) {
        nn::NamedTensors s;
        {
          py::gil_scoped_release nogil;
          s = io::load_safetensors(path);
        }
        return to_dict(s);
      },
      py::arg("path"), "Reads a safetensors file (treated as hostile) into a dict of CPU tensors.");
}

}  // namespace kiln::python

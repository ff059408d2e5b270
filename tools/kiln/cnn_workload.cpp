#include "tools/kiln/cnn_workload.h"

#include <cmath>

#include <fmt/format.h>

#include "kiln/autograd/grad_mode.h"
#include "kiln/compile/compile.h"
#include "kiln/core/error.h"
#include "kiln/nn/cnn.h"
#include "kiln/ops/conv.h"
#include "kiln/ops/ops.h"
#include "kiln/optim/optimizer.h"

namespace kiln::workloads {

const std::vector<ConvShape>& resnet_conv_shapes() {
  static const std::vector<ConvShape> shapes = {
      {"stem_7x7_s2", 3, 64, 224, 7, 2, 3}, {"res2_1x1", 256, 64, 56, 1, 1, 0},
      {"res2_3x3", 64, 64, 56, 3, 1, 1},    {"res3_3x3_s2", 128, 128, 56, 3, 2, 1},
      {"res3_3x3", 128, 128, 28, 3, 1, 1},  {"res4_3x3", 256, 256, 14, 3, 1, 1},
      {"res5_3x3", 512, 512, 7, 3, 1, 1},
  };
  return shapes;
}

int64_t conv_batch(Device device) { return device.is_cpu() ? 8 : 32; }

std::vector<Metric> conv(const Options& o) {
  const int64_t iters = o.iters > 0 ? o.iters : 5, batch = conv_batch(o.device);
  Generator gen(5);
  std::vector<Metric> out = {{"conv_batch", static_cast<double>(batch), "count", "images"}};
  for (const ConvShape& s : resnet_conv_shapes()) {
    Tensor x = randn({batch, s.in, s.size, s.size}, &gen).to(o.device).requires_grad_();
    Tensor w = (randn({s.out, s.in, s.kernel, s.kernel}, &gen) *
                (1.0 / std::sqrt(static_cast<double>(s.in * s.kernel * s.kernel))))
                   .to(o.device)
                   .requires_grad_();
    auto fwd = [&] { return conv2d(x, w, {}, {s.stride}, {s.padding}); };
    {  // one output element of image 0 against float64
      Tensor y = fwd().detach().to(kCPU);
      Tensor y64 = conv2d(narrow(x.detach().to(kCPU), 0, 0, 1).to(kFloat64),
                          w.detach().to(kCPU).to(kFloat64), {}, {s.stride}, {s.padding});
      double err = max(abs(sub(narrow(y, 0, 0, 1).to(kFloat64), y64))).item<double>();
      KILN_CHECK(err < 1e-2, "[bench conv] check failed: {} is off by {}", s.name, err);
    }
    Tensor grad = ones_like(fwd());
    const double f = time_per_call(
        iters, 3, 1,
        [&] {
          autograd::NoGradGuard ng;
          fwd();
        },
        o.device);
    const double fb = time_per_call(
        iters, 3, 1,
        [&] {
          x.set_grad({});
          w.set_grad({});
          fwd().backward(grad);
        },
        o.device);
    out.push_back(
        {fmt::format("conv_{}_fwd_us", s.name), f * 1e6, "us",
         fmt::format("{}->{} {}x{} k{} s{}", s.in, s.out, s.size, s.size, s.kernel, s.stride)});
    out.push_back({fmt::format("conv_{}_fwdbwd_us", s.name), fb * 1e6, "us",
                   "forward + backward (input, weight)"});
  }
  return out;
}

std::vector<Metric> cnn(const Options& o) {
  const int64_t iters = o.iters > 0 ? o.iters : 10;
  Generator gen(6);
  nn::CNNConfig cfg;
  cfg.dropout = 0;
  nn::CNN model(cfg, {.gen = &gen});
  model.to(o.device);
  optim::AdamW opt(model.parameters(), {.lr = 1e-3});
  Tensor x = randn({64, 1, 28, 28}, &gen).to(o.device);
  Tensor y = randint(0, 10, {64}, &gen).to(o.device);
  auto step = [&](const Tensor& xs, const Tensor& ys) {
    opt.zero_grad();
    Tensor loss = cross_entropy(model(xs), ys);
    loss.backward();
    opt.step();
    return loss.detach();
  };
  double first = step(x, y).item<double>(), last = first;
  for (int i = 0; i < 4; ++i) last = step(x, y).item<double>();
  KILN_CHECK(std::isfinite(last) && last < first,
             "[bench cnn] check failed: the loss went from {} to {} in 5 steps", first, last);
  const double eager = time_per_call(
      iters, 3, 1, [&] { step(x, y); }, o.device);
  CompiledFunction compiled = compile(step, {.name = "cnn_step"});
  TensorList in{x, y}, res;
  const double comp = time_per_call(
      iters, 3, 3, [&] { compiled.call(in, res); }, o.device);
  const bool graphs = compiled.entries().at(0).device_graphs;
  return {{"cnn_step_us", eager * 1e6, "us", "eager train step"},
          {graphs ? "cnn_step_graph_us" : "cnn_step_compiled_us", comp * 1e6, "us",
           graphs ? "compiled, replayed as a device graph" : "compiled"}};
}

}  // namespace kiln::workloads

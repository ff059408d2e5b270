// conv2d forward, and forward + backward for the input and the weight, at ResNet-50's shapes
// (tools/kiln/cnn_workload.h, batch 8) on the CPU: Kiln (oneDNN) against libtorch in one run, on
// the same number of threads (--threads, default 1). Issue 16's target: within 10% of libtorch
// (ratio <= 1.1). Each shape checks that both sides computed the same output before timing.
// --smoke checks only; --json FILE writes the numbers.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <omp.h>

#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "bench/main_guard.h"
#include "bench/timing.h"
#include "kiln/kiln.h"
#include "kiln/ops/conv.h"
#include "tools/kiln/cnn_workload.h"

namespace {

at::Tensor to_aten(const kiln::Tensor& t) {
  std::vector<float> v = t.to(kiln::kFloat32).to_vector<float>();
  std::vector<int64_t> sizes(t.sizes().begin(), t.sizes().end());
  return at::from_blob(v.data(), sizes, at::kFloat).clone();
}

double time_us(const std::function<void()>& fn, int iters) {
  return 1e6 * kiln::bench::median_seconds_per_call(fn, iters, 3, 1);
}

int bench_main(int argc, char** argv) {
  bool smoke = false;
  int threads = 1, iters = 5;
  std::string json_path;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--smoke"))
      smoke = true;
    else if (!std::strcmp(argv[i], "--threads") && i + 1 < argc)
      threads = std::atoi(argv[++i]);
    else if (!std::strcmp(argv[i], "--iters") && i + 1 < argc)
      iters = std::atoi(argv[++i]);
    else if (!std::strcmp(argv[i], "--json") && i + 1 < argc)
      json_path = argv[++i];
    else {
      fmt::print(stderr, "usage: kiln_conv_bench [--smoke] [--threads N] [--iters N] [--json F]\n");
      return 2;
    }
  }
  at::set_num_threads(threads);
  omp_set_num_threads(threads);
  const int64_t batch = smoke ? 1 : kiln::workloads::conv_batch(kiln::Device(kiln::kCPU));
  kiln::Generator gen(7);
  fmt::print("{} thread(s), batch {}\n{:<26} {:>12} {:>12} {:>8}\n", threads, batch, "shape",
             "kiln us", "libtorch us", "ratio");
  std::string json = "{\n";
  bool first = true;
  for (const auto& s : kiln::workloads::resnet_conv_shapes()) {
    kiln::Tensor x = kiln::randn({batch, s.in, s.size, s.size}, &gen).requires_grad_();
    kiln::Tensor w = kiln::randn({s.out, s.in, s.kernel, s.kernel}, &gen).requires_grad_();
    at::Tensor ax = to_aten(x).requires_grad_(), aw = to_aten(w).requires_grad_();
    auto kfwd = [&] { return kiln::conv2d(x, w, {}, {s.stride}, {s.padding}); };
    auto afwd = [&] { return at::conv2d(ax, aw, {}, s.stride, s.padding); };
    {
      kiln::autograd::NoGradGuard ng;
      at::NoGradGuard ang;
      at::Tensor diff = (to_aten(kfwd()) - afwd()).abs().max();
      double scale = afwd().abs().max().item<double>();
      if (diff.item<double>() > 1e-4 * (1 + scale)) {
        fmt::print(stderr, "{}: Kiln and libtorch differ by {}\n", s.name, diff.item<double>());
        return 1;
      }
    }
    if (smoke) continue;
    kiln::Tensor kg = kiln::ones_like(kfwd());
    at::Tensor ag = at::ones_like(afwd());
    const double kf = time_us(
        [&] {
          kiln::autograd::NoGradGuard ng;
          kfwd();
        },
        iters);
    const double af = time_us(
        [&] {
          at::NoGradGuard ng;
          afwd();
        },
        iters);
    const double kfb = time_us(
        [&] {
          x.set_grad({});
          w.set_grad({});
          kfwd().backward(kg);
        },
        iters);
    const double afb = time_us(
        [&] {
          ax.mutable_grad() = at::Tensor();
          aw.mutable_grad() = at::Tensor();
          afwd().backward(ag);
        },
        iters);
    for (auto [key, k, a] : {std::tuple{s.name + "_fwd", kf, af}, {s.name + "_fwdbwd", kfb, afb}}) {
      fmt::print("{:<26} {:>12.1f} {:>12.1f} {:>8.3f}\n", key, k, a, k / a);
      json += fmt::format("{}  \"conv_{}\": {{\"kiln_us\": {:.1f}, \"libtorch_us\": {:.1f}}}",
                          first ? "" : ",\n", key, k, a);
      first = false;
    }
  }
  if (smoke) {
    fmt::print("kiln_conv_bench: smoke run passed\n");
    return 0;
  }
  if (!json_path.empty()) std::ofstream(json_path) << json << "\n}\n";
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return kiln::bench::guarded_main("kiln_conv_bench", bench_main, argc, argv);
}

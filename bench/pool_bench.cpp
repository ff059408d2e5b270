// Pooling forward + backward at a CNN-sized input (issue 16) against libtorch in the same
// process, on the CPU: max_pool2d_with_indices (2x2) then its backward, and adaptive_avg_pool2d
// (to 7x7 and to 1x1) then its backward, float32, against the same at:: ops. Each result is
// checked against ATen's before timing. Prints milliseconds per forward and per backward, the
// forward's bandwidth (input and output bytes) and Kiln / ATen; --smoke checks a small input and
// times nothing.
// Usage: kiln_pool_bench [--smoke] [N C H W] [threads]
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <fmt/format.h>

#include <cstdlib>
#include <cstring>
#include <functional>
#include <vector>

#include "bench/main_guard.h"
#include "bench/nchw_args.h"
#include "bench/timing.h"
#include "kiln/kiln.h"
#include "tests/ops/torch_bridge.h"

namespace {

using kiln::bench::median_seconds_per_call;

bool g_smoke = false;  // check only, time nothing

void check(const kiln::Tensor& got, const at::Tensor& want, const char* what) {
  if (!at::allclose(kiln::test::to_aten(got).to(want.scalar_type()), want, 1e-5, 1e-6)) {
    fmt::print(stderr, "{}: Kiln and ATen differ\n", what);
    std::exit(1);
  }
}

void report(const char* name, const std::function<void()>& kf, const std::function<void()>& kb,
            const std::function<void()>& af, const std::function<void()>& ab, double bytes) {
  if (g_smoke) return;
  const int iters = 20, repeats = 7, warmup = 5;
  const double tkf = median_seconds_per_call(kf, iters, repeats, warmup);
  const double tkb = median_seconds_per_call(kb, iters, repeats, warmup);
  const double taf = median_seconds_per_call(af, iters, repeats, warmup);
  const double tab = median_seconds_per_call(ab, iters, repeats, warmup);
  fmt::print("  {}\n", name);
  fmt::print("    forward   kiln {:7.3f} ms ({:5.1f} GB/s)  aten {:7.3f} ms  kiln/aten {:.2f}\n",
             tkf * 1e3, bytes / tkf / 1e9, taf * 1e3, tkf / taf);
  fmt::print("    backward  kiln {:7.3f} ms  aten {:7.3f} ms  kiln/aten {:.2f}\n", tkb * 1e3,
             tab * 1e3, tkb / tab);
  fmt::print("    both      kiln {:7.3f} ms  aten {:7.3f} ms  kiln/aten {:.2f}\n",
             (tkf + tkb) * 1e3, (taf + tab) * 1e3, (tkf + tkb) / (taf + tab));
}

void run(int64_t n, int64_t c, int64_t h, int64_t w) {
  kiln::Generator gen(1);
  kiln::Tensor x = kiln::randn({n, c, h, w}, &gen, kiln::kFloat32, kiln::Device(kiln::kCPU));
  at::Tensor ax = kiln::test::to_aten(x);
  fmt::print("pooling [{}, {}, {}, {}] float32 cpu ({} threads)\n", n, c, h, w,
             kiln::get_num_threads());
  const double in_bytes = static_cast<double>(x.numel()) * 4;

  // max_pool2d 2x2: values and int64 indices out.
  auto [y, idx] = kiln::max_pool2d_with_indices(x, {2});
  auto [ay, aidx] = at::max_pool2d_with_indices(ax, {2, 2}, {}, {0, 0}, {1, 1}, false);
  check(y, ay, "max_pool2d");
  check(idx, aidx, "max_pool2d indices");
  kiln::Tensor gy = kiln::randn(y.sizes(), &gen, kiln::kFloat32, kiln::Device(kiln::kCPU));
  at::Tensor agy = kiln::test::to_aten(gy);
  check(kiln::max_pool2d_with_indices_backward(gy, x, {2}, {}, {0}, {1}, false, idx),
        at::max_pool2d_with_indices_backward(agy, ax, {2, 2}, {}, {0, 0}, {1, 1}, false, aidx),
        "max_pool2d backward");
  report(
      "max_pool2d_with_indices 2x2", [&] { kiln::max_pool2d_with_indices(x, {2}); },
      [&] { kiln::max_pool2d_with_indices_backward(gy, x, {2}, {}, {0}, {1}, false, idx); },
      [&] {
        at::max_pool2d_with_indices(ax, {2, 2}, {}, {0, 0}, {1, 1}, false);
      },
      [&] {
        at::max_pool2d_with_indices_backward(agy, ax, {2, 2}, {}, {0, 0}, {1, 1}, false, aidx);
      },
      in_bytes + static_cast<double>(y.numel()) * 12);

  for (int64_t o : {7, 1}) {
    kiln::Tensor ya = kiln::adaptive_avg_pool2d(x, {o, o});
    check(ya, at::_adaptive_avg_pool2d(ax, {o, o}), "adaptive_avg_pool2d");
    kiln::Tensor gya = kiln::randn(ya.sizes(), &gen, kiln::kFloat32, kiln::Device(kiln::kCPU));
    at::Tensor agya = kiln::test::to_aten(gya);
    check(kiln::adaptive_avg_pool2d_backward(gya, x), at::_adaptive_avg_pool2d_backward(agya, ax),
          "adaptive_avg_pool2d backward");
    report(
        o == 7 ? "adaptive_avg_pool2d to 7x7" : "adaptive_avg_pool2d to 1x1",
        [&] {
          kiln::adaptive_avg_pool2d(x, {o, o});
        },
        [&] { kiln::adaptive_avg_pool2d_backward(gya, x); },
        [&] {
          at::_adaptive_avg_pool2d(ax, {o, o});
        },
        [&] { at::_adaptive_avg_pool2d_backward(agya, ax); },
        in_bytes + static_cast<double>(ya.numel()) * 4);
  }
}

int bench_main(int argc, char** argv) {
  const auto a = kiln::bench::parse_nchw_args(argc, argv, {64, 32, 28, 28}, {2, 3, 14, 14});
  g_smoke = a.smoke;
  const auto& s = a.shape;
  run(s[0], s[1], s[2], s[3]);
  if (g_smoke) fmt::print("kiln_pool_bench: smoke run passed\n");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return kiln::bench::guarded_main("kiln_pool_bench", bench_main, argc, argv);
}

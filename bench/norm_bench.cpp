// Batch norm forward + backward in training at a CNN-sized input (issue 16) against libtorch in
// the same process, on the CPU: native_batch_norm_legit then native_batch_norm_backward against
// at::native_batch_norm and at::native_batch_norm_backward, float32. Each result (output, saved
// statistics, running statistics, the three gradients) is checked against ATen's before timing.
// Prints milliseconds per forward, per backward and per step, and Kiln / ATen; --smoke checks a
// small input and times nothing.
// Usage: kiln_norm_bench [--smoke] [N C H W] [threads]
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <fmt/format.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "bench/main_guard.h"
#include "bench/nchw_args.h"
#include "bench/timing.h"
#include "kiln/kiln.h"

namespace {

using kiln::bench::median_seconds_per_call;

// A Kiln copy of a contiguous float32 ATen tensor.
kiln::Tensor copy_of(const at::Tensor& a) {
  kiln::Tensor t = kiln::empty(a.sizes().vec(), kiln::kFloat32);
  std::memcpy(t.impl()->data(), a.data_ptr(), t.nbytes());
  return t;
}

void check(const kiln::Tensor& got, const at::Tensor& want, const char* what) {
  kiln::Tensor g = got.contiguous();
  at::Tensor a = at::from_blob(g.impl()->data(), want.sizes(), at::kFloat).clone();
  // Relative to the largest value: grad_weight and grad_bias are per-channel sums of N H W
  // terms (50,176 at the default size) in another order than ATen's, so a channel whose sum
  // cancels to near 0 is off by far more than its own size times float32's epsilon.
  const double worst = (a - want).abs().max().item<double>();
  const double scale = std::max(1.0, want.abs().max().item<double>());
  if (worst > 1e-4 * scale) {
    fmt::print(stderr, "{}: Kiln and ATen differ by {} (largest value {})\n", what, worst, scale);
    std::exit(1);
  }
}

void run(int64_t n, int64_t c, int64_t h, int64_t w, bool smoke) {
  at::manual_seed(1);
  at::Tensor ax = at::randn({n, c, h, w}), agy = at::randn({n, c, h, w});
  kiln::Tensor x = copy_of(ax), gy = copy_of(agy);
  kiln::Tensor wt = kiln::ones({c}), b = kiln::zeros({c}), rm = kiln::zeros({c}),
               rv = kiln::ones({c});
  at::Tensor aw = at::ones({c}), ab = at::zeros({c}), arm = at::zeros({c}), arv = at::ones({c});
  kiln::Tensor sm, sr;
  at::Tensor asm_, asr;
  auto k_fwd = [&] {
    auto r = kiln::native_batch_norm_legit(x, wt, b, rm, rv, true, 0.1, 1e-5);
    sm = std::get<1>(r);
    sr = std::get<2>(r);
  };
  auto k_bwd = [&] {
    kiln::native_batch_norm_backward(gy, x, wt, rm, rv, sm, sr, true, 1e-5, {1, 1, 1});
  };
  auto a_fwd = [&] {
    auto r = at::native_batch_norm(ax, aw, ab, arm, arv, true, 0.1, 1e-5);
    asm_ = std::get<1>(r);
    asr = std::get<2>(r);
  };
  auto a_bwd = [&] {
    at::native_batch_norm_backward(agy, ax, aw, arm, arv, asm_, asr, true, 1e-5,
                                   {true, true, true});
  };
  // One step of each, checked: the running statistics are updated the same way too.
  auto [y, m, r] = kiln::native_batch_norm_legit(x, wt, b, rm, rv, true, 0.1, 1e-5);
  auto [ay, am, ar] = at::native_batch_norm(ax, aw, ab, arm, arv, true, 0.1, 1e-5);
  check(y, ay, "batch_norm output");
  check(m, am, "batch_norm save_mean");
  check(r, ar, "batch_norm save_invstd");
  check(rm, arm, "batch_norm running_mean");
  check(rv, arv, "batch_norm running_var");
  auto [gx, gw, gb] =
      kiln::native_batch_norm_backward(gy, x, wt, rm, rv, m, r, true, 1e-5, {1, 1, 1});
  auto [agx, agw, agb] =
      at::native_batch_norm_backward(agy, ax, aw, arm, arv, am, ar, true, 1e-5, {true, true, true});
  check(gx, agx, "batch_norm grad_input");
  check(gw, agw, "batch_norm grad_weight");
  check(gb, agb, "batch_norm grad_bias");
  if (smoke) return;
  const int iters = 20, repeats = 7, warmup = 5;
  const double kf = median_seconds_per_call(k_fwd, iters, repeats, warmup);
  const double kb = median_seconds_per_call(k_bwd, iters, repeats, warmup);
  const double af = median_seconds_per_call(a_fwd, iters, repeats, warmup);
  const double ab_ = median_seconds_per_call(a_bwd, iters, repeats, warmup);
  fmt::print("batch_norm train [{}, {}, {}, {}] float32 cpu ({} threads)\n", n, c, h, w,
             kiln::get_num_threads());
  fmt::print("  forward   kiln {:8.3f} ms  aten {:8.3f} ms  kiln/aten {:.2f}\n", kf * 1e3, af * 1e3,
             kf / af);
  fmt::print("  backward  kiln {:8.3f} ms  aten {:8.3f} ms  kiln/aten {:.2f}\n", kb * 1e3,
             ab_ * 1e3, kb / ab_);
  fmt::print("  step      kiln {:8.3f} ms  aten {:8.3f} ms  kiln/aten {:.2f}\n", (kf + kb) * 1e3,
             (af + ab_) * 1e3, (kf + kb) / (af + ab_));
}

int bench_main(int argc, char** argv) {
  const auto a = kiln::bench::parse_nchw_args(argc, argv, {64, 32, 28, 28}, {2, 3, 5, 4});
  const bool smoke = a.smoke;
  const auto& s = a.shape;
  run(s[0], s[1], s[2], s[3], smoke);
  if (smoke) fmt::print("kiln_norm_bench: smoke run passed\n");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return kiln::bench::guarded_main("kiln_norm_bench", bench_main, argc, argv);
}

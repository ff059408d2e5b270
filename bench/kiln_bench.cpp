// Kiln against libtorch (C++, one thread) on the host-overhead workloads of BENCHMARKS.md:
// `dispatch` (1-element add, add_out, view, detach), `chain` (256 elementwise ops on 4096
// floats) and a 64x64 mm. Every workload checks that both sides computed the same result
// before it is timed; timings are medians of several repeats and only their ratio means
// anything. --smoke runs each once, checking results only. --json FILE writes the numbers.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <cblas.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include "bench/timing.h"
#include "kiln/kiln.h"

namespace {

bool g_smoke = false;

// Median over `repeats` of the mean ns per call of `fn` over `iters` calls.
double time_ns(const std::function<void()>& fn, int iters, int repeats = 7) {
  if (g_smoke) {
    fn();
    return 0;
  }
  return 1e9 * kiln::bench::median_seconds_per_call(fn, iters, repeats, iters / 10 + 1);
}

at::Tensor to_aten(const kiln::Tensor& t) {
  auto v = t.to_vector<float>();
  std::vector<int64_t> sizes(t.sizes().begin(), t.sizes().end());
  return at::from_blob(v.data(), sizes, at::kFloat).clone();
}

void check_same(const char* what, const kiln::Tensor& k, const at::Tensor& a, double tol) {
  auto kv = k.to_vector<float>();
  at::Tensor ac = a.contiguous();
  const float* av = ac.data_ptr<float>();
  if (static_cast<int64_t>(kv.size()) != ac.numel()) {
    fmt::print(stderr, "{}: size mismatch\n", what);
    std::exit(1);
  }
  for (size_t i = 0; i < kv.size(); ++i)
    if (std::abs(kv[i] - av[i]) > tol * (1 + std::abs(av[i]))) {
      fmt::print(stderr, "{}: results differ at {}: kiln {} libtorch {}\n", what, i, kv[i], av[i]);
      std::exit(1);
    }
}

struct Row {
  std::string key;
  double kiln_ns;
  double torch_ns;
  double target;  // kiln/torch ratio to meet
};

}  // namespace

int main(int argc, char** argv) {
  std::string json_path;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--smoke"))
      g_smoke = true;
    else if (!std::strcmp(argv[i], "--json") && i + 1 < argc)
      json_path = argv[++i];
    else {
      fmt::print(stderr, "usage: kiln_bench [--smoke] [--json FILE]\n");
      return 2;
    }
  }
  at::set_num_threads(1);
  openblas_set_num_threads(1);
  std::vector<Row> rows;

  // dispatch: 1-element CPU tensors
  {
    kiln::Tensor a = kiln::ones({1}), b = kiln::ones({1}), out = kiln::empty({1});
    at::Tensor ta = at::ones({1}), tb = at::ones({1}), tout = at::empty({1});
    check_same("add", kiln::add(a, b), at::add(ta, tb), 0);
    rows.push_back({"dispatch_add_1elem", time_ns([&] { kiln::add(a, b); }, 200000),
                    time_ns([&] { at::add(ta, tb); }, 200000), 0.2});
    rows.push_back({"dispatch_add_out_1elem", time_ns([&] { kiln::add_out(out, a, b); }, 200000),
                    time_ns([&] { at::add_out(tout, ta, tb); }, 200000), 0.2});
    rows.push_back({"dispatch_view",
                    time_ns(
                        [&] {
                          kiln::view(a, {1, 1});
                        },
                        500000),
                    time_ns(
                        [&] {
                          ta.view({1, 1});
                        },
                        500000),
                    0.1});
    rows.push_back({"dispatch_detach", time_ns([&] { kiln::detach(a); }, 500000),
                    time_ns([&] { ta.detach(); }, 500000), 0.1});
  }

  // chain: 64 x (x*1.0001, +0.0001, relu, -0.00005) on 4096 floats
  {
    kiln::Tensor x0 = kiln::randn({4096});
    at::Tensor t0 = to_aten(x0);
    auto kchain = [&] {
      kiln::Tensor x = x0;
      for (int i = 0; i < 64; ++i) x = kiln::relu(x * 1.0001 + 0.0001) - 0.00005;
      return x;
    };
    auto tchain = [&] {
      at::Tensor x = t0;
      for (int i = 0; i < 64; ++i) x = at::relu(x * 1.0001 + 0.0001) - 0.00005;
      return x;
    };
    check_same("chain", kchain(), tchain(), 1e-5);
    rows.push_back(
        {"chain_us_per_op_x1000", time_ns(kchain, 200) / 256, time_ns(tchain, 200) / 256, 0.5});
  }

  // mm 64x64
  {
    kiln::Tensor a = kiln::randn({64, 64}), b = kiln::randn({64, 64});
    at::Tensor ta = to_aten(a), tb = to_aten(b);
    check_same("mm", kiln::mm(a, b), at::mm(ta, tb), 1e-4);
    rows.push_back({"mm_64", time_ns([&] { kiln::mm(a, b); }, 20000),
                    time_ns([&] { at::mm(ta, tb); }, 20000), 1.1});
  }

  if (g_smoke) {
    fmt::print("kiln_bench: smoke run passed ({} workloads checked)\n", rows.size());
    return 0;
  }
  fmt::print("{:<26} {:>12} {:>12} {:>8} {:>8}\n", "workload", "kiln ns", "libtorch ns", "ratio",
             "target");
  std::string json = "{\n";
  for (size_t i = 0; i < rows.size(); ++i) {
    const Row& r = rows[i];
    double ratio = r.kiln_ns / r.torch_ns;
    fmt::print("{:<26} {:>12.1f} {:>12.1f} {:>8.3f} {:>7}{:.2f}{}\n", r.key, r.kiln_ns, r.torch_ns,
               ratio, "<=", r.target, ratio <= r.target ? "" : "  (missed)");
    json += fmt::format(
        "  \"{}\": {{\"kiln_ns\": {:.1f}, \"libtorch_ns\": {:.1f}, \"ratio\": {:.4f}}}{}\n", r.key,
        r.kiln_ns, r.torch_ns, ratio, i + 1 < rows.size() ? "," : "");
  }
  json += "}\n";
  if (!json_path.empty()) std::ofstream(json_path) << json;
  return 0;
}

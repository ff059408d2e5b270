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

#include "bench/main_guard.h"
#include "bench/timing.h"
#include "kiln/kiln.h"
#include "kiln/ops/op_list.h"

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

// A Kiln-only cost with an absolute target (compile's overheads).
struct Cost {
  std::string key;
  double ns;
  double target_ns;
};

int bench_main(int argc, char** argv) {
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
  std::vector<Cost> costs;

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
    const double torch_ns = time_ns(tchain, 200) / 256;
    rows.push_back({"chain_us_per_op_x1000", time_ns(kchain, 200) / 256, torch_ns, 0.5});

    // The same chain compiled: one traced entry replayed, each op a bound out= kernel.
    kiln::CompiledFunction compiled = kiln::compile([&](const kiln::Tensor& x) {
      kiln::Tensor y = x;
      for (int i = 0; i < 64; ++i) y = kiln::relu(y * 1.0001 + 0.0001) - 0.00005;
      return y;
    });
    kiln::TensorList in{x0}, out;
    compiled.call(in, out);
    compiled.call(in, out);
    check_same("chain compiled", out.at(0), tchain(), 1e-5);
    const double compiled_ns = time_ns([&] { compiled.call(in, out); }, 200) / 256;
    rows.push_back({"chain_compiled_us_per_op_x1000", compiled_ns, torch_ns, 0.5});
    // The kernels alone: the same out= kernels called directly on preallocated buffers.
    using kiln::DispatchKey;
    namespace ops = kiln::ops;
    kiln::Tensor b1 = kiln::empty({4096}), b2 = kiln::empty({4096}), b3 = kiln::empty({4096}),
                 b4 = kiln::empty({4096});
    // The numbers as the ops wrap them (0-d float64 wrapped numbers, cast by the kernels).
    auto wrapped = [](double v) {
      kiln::Tensor t = kiln::scalar_tensor(v, kiln::kFloat64);
      t.impl()->set_wrapped_number(true);
      return t;
    };
    kiln::Tensor c1 = wrapped(1.0001), c2 = wrapped(0.0001), c3 = wrapped(0.00005);
    auto kernels = [&] {
      const kiln::Tensor* x = &x0;
      for (int i = 0; i < 64; ++i) {
        ops::op_mul_out.call_at(DispatchKey::CPU, b1, *x, c1);
        ops::op_add_out.call_at(DispatchKey::CPU, b2, b1, c2, 1);
        ops::op_relu_out.call_at(DispatchKey::CPU, b3, b2);
        ops::op_sub_out.call_at(DispatchKey::CPU, b4, b3, c3, 1);
        x = &b4;
      }
    };
    kernels();
    check_same("chain kernels", b4, tchain(), 1e-5);
    const double kernel_ns = time_ns(kernels, 200) / 256;
    costs.push_back({"chain_replay_overhead_ns_per_op", compiled_ns - kernel_ns, 30});
    costs.push_back({"chain_kernel_ns_per_op (reference)", kernel_ns, 0});
  }

  // compile_call: a compiled function of 10 small inputs returning x0 + x1; its cost beyond
  // the eager op is the guard check (10 inputs) plus binding and the output.
  {
    kiln::TensorList in;
    for (int i = 0; i < 10; ++i) in.push_back(kiln::randn({4}));
    kiln::CompiledFunction f =
        kiln::compile([](std::span<const kiln::Tensor> x) -> kiln::TensorList {
          return {kiln::add(x[0], x[1])};
        });
    kiln::TensorList out;
    f.call(in, out);
    f.call(in, out);
    check_same("compile_call", out.at(0), to_aten(kiln::add(in[0], in[1])), 0);
    const double call_ns = time_ns([&] { f.call(in, out); }, 200000);
    const double eager_ns = time_ns([&] { kiln::add(in[0], in[1]); }, 200000);
    costs.push_back({"compile_call_ns_beyond_eager", call_ns - eager_ns, 100});
    costs.push_back({"compile_call_ns (reference)", call_ns, 0});
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
        r.kiln_ns, r.torch_ns, ratio, ",");
  }
  fmt::print("\n{:<38} {:>10} {:>10}\n", "compile cost", "ns", "target");
  for (const Cost& c : costs) {
    fmt::print("{:<38} {:>10.1f} {:>10}{}\n", c.key, c.ns,
               c.target_ns > 0 ? fmt::format("<= {:.0f}", c.target_ns) : "",
               c.target_ns > 0 && c.ns > c.target_ns ? "  (missed)" : "");
    json += fmt::format("  \"{}\": {{\"ns\": {:.1f}}},\n", c.key, c.ns);
  }
  json += "  \"unit\": \"ns\"\n}\n";
  if (!json_path.empty()) std::ofstream(json_path) << json;
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return kiln::bench::guarded_main("kiln_bench", bench_main, argc, argv);
}

// The sim accelerator's launch-bound workloads (BENCHMARKS.md `chain` and `mlp`), eager against
// compiled-and-captured, in one run. sim charges KILN_SIM_LAUNCH_NS (default 5000) per launch
// and KILN_SIM_NODE_NS (default 500) per node of a replayed graph, so a launch-bound step
// should approach their ratio (10x) once captured. Every row first checks that the compiled
// step computes what the eager one does. --smoke runs each once, checking results only.
// --json FILE writes the numbers.
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include "bench/main_guard.h"
#include "bench/timing.h"
#include "kiln/backend/backend.h"
#include "kiln/kiln.h"

namespace {

bool g_smoke = false;
kiln::Device g_sim;

// Median µs per call of `fn`, which ends by waiting for the device.
double time_us(const std::function<void()>& fn, int iters) {
  if (g_smoke) {
    fn();
    return 0;
  }
  return 1e6 * kiln::bench::median_seconds_per_call(fn, iters, 5, 2);
}

void check_equal(const char* what, const kiln::Tensor& a, const kiln::Tensor& b) {
  if (a.to_vector<float>() != b.to_vector<float>()) {
    fmt::print(stderr, "{}: compiled and eager results differ\n", what);
    std::exit(1);
  }
}

struct Row {
  std::string key;
  double eager_us, compiled_us;
  std::string unit;
};

// `chain` on n floats (BENCHMARKS.md: n = 4096); a small n leaves launches alone to compare.
Row bench_chain(std::vector<Row>& extra, int64_t n) {
  const std::string key = n == 4096 ? "chain_us_per_op" : fmt::format("chain{}_us_per_op", n);
  kiln::Tensor x0 = kiln::randn({n}).to(g_sim);
  auto chain = [](const kiln::Tensor& x) {
    kiln::Tensor y = x;
    for (int i = 0; i < 64; ++i) y = kiln::relu(y * 1.0001 + 0.0001) - 0.00005;
    return y;
  };
  kiln::CompiledFunction captured = kiln::compile(chain, {.name = "chain", .static_inputs = {0}});
  kiln::CompiledFunction steps =
      kiln::compile(chain, {.name = "chain_steps", .static_inputs = {0}, .capture = false});
  kiln::TensorList in{x0}, out, out2;
  for (int i = 0; i < 3; ++i) captured.call(in, out);
  for (int i = 0; i < 3; ++i) steps.call(in, out2);
  check_equal("chain", out.at(0), chain(x0));
  check_equal("chain (steps)", out2.at(0), chain(x0));
  double eager = time_us(
      [&] {
        chain(x0);
        kiln::synchronize(g_sim);
      },
      20);
  double graph = time_us(
      [&] {
        captured.call(in, out);
        kiln::synchronize(g_sim);
      },
      20);
  double replay = time_us(
      [&] {
        steps.call(in, out2);
        kiln::synchronize(g_sim);
      },
      20);
  if (n == 4096)
    extra.push_back({key + " (compiled, capture off)", eager / 256, replay / 256, "µs"});
  return {key, eager / 256, graph / 256, "µs"};
}

Row bench_mlp(const std::string& key, int64_t width, int64_t layers, int iters) {
  kiln::Generator gen(1);
  auto make = [&] {
    kiln::Generator g(1);
    auto m = std::make_shared<kiln::nn::Sequential>();
    for (int64_t i = 0; i < layers; ++i) {
      m->push_back(std::make_shared<kiln::nn::Linear>(width, width, true, kiln::nn::Init{&g}));
      m->push_back(std::make_shared<kiln::nn::GELU>());
    }
    m->push_back(std::make_shared<kiln::nn::Linear>(width, 10, true, kiln::nn::Init{&g}));
    m->to(g_sim);
    return m;
  };
  auto em = make(), cm = make();
  kiln::optim::AdamW eo(em->parameters(), {.lr = 1e-3}), co(cm->parameters(), {.lr = 1e-3});
  kiln::Tensor x = kiln::randn({64, width}, &gen).to(g_sim);
  kiln::Tensor y = kiln::randint(0, 10, {64}, &gen).to(g_sim);
  auto step = [](kiln::nn::Sequential& m, kiln::optim::Optimizer& o, const kiln::Tensor& x,
                 const kiln::Tensor& y) {
    o.zero_grad();
    kiln::Tensor loss = kiln::cross_entropy(m.forward(x), y);
    loss.backward();
    o.step();
    return loss.detach();
  };
  kiln::CompiledFunction c = kiln::compile(
      [&](const kiln::Tensor& a, const kiln::Tensor& b) { return step(*cm, co, a, b); },
      {.name = key, .static_inputs = {0, 1}});
  kiln::TensorList in{x, y}, out;
  for (int i = 0; i < 4; ++i) {
    kiln::Tensor want = step(*em, eo, x, y);
    c.call(in, out);
    check_equal(key.c_str(), out.at(0), want);
  }
  if (!c.entries().at(0).device_graphs) {
    fmt::print(stderr, "{}: the compiled step did not capture a device graph\n", key);
    std::exit(1);
  }
  double eager = time_us(
      [&] {
        step(*em, eo, x, y);
        kiln::synchronize(g_sim);
      },
      iters);
  double graph = time_us(
      [&] {
        c.call(in, out);
        kiln::synchronize(g_sim);
      },
      iters);
  return {key, eager, graph, "µs"};
}

int bench_main(int argc, char** argv) {
  std::string json_path;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--smoke")) {
      g_smoke = true;
    } else if (!std::strcmp(argv[i], "--json") && i + 1 < argc) {
      json_path = argv[++i];
    } else {
      fmt::print(stderr, "usage: kiln_sim_bench [--smoke] [--json FILE]\n");
      return 2;
    }
  }
  kiln::set_num_threads(1);
  kiln::load_backend("sim");
  g_sim = kiln::Device("sim");
  const char* launch = std::getenv("KILN_SIM_LAUNCH_NS");
  const char* node = std::getenv("KILN_SIM_NODE_NS");
  const double modelled = (launch ? std::atof(launch) : 5000) / (node ? std::atof(node) : 500);

  std::vector<Row> rows, extra;
  rows.push_back(bench_chain(extra, 4096));
  rows.push_back(bench_chain(extra, 16));
  rows.push_back(bench_mlp("mlp_step_width64", 64, 3, 50));
  rows.push_back(bench_mlp("mlp_step_width512", 512, 4, 5));
  rows.insert(rows.end(), extra.begin(), extra.end());
  if (g_smoke) {
    fmt::print("kiln_sim_bench: smoke run passed ({} workloads checked)\n", rows.size());
    return 0;
  }
  fmt::print("sim: {:.0f} ns per launch, {:.0f} ns per graph node: modelled ratio {:.1f}x\n",
             launch ? std::atof(launch) : 5000, node ? std::atof(node) : 500, modelled);
  fmt::print("{:<48} {:>12} {:>12} {:>8}\n", "workload", "eager", "compiled", "speed-up");
  std::string json = "{\n";
  for (const Row& r : rows) {
    fmt::print("{:<48} {:>10.2f}{} {:>10.2f}{} {:>7.2f}x\n", r.key, r.eager_us, r.unit,
               r.compiled_us, r.unit, r.eager_us / r.compiled_us);
    json += fmt::format(
        "  \"sim_{}\": {{\"eager_us\": {:.3f}, \"compiled_us\": {:.3f}, "
        "\"speedup\": {:.3f}}},\n",
        r.key.find(' ') == std::string::npos ? r.key : r.key.substr(0, r.key.find(' ')) + "_steps",
        r.eager_us, r.compiled_us, r.eager_us / r.compiled_us);
  }
  json += fmt::format("  \"sim_modelled_launch_ratio\": {:.2f}\n}}\n", modelled);
  if (!json_path.empty()) std::ofstream(json_path) << json;
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return kiln::bench::guarded_main("kiln_sim_bench", bench_main, argc, argv);
}

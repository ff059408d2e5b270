// The compiled `gpt` training step (BENCHMARKS.md's workload: vocab 512, context 128, width 256,
// 4 layers, batch 8) with its gradients all-reduced through NCCL (ReduceOp::Avg, one
// all_reduce_ per parameter, as a DDP without buckets would issue them) against the same step
// without them, both captured into CUDA graphs and replayed, in one run on one GPU. Run as a
// world of one (no launcher) it prices what the collectives cost a captured step: NCCL's
// one-rank kernels and their graph nodes (issue 14's "compiled gpt step with its all-reduces
// captured against the same step without them"). Under `mpirun -n N` with a GPU per rank it
// times the real thing.
//   build/release/kiln_nccl_gpt_bench [--iters N] [--json FILE]
// The results are checked before timing: in a world of one averaging changes nothing, so both
// steps' losses must agree bitwise and fall. The two steps are timed in alternating repeats
// (so a noisy neighbour slows both) and the medians are reported with their ratio. Exits 0
// with a note when no GPU or no NCCL is present (CI).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "bench/main_guard.h"
#include "kiln/backend/backend.h"
#include "kiln/backend/cuda/cuda.h"
#include "kiln/backend/cuda/nccl.h"
#include "kiln/compile/compile.h"
#include "kiln/distributed/distributed.h"
#include "kiln/nn/transformer.h"
#include "kiln/ops/ops.h"
#include "kiln/optim/optimizer.h"

using namespace kiln;

namespace {

constexpr int64_t kBatch = 8;

// One GPT, its optimizer, a fixed batch and its compiled training step; `all_reduce` makes the
// step average every gradient over the world before the optimizer reads it.
struct Step {
  Step(Device gpu, bool all_reduce)
      : cfg(nn::GPTConfig::bench()), gen(0), model(cfg, nn::Init{.gen = &gen}) {
    model.to(gpu);
    opt = std::make_unique<optim::AdamW>(model.parameters(), optim::AdamWOptions{.lr = 3e-4});
    idx = randint(0, cfg.vocab_size, {kBatch, cfg.context}, &gen).to(gpu);
    tgt = randint(0, cfg.vocab_size, {kBatch, cfg.context}, &gen).to(gpu);
    fn = std::make_unique<CompiledFunction>(compile(
        [this, all_reduce] {
          opt->zero_grad();
          Tensor loss = model.loss(idx, tgt);
          loss.backward();
          if (all_reduce)
            for (const Tensor& p : model.parameters())
              distributed::all_reduce_(p.grad(), distributed::ReduceOp::Avg);
          opt->step();
          return loss.detach();
        },
        {.name = all_reduce ? "gpt_step_all_reduce" : "gpt_step"}));
  }
  double run() { return (*fn)({})[0].item<double>(); }

  nn::GPTConfig cfg;
  Generator gen;
  nn::GPT model;
  std::unique_ptr<optim::AdamW> opt;
  Tensor idx, tgt;
  std::unique_ptr<CompiledFunction> fn;
};

// Seconds per call of `iters` calls of `fn`, the device synchronised at the end.
template <class F>
double seconds_per_call(Device gpu, int iters, F&& fn) {
  auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < iters; ++i) fn();
  synchronize(gpu);
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / iters;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

int bench_main(int argc, char** argv) {
  int iters = 20;
  const char* json_path = nullptr;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (std::strcmp(argv[i], "--iters") == 0) iters = std::max(1, std::atoi(argv[i + 1]));
    if (std::strcmp(argv[i], "--json") == 0) json_path = argv[i + 1];
  }
  try {
    load_backend("cuda");
  } catch (const Error& e) {
    fmt::print("kiln_nccl_gpt_bench: skipped: {}\n", e.what());
    return 0;
  }
  if (cuda::nccl_version() == 0) {
    fmt::print("kiln_nccl_gpt_bench: skipped: libkiln_cuda was built without NCCL\n");
    return 0;
  }
  distributed::world();  // after the plugin, so the world has its NCCL communicator
  const Device gpu("cuda", cuda::nccl_device());
  const bool lead = distributed::rank() == 0;

  Step plain(gpu, false), reduced(gpu, true);
  // Check first: warm-up, capture, then replays; in a world of one both steps are the same
  // arithmetic, so their losses agree bitwise, and training lowers them.
  std::vector<double> a, b;
  for (int i = 0; i < 6; ++i) {
    a.push_back(plain.run());
    b.push_back(reduced.run());
  }
  bool falls = std::isfinite(a.back()) && a.back() < a.front() && b.back() < b.front();
  bool same = distributed::world_size() > 1 || a == b;
  if (!falls || !same) {
    fmt::print(stderr,
               "kiln_nccl_gpt_bench: check failed: losses without all-reduce {}, with {} "
               "(they must fall, and agree bitwise in a world of one)\n",
               a, b);
    return 1;
  }
  const CacheEntryInfo pi = plain.fn->entries().at(0), ri = reduced.fn->entries().at(0);
  if (pi.captures < 1 || ri.captures < 1) {
    fmt::print(stderr, "kiln_nccl_gpt_bench: a step was not captured:\n{}\n{}\n",
               plain.fn->explain(), reduced.fn->explain());
    return 1;
  }

  std::vector<double> tp, tr;
  for (int r = 0; r < 7; ++r) {  // alternating, so that a slow spell slows both
    tp.push_back(seconds_per_call(gpu, iters, [&] { plain.run(); }));
    tr.push_back(seconds_per_call(gpu, iters, [&] { reduced.run(); }));
  }
  const double plain_us = median(tp) * 1e6, reduced_us = median(tr) * 1e6;
  const int64_t n_params = static_cast<int64_t>(reduced.model.parameters().size());

  nlohmann::ordered_json j;
  j["nccl_version"] = cuda::nccl_version();
  j["world_size"] = distributed::world_size();
  j["gpt_graph_us"] = plain_us;
  j["gpt_all_reduce_graph_us"] = reduced_us;
  j["gpt_all_reduce_ratio"] = reduced_us / plain_us;
  j["gpt_all_reduces_per_step"] = n_params;
  j["gpt_graph_steps"] = pi.steps;
  j["gpt_all_reduce_graph_steps"] = ri.steps;
  if (lead) {
    fmt::print("NCCL {} on {}, world of {} ({} all-reduces per step, avg, one per parameter)\n",
               cuda::nccl_version(), cuda::device_properties(gpu.index()).name,
               distributed::world_size(), n_params);
    fmt::print("  gpt step, compiled and captured:                  {:9.1f} us ({} steps)\n",
               plain_us, pi.steps);
    fmt::print("  the same with its gradients all-reduced (NCCL):   {:9.1f} us ({} steps)\n",
               reduced_us, ri.steps);
    fmt::print("  ratio: {:.3f} ({:+.1f} us per step, {:.2f} us per all-reduce)\n",
               reduced_us / plain_us, reduced_us - plain_us,
               (reduced_us - plain_us) / static_cast<double>(n_params));
    if (json_path) std::ofstream(json_path) << j.dump(2) << "\n";
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return kiln::bench::guarded_main("kiln_nccl_gpt_bench", bench_main, argc, argv);
}

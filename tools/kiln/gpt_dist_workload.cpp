#include "tools/kiln/gpt_dist_workload.h"

#include <chrono>
#include <cmath>
#include <cstdio>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include <fmt/format.h>

#include "kiln/amp/autocast.h"
#include "kiln/compile/compile.h"
#include "kiln/core/error.h"
#include "kiln/distributed/collectives.h"
#include "kiln/distributed/init.h"
#include "kiln/dtensor/device_mesh.h"
#include "kiln/dtensor/dtensor.h"
#include "kiln/nn/transformer.h"
#include "kiln/ops/ops.h"
#include "kiln/optim/optimizer.h"
#include "kiln/parallel/ddp.h"
#include "kiln/parallel/fsdp.h"
#include "kiln/parallel/tensor_parallel.h"
#include "tools/kiln/device_probe.h"
#include "tools/kiln/dist_workloads.h"

// Note [Timing the distributed GPT steps]
// The steps bench/torch_gpt_dist.py times for PyTorch, with the same model, batch and keys, so
// that one call on a machine of N GPUs runs both under the same launcher count: DDP and FSDP are
// weak-scaled (8 sequences a rank, tokens/s counted over all ranks), tensor parallelism splits
// one batch of 8 (every rank draws the same). Each rank uses the device of its local rank
// (cuda:<local rank> under --device cuda; the CPU otherwise). Before any timing the loss must
// fall over 3 steps, eager and compiled (--compiled-only: no eager model, so that no eager
// step, nor its collectives, runs before the compiled ones). Every timed call ends with a device
// synchronize and each repeat starts from a barrier (Note [Timing collectives] in
// dist_workloads.cpp), so a rank's time is its own steps' and the slowest rank sets the pace of the
// collectives. Under tensor parallelism AdamW steps DTensor and plain parameters with one optimizer
// each (an optimizer refuses a list that mixes them). What a rank keeps between steps is counted
// from its tensors (parameters, gradients, moments); a device's peak memory is not reported (the
// backends have no allocator statistics behind a common interface).
namespace kiln::workloads {

namespace {

namespace dt = kiln::dtensor;

constexpr int kRepeats = 3;
constexpr int64_t kRowsPerRank = 8;

const char* mode_name(GptParallelism m) {
  switch (m) {
    case GptParallelism::DDP:
      return "ddp";
    case GptParallelism::TP:
      return "tp";
    case GptParallelism::FSDP:
      return "fsdp";
  }
  return "?";
}

struct ParallelGpt {
  std::unique_ptr<nn::GPT> model;
  std::unique_ptr<parallel::DistributedDataParallel> ddp;
  std::vector<std::unique_ptr<optim::AdamW>> opts;
  Tensor idx, tgt;
  Device device;
  GptParallelism mode = GptParallelism::DDP;
  bool bf16 = false;
  bool no_sync = false;  // DDP's backward without its all-reduces
  int64_t vocab = 0;

  Tensor step() {
    if (ddp) {
      ddp->zero_grad();
    } else {
      model->zero_grad();
    }
    Tensor loss;
    {
      std::optional<amp::AutocastGuard> autocast;
      if (bf16) autocast.emplace(device, kBFloat16);
      if (mode == GptParallelism::TP) {
        Tensor logits = model->forward(idx);
        loss =
            parallel::loss_parallel_cross_entropy(logits.reshape({-1, vocab}), tgt.reshape({-1}));
      } else {
        loss = model->loss(idx, tgt);
      }
    }
    if (ddp && no_sync) {
      auto guard = ddp->no_sync();
      loss.backward();
    } else {
      loss.backward();
    }
    for (auto& opt : opts) opt->step();
    return (dt::is_dtensor(loss) ? dt::to_local(loss) : loss).detach();
  }
  double resident_mb() const {
    TensorList params = model->parameters(), grads, moments;
    for (const Tensor& p : params) grads.push_back(p.grad());
    for (const auto& opt : opts)
      for (const TensorList* l : {&opt->exp_avg(), &opt->exp_avg_sq()})
        moments.insert(moments.end(), l->begin(), l->end());
    return local_mb(params) + local_mb(grads) + local_mb(moments);
  }
};

std::unique_ptr<ParallelGpt> make(const nn::GPTConfig& cfg, GptParallelism mode, Device device,
                                  const Options& o, const dt::DeviceMesh* mesh) {
  auto p = std::make_unique<ParallelGpt>();
  const bool bf16 = o.amp == "bf16";
  p->no_sync = o.no_sync;
  p->device = device;
  p->mode = mode;
  p->bf16 = bf16;
  p->vocab = cfg.vocab_size;
  Generator gen(0);  // the same weights on every rank
  p->model = std::make_unique<nn::GPT>(cfg, nn::Init{.gen = &gen});
  p->model->to(device);
  const optim::AdamWOptions adamw{.lr = 3e-4};
  switch (mode) {
    case GptParallelism::DDP:
      p->ddp = std::make_unique<parallel::DistributedDataParallel>(
          *p->model, o.bucket_mb > 0
                         ? parallel::DDPOptions{.bucket_cap_bytes =
                                                    static_cast<int64_t>(o.bucket_mb * (1 << 20))}
                         : parallel::DDPOptions{});
      p->opts.push_back(std::make_unique<optim::AdamW>(p->model->parameters(), adamw));
      break;
    case GptParallelism::TP: {
      parallel::parallelize_module(*p->model, *mesh,
                                   parallel::gpt_tensor_parallel_plan(cfg, *mesh));
      TensorList dtensors, plain;
      for (const Tensor& w : p->model->parameters())
        (dt::is_dtensor(w) ? dtensors : plain).push_back(w);
      for (const TensorList* l : {&dtensors, &plain})
        if (!l->empty()) p->opts.push_back(std::make_unique<optim::AdamW>(*l, adamw));
      break;
    }
    case GptParallelism::FSDP:
      for (auto& [path, sub] : p->model->named_modules())
        if (sub->type_name() == "Block") parallel::fully_shard(*sub, *mesh, {});
      parallel::fully_shard(*p->model, *mesh, {});
      p->opts.push_back(std::make_unique<optim::AdamW>(p->model->parameters(), adamw));
      break;
  }
  const int rank = distributed::rank(), ranks = distributed::world_size();
  Generator data(1);  // one draw for all ranks; DDP and FSDP take their own rows of it
  const int64_t rows = mode == GptParallelism::TP ? kRowsPerRank : kRowsPerRank * ranks;
  Tensor idx = randint(0, cfg.vocab_size, {rows, cfg.context}, &data);
  Tensor tgt = randint(0, cfg.vocab_size, {rows, cfg.context}, &data);
  if (mode != GptParallelism::TP) {
    idx = narrow(idx, 0, rank * kRowsPerRank, kRowsPerRank);
    tgt = narrow(tgt, 0, rank * kRowsPerRank, kRowsPerRank);
  }
  p->idx = idx.contiguous().to(device);
  p->tgt = tgt.contiguous().to(device);
  return p;
}

void check_falls(const std::string& what, const std::function<Tensor()>& step,
                 const std::function<void(int)>& after_step = {}) {
  double first = step().item<double>(), last = first;
  if (after_step) after_step(1);
  for (int i = 1; i < 3; ++i) {
    last = step().item<double>();
    if (after_step) after_step(i + 1);
  }
  KILN_CHECK(std::isfinite(first) && std::isfinite(last) && last < first,
             "[bench] check failed: the {} loss went from {} to {} in 3 steps", what, first, last);
}

std::vector<Metric> gpt_parallel_on_every_rank(const Options& o, bool large, GptParallelism mode) {
  const int ranks = distributed::world_size();
  const Device device = rank_device(o.device);
  const nn::GPTConfig cfg = large ? gpt_large_config() : nn::GPTConfig::bench();
  const bool bf16 = o.amp == "bf16";
  const std::string key =
      fmt::format("{}_{}{}{}{}", large ? "gpt_large" : "gpt", mode_name(mode), bf16 ? "_bf16" : "",
                  o.bucket_mb > 0 ? fmt::format("_b{}", o.bucket_mb) : "",
                  o.no_sync ? "_nosync" : "") +
      (o.pipelined ? "_pipelined" : "");
  const dt::DeviceMesh* mesh = nullptr;
  if (mode != GptParallelism::DDP)
    mesh = &dt::init_device_mesh(device, {ranks}, {mode == GptParallelism::TP ? "tp" : "dp"});
  auto barrier = [] { distributed::barrier(); };
  const int64_t iters = o.iters > 0 ? o.iters : (large ? 3 : 10);
  const double tokens = static_cast<double>(kRowsPerRank * cfg.context) *
                        (mode == GptParallelism::TP ? 1.0 : static_cast<double>(ranks));

  // Device memory (where the backend counts it): the peak over a model's checked, warm-up and
  // timed steps, as torch_gpt_dist.py measures PyTorch's.
  auto reset_peak = [&] {
    if (counts_memory(device)) reset_peak_memory(device);
  };
  auto report_peak = [&](std::vector<Metric>& into, const std::string& name, const char* what) {
    if (std::optional<double> mb = peak_device_mb(device))
      into.push_back({key + name, *mb, "MB", what});
  };
  auto timed = [&](const std::function<void()>& fn) {
    if (o.pipelined)  // one call is `iters` steps and a synchronize
      return time_interleaved(1, kRepeats, {[&] {
                                for (int64_t i = 0; i < iters; ++i) fn();
                                synchronize(device);
                              }},
                              barrier)[0] /
             static_cast<double>(iters);
    return time_interleaved(iters, kRepeats, {[&] {
                              fn();
                              synchronize(device);
                            }},
                            barrier)[0];
  };
  const std::string what = fmt::format(
      "train step of a GPT at width {} x {} layers, {} sequences of {} a rank ({}), "
      "all ranks",
      cfg.width, cfg.layers, kRowsPerRank, cfg.context,
      mode == GptParallelism::TP ? "the same on every rank" : "each its own");
  std::vector<Metric> m = {
      {"world", static_cast<double>(ranks), "count", "ranks, one device each"}};
  double best = 0;
  std::optional<DeviceProbe> probe;
  if (o.probe) probe.emplace(device);
  auto phase = [&](const std::string& name) {
    if (probe) probe->report(name);
  };
  phase("start");
  // --probe-allreduces: what starts the slowdown the probe shows (Note [The device probe]).
  for (int64_t bytes : {int64_t{4} << 10, int64_t{12} << 20}) {
    if (o.probe_allreduces == 0) break;
    Tensor t = ones({bytes / 4}, {}, device);
    for (int64_t i = 0; i < o.probe_allreduces; ++i) {
      distributed::all_reduce_async(t, distributed::ReduceOp::Avg).wait();  // as DDP's buckets
      if (i < 3 || i + 1 == o.probe_allreduces)
        phase(fmt::format("{} all-reduce(s) of {} KiB", i + 1, bytes >> 10));
    }
  }
  if (!o.compiled_only) {
    reset_peak();
    std::unique_ptr<ParallelGpt> eager = make(cfg, mode, device, o, mesh);
    phase("eager model made");
    check_falls(
        key, [&] { return eager->step(); }, [&](int i) { phase(fmt::format("eager step {}", i)); });
    const double s = timed([&] { eager->step(); });
    phase("eager steps timed");
    m.push_back({key + "_eager_tokens_per_s", tokens / s, "tok/s", what});
    m.push_back({key + "_resident_mb", eager->resident_mb(), "MB",
                 "a rank's parameters, gradients and AdamW moments"});
    report_peak(m, "_eager_peak_mb", "the most device memory a rank held in live tensors");
    best = tokens / s;
    eager.reset();  // its memory back before the compiled model's
    phase("eager model freed");
  }
  if (has_graphs(device)) {
    synchronize(device);
    reset_peak();
    std::unique_ptr<ParallelGpt> fresh = make(cfg, mode, device, o, mesh);
    phase("compiled model made");
    CompiledFunction cf = compile([&] { return fresh->step(); }, {.name = key + "_step"});
    check_falls(key + " compiled", [&] { return cf({})[0]; });
    phase("compiled step captured");
    const double g = timed([&] { cf({}); });
    phase("compiled steps timed");
    m.push_back({key + "_graph_tokens_per_s", tokens / g, "tok/s", "the same step, compiled"});
    if (o.compiled_only)
      m.push_back({key + "_resident_mb", fresh->resident_mb(), "MB",
                   "a rank's parameters, gradients and AdamW moments"});
    // Where a compiled step's time goes: the host's part of a call (it returns before the device
    // is done, unless the host is the slower), and how the step was captured.
    double host_s = 0;
    for (int64_t i = 0; i < iters; ++i) {
      auto t0 = std::chrono::steady_clock::now();
      cf({});
      host_s += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      synchronize(device);
    }
    m.push_back({key + "_graph_host_us", host_s / static_cast<double>(iters) * 1e6, "us",
                 "the host's part of a compiled call, before its synchronize (mean)"});
    const CacheEntryInfo info = cf.entries().at(0);  // entries() returns a copy
    if (o.explain && distributed::rank() == 0)
      fmt::print(stderr, "{}\n{}\n", cf.explain(), cf.steps_str());
    m.push_back({key + "_graph_segments", static_cast<double>(info.segments), "count",
                 "device graphs a compiled call launches"});
    m.push_back({key + "_graph_comm_stream_steps", static_cast<double>(info.comm_stream_steps),
                 "count", "collectives on the communication stream"});
    report_peak(m, "_graph_peak_mb", "the same for the compiled step (its graphs' memory too)");
    best = std::max(best, tokens / g);
  }
  m.push_back({key + "_best_tokens_per_s", best, "tok/s", "the better of the two"});
  m.push_back({key + "_best_tokens_per_s_per_gpu", best / ranks, "tok/s", "that / the ranks"});
  return m;
}

}  // namespace

std::vector<Metric> gpt_parallel(const Options& o, bool large, GptParallelism mode) {
  KILN_CHECK(o.iters >= 0, "[bench] --iters must not be negative, got {}", o.iters);
  KILN_CHECK(o.amp.empty() || o.amp == "bf16", "[bench] --amp must be bf16, got '{}'", o.amp);
  distributed::init();
  return on_every_rank([&] { return gpt_parallel_on_every_rank(o, large, mode); });
}

}  // namespace kiln::workloads

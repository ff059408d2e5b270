#include "tools/kiln/tp_workload.h"

#include <cmath>
#include <functional>
#include <memory>

#include <fmt/format.h>

#include "kiln/compile/compile.h"
#include "kiln/core/error.h"
#include "kiln/distributed/collectives.h"
#include "kiln/distributed/init.h"
#include "kiln/dtensor/device_mesh.h"
#include "kiln/dtensor/dtensor.h"
#include "kiln/nn/transformer.h"
#include "kiln/ops/ops.h"
#include "kiln/optim/optimizer.h"
#include "kiln/parallel/tensor_parallel.h"
#include "tools/kiln/dist_workloads.h"

// Note [Timing the tensor-parallel step]
// Both steps run on every rank at once, as `kiln bench ddp` times its local step: the
// single-process step is what one rank of this machine does while its neighbours do the same,
// so the two share the cores, memory bandwidth and caches alike, and the ratio is the speed-up
// tensor parallelism buys on this host (its ideal is the world size). The two are interleaved
// repeat by repeat from a barrier (Note [Timing collectives] in dist_workloads.cpp). The models
// start from the same weights and every rank draws the same batch, so before timing the first
// tensor-parallel loss must equal the single-process one, and both must fall. AdamW steps the
// tensor-parallel model's DTensor and plain parameters with one optimizer each (an optimizer
// refuses a list that mixes them); no gradient clipping.
namespace kiln::workloads {

namespace {

namespace dt = kiln::dtensor;

constexpr int kRepeats = 6;  // a multiple of 2: each step leads equally often
constexpr int64_t kBatch = 8;

struct Steps {
  nn::GPTConfig cfg = nn::GPTConfig::bench();
  std::unique_ptr<nn::GPT> local_model, tp_model;
  std::unique_ptr<optim::AdamW> local_opt, tp_dtensor_opt, tp_plain_opt;
  Tensor idx, tgt;

  explicit Steps(const dt::DeviceMesh& mesh) {
    auto make = [&] {
      Generator gen(0);
      return std::make_unique<nn::GPT>(cfg, nn::Init{.gen = &gen});
    };
    local_model = make();
    tp_model = make();
    parallel::parallelize_module(*tp_model, mesh, parallel::gpt_tensor_parallel_plan(cfg, mesh));
    local_opt =
        std::make_unique<optim::AdamW>(local_model->parameters(), optim::AdamWOptions{.lr = 3e-4});
    TensorList dtensors, plain;
    for (const Tensor& p : tp_model->parameters())
      (dt::is_dtensor(p) ? dtensors : plain).push_back(p);
    tp_dtensor_opt = std::make_unique<optim::AdamW>(dtensors, optim::AdamWOptions{.lr = 3e-4});
    tp_plain_opt = std::make_unique<optim::AdamW>(plain, optim::AdamWOptions{.lr = 3e-4});
    Generator data(1);  // the same batch on every rank
    idx = randint(0, cfg.vocab_size, {kBatch, cfg.context}, &data);
    tgt = randint(0, cfg.vocab_size, {kBatch, cfg.context}, &data);
  }
  Tensor local() {
    local_opt->zero_grad();
    Tensor loss = local_model->loss(idx, tgt);
    loss.backward();
    local_opt->step();
    return loss.detach();
  }
  Tensor tp() {
    tp_model->zero_grad();
    Tensor logits = tp_model->forward(idx);
    Tensor loss = parallel::loss_parallel_cross_entropy(logits.reshape({-1, cfg.vocab_size}),
                                                        tgt.reshape({-1}));
    loss.backward();
    tp_dtensor_opt->step();
    tp_plain_opt->step();
    return dt::to_local(loss).detach();
  }
};

// Runs `step` 3 times: the loss must stay finite and fall. Returns the first loss.
double check_falls(const char* what, const std::function<Tensor()>& step) {
  double first = step().item<double>(), last = first;
  for (int i = 1; i < 3; ++i) last = step().item<double>();
  KILN_CHECK(std::isfinite(first) && std::isfinite(last) && last < first,
             "[bench tp] check failed: the {} loss went from {} to {} in 3 steps", what, first,
             last);
  return first;
}

void check_equal(const char* what, double local, double tp) {
  KILN_CHECK(std::abs(local - tp) <= 1e-4 * std::abs(local),
             "[bench tp] check failed: the first {} loss is {} under tensor parallel, {} in one "
             "process",
             what, tp, local);
}

std::vector<Metric> tp_on_every_rank(const Options& o) {
  const int ranks = distributed::world_size();
  const int64_t iters = o.iters > 0 ? o.iters : 2;
  const auto& mesh = dt::init_device_mesh(Device(kCPU), {ranks}, {"tp"});
  auto barrier = [] { distributed::barrier(); };

  Steps eager(mesh);
  check_equal("eager", check_falls("local", [&] { return eager.local(); }),
              check_falls("tensor-parallel", [&] { return eager.tp(); }));
  std::vector<double> s =
      time_interleaved(iters, kRepeats, {[&] { eager.local(); }, [&] { eager.tp(); }}, barrier);

  Steps fresh(mesh);
  CompiledFunction local_c = compile([&] { return fresh.local(); }, {.name = "local_gpt_step"});
  CompiledFunction tp_c = compile([&] { return fresh.tp(); }, {.name = "tp_gpt_step"});
  check_equal("compiled", check_falls("compiled local", [&] { return local_c({})[0]; }),
              check_falls("compiled tensor-parallel", [&] { return tp_c({})[0]; }));
  std::vector<double> c =
      time_interleaved(iters, kRepeats, {[&] { local_c({}); }, [&] { tp_c({}); }}, barrier);

  const nn::GPTConfig& cfg = eager.cfg;
  const std::string what = fmt::format("GPT width {} x {} layers, {} heads, batch {} x {}",
                                       cfg.width, cfg.layers, cfg.heads, kBatch, cfg.context);
  return {
      {"world", static_cast<double>(ranks), "count", "ranks (the tensor-parallel mesh)"},
      {"threads", static_cast<double>(get_num_threads()), "count", "OpenMP threads a rank"},
      {"gpt_step_local_us", s[0] * 1e6, "us",
       "train step of the " + what + ", one process (all ranks at once)"},
      {"gpt_step_tp_us", s[1] * 1e6, "us", "the same step, tensor parallel over the ranks"},
      {"tp_speedup", s[0] / s[1], "x", "local / tp"},
      {"tp_ideal_speedup", static_cast<double>(ranks), "x", "the world size"},
      {"gpt_step_local_compiled_us", c[0] * 1e6, "us", "the local step, compiled"},
      {"gpt_step_tp_compiled_us", c[1] * 1e6, "us", "the tensor-parallel step, compiled"},
      {"tp_compiled_speedup", c[0] / c[1], "x", "compiled local / compiled tp"},
  };
}

}  // namespace

std::vector<Metric> tp(const Options& o) {
  KILN_CHECK_DEVICE(o.device.is_cpu(), "[bench tp] times cpu tensors only, not {}", o.device);
  KILN_CHECK(o.iters >= 0, "[bench] --iters must be positive, got {}", o.iters);
  distributed::init();
  return on_every_rank([&] { return tp_on_every_rank(o); });
}

}  // namespace kiln::workloads

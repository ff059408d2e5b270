#include "tools/kiln/fsdp_workload.h"

#include <cmath>
#include <functional>
#include <memory>

#include <fmt/format.h>

#include "kiln/core/error.h"
#include "kiln/core/storage.h"
#include "kiln/distributed/collectives.h"
#include "kiln/distributed/flight_recorder.h"
#include "kiln/distributed/init.h"
#include "kiln/dtensor/device_mesh.h"
#include "kiln/dtensor/dtensor.h"
#include "kiln/nn/transformer.h"
#include "kiln/ops/ops.h"
#include "kiln/optim/optimizer.h"
#include "kiln/parallel/ddp.h"
#include "kiln/parallel/fsdp.h"
#include "tools/kiln/dist_workloads.h"

// Note [Timing the FSDP step]
// Four models from the same weights train on the same data, each rank on its own rows of the
// batch: under DistributedDataParallel (every rank holds everything), under fully_shard with
// every Block a unit and the GPT the root, resharding after forward (the default), the same
// keeping the gathered parameters until backward, and the first with bfloat16 gathers and
// float32 reduce-scatters (MixedPrecisionPolicy). Before timing, the first losses must agree
// (the bfloat16 one within 2e-2) and fall over 3 steps; one step of each FSDP model counts the
// bytes its all-gathers and reduce-scatters take in (the flight recorder's entries). The steps are
// interleaved repeat by repeat from a barrier (Note [Timing collectives] in dist_workloads.cpp);
// then one more step of each is measured for its peak CPU memory beyond what was allocated before
// it (begin_cpu_peak): activations, gathered parameters, gradients and the optimizer's temporaries.
namespace kiln::workloads {

namespace {

namespace dt = kiln::dtensor;

constexpr int kRepeats = 6;
constexpr int64_t kRowsPerRank = 2;

std::unique_ptr<nn::GPT> make_gpt(const nn::GPTConfig& cfg) {
  Generator gen(0);
  return std::make_unique<nn::GPT>(cfg, nn::Init{.gen = &gen});
}

struct Model {
  std::unique_ptr<nn::GPT> gpt;
  std::unique_ptr<parallel::DistributedDataParallel> ddp;
  std::unique_ptr<optim::AdamW> opt;
};

Model ddp_model(const nn::GPTConfig& cfg) {
  Model m{make_gpt(cfg), nullptr, nullptr};
  m.ddp = std::make_unique<parallel::DistributedDataParallel>(*m.gpt);
  m.opt = std::make_unique<optim::AdamW>(m.gpt->parameters(), optim::AdamWOptions{.lr = 3e-4});
  return m;
}

Model fsdp_model(const nn::GPTConfig& cfg, const dt::DeviceMesh& mesh, bool reshard,
                 bool bf16 = false) {
  Model m{make_gpt(cfg), nullptr, nullptr};
  const std::optional<DType> bf16_or_none =
      bf16 ? std::optional<DType>(kBFloat16) : std::optional<DType>();
  parallel::MixedPrecisionPolicy mp{
      .param_dtype = bf16_or_none,
      .reduce_dtype = bf16 ? std::optional<DType>(kFloat32) : std::optional<DType>()};
  for (auto& [path, sub] : m.gpt->named_modules())
    if (sub->type_name() == "Block")
      parallel::fully_shard(*sub, mesh, {.reshard_after_forward = reshard, .mp = mp});
  mp.output_dtype = kFloat32;  // the loss in float32
  parallel::fully_shard(*m.gpt, mesh, {.mp = mp});
  m.opt = std::make_unique<optim::AdamW>(m.gpt->parameters(), optim::AdamWOptions{.lr = 3e-4});
  return m;
}

// What a rank keeps between steps: parameters, gradients and AdamW's moments (local bytes).
double resident_mb(const Model& m) {
  TensorList grads;
  for (const Tensor& p : m.gpt->parameters()) grads.push_back(p.grad());
  return local_mb(m.gpt->parameters()) + local_mb(grads) + local_mb(m.opt->exp_avg()) +
         local_mb(m.opt->exp_avg_sq());
}

std::vector<Metric> fsdp_on_every_rank(const Options& o) {
  const int ranks = distributed::world_size(), rank = distributed::rank();
  const int64_t iters = o.iters > 0 ? o.iters : 3;
  const nn::GPTConfig cfg = nn::GPTConfig::bench();
  const auto& mesh = dt::init_device_mesh(Device(kCPU), {ranks}, {"dp"});
  Generator data(1);  // the same batch on every rank; each takes its rows
  const int64_t rows = kRowsPerRank * ranks;
  Tensor idx = randint(0, cfg.vocab_size, {rows, cfg.context}, &data);
  Tensor tgt = randint(0, cfg.vocab_size, {rows, cfg.context}, &data);
  idx = narrow(idx, 0, rank * kRowsPerRank, kRowsPerRank).contiguous();
  tgt = narrow(tgt, 0, rank * kRowsPerRank, kRowsPerRank).contiguous();

  Model models[] = {ddp_model(cfg), fsdp_model(cfg, mesh, true), fsdp_model(cfg, mesh, false),
                    fsdp_model(cfg, mesh, true, true)};
  const char* names[] = {"ddp", "fsdp", "fsdp_keep", "fsdp_bf16"};
  auto step = [&](Model& m) {
    m.opt->zero_grad();
    Tensor loss = m.gpt->loss(idx, tgt);
    loss.backward();
    m.opt->step();
    Tensor l = loss.detach();
    return ranks == 1 ? l : distributed::all_reduce(l, distributed::ReduceOp::Avg);
  };
  double first[4];
  for (int k = 0; k < 4; ++k) {
    double f = step(models[k]).item<double>(), last = f;
    for (int i = 1; i < 3; ++i) last = step(models[k]).item<double>();
    KILN_CHECK(std::isfinite(f) && std::isfinite(last) && last < f,
               "[bench fsdp] check failed: the {} loss went from {} to {} in 3 steps", names[k], f,
               last);
    first[k] = f;
  }
  for (int k = 1; k < 4; ++k)
    KILN_CHECK(std::abs(first[k] - first[0]) <= (k == 3 ? 2e-2 : 1e-4) * std::abs(first[0]),
               "[bench fsdp] check failed: the first {} loss is {}, under DDP {}", names[k],
               first[k], first[0]);
  std::vector<double> s = time_interleaved(iters, kRepeats,
                                           {[&] { step(models[0]); }, [&] { step(models[1]); },
                                            [&] { step(models[2]); }, [&] { step(models[3]); }},
                                           [] { distributed::barrier(); });
  // Bytes the FSDP step's collectives take in: each all-gather's shard, each reduce-scatter's
  // whole buffer (16-bit reductions widen to float32 inside MPI on the CPU; not counted).
  double gather_mb[4] = {}, scatter_mb[4] = {};
  for (int k = 1; k < 4; k += 2) {
    auto& fr = distributed::FlightRecorder::get();
    const auto before = fr.entries();
    const double mark = before.empty() ? -1.0 : before.back().started_s;
    step(models[k]);
    for (const auto& e : fr.entries()) {
      if (e.started_s <= mark) continue;
      const double mb = static_cast<double>(e.numel) * static_cast<double>(itemsize(e.dtype)) / 1e6;
      if (e.op.find("all_gather") != std::string::npos) gather_mb[k] += mb;
      if (e.op.find("reduce_scatter") != std::string::npos) scatter_mb[k] += mb;
    }
  }
  double peak[4];
  for (int k = 0; k < 4; ++k) {
    distributed::barrier();
    begin_cpu_peak();
    step(models[k]);
    peak[k] = static_cast<double>(end_cpu_peak()) / 1e6;
  }
  double resident[4];
  for (int k = 0; k < 4; ++k) resident[k] = resident_mb(models[k]);
  const std::string what = fmt::format("GPT width {} x {} layers, batch {} x {} per rank",
                                       cfg.width, cfg.layers, kRowsPerRank, cfg.context);
  return {
      {"world", static_cast<double>(ranks), "count", "ranks (the data-parallel mesh)"},
      {"threads", static_cast<double>(get_num_threads()), "count", "OpenMP threads a rank"},
      {"gpt_step_ddp_us", s[0] * 1e6, "us", "train step of the " + what + ", DDP"},
      {"gpt_step_fsdp_us", s[1] * 1e6, "us", "the same step, FSDP resharding after forward"},
      {"gpt_step_fsdp_keep_us", s[2] * 1e6, "us", "FSDP keeping the gathered parameters"},
      {"gpt_step_fsdp_bf16_us", s[3] * 1e6, "us",
       "FSDP with bfloat16 gathers and compute, float32 reduce-scatters"},
      {"fsdp_vs_ddp", s[1] / s[0], "x", "fsdp / ddp time"},
      {"fsdp_bf16_vs_fsdp", s[3] / s[1], "x", "fsdp_bf16 / fsdp time"},
      {"all_gather_fsdp_mb", gather_mb[1], "MB", "all-gather input bytes a rank sends a step"},
      {"all_gather_fsdp_bf16_mb", gather_mb[3], "MB", "the same with bfloat16 gathers"},
      {"reduce_scatter_fsdp_mb", scatter_mb[1], "MB", "reduce-scatter input bytes a step"},
      {"reduce_scatter_fsdp_bf16_mb", scatter_mb[3], "MB", "the same, bfloat16 gathers"},
      {"resident_ddp_mb", resident[0], "MB",
       "parameters, gradients and AdamW moments a rank keeps, DDP"},
      {"resident_fsdp_mb", resident[1], "MB", "the same under FSDP"},
      {"step_extra_ddp_mb", peak[0], "MB", "peak CPU memory one DDP step adds to that"},
      {"step_extra_fsdp_mb", peak[1], "MB", "one FSDP step, resharding after forward"},
      {"step_extra_fsdp_keep_mb", peak[2], "MB", "one FSDP step, keeping"},
      {"step_extra_fsdp_bf16_mb", peak[3], "MB", "one FSDP step, bfloat16 gathers"},
      {"peak_ddp_mb", resident[0] + peak[0], "MB", "resident + step, DDP"},
      {"peak_fsdp_mb", resident[1] + peak[1], "MB", "resident + step, FSDP"},
      {"peak_fsdp_keep_mb", resident[2] + peak[2], "MB", "resident + step, FSDP keeping"},
      {"peak_fsdp_bf16_mb", resident[3] + peak[3], "MB", "resident + step, FSDP bfloat16"},
  };
}

}  // namespace

std::vector<Metric> fsdp(const Options& o) {
  KILN_CHECK_DEVICE(o.device.is_cpu(), "[bench fsdp] times cpu tensors only, not {}", o.device);
  KILN_CHECK(o.iters >= 0, "[bench] --iters must be positive, got {}", o.iters);
  distributed::init();
  return on_every_rank([&] { return fsdp_on_every_rank(o); });
}

}  // namespace kiln::workloads

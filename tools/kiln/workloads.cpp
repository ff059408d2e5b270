#include "tools/kiln/workloads.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <optional>

#include "kiln/amp/autocast.h"
#include "kiln/compile/compile.h"
#include "kiln/core/error.h"
#include "kiln/nn/transformer.h"
#include "kiln/ops/ops.h"
#include "kiln/optim/optimizer.h"
#include "tools/kiln/cnn_workload.h"
#include "tools/kiln/dist_workloads.h"
#include "tools/kiln/dtensor_workload.h"
#include "tools/kiln/fsdp_workload.h"
#include "tools/kiln/gpt_dist_workload.h"
#include "tools/kiln/tp_workload.h"

namespace kiln::workloads {

namespace {

// Median over `repeats` runs of the seconds per call of `iters` calls to fn, after `warm`
// untimed calls. The median, as torch_anchor.py takes, shrugs off a noisy neighbour.
// On an asynchronous device each repeat ends when the device has finished its work.
template <class F>
double seconds_per_call(int64_t iters, int repeats, int64_t warm, F&& fn,
                        Device device = Device(kCPU)) {
  for (int64_t i = 0; i < warm; ++i) fn();
  synchronize(device);
  std::vector<double> runs;
  for (int r = 0; r < repeats; ++r) {
    auto t0 = std::chrono::steady_clock::now();
    for (int64_t i = 0; i < iters; ++i) fn();
    synchronize(device);
    std::chrono::duration<double> dt = std::chrono::steady_clock::now() - t0;
    runs.push_back(dt.count() / static_cast<double>(iters));
  }
  std::sort(runs.begin(), runs.end());
  return runs[runs.size() / 2];
}

int64_t iters_or(const Options& o, int64_t default_iters) {
  KILN_CHECK(o.iters >= 0, "[bench] --iters must be positive, got {}", o.iters);
  return o.iters > 0 ? o.iters : default_iters;
}

// Runs `step` (which returns a loss) a few times: the loss must stay finite and fall.
template <class F>
void check_loss_falls(const char* name, int steps, F&& step) {
  double first = step().template item<double>(), last = first;
  for (int i = 1; i < steps; ++i) last = step().template item<double>();
  KILN_CHECK(std::isfinite(first) && std::isfinite(last) && last < first,
             "[bench {}] check failed: the loss went from {} to {} in {} steps", name, first, last,
             steps);
}

constexpr int64_t kDispatchIters = 20000, kChainIters = 200, kAdamWIters = 20, kMlpIters = 20,
                  kGptIters = 3;

// The compiled step's size: its steps (kernels per replay), and with KILN_BENCH_STEPS set the
// step list on stderr (to see which kernels a replay runs).
Metric steps_of(const CompiledFunction& cf, const std::string& key) {
  if (std::getenv("KILN_BENCH_STEPS")) fmt::print(stderr, "{}", cf.steps_str());
  return {key, static_cast<double>(cf.entries().at(0).steps), "count", "kernels per replay"};
}

std::vector<Metric> dispatch(const Options& o) {
  KILN_CHECK_DEVICE(o.device.is_cpu(), "[bench dispatch] times cpu tensors only, not {}", o.device);
  int64_t iters = iters_or(o, kDispatchIters);
  Tensor a = ones({1}), b = ones({1});
  float sum = add(a, b).item<float>();
  KILN_CHECK(sum == 2.0f, "[bench dispatch] check failed: 1 + 1 gave {}", sum);
  KILN_CHECK(a.view({1}).data_ptr() == a.data_ptr() && a.detach().data_ptr() == a.data_ptr(),
             "[bench dispatch] check failed: view/detach did not share storage");
  int64_t warm = std::min<int64_t>(iters, 1000);
  double add_s = seconds_per_call(iters, 5, warm, [&] { add(a, b); });
  double view_s = seconds_per_call(iters, 5, warm, [&] { a.view({1}); });
  double detach_s = seconds_per_call(iters, 5, warm, [&] { a.detach(); });
  return {{"cpu_add_1elem_us", add_s * 1e6, "us", "add of two 1-element tensors"},
          {"cpu_view_us", view_s * 1e6, "us", "view of a 1-element tensor"},
          {"cpu_detach_us", detach_s * 1e6, "us", "detach of a 1-element tensor"}};
}

constexpr int kChainOps = 256;

Tensor chain(Tensor x) {
  for (int i = 0; i < kChainOps / 4; ++i) {
    x = mul(x, 1.0001);
    x = add(x, 0.0001);
    x = relu(x);
    x = sub(x, 0.00005);
  }
  return x;
}

std::vector<Metric> chain_workload(const Options& o) {
  int64_t iters = iters_or(o, kChainIters);
  Generator gen(0);
  Tensor x0 = randn({4096}, &gen).to(o.device);
  std::vector<float> ref = x0.to_vector<float>();
  for (float& v : ref)
    for (int i = 0; i < kChainOps / 4; ++i) v = std::max(v * 1.0001f + 0.0001f, 0.0f) - 0.00005f;
  KILN_CHECK(allclose(chain(x0), from_vector(ref), 1e-5, 1e-6),
             "[bench chain] check failed: the result differs from a host loop");
  double s = seconds_per_call(
      iters, 5, std::min<int64_t>(iters, 5), [&] { chain(x0); }, o.device);
  std::vector<Metric> m = {{"chain_eager_us_per_op", s / kChainOps * 1e6, "us/op",
                            "one op of the 256-op chain on 4096 floats"}};
  if (has_graphs(o.device)) {
    CompiledFunction cf =
        compile([](const Tensor& x) { return chain(x); }, {.name = "chain", .static_inputs = {0}});
    KILN_CHECK(allclose(cf({x0})[0], from_vector(ref).to(o.device), 1e-5, 1e-6),
               "[bench chain] check failed: the compiled chain differs from a host loop");
    double g = seconds_per_call(
        iters, 5, 5, [&] { cf({x0}); }, o.device);
    m.push_back({"chain_graph_us_per_op", g / kChainOps * 1e6, "us/op",
                 "the same, compiled: one captured graph"});
  }
  return m;
}

std::vector<Metric> adamw(const Options& o) {
  int64_t iters = iters_or(o, kAdamWIters);
  Generator gen(0);
  TensorList params;
  int64_t n = 0;
  for (int64_t i = 0; i < 128; ++i) {
    Tensor p = randn({64 + (i % 8) * 32, 128}, &gen).to(o.device);
    p.requires_grad_();
    p.set_grad(randn(p.sizes(), &gen).to(o.device));
    params.push_back(p);
    n += p.numel();
  }
  optim::AdamWOptions opts;  // PyTorch's defaults, as torch_anchor.py uses
  optim::AdamW opt(params, opts);
  // The first step against the closed form: m_hat = g and v_hat = g^2, so the update is
  // lr * g / (|g| + eps) after decay by (1 - lr * wd).
  std::vector<float> p0 = params[0].to_vector<float>(), g0 = params[0].grad().to_vector<float>();
  opt.step();
  std::vector<float> p1 = params[0].to_vector<float>();
  for (size_t j = 0; j < p0.size(); ++j) {
    double want =
        p0[j] * (1 - opts.lr * opts.weight_decay) - opts.lr * g0[j] / (std::abs(g0[j]) + opts.eps);
    KILN_CHECK(std::abs(p1[j] - want) <= 1e-6 + 1e-5 * std::abs(want),
               "[bench adamw] check failed: element {} is {} after one step, expected {}", j, p1[j],
               want);
  }
  double s = seconds_per_call(
      iters, 5, std::min<int64_t>(iters, 3), [&] { opt.step(); }, o.device);
  std::vector<Metric> m = {
      {"adamw_params", static_cast<double>(n), "count", "parameters updated per step"},
      {"adamw_fused_us", s * 1e6, "us", "fused AdamW step (foreach_adamw_)"}};
  if (has_graphs(o.device)) {
    CompiledFunction cf = compile(
        [&]() {
          opt.step();
          return TensorList{};
        },
        {.name = "adamw_step"});
    double g = seconds_per_call(
        iters, 5, 5, [&] { cf({}); }, o.device);
    m.push_back({"adamw_fused_graph_us", g * 1e6, "us", "the same, compiled: a captured graph"});
  }
  return m;
}

std::vector<Metric> mlp(const Options& o) {
  int64_t iters = iters_or(o, kMlpIters);
  Generator gen(0);
  nn::Init init{.gen = &gen};
  nn::Sequential model;
  for (int i = 0; i < 4; ++i) {
    model.push_back(std::make_shared<nn::Linear>(512, 512, true, init));
    model.push_back(std::make_shared<nn::GELU>());
  }
  model.push_back(std::make_shared<nn::Linear>(512, 10, true, init));
  model.to(o.device);
  optim::AdamW opt(model.parameters(), optim::AdamWOptions{});
  Tensor x = randn({64, 512}, &gen).to(o.device), y = randint(0, 10, {64}, &gen).to(o.device);
  auto step = [&] {
    opt.zero_grad();
    Tensor loss = cross_entropy(model(x), y);
    loss.backward();
    opt.step();
    return loss;
  };
  // Both checks come before any timing: a long timed run (--iters) fits these 64 samples to a
  // loss of 0, after which no loss can fall.
  check_loss_falls("mlp", 5, step);
  std::optional<CompiledFunction> cf;
  if (has_graphs(o.device)) {
    cf.emplace(compile([&] { return step().detach(); }, {.name = "mlp_step"}));
    check_loss_falls("mlp compiled", 5, [&] { return (*cf)({})[0]; });
  }
  double s = seconds_per_call(iters, 3, 0, step, o.device);
  std::vector<Metric> m = {{"mlp_eager_us", s * 1e6, "us", "train step, 4x512 MLP, batch 64"}};
  if (cf) {
    double g = seconds_per_call(
        iters, 3, 3, [&] { (*cf)({}); }, o.device);
    m.push_back({"mlp_graph_us", g * 1e6, "us", "the same step, compiled: a captured graph"});
    m.push_back(steps_of(*cf, "mlp_graph_steps"));
  }
  return m;
}

// A GPT training step of `cfg` on batch x cfg.context tokens, eager and (on a device with
// graphs) compiled; keys start with `name`.
std::vector<Metric> gpt_step(const Options& o, const nn::GPTConfig& cfg, int64_t batch,
                             const std::string& base_name, int64_t default_iters) {
  int64_t iters = iters_or(o, default_iters);
  KILN_CHECK(o.amp.empty() || o.amp == "bf16", "[bench] --amp must be bf16, got '{}'", o.amp);
  const std::string name = o.amp.empty() ? base_name : base_name + "_" + o.amp;
  const int64_t T = cfg.context;
  Generator gen(0);
  nn::GPT model(cfg, nn::Init{.gen = &gen});
  model.to(o.device);
  optim::AdamW opt(model.parameters(), {.lr = 3e-4});
  Tensor idx = randint(0, cfg.vocab_size, {batch, T}, &gen).to(o.device);
  Tensor tgt = randint(0, cfg.vocab_size, {batch, T}, &gen).to(o.device);
  auto step = [&] {
    opt.zero_grad();
    Tensor loss;
    {
      std::optional<amp::AutocastGuard> autocast;
      if (!o.amp.empty()) autocast.emplace(o.device, kBFloat16);
      loss = model.loss(idx, tgt);
    }
    loss.backward();
    opt.step();
    return loss;
  };
  // Both checks before any timing, as in mlp.
  check_loss_falls(name.c_str(), 3, step);
  std::optional<CompiledFunction> cf;
  if (has_graphs(o.device)) {
    cf.emplace(compile([&] { return step().detach(); }, {.name = name + "_step"}));
    check_loss_falls((name + " compiled").c_str(), 3, [&] { return (*cf)({})[0]; });
  }
  const double tokens = static_cast<double>(batch * T);
  double s = seconds_per_call(iters, 1, 0, step, o.device);
  std::vector<Metric> m = {
      {name + "_eager_us", s * 1e6, "us",
       fmt::format("train step, GPT width {} x {} layers, batch {} x {}", cfg.width, cfg.layers,
                   batch, T)},
      {name + "_eager_tokens_per_s", tokens / s, "tok/s", "the same, in tokens per second"},
      {name + "_width", static_cast<double>(cfg.width), "count", "model width"},
      {name + "_params", static_cast<double>(model.num_parameters()), "count", "parameters"}};
  if (cf) {
    double g = seconds_per_call(
        iters, 3, 3, [&] { (*cf)({}); }, o.device);
    m.push_back({name + "_graph_us", g * 1e6, "us", "the same step, compiled: a captured graph"});
    m.push_back({name + "_graph_tokens_per_s", tokens / g, "tok/s", "compiled, tokens per second"});
    m.push_back(steps_of(*cf, name + "_graph_steps"));
  }
  return m;
}

std::vector<Metric> gpt(const Options& o) {
  nn::GPTConfig cfg = nn::GPTConfig::bench();
  if (o.small) cfg.width = 128;
  // A shrunk model reports under its own keys: it must never pass for the anchor's workload.
  return gpt_step(o, cfg, 8, o.small ? "gpt_small" : "gpt", kGptIters);
}

// Compute-bound: width 768, 12 layers, 12 heads, context 1024, batch 8 (issue 6's size).
std::vector<Metric> gpt_large(const Options& o) {
  return gpt_step(o, gpt_large_config(), 8, "gpt_large", 3);
}

}  // namespace

const std::vector<Workload>& all() {
  static const std::vector<Workload> list = {
      {"dispatch", "add/view/detach of 1-element cpu tensors: pure host cost", kDispatchIters,
       dispatch},
      {"chain", "256 elementwise ops on 4096 floats: per-op overhead", kChainIters, chain_workload},
      {"adamw", "AdamW step over 128 params (2.88 M values)", kAdamWIters, adamw},
      {"mlp", "train step of 4x(Linear 512, GELU) + Linear 512->10, batch 64", kMlpIters, mlp},
      {"gpt", "train step of the bench GPT (vocab 512, ctx 128, width 256, 4 layers)", kGptIters,
       gpt},
      {"gpt_large", "train step of a GPT at width 768, 12 layers, ctx 1024, batch 8", 3, gpt_large},
      // dist_workloads.h: run on N ranks with scripts/mpirun.sh N.
      {"allreduce", "float32 all_reduce at 4 KB..64 MB against bare MPI_Allreduce (mpirun)", 200,
       [](const Options& o) { return allreduce(o); }},
      {"ddp", "the mlp step under DistributedDataParallel against one process (mpirun)", 10, ddp},
      {"dtensor", "add/mm/detach/relu/sum on 64x64 DTensors against plain tensors (mpirun)", 2000,
       dtensor},
      {"tp", "the bench GPT's step, tensor parallel over the ranks against one process (mpirun)", 2,
       tp},
      {"fsdp", "the bench GPT's step under fully_shard against DDP, each rank its rows (mpirun)", 3,
       fsdp},
      // gpt_dist_workload.h: issue 18's steps, one device a rank (mpirun), as
      // bench/torch_gpt_dist.py times PyTorch's.
      {"gpt_ddp", "the gpt step under DDP, 8 sequences a rank (mpirun)", 10,
       [](const Options& o) { return gpt_parallel(o, false, GptParallelism::DDP); }},
      {"gpt_tp", "the gpt step, tensor parallel over the ranks (mpirun)", 10,
       [](const Options& o) { return gpt_parallel(o, false, GptParallelism::TP); }},
      {"gpt_fsdp", "the gpt step under fully_shard, 8 sequences a rank (mpirun)", 10,
       [](const Options& o) { return gpt_parallel(o, false, GptParallelism::FSDP); }},
      {"gpt_large_ddp", "the gpt_large step under DDP, 8 sequences a rank (mpirun)", 3,
       [](const Options& o) { return gpt_parallel(o, true, GptParallelism::DDP); }},
      {"gpt_large_tp", "the gpt_large step, tensor parallel over the ranks (mpirun)", 3,
       [](const Options& o) { return gpt_parallel(o, true, GptParallelism::TP); }},
      {"gpt_large_fsdp", "the gpt_large step under fully_shard, 8 sequences a rank (mpirun)", 3,
       [](const Options& o) { return gpt_parallel(o, true, GptParallelism::FSDP); }},
      // cnn_workload.h
      {"conv", "conv2d forward and forward+backward at ResNet-50's shapes", 5, conv},
      {"cnn", "train step of nn::CNN (kiln train --model cnn), batch 64 of 28x28 images", 10, cnn},
  };
  return list;
}

bool has_graphs(Device d) {
  DeviceInterface* i = d.is_cpu() ? nullptr : device_interface(d.type());
  return i && i->caps().graphs;
}

bool has_streams(Device d) { return !d.is_cpu() && !d.is_meta(); }

nn::GPTConfig gpt_large_config() {
  return {.vocab_size = 512, .context = 1024, .width = 768, .layers = 12, .heads = 12};
}

double time_per_call(int64_t iters, int repeats, int64_t warm, const std::function<void()>& fn,
                     Device device) {
  return seconds_per_call(iters, repeats, warm, fn, device);
}

const Workload* find(const std::string& name) {
  for (const Workload& w : all())
    if (w.name == name) return &w;
  return nullptr;
}

}  // namespace kiln::workloads

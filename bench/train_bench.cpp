// Kiln against libtorch C++ on whole training workloads of BENCHMARKS.md, in one run: the
// `adamw` step (128 parameters, 2.88 M values), the `mlp` train step (4 x Linear 512 + GELU,
// batch 64) and a narrow variant where host overhead dominates (3 x Linear 64), and the `gpt`
// train step (GPTConfig::bench(); --gpt-width shrinks it for quick runs), and the `cnn` train
// step (kiln::nn::CNN, batch 64 of 28x28 images; issue 16's target: 1.2x libtorch's speed). Both
// sides start from the same weights and inputs; each workload checks that the first losses agree
// before timing. Both run on the same number of threads (--threads, default 1). --smoke runs each
// workload's check only. --only NAME runs one workload (adamw, mlp, cnn or gpt). Kiln and
// libtorch are timed in alternation (Note [Interleaved timing] in bench/timing.h); a row's ratio
// is the median of the rounds' ratios, printed with their range. --json FILE writes the numbers.
// --flush-denormal flushes denormal floats to zero on both sides (torch.set_flush_denormal and
// kiln::set_flush_denormal): the mlp workloads fit their 64 samples and then run mostly on denormal
// gradients without it.
#include <omp.h>
#include <torch/torch.h>

#include <chrono>
#include <cstring>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include "bench/main_guard.h"
#include "bench/timing.h"
#include "kiln/kiln.h"

namespace {

bool g_smoke = false;

torch::Tensor to_torch(const kiln::Tensor& t) {
  std::vector<float> v = t.to(kiln::kFloat32).to_vector<float>();
  std::vector<int64_t> sizes(t.sizes().begin(), t.sizes().end());
  torch::Tensor out = torch::from_blob(v.data(), sizes, torch::kFloat).clone();
  return t.dtype() == kiln::kInt64 ? out.to(torch::kLong) : out;
}

void check_close(const char* what, double kiln_v, double torch_v, double tol) {
  if (std::abs(kiln_v - torch_v) > tol * (1 + std::abs(torch_v))) {
    fmt::print(stderr, "{}: Kiln gives {}, libtorch {}\n", what, kiln_v, torch_v);
    std::exit(1);
  }
}

// Copies Kiln's parameters into a libtorch module with the same parameter names.
void copy_params(const kiln::nn::Module& from, torch::nn::Module& to) {
  torch::NoGradGuard no_grad;
  auto named = to.named_parameters();
  for (const auto& [name, t] : from.named_parameters()) {
    torch::Tensor* dst = named.find(name);
    if (!dst) {
      fmt::print(stderr, "libtorch model has no parameter {}\n", name);
      std::exit(1);
    }
    dst->copy_(to_torch(t));
  }
}

struct Row {
  std::string key;
  double kiln_us;
  double torch_us;
  double target;  // kiln / libtorch time ratio to meet
  // The median over rounds of kiln / libtorch and the rounds' range (Note [Interleaved timing]
  // in bench/timing.h); not kiln_us / torch_us, which are medians taken apart.
  double ratio = 0, ratio_min = 0, ratio_max = 0;
};

// ---------------------------------------------------------------- adamw
Row bench_adamw() {
  kiln::TensorList kp;
  std::vector<torch::Tensor> tp;
  for (int i = 0; i < 128; ++i) {
    kiln::Tensor p = kiln::randn({64 + (i % 8) * 32, 128}).requires_grad_();
    p.set_grad(kiln::randn(p.sizes()));
    torch::Tensor q = to_torch(p).requires_grad_();
    q.mutable_grad() = to_torch(p.grad());
    kp.push_back(p);
    tp.push_back(q);
  }
  kiln::optim::AdamW kopt(kp, {.lr = 1e-3, .weight_decay = 1e-2});
  torch::optim::AdamW topt(tp, torch::optim::AdamWOptions(1e-3).weight_decay(1e-2));
  kopt.step();
  topt.step();
  check_close("adamw", kiln::sum(kp[5].to(kiln::kFloat64)).item<double>(),
              tp[5].sum().item<double>(), 1e-5);
  if (g_smoke) return {"adamw_step", 0, 0, 1};
  const kiln::bench::Interleaved t = kiln::bench::interleaved_seconds_per_call(
      {[&] { topt.step(); }, [&] { kopt.step(); }}, 20, 5, 2);
  return {"adamw_step",  1e6 * t.seconds_per_call[1], 1e6 * t.seconds_per_call[0],
          0.67,          t.ratio_to_first[1],         t.ratio_min[1],
          t.ratio_max[1]};
}

// ---------------------------------------------------------------- mlp
struct TorchMLP : torch::nn::Module {
  TorchMLP(int64_t width, int64_t layers, int64_t out) {
    for (int64_t i = 0; i < layers; ++i)
      hidden.push_back(register_module(std::to_string(2 * i), torch::nn::Linear(width, width)));
    head = register_module(std::to_string(2 * layers), torch::nn::Linear(width, out));
  }
  torch::Tensor forward(torch::Tensor x) {
    for (auto& l : hidden) x = torch::gelu(l->forward(x));
    return head->forward(x);
  }
  std::vector<torch::nn::Linear> hidden;
  torch::nn::Linear head{nullptr};
};

// The compiled form of a Kiln step: the same step traced once and replayed. Checks that it
// keeps computing the losses libtorch computes, then times it.
struct Compiled {
  kiln::CompiledFunction fn;
  kiln::TensorList in, out;
  double step(const std::function<double()>& torch_step, const char* what) {
    fn.call(in, out);
    double k = out.at(0).item<double>();
    check_close(what, k, torch_step(), 1e-4);
    return k;
  }
};

kiln::CacheEntryInfo g_gpt_compile;
double g_gpt_eager_us = 0;

// How a classifier's step is checked and timed (classifier_rows).
struct StepBench {
  int iters, rounds;
  double tol, target, compiled_target;
};

// Times libtorch's step, Kiln's compiled step and Kiln's eager step in alternation (Note
// [Interleaved timing] in bench/timing.h). Pushes the compiled row; returns the eager one.
Row timed_rows(std::vector<Row>& rows, const std::string& key, const std::function<void()>& tstep,
               Compiled& c, const std::function<void()>& kstep, const StepBench& b) {
  const kiln::bench::Interleaved t = kiln::bench::interleaved_seconds_per_call(
      {tstep, [&] { c.fn.call(c.in, c.out); }, kstep}, b.iters, b.rounds, 2);
  const double torch_us = 1e6 * t.seconds_per_call[0];
  rows.push_back({key + "_compiled", 1e6 * t.seconds_per_call[1], torch_us, b.compiled_target,
                  t.ratio_to_first[1], t.ratio_min[1], t.ratio_max[1]});
  return {key,           1e6 * t.seconds_per_call[2], torch_us,
          b.target,      t.ratio_to_first[2],         t.ratio_min[2],
          t.ratio_max[2]};
}

// A classifier's training step (zero_grad, forward, cross-entropy, backward, AdamW lr 1e-3) in
// Kiln, eager and compiled, and in libtorch, from the same weights and batch: the first losses
// must agree within `tol`, then the three are timed in alternation (Note [Interleaved timing]).
// Pushes the compiled row; returns the eager one.
template <class TorchModel>
Row classifier_rows(std::vector<Row>& rows, const std::string& key, kiln::nn::UnaryModule& kmodel,
                    const std::shared_ptr<TorchModel>& tmodel, const kiln::Tensor& kx,
                    const kiln::Tensor& ky, const StepBench& b) {
  copy_params(kmodel, *tmodel);
  torch::Tensor tx = to_torch(kx), ty = to_torch(ky);
  kiln::optim::AdamW kopt(kmodel.parameters(), {.lr = 1e-3});
  torch::optim::AdamW topt(tmodel->parameters(), torch::optim::AdamWOptions(1e-3));
  auto kstep_on = [&](const kiln::Tensor& x, const kiln::Tensor& y) -> kiln::Tensor {
    kopt.zero_grad();
    kiln::Tensor loss = kiln::cross_entropy(kmodel(x), y);
    loss.backward();
    kopt.step();
    return loss.detach();
  };
  auto kstep = [&]() -> kiln::Tensor { return kstep_on(kx, ky); };
  auto tstep = [&]() -> torch::Tensor {
    topt.zero_grad();
    torch::Tensor loss = torch::cross_entropy_loss(tmodel->forward(tx), ty);
    loss.backward();
    topt.step();
    return loss;
  };
  for (int i = 0; i < 3; ++i)
    check_close(key.c_str(), kstep().template item<double>(), tstep().template item<double>(),
                b.tol);
  Compiled c{
      kiln::compile([&](const kiln::Tensor& x, const kiln::Tensor& y) { return kstep_on(x, y); },
                    {.name = key}),
      {kx, ky},
      {}};
  for (int i = 0; i < 3; ++i)
    c.step([&] { return tstep().template item<double>(); }, (key + " compiled").c_str());
  if (g_smoke) {
    rows.push_back({key + "_compiled", 0, 0, b.compiled_target});
    return {key, 0, 0, b.target};
  }
  return timed_rows(rows, key, tstep, c, kstep, b);
}

Row bench_mlp(std::vector<Row>& rows, const std::string& key, int64_t width, int64_t layers,
              int iters, double target, double compiled_target) {
  kiln::Generator gen(1);
  kiln::nn::Sequential kmodel;
  for (int64_t i = 0; i < layers; ++i) {
    kmodel.push_back(std::make_shared<kiln::nn::Linear>(width, width, true, kiln::nn::Init{&gen}));
    kmodel.push_back(std::make_shared<kiln::nn::GELU>());
  }
  kmodel.push_back(std::make_shared<kiln::nn::Linear>(width, 10, true, kiln::nn::Init{&gen}));
  auto tmodel = std::make_shared<TorchMLP>(width, layers, 10);
  kiln::Tensor kx = kiln::randn({64, width}, &gen), ky = kiln::randint(0, 10, {64}, &gen);
  return classifier_rows(rows, key, kmodel, tmodel, kx, ky,
                         {iters, 5, 1e-4, target, compiled_target});
}

// ---------------------------------------------------------------- gpt
// The same GPT-2 block structure as kiln::nn::GPT, with nanoGPT's parameter names.
struct TorchBlock : torch::nn::Module {
  TorchBlock(int64_t c, int64_t heads) : heads(heads) {
    ln_1 = register_module("ln_1", torch::nn::LayerNorm(torch::nn::LayerNormOptions({c})));
    attn = register_module("attn", std::make_shared<torch::nn::Module>());
    c_attn = attn->register_module("c_attn", torch::nn::Linear(c, 3 * c));
    attn_proj = attn->register_module("c_proj", torch::nn::Linear(c, c));
    ln_2 = register_module("ln_2", torch::nn::LayerNorm(torch::nn::LayerNormOptions({c})));
    mlp = register_module("mlp", std::make_shared<torch::nn::Module>());
    c_fc = mlp->register_module("c_fc", torch::nn::Linear(c, 4 * c));
    mlp_proj = mlp->register_module("c_proj", torch::nn::Linear(4 * c, c));
  }
  torch::Tensor forward(torch::Tensor x) {
    int64_t b = x.size(0), t = x.size(1), c = x.size(2), d = c / heads;
    auto qkv = c_attn->forward(ln_1->forward(x)).split(c, 2);
    auto heads_first = [&](const torch::Tensor& y) {
      return y.view({b, t, heads, d}).transpose(1, 2);
    };
    torch::Tensor q = heads_first(qkv[0]), k = heads_first(qkv[1]), v = heads_first(qkv[2]);
    torch::Tensor att = torch::matmul(q, k.transpose(-2, -1)) / std::sqrt(static_cast<double>(d));
    torch::Tensor mask = torch::ones({t, t}, torch::kBool).tril();
    att = torch::softmax(att.masked_fill(mask.logical_not(), -INFINITY), -1);
    torch::Tensor y = torch::matmul(att, v).transpose(1, 2).contiguous().view({b, t, c});
    x = x + attn_proj->forward(y);
    return x +
           mlp_proj->forward(torch::gelu(c_fc->forward(ln_2->forward(x)), /*approximate=*/"tanh"));
  }
  int64_t heads;
  torch::nn::LayerNorm ln_1{nullptr}, ln_2{nullptr};
  std::shared_ptr<torch::nn::Module> attn, mlp;
  torch::nn::Linear c_attn{nullptr}, attn_proj{nullptr}, c_fc{nullptr}, mlp_proj{nullptr};
};

struct TorchGPT : torch::nn::Module {
  explicit TorchGPT(const kiln::nn::GPTConfig& cfg) : vocab(cfg.vocab_size) {
    auto tr = register_module("transformer", std::make_shared<torch::nn::Module>());
    wte = tr->register_module("wte", torch::nn::Embedding(cfg.vocab_size, cfg.width));
    wpe = tr->register_module("wpe", torch::nn::Embedding(cfg.context, cfg.width));
    auto h = tr->register_module("h", std::make_shared<torch::nn::Module>());
    for (int64_t i = 0; i < cfg.layers; ++i)
      blocks.push_back(h->register_module(std::to_string(i),
                                          std::make_shared<TorchBlock>(cfg.width, cfg.heads)));
    ln_f =
        tr->register_module("ln_f", torch::nn::LayerNorm(torch::nn::LayerNormOptions({cfg.width})));
  }
  torch::Tensor loss(const torch::Tensor& idx, const torch::Tensor& targets) {
    torch::Tensor x = wte->forward(idx) + wpe->forward(torch::arange(idx.size(1)));
    for (auto& b : blocks) x = b->forward(x);
    torch::Tensor logits = torch::matmul(ln_f->forward(x), wte->weight.t());
    return torch::cross_entropy_loss(logits.reshape({-1, vocab}), targets.reshape({-1}));
  }
  int64_t vocab;
  torch::nn::Embedding wte{nullptr}, wpe{nullptr};
  std::vector<std::shared_ptr<TorchBlock>> blocks;
  torch::nn::LayerNorm ln_f{nullptr};
};

Row bench_gpt(std::vector<Row>& rows, int64_t width, int iters) {
  kiln::nn::GPTConfig cfg = kiln::nn::GPTConfig::bench();
  cfg.width = width;
  kiln::Generator gen(2);
  kiln::nn::GPT kmodel(cfg, {&gen});
  auto tmodel = std::make_shared<TorchGPT>(cfg);
  copy_params(kmodel, *tmodel);
  kiln::Tensor kx = kiln::randint(0, cfg.vocab_size, {8, cfg.context}, &gen);
  kiln::Tensor ky = kiln::randint(0, cfg.vocab_size, {8, cfg.context}, &gen);
  torch::Tensor tx = to_torch(kx), ty = to_torch(ky);
  kiln::optim::AdamW kopt(kmodel.parameters(), {.lr = 1e-3});
  torch::optim::AdamW topt(tmodel->parameters(), torch::optim::AdamWOptions(1e-3));
  auto kstep_on = [&](const kiln::Tensor& x, const kiln::Tensor& y) {
    kopt.zero_grad();
    kiln::Tensor loss = kmodel.loss(x, y);
    loss.backward();
    kopt.step();
    return loss.detach();
  };
  auto kstep = [&] { return kstep_on(kx, ky); };
  auto tstep = [&] {
    topt.zero_grad();
    torch::Tensor loss = tmodel->loss(tx, ty);
    loss.backward();
    topt.step();
    return loss;
  };
  for (int i = 0; i < 2; ++i)
    check_close("gpt", kstep().item<double>(), tstep().item<double>(), 1e-4);
  std::string key = fmt::format("gpt_step_width{}", width);
  Compiled c{
      kiln::compile([&](const kiln::Tensor& x, const kiln::Tensor& y) { return kstep_on(x, y); },
                    {.name = key}),
      {kx, ky},
      {}};
  for (int i = 0; i < 2; ++i)
    c.step([&] { return tstep().item<double>(); }, (key + " compiled").c_str());
  g_gpt_compile = c.fn.entries().at(0);
  if (g_smoke) {
    rows.push_back({key + "_compiled", 0, 0, 1.1});
    return {key, 0, 0, 1.1};
  }
  Row eager = timed_rows(rows, key, tstep, c, kstep, {iters, 5, 0, 1.1, 1.1});
  g_gpt_eager_us = eager.kiln_us;
  return eager;
}

// ---------------------------------------------------------------- cnn
// kiln::nn::CNN (the `kiln train --model cnn` network: conv-BN-ReLU-maxpool x2, Linear 128,
// dropout 0, Linear 10) and the same network in torch::nn, batch 64 of 28x28 images, AdamW.
struct TorchCNN : torch::nn::Module {
  explicit TorchCNN(const kiln::nn::CNNConfig& c) {
    namespace tn = torch::nn;
    tn::Sequential f, h;
    int64_t in = c.in_channels, side = c.image_size;
    for (int64_t out : c.channels) {
      f->push_back(tn::Conv2d(tn::Conv2dOptions(in, out, 3).padding(1).bias(false)));
      f->push_back(tn::BatchNorm2d(out));
      f->push_back(tn::ReLU());
      f->push_back(tn::MaxPool2d(2));
      in = out;
      side /= 2;
    }
    h->push_back(tn::Flatten());
    h->push_back(tn::Linear(in * side * side, c.hidden));
    h->push_back(tn::ReLU());
    h->push_back(tn::Dropout(c.dropout));
    h->push_back(tn::Linear(c.hidden, c.classes));
    features = register_module("features", f);
    classifier = register_module("classifier", h);
  }
  torch::Tensor forward(const torch::Tensor& x) {
    return classifier->forward(features->forward(x));
  }
  torch::nn::Sequential features{nullptr}, classifier{nullptr};
};

Row bench_cnn(std::vector<Row>& rows, int iters) {
  kiln::nn::CNNConfig cfg;
  cfg.dropout = 0;  // the same step on both sides (no masks to match)
  kiln::Generator gen(3);
  kiln::nn::CNN kmodel(cfg, {&gen});
  auto tmodel = std::make_shared<TorchCNN>(cfg);
  kiln::Tensor kx = kiln::randn({64, 1, 28, 28}, &gen), ky = kiln::randint(0, 10, {64}, &gen);
  return classifier_rows(rows, "cnn_step_batch64", kmodel, tmodel, kx, ky,
                         {iters, 7, 1e-3, 1 / 1.2, 1 / 1.2});
}

int bench_main(int argc, char** argv) {
  std::string json_path;
  int threads = 1;
  int64_t gpt_width = 256;
  bool flush_denormal = false;
  std::string only;  // one workload, for quick measurements
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--smoke"))
      g_smoke = true;
    else if (!std::strcmp(argv[i], "--json") && i + 1 < argc)
      json_path = argv[++i];
    else if (!std::strcmp(argv[i], "--threads") && i + 1 < argc)
      threads = std::atoi(argv[++i]);
    else if (!std::strcmp(argv[i], "--gpt-width") && i + 1 < argc)
      gpt_width = std::atoll(argv[++i]);
    else if (!std::strcmp(argv[i], "--flush-denormal"))
      flush_denormal = true;
    else if (!std::strcmp(argv[i], "--only") && i + 1 < argc)
      only = argv[++i];
    else {
      fmt::print(stderr,
                 "usage: kiln_train_bench [--smoke] [--json FILE] [--threads N] [--gpt-width W] "
                 "[--flush-denormal] [--only adamw|mlp|cnn|gpt]\n");
      return 2;
    }
  }
  if (!only.empty() && only != "adamw" && only != "mlp" && only != "cnn" && only != "gpt") {
    fmt::print(stderr, "kiln_train_bench: --only takes adamw, mlp, cnn or gpt, got '{}'\n", only);
    return 2;
  }
  torch::set_num_threads(threads);
  omp_set_num_threads(threads);
  if (flush_denormal) {  // both sides, after the thread counts (Note [Flushing denormals])
    at::globalContext().setFlushDenormal(true);
    kiln::set_flush_denormal(true);
  }
  auto wanted = [&](const char* workload) { return only.empty() || only == workload; };
  std::vector<Row> rows;
  if (wanted("adamw")) rows.push_back(bench_adamw());
  // bench_* push their compiled rows first, then return the eager row.
  auto add = [&](std::vector<Row> compiled, Row eager) {
    rows.push_back(eager);
    rows.insert(rows.end(), compiled.begin(), compiled.end());
  };
  if (wanted("mlp")) {
    std::vector<Row> c;
    Row e = bench_mlp(c, "mlp_step_width512", 512, 4, 20, 1.1, 1.1);
    add(c, e);
  }
  if (wanted("mlp")) {
    std::vector<Row> c;
    Row e = bench_mlp(c, "mlp_step_width64", 64, 3, 200, 0.67, 1.0 / 3);
    add(c, e);
  }
  if (wanted("cnn")) {
    std::vector<Row> c;
    Row e = bench_cnn(c, 5);
    add(c, e);
  }
  if (g_smoke) gpt_width = 32;
  if (wanted("gpt")) {
    std::vector<Row> c;
    Row e = bench_gpt(c, gpt_width, 2);
    add(c, e);
  }
  if (g_smoke) {
    fmt::print("kiln_train_bench: smoke run passed ({} workloads checked)\n", rows.size());
    return 0;
  }
  fmt::print("{} thread(s)\n{:<27} {:>10} {:>12} {:>7} {:>13} {:>8}\n", threads, "workload",
             "kiln us", "libtorch us", "ratio", "rounds", "target");
  std::string json = "{\n";
  for (size_t i = 0; i < rows.size(); ++i) {
    const Row& r = rows[i];
    const double ratio = r.ratio;
    fmt::print("{:<27} {:>10.1f} {:>12.1f} {:>7.3f} {:>6.3f}-{:<6.3f} {:>5}{:.2f}{}\n", r.key,
               r.kiln_us, r.torch_us, ratio, r.ratio_min, r.ratio_max, "<=", r.target,
               ratio <= r.target ? "" : "  (missed)");
    json += fmt::format(
        "  \"{}\": {{\"kiln_us\": {:.1f}, \"libtorch_us\": {:.1f}, \"ratio\": {:.4f}}},\n", r.key,
        r.kiln_us, r.torch_us, ratio);
  }
  if (wanted("gpt")) {
    // Compiling = the traced call (the real step, plus recording) and the lowering; what it
    // costs beyond running the step once eagerly is what compile adds.
    const double beyond = g_gpt_compile.compile_ms - g_gpt_eager_us / 1e3;
    fmt::print(
        "compiling the gpt step: {:.1f} ms = traced call {:.1f} ms + lowering {:.1f} ms; beyond "
        "one eager step ({:.1f} ms): {:.1f} ms (target <= 200 ms){}\n",
        g_gpt_compile.compile_ms, g_gpt_compile.trace_ms, g_gpt_compile.lower_ms,
        g_gpt_eager_us / 1e3, beyond, beyond <= 200 ? "" : "  (missed)");
    json += fmt::format(
        "  \"gpt_compile_ms\": {:.1f},\n  \"gpt_compile_lower_ms\": {:.1f},\n  "
        "\"gpt_compile_beyond_eager_ms\": {:.1f},\n",
        g_gpt_compile.compile_ms, g_gpt_compile.lower_ms, beyond);
  }
  json += fmt::format("  \"threads\": {}\n}}\n", threads);
  if (!json_path.empty()) std::ofstream(json_path) << json;
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return kiln::bench::guarded_main("kiln_train_bench", bench_main, argc, argv);
}

// `kiln train`: a byte-level GPT on a text corpus, AdamW with warm-up and cosine decay,
// periodic evaluation, and a safetensors checkpoint at the end.
#include <cmath>
#include <filesystem>
#include <optional>

#include <fmt/format.h>

#include "kiln/autograd/grad_mode.h"
#include "kiln/compile/compile.h"
#include "kiln/core/error.h"
#include "kiln/nn/transformer.h"
#include "kiln/optim/optimizer.h"
#include "kiln/profiler/profiler.h"
#include "tools/kiln/checkpoint.h"
#include "tools/kiln/commands.h"
#include "tools/kiln/data.h"
#include "tools/kiln/progress.h"

namespace kiln::tool {

namespace {

constexpr double kTrainFraction = 0.9;
constexpr int64_t kEvalBatches = 4;
constexpr double kWeightDecay = 0.1;
constexpr double kClipNorm = 1.0;

struct Losses {
  double train, val;
};

nn::GPTConfig config_named(const std::string& name) {
  if (name == "tiny") return nn::GPTConfig::tiny(kByteVocab);
  if (name == "small") return nn::GPTConfig::small(kByteVocab);
  KILN_THROW(Value, "[train] unknown --config '{}' (expected tiny or small)", name);
}

// Mean loss over the same kEvalBatches batches of each split at every evaluation (a fixed
// generator), so successive evaluations compare like with like.
Losses evaluate(nn::GPT& model, const Corpus& corpus, int64_t batch, int64_t seq, uint64_t seed,
                Device device) {
  autograd::NoGradGuard no_grad;
  model.eval();
  auto mean_loss = [&](const std::vector<int64_t>& tokens) {
    Generator gen(seed);
    double total = 0;
    for (int64_t i = 0; i < kEvalBatches; ++i) {
      auto [x, y] = sample_batch(tokens, batch, seq, gen);
      total += model.loss(x.to(device), y.to(device)).item<double>();
    }
    return total / kEvalBatches;
  };
  Losses l{mean_loss(corpus.train), mean_loss(corpus.val)};
  model.train();
  return l;
}

void validate(const TrainOptions& o, const nn::GPTConfig& cfg) {
  KILN_CHECK(o.steps > 0, "[train] --steps must be positive, got {}", o.steps);
  KILN_CHECK(o.batch > 0, "[train] --batch must be positive, got {}", o.batch);
  KILN_CHECK(o.seq > 0 && o.seq <= cfg.context,
             "[train] --seq must be in [1, {}] (the context of --config {}), got {}", cfg.context,
             o.config, o.seq);
  KILN_CHECK(o.lr > 0 && std::isfinite(o.lr), "[train] --lr must be positive, got {}", o.lr);
  KILN_CHECK(o.eval_every >= 0, "[train] --eval-every must be >= 0, got {}", o.eval_every);
  KILN_CHECK(!o.out.empty() && !std::filesystem::is_directory(o.out),
             "[train] --out must name a file, got '{}'", o.out);
  auto dir = std::filesystem::absolute(o.out).parent_path();
  KILN_CHECK(std::filesystem::is_directory(dir),
             "[train] cannot write --out '{}': directory '{}' does not exist", o.out, dir.string());
  if (!o.profile.empty()) {
    auto pdir = std::filesystem::absolute(o.profile).parent_path();
    KILN_CHECK(std::filesystem::is_directory(pdir) && !std::filesystem::is_directory(o.profile),
               "[train] cannot write --profile '{}': directory '{}' does not exist", o.profile,
               pdir.string());
  }
}

}  // namespace

int run_train(const TrainOptions& o) {
  const Common common = apply_common(o.common);
  const int threads = common.threads;
  const Device device = common.device;
  nn::GPTConfig cfg = config_named(o.config);
  validate(o, cfg);

  std::string path = o.data.empty() ? kDefaultCorpus : o.data;
  std::vector<int64_t> tokens = encode_bytes(read_text_file(path));
  Corpus corpus = split_corpus(tokens, kTrainFraction, o.seq);

  Generator gen(o.seed);
  nn::GPT model(cfg, nn::Init{.gen = &gen});
  model.to(device);  // initialised on the cpu: the same weights on every device
  // Weight decay on matrices and embeddings only, as GPT-2 and nanoGPT do: decaying gains
  // and biases towards zero only hurts.
  TensorList decay, no_decay;
  for (const Tensor& p : model.parameters()) (p.dim() >= 2 ? decay : no_decay).push_back(p);
  optim::AdamW opt_decay(decay, {.lr = o.lr, .weight_decay = kWeightDecay});
  optim::AdamW opt_no_decay(no_decay, {.lr = o.lr, .weight_decay = 0.0});
  TensorList params = model.parameters();
  optim::WarmupCosineLR schedule{o.lr, o.lr / 10, std::max<int64_t>(1, o.steps / 10), o.steps};

  fmt::print("kiln train: GPT {} ({} parameters: width {}, {} layers, {} heads, context {})\n",
             o.config, model.num_parameters(), cfg.width, cfg.layers, cfg.heads, cfg.context);
  fmt::print(
      "corpus {} ({} bytes: {} train, {} val), batch {} x {} tokens, {} steps, lr {}, "
      "seed {}, threads {}, device {}\n",
      path, tokens.size(), corpus.train.size(), corpus.val.size(), o.batch, o.seq, o.steps, o.lr,
      o.seed, threads, device);
  std::fflush(stdout);

  // One training step; compiled, it is traced once and replayed (kiln::compile). The learning
  // rates are set outside it: they live in the optimizers' lr tensors.
  auto train_step = [&](const Tensor& x, const Tensor& y) {
    model.zero_grad();
    Tensor loss = model.loss(x, y);
    loss.backward();
    optim::clip_grad_norm_(params, kClipNorm);
    opt_decay.step();
    opt_no_decay.step();
    return loss.detach();
  };
  std::optional<CompiledFunction> compiled;
  if (o.compile)
    compiled.emplace(compile(train_step, {.name = "train_step", .input_names = {"x", "y"}}));
  std::optional<profiler::Session> profile;
  if (!o.profile.empty()) profile.emplace();

  Progress progress(o.steps, o.batch * o.seq, stdout_is_tty());
  const uint64_t eval_seed = o.seed + 1;
  auto report = [&](int64_t step) {
    Losses l = evaluate(model, corpus, o.batch, o.seq, eval_seed, device);
    progress.print_line(
        fmt::format("step {}: train loss {:.4f}, val loss {:.4f}", step, l.train, l.val));
    return l;
  };
  for (int64_t step = 0; step < o.steps; ++step) {
    opt_decay.set_lr(schedule(step));
    opt_no_decay.set_lr(schedule(step));
    auto [hx, hy] = sample_batch(corpus.train, o.batch, o.seq, gen);
    Tensor x = hx.to(device), y = hy.to(device);
    Tensor loss = compiled ? (*compiled)({x, y}).at(0) : train_step(x, y);
    double l = loss.item<double>();
    KILN_CHECK(std::isfinite(l), "[train] the loss became {} at step {} (try a lower --lr)", l,
               step + 1);
    progress.update(step + 1, l);
    if (o.eval_every > 0 && (step + 1) % o.eval_every == 0 && step + 1 < o.steps) report(step + 1);
  }
  double seconds = progress.elapsed_s(), tok_s = progress.tokens_per_s();
  Losses final = report(o.steps);
  progress.finish();

  if (compiled) {
    CacheEntryInfo e = compiled->entries().at(0);
    fmt::print(
        "compile: {} cache entr{}, {} replays, {} eager (warm-up) calls; compiled in {:.1f} ms "
        "({} steps per replay, intermediates {:.1f} MiB planned{}){}\n",
        compiled->entries().size(), compiled->entries().size() == 1 ? "y" : "ies", e.hits,
        compiled->eager_calls(), e.compile_ms, e.steps, e.arena_bytes / 1048576.0,
        // The eager peak is measured for cpu memory only.
        device.is_cpu() ? fmt::format(" vs {:.1f} MiB eager peak", e.eager_peak_bytes / 1048576.0)
                        : "",
        e.device_graphs ? fmt::format("; replayed as a device graph (captured {} time{})",
                                      e.captures, e.captures == 1 ? "" : "s")
                        : "");
  }
  if (profile) {
    profile->save_chrome_trace(o.profile);
    fmt::print("profile: {} ({} events; open it in https://ui.perfetto.dev)\n", o.profile,
               profile->events().size());
  }
  save_checkpoint(model, o.config, o.steps, o.out);
  fmt::print(
      "done: {} steps in {:.1f} s ({:.0f} tokens/s); final train loss {:.4f}, val loss "
      "{:.4f}\ncheckpoint: {}\n",
      o.steps, seconds, tok_s, final.train, final.val, o.out);
  return 0;
}

}  // namespace kiln::tool

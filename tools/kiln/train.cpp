// `kiln train`: a byte-level GPT on a text corpus, AdamW with warm-up and cosine decay,
// periodic evaluation, a safetensors checkpoint at the end (and every --save-every steps),
// and --resume from one.
#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <map>
#include <optional>

#include <fmt/format.h>

#include "kiln/amp/autocast.h"
#include "kiln/amp/grad_scaler.h"
#include "kiln/autograd/grad_mode.h"
#include "kiln/compile/compile.h"
#include "kiln/core/error.h"
#include "kiln/distributed/distributed.h"
#include "kiln/dtensor/device_mesh.h"
#include "kiln/dtensor/dtensor.h"
#include "kiln/nn/transformer.h"
#include "kiln/ops/ops.h"
#include "kiln/optim/optimizer.h"
#include "kiln/parallel/ddp.h"
#include "kiln/parallel/fsdp.h"
#include "kiln/parallel/tensor_parallel.h"
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
// Note [Compiled steps and the optimizers' step counts]
// Optimizer::steps() counts step() calls on the host, and a compiled step's replays make
// none, so with --compile it stops at the eager (tracing and warm-up) calls. Every step here
// updates every parameter once, so the true count is the training step: checkpoints store
// that, which makes a compiled run's checkpoint the same file as an eager run's, and a
// resumed run's the same as an uninterrupted one's. (AdamW's bias correction reads its
// per-parameter device counts, which replays do advance: they are saved as they are.)

using LossFn = std::function<Tensor(const Tensor&, const Tensor&)>;

// A loss as a plain tensor: a DTensor's (replicated) local value.
Tensor plain(const Tensor& t) { return dtensor::is_dtensor(t) ? dtensor::to_local(t) : t; }

Losses evaluate(nn::GPT& model, const LossFn& loss_of, const Corpus& corpus, int64_t batch,
                int64_t seq, uint64_t seed, Device device) {
  autograd::NoGradGuard no_grad;
  model.eval();
  auto mean_loss = [&](const std::vector<int64_t>& tokens) {
    Generator gen(seed);
    double total = 0;
    for (int64_t i = 0; i < kEvalBatches; ++i) {
      auto [x, y] = sample_batch(tokens, batch, seq, gen);
      total += plain(loss_of(x.to(device), y.to(device))).item<double>();
    }
    return total / kEvalBatches;
  };
  Losses l{mean_loss(corpus.train), mean_loss(corpus.val)};
  model.train();
  return l;
}

void validate(const TrainOptions& o, const nn::GPTConfig& cfg) {
  KILN_CHECK(o.amp.empty() || o.amp == "bf16" || o.amp == "fp16",
             "[train] --amp must be bf16 or fp16, got '{}'", o.amp);
  KILN_CHECK(o.steps > 0, "[train] --steps must be positive, got {}", o.steps);
  KILN_CHECK(o.batch > 0, "[train] --batch must be positive, got {}", o.batch);
  KILN_CHECK(o.seq > 0 && o.seq <= cfg.context,
             "[train] --seq must be in [1, {}] (the context of --config {}), got {}", cfg.context,
             o.config, o.seq);
  KILN_CHECK(o.lr > 0 && std::isfinite(o.lr), "[train] --lr must be positive, got {}", o.lr);
  KILN_CHECK(o.eval_every >= 0, "[train] --eval-every must be >= 0, got {}", o.eval_every);
  KILN_CHECK(!o.save_every || *o.save_every > 0, "[train] --save-every must be positive, got {}",
             o.save_every.value_or(0));
  KILN_CHECK(!o.stop_after || (*o.stop_after > 0 && *o.stop_after <= o.steps),
             "[train] --stop-after must be in [1, {}] (--steps), got {}", o.steps,
             o.stop_after.value_or(0));
  check_writable(o.out, "--out");
  if (!o.profile.empty()) check_writable(o.profile, "--profile");
}

// The options a resumed run must share with the stopped one (TrainState::run): everything
// that decides the model, the batches and the learning rate at each step.
std::map<std::string, std::string> run_options(const TrainOptions& o, const std::string& text) {
  return {{"--config", o.config},
          {"--steps", std::to_string(o.steps)},
          {"--batch", std::to_string(o.batch)},
          {"--seq", std::to_string(o.seq)},
          {"--lr", fmt::format("{}", o.lr)},  // the shortest text that reads back exactly
          {"--seed", std::to_string(o.seed)},
          {"corpus", fingerprint(text)}};
}

// Loads --resume's checkpoint and checks that it is a step of this run, naming every option
// that differs.
Checkpoint load_resume(const TrainOptions& o, const std::map<std::string, std::string>& run) {
  Checkpoint ck = load_checkpoint(o.resume);
  KILN_CHECK(ck.train.has_value(),
             "[train] cannot --resume from '{}': it holds no training state (written by a kiln "
             "train without --resume support)",
             o.resume);
  std::vector<std::string> differ;
  for (const auto& [name, value] : run) {
    auto it = ck.train->run.find(name);
    std::string stored = it == ck.train->run.end() ? "(absent)" : it->second;
    if (stored != value)
      differ.push_back(fmt::format("{} is {} here but {} in the checkpoint", name, value, stored));
  }
  KILN_CHECK(differ.empty(), "[train] cannot --resume from '{}': {}", o.resume,
             fmt::join(differ, "; "));
  KILN_CHECK(ck.steps < o.steps,
             "[train] cannot --resume from '{}': it is at step {} of --steps {}, nothing is left "
             "to train",
             o.resume, ck.steps, o.steps);
  KILN_CHECK(!o.stop_after || *o.stop_after > ck.steps,
             "[train] --stop-after {} is not after the resumed step {}", *o.stop_after, ck.steps);
  return ck;
}

// The entries of `all` named "<prefix>.<entry>", renamed "<entry>".
io::StateDict entries_of(const io::StateDict& all, const std::string& prefix) {
  io::StateDict out;
  for (const auto& [name, t] : all)
    if (name.starts_with(prefix + ".")) out.emplace_back(name.substr(prefix.size() + 1), t);
  return out;
}

// Note [Optimizers over sharded parameters]
// Under --tp the model mixes DTensor parameters (the sharded layers') with plain ones (the
// LayerNorms, the position embedding); one AdamW per weight-decay group steps both kinds (it
// groups them itself: Note [Parameter groups] in kiln/optim/optimizer.cpp), and
// optim::clip_grad_norm_ clips by their global norm. A checkpoint holds the single-process
// optimizer state ("exp_avg.i" for the group's i-th parameter in model order), each tensor
// gathered whole by `whole` (collective under --tp and --fsdp: every rank calls it).
struct AdamWGroup {
  std::vector<std::string> names;  // of the parameters, in the optimizer's order
  optim::AdamW opt;

  static AdamWGroup make(const nn::NamedTensors& params, const optim::AdamWOptions& options) {
    std::vector<std::string> names;
    TensorList tensors;
    for (const auto& [name, p] : params) {
      names.push_back(name);
      tensors.push_back(p);
    }
    return {std::move(names), optim::AdamW(std::move(tensors), options)};
  }
  // `whole(param_name, t)`: t (a state tensor of that parameter) as a plain whole tensor.
  optim::StateDict state_dict(
      const std::function<Tensor(const std::string&, const Tensor&)>& whole) const {
    optim::StateDict out;
    for (const auto& [key, t] : opt.state_dict()) {
      const size_t dot = key.rfind('.');
      out.emplace_back(
          key, dot == std::string::npos ? t : whole(names.at(std::stoul(key.substr(dot + 1))), t));
    }
    return out;
  }
};

}  // namespace

// Creates and removes a file beside `path`, as save_safetensors's temporary file will be.
void check_writable(const std::string& path, const std::string& option) {
  namespace fs = std::filesystem;
  KILN_CHECK(!path.empty() && !fs::is_directory(path), "[train] {} must name a file, got '{}'",
             option, path);
  fs::path dir = fs::absolute(path).parent_path();
  std::error_code ec;
  KILN_CHECK(fs::exists(dir, ec), "[train] cannot write {} '{}': directory '{}' does not exist",
             option, path, dir.string());
  KILN_CHECK(fs::is_directory(dir, ec), "[train] cannot write {} '{}': '{}' is not a directory",
             option, path, dir.string());
  std::string probe = path + ".tmp.XXXXXX";
  int fd = ::mkostemp(probe.data(), O_CLOEXEC);
  KILN_CHECK(fd >= 0, "[train] cannot write {} '{}': {}", option, path, std::strerror(errno));
  ::close(fd);
  ::unlink(probe.c_str());
}

// Note [Data-parallel training]
// With --ddp each process of `mpirun -n N kiln train --ddp` is one rank. Every rank builds the
// same model, reads the same corpus and draws the same whole batch of --batch sequences from
// the same generator (so the data position and a checkpoint's generator state are those of a
// single-process run), then trains on its own N-th of it; DistributedDataParallel averages
// the gradients, so each step is the single-process step on the whole batch up to rounding.
// The loss printed is the ranks' mean. Rank 0 alone prints (the others' stdout goes to
// /dev/null), evaluates and writes checkpoints; every rank checks the options, so bad ones
// stop every rank alike. With --device cuda, rank r uses cuda:<its local rank>.
//
// Note [Tensor-parallel training]
// With --tp N (N the world size) the ranks form a 1-D mesh and the model is split by
// parallel::gpt_tensor_parallel_plan: each rank holds its share of the heads, the MLP and the
// vocabulary (DTensor parameters) and a copy of the rest (plain). Every rank trains on the whole
// batch, so the data and the generators advance as in one process; the loss is
// loss_parallel_cross_entropy over the vocabulary-sharded logits, replicated on every rank. The
// optimizers and the gradient clipping take lists of both kinds (Note [Optimizers over sharded
// parameters]). --fsdp shards every parameter as Shard(0) (parallel::fully_shard on each block,
// then the model) and splits the batch as --ddp does; with --amp its units gather the
// parameters in the autocast dtype and reduce the gradients in float32 (FSDP2's
// MixedPrecisionPolicy as PyTorch's recipes set it: half the gather bytes, float32 master
// shards and gradient sums). Under both, evaluation and checkpoints are
// collective: every rank evaluates, every rank gathers the parameters and the optimizer state
// whole (full_tensor; the fused q, k, v rows back in the module's order), and rank 0 writes the
// file a single-process run writes, which `kiln generate` and --resume read (in one process or
// any mode: under --tp and --fsdp each rank keeps its piece of every whole tensor, with the fused
// q, k, v rows put back rank-major, so a run may resume on another number of ranks).
int run_train(const TrainOptions& o) {
  KILN_CHECK(o.model == "gpt" || o.model == "cnn", "[train] --model must be gpt or cnn, got '{}'",
             o.model);
  if (o.model == "cnn") return run_train_cnn(o);
  int rank = 0, ranks = 1;
  CommonOptions common_options = o.common;
  KILN_CHECK(o.tp >= 0, "[train] --tp must be positive, got {}", o.tp);
  const int modes = int{o.ddp} + int{o.tp > 0} + int{o.fsdp};
  KILN_CHECK(modes <= 1, "[train] --ddp, --tp and --fsdp exclude each other, got{}{}{}",
             o.ddp ? " --ddp" : "", o.tp > 0 ? fmt::format(" --tp {}", o.tp) : "",
             o.fsdp ? " --fsdp" : "");
  // The model is split across the ranks: evaluations and checkpoints are collective.
  const bool sharded = o.tp > 0 || o.fsdp;
  if (modes > 0) {
    distributed::init();
    rank = distributed::rank();
    ranks = distributed::world_size();
    if (common_options.device == "cuda")
      common_options.device = fmt::format("cuda:{}", distributed::local_rank());
    if (rank != 0)
      KILN_CHECK(std::freopen("/dev/null", "w", stdout), "[train] cannot mute rank {}", rank);
  }
  const Common common = apply_common(common_options);
  const int threads = common.threads;
  const Device device = common.device;
  nn::GPTConfig cfg = config_named(o.config);
  validate(o, cfg);
  KILN_CHECK(o.tp == 0 || o.tp == ranks,
             "[train] --tp {} must equal the number of ranks ({}; run mpirun -n {} kiln train "
             "--tp {})",
             o.tp, ranks, o.tp, o.tp);
  KILN_CHECK(o.tp > 0 || o.batch % ranks == 0,
             "[train] --batch {} is not a multiple of the {} ranks ({})", o.batch, ranks,
             o.fsdp ? "--fsdp" : "--ddp");

  std::string path = o.data.empty() ? kDefaultCorpus : o.data;
  std::string text = read_text_file(path);
  std::vector<int64_t> tokens = encode_bytes(text);
  Corpus corpus = split_corpus(tokens, kTrainFraction, o.seq);
  const std::map<std::string, std::string> run = run_options(o, text);
  std::optional<Checkpoint> resume;
  if (!o.resume.empty()) resume = load_resume(o, run);

  Generator gen(o.seed);
  nn::GPT model(cfg, nn::Init{.gen = &gen});
  model.to(device);  // initialised on the cpu: the same weights on every device
  const int64_t num_parameters = model.num_parameters();
  // See Note [Tensor-parallel training].
  const dtensor::DeviceMesh* mesh = nullptr;
  if (sharded) mesh = &dtensor::init_device_mesh(device, {ranks}, {o.fsdp ? "dp" : "tp"});
  if (o.tp > 0)
    parallel::parallelize_module(model, *mesh, parallel::gpt_tensor_parallel_plan(cfg, *mesh));
  int64_t fsdp_units = 0;
  if (o.fsdp) {
    parallel::FullyShardOptions shard_options;
    if (!o.amp.empty()) {
      shard_options.mp.param_dtype = o.amp == "fp16" ? kFloat16 : kBFloat16;
      shard_options.mp.reduce_dtype = kFloat32;
    }
    for (auto& [path, sub] : model.named_modules())
      if (sub->type_name() == "Block") {
        parallel::fully_shard(*sub, *mesh, shard_options);
        ++fsdp_units;
      }
    parallel::fully_shard(model, *mesh, shard_options);
    ++fsdp_units;
  }
  // Weight decay on matrices and embeddings only, as GPT-2 and nanoGPT do: decaying gains
  // and biases towards zero only hurts.
  nn::NamedTensors decay, no_decay;
  for (const auto& [name, p] : model.named_parameters())
    (p.dim() >= 2 ? decay : no_decay).emplace_back(name, p);
  AdamWGroup opt_decay = AdamWGroup::make(decay, {.lr = o.lr, .weight_decay = kWeightDecay});
  AdamWGroup opt_no_decay = AdamWGroup::make(no_decay, {.lr = o.lr, .weight_decay = 0.0});
  TensorList params = model.parameters();
  // A parameter's or its optimizer state's tensor as a plain whole tensor in the module's
  // layout (collective when it is a DTensor). See Note [Tensor-parallel training].
  auto whole = [&](const std::string& name, const Tensor& t) {
    if (!dtensor::is_dtensor(t)) return t.detach();
    Tensor w = dtensor::full_tensor(t);
    if (o.tp > 1 && w.dim() > 0 && name.find(".attn.c_attn.") != std::string::npos)
      w = parallel::fused_rows_to_module_order(w, 3, o.tp);
    return w.detach();
  };
  // --amp bf16|fp16: the forward and the loss under autocast; backward runs outside it, in the
  // dtypes the forward saved (Note [Autocast] in kiln/amp/autocast.cpp). fp16 adds loss scaling
  // (Note [Loss scaling on the device] in kiln/amp/grad_scaler.cpp); otherwise the scaler is
  // disabled, a pass-through.
  const LossFn loss_of = [&](const Tensor& x, const Tensor& y) {
    std::optional<amp::AutocastGuard> autocast;
    if (!o.amp.empty()) autocast.emplace(device, o.amp == "fp16" ? kFloat16 : kBFloat16);
    if (o.tp == 0) return model.loss(x, y);
    Tensor logits = model.forward(x);
    return parallel::loss_parallel_cross_entropy(logits.reshape({-1, cfg.vocab_size}),
                                                 y.reshape({-1}));
  };
  amp::GradScaler scaler(device, {.enabled = o.amp == "fp16"});
  optim::WarmupCosineLR schedule{o.lr, o.lr / 10, std::max<int64_t>(1, o.steps / 10), o.steps};
  // The inverse of `whole`: a checkpoint's tensor of parameter `name` in the layout this run's
  // DTensor has (the fused q, k, v rows rank-major); loading keeps each rank's piece of it.
  auto sharded_layout = [&](const std::string& name, const Tensor& w) {
    if (o.tp > 1 && w.dim() > 0 && name.find(".attn.c_attn.") != std::string::npos)
      return parallel::fused_rows_to_module_order(w, o.tp, 3);
    return w;
  };
  // An optimizer group's entries with each parameter's state in that layout.
  auto optimizer_entries = [&](const AdamWGroup& g, const io::StateDict& all,
                               const std::string& prefix) {
    io::StateDict out;
    for (auto [key, t] : entries_of(all, prefix)) {
      const size_t dot = key.rfind('.');
      size_t i = 0;
      if (dot != std::string::npos &&
          std::from_chars(key.data() + dot + 1, key.data() + key.size(), i).ec == std::errc() &&
          i < g.names.size())
        t = sharded_layout(g.names[i], t);
      out.emplace_back(key, t);
    }
    return out;
  };
  const int64_t start = resume ? resume->steps : 0;
  if (resume) {
    // Every check passed before anything is restored: see Note [Resumable checkpoints]. Under
    // --tp and --fsdp each rank keeps its piece of the whole tensors the checkpoint holds.
    const TrainState& st = *resume->train;
    try {
      io::StateDict state;
      for (const auto& [name, t] : resume->state) state.emplace_back(name, sharded_layout(name, t));
      model.load_state_dict(state);
      opt_decay.opt.load_state_dict(optimizer_entries(opt_decay, st.optim, "decay"));
      opt_no_decay.opt.load_state_dict(optimizer_entries(opt_no_decay, st.optim, "no_decay"));
      if (!st.scaler.empty()) scaler.load_state_dict(st.scaler);  // fp16's; else a new scale
    } catch (const Error& e) {
      KILN_THROW(Value, "[train] cannot --resume from '{}': {}", o.resume, e.what());
    }
    gen.set_seed(st.rng_seed);
    gen.set_offset(st.rng_offset);
    default_generator().set_seed(st.default_rng_seed);
    default_generator().set_offset(st.default_rng_offset);
  }
  // See Note [Data-parallel training].
  std::optional<parallel::DistributedDataParallel> ddp;
  if (o.ddp) ddp.emplace(model);
  const bool split_batch = o.ddp || o.fsdp;
  const int64_t share = split_batch ? o.batch / ranks : o.batch;
  // What a checkpoint written after `done` steps holds besides the model.
  // See Note [Compiled steps and the optimizers' step counts].
  auto train_state = [&](int64_t done) {
    TrainState st{.run = run,
                  .rng_seed = gen.seed(),
                  .rng_offset = gen.offset(),
                  .default_rng_seed = default_generator().seed(),
                  .default_rng_offset = default_generator().offset(),
                  .optim = {},
                  .scaler = {}};
    using Named = std::pair<AdamWGroup*, std::string>;
    for (const auto& [opt, prefix] :
         {Named{&opt_decay, "decay."}, Named{&opt_no_decay, "no_decay."}})
      for (auto& [name, t] : opt->state_dict(whole))
        st.optim.emplace_back(prefix + name, name == "steps" ? scalar_tensor(done, kInt64) : t);
    st.scaler = scaler.state_dict();  // empty unless --amp fp16
    return st;
  };
  // Every rank calls it under --tp and --fsdp (the gathers are collective); rank 0 writes.
  auto write_checkpoint = [&](int64_t done) {
    if (rank != 0 && !sharded) return;
    io::StateDict state;
    for (const auto& [name, t] : model.state_dict()) state.emplace_back(name, whole(name, t));
    TrainState st = train_state(done);
    if (rank == 0) save_checkpoint(cfg, state, o.config, done, st, o.out);
  };

  fmt::print("kiln train: GPT {} ({} parameters: width {}, {} layers, {} heads, context {})\n",
             o.config, num_parameters, cfg.width, cfg.layers, cfg.heads, cfg.context);
  fmt::print(
      "corpus {} ({} bytes: {} train, {} val), batch {} x {} tokens, {} steps, lr {}, "
      "seed {}, threads {}, device {}\n",
      path, tokens.size(), corpus.train.size(), corpus.val.size(), o.batch, o.seq, o.steps, o.lr,
      o.seed, threads, device);
  if (ddp)
    fmt::print("ddp: {} ranks, {} sequences each, {} bucket{}\n", ranks, share,
               ddp->buckets().size(), ddp->buckets().size() == 1 ? "" : "s");
  if (o.tp > 0)
    fmt::print("tp: {} ranks, {} of {} heads each, the whole batch on every rank\n", ranks,
               cfg.heads / ranks, cfg.heads);
  if (o.fsdp)
    fmt::print(
        "fsdp: {} ranks, {} sequences each, {} units{}\n", ranks, share, fsdp_units,
        o.amp.empty() ? "" : fmt::format(", gathers in {}, gradients reduced in float32", o.amp));
  if (!o.amp.empty())
    fmt::print("amp: {} autocast, float32 master weights{}\n", o.amp,
               scaler.is_enabled() ? fmt::format(", loss scale {}", scaler.get_scale()) : "");
  if (resume) fmt::print("resuming from {} at step {}\n", o.resume, start);
  std::fflush(stdout);

  // One training step; compiled, it is traced once and replayed (kiln::compile). The learning
  // rates are set outside it: they live in the optimizers' lr tensors.
  // Under --amp fp16 the loss is scaled, the gradients unscaled before clipping, and a step
  // whose gradients overflowed is skipped on the device (the scaler is a pass-through otherwise).
  auto train_step = [&](const Tensor& x, const Tensor& y) {
    model.zero_grad();
    Tensor loss = loss_of(x, y);
    scaler.scale(loss).backward();
    scaler.unscale_(opt_decay.opt);
    scaler.unscale_(opt_no_decay.opt);
    optim::clip_grad_norm_(params, kClipNorm);
    scaler.step(opt_decay.opt);
    scaler.step(opt_no_decay.opt);
    scaler.update();
    return plain(loss).detach();  // a DTensor under --tp: its replicated local value
  };
  std::optional<CompiledFunction> compiled;
  if (o.compile)
    compiled.emplace(compile(train_step, {.name = "train_step", .input_names = {"x", "y"}}));
  std::optional<profiler::Session> profile;
  if (!o.profile.empty() && rank == 0) profile.emplace();

  // Open MPI gives every rank a pseudo-terminal for stdout, whatever mpirun's own stdout is:
  // with --ddp the progress is printed as lines.
  Progress progress(o.steps, o.batch * o.seq, stdout_is_tty() && modes == 0, start);
  const uint64_t eval_seed = o.seed + 1;
  auto report = [&](int64_t step) {
    Losses l = evaluate(model, loss_of, corpus, o.batch, o.seq, eval_seed, device);
    progress.print_line(
        fmt::format("step {}: train loss {:.4f}, val loss {:.4f}", step, l.train, l.val));
    return l;
  };
  for (int64_t step = start; step < o.steps; ++step) {
    opt_decay.opt.set_lr(schedule(step));
    opt_no_decay.opt.set_lr(schedule(step));
    auto [hx, hy] = sample_batch(corpus.train, o.batch, o.seq, gen);
    if (split_batch) {  // this rank's share of the whole batch
      hx = narrow(hx, 0, rank * share, share);
      hy = narrow(hy, 0, rank * share, share);
    }
    Tensor x = hx.to(device), y = hy.to(device);
    Tensor loss = plain(compiled ? (*compiled)({x, y}).at(0) : train_step(x, y));
    if (split_batch) loss = distributed::all_reduce(loss, distributed::ReduceOp::Avg);
    double l = loss.item<double>();
    KILN_CHECK(std::isfinite(l), "[train] the loss became {} at step {} (try a lower --lr)", l,
               step + 1);
    const int64_t done = step + 1;
    progress.update(done, l);
    const bool evaluates = rank == 0 || sharded;  // sharded: every rank takes part
    if (evaluates && o.eval_every > 0 && done % o.eval_every == 0 && done < o.steps) report(done);
    if (o.save_every && done % *o.save_every == 0 && done < o.steps) {
      write_checkpoint(done);
      progress.print_line(fmt::format("step {}: checkpoint {}", done, o.out));
    }
    if (o.stop_after && done == *o.stop_after) {
      progress.finish();
      fmt::print("stopped after step {} (--stop-after)\n", done);
      return 0;
    }
  }
  double seconds = progress.elapsed_s(), tok_s = progress.tokens_per_s();
  Losses final = rank == 0 || sharded ? report(o.steps) : Losses{0, 0};
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
  write_checkpoint(o.steps);
  fmt::print(
      "done: {} steps in {:.1f} s ({:.0f} tokens/s); final train loss {:.4f}, val loss "
      "{:.4f}\ncheckpoint: {}\n",
      o.steps - start, seconds, tok_s, final.train, final.val, o.out);
  return 0;
}

}  // namespace kiln::tool

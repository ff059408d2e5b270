// `kiln train --model cnn`: nn::CNN (conv–batch-norm–ReLU–max-pool blocks and a linear head) on
// Fashion-MNIST (Debian's dataset-fashion-mnist), AdamW with warm-up and cosine decay, the test
// set's loss and accuracy after every epoch, and the model's state (safetensors) at the end.
#include <chrono>
#include <cmath>
#include <optional>
#include <set>

#include <fmt/format.h>

#include "kiln/amp/autocast.h"
#include "kiln/amp/grad_scaler.h"
#include "kiln/autograd/grad_mode.h"
#include "kiln/compile/compile.h"
#include "kiln/core/error.h"
#include "kiln/data/fashion_mnist.h"
#include "kiln/data/loader.h"
#include "kiln/io/safetensors.h"
#include "kiln/nn/cnn.h"
#include "kiln/ops/ops.h"
#include "kiln/optim/optimizer.h"
#include "tools/kiln/commands.h"

namespace kiln::tool {

namespace {

constexpr int64_t kEvalBatch = 500;
constexpr double kWeightDecay = 5e-4;

// The options `--model cnn` reads; any other named on the command line is refused, so that a
// GPT option is never silently ignored.
void check_cnn_options(const TrainOptions& o) {
  static const std::set<std::string> kCnnOptions = {
      "--model", "--data", "--epochs",  "--train-limit", "--steps",  "--batch",  "--lr",
      "--seed",  "--out",  "--compile", "--amp",         "--device", "--threads"};
  for (const std::string& name : o.given)
    KILN_CHECK(kCnnOptions.contains(name),
               "[train] {} does not apply to --model cnn (it takes --epochs, --train-limit, "
               "--steps, --batch, --lr, --seed, --data, --out, --compile, --amp, --device, "
               "--threads)",
               name);
  KILN_CHECK(o.epochs > 0, "[train] --epochs must be positive, got {}", o.epochs);
  KILN_CHECK(o.train_limit >= 0, "[train] --train-limit must be >= 0, got {}", o.train_limit);
  KILN_CHECK(o.batch > 0, "[train] --batch must be positive, got {}", o.batch);
  KILN_CHECK(o.steps > 0, "[train] --steps must be positive, got {}", o.steps);
  KILN_CHECK(o.lr > 0 && std::isfinite(o.lr), "[train] --lr must be positive, got {}", o.lr);
  KILN_CHECK(o.amp.empty() || o.amp == "bf16" || o.amp == "fp16",
             "[train] --amp must be bf16 or fp16, got '{}'", o.amp);
  check_writable(o.out, "--out");
}

// Images [N, 28, 28] uint8 as [N, 1, 28, 28] beside their labels; the first `limit` (0: all).
std::shared_ptr<data::TensorSource> source_of(const data::LabelledSet& set, int64_t limit) {
  Tensor images = set.inputs, labels = set.labels;
  if (limit > 0 && limit < images.size(0)) {
    images = narrow(images, 0, 0, limit);
    labels = narrow(labels, 0, 0, limit);
  }
  images = images.reshape({images.size(0), 1, images.size(1), images.size(2)});
  return std::make_shared<data::TensorSource>(std::vector<Tensor>{images, labels});
}

struct Evaluation {
  double loss, accuracy;
};

// Mean loss and the fraction classified right over the whole test set, in eval mode.
Evaluation evaluate(nn::CNN& model, data::DataLoader& test, Device device) {
  autograd::NoGradGuard no_grad;
  model.eval();
  Tensor loss_sum = zeros({}, kFloat64, device), right = zeros({}, kInt64, device);
  test.start_epoch(0);
  while (std::optional<data::Batch> b = test.next()) {
    Tensor x = (*b)[0].to(device), y = (*b)[1].to(device);
    Tensor logits = model(x);
    loss_sum = add(loss_sum, mul(cross_entropy(logits, y).to(kFloat64), x.size(0)));
    right = add(right, sum(eq(argmax(logits, 1), y)));
  }
  model.train();
  const auto n = static_cast<double>(test.size());
  return {loss_sum.item<double>() / n, static_cast<double>(right.item<int64_t>()) / n};
}

}  // namespace

int run_train_cnn(const TrainOptions& o) {
  check_cnn_options(o);
  const Common common = apply_common(o.common);
  const Device device = common.device;
  const std::string dir = o.data.empty() ? data::kFashionMnistDir : o.data;
  data::FashionMnist fm = data::load_fashion_mnist(dir);
  const data::Normalize normalize{
      .scale = 255, .mean = data::kFashionMnistMean, .std = data::kFashionMnistStd};
  // Full batches only, so that a compiled step sees one shape; each epoch drops a different
  // remainder (the order is reshuffled).
  data::DataLoader train(source_of(fm.train, o.train_limit), {.batch_size = o.batch,
                                                              .shuffle = true,
                                                              .seed = o.seed,
                                                              .drop_last = true,
                                                              .normalize = normalize});
  data::DataLoader test(source_of(fm.test, 0),
                        {.batch_size = kEvalBatch, .shuffle = false, .normalize = normalize});
  KILN_CHECK(train.batches_per_epoch() > 0,
             "[train] --batch {} is larger than the {} training images", o.batch, train.size());
  const int64_t total_steps = std::min(o.epochs * train.batches_per_epoch(), o.steps);

  Generator gen(o.seed);
  nn::CNN model({}, nn::Init{.gen = &gen});
  model.to(device);  // initialised on the cpu: the same weights on every device
  optim::AdamW opt(model.parameters(), {.lr = o.lr, .weight_decay = kWeightDecay});
  optim::WarmupCosineLR schedule{o.lr, o.lr / 100, std::max<int64_t>(1, total_steps / 20),
                                 total_steps};

  // --amp bf16|fp16: the forward and the loss under autocast, float32 master weights; fp16 adds
  // loss scaling, every decision on the device (the scaler is a pass-through otherwise).
  amp::GradScaler scaler(device, {.enabled = o.amp == "fp16"});
  auto train_step = [&](const Tensor& x, const Tensor& y) {
    opt.zero_grad();
    Tensor loss;
    {
      std::optional<amp::AutocastGuard> autocast;
      if (!o.amp.empty()) autocast.emplace(device, o.amp == "fp16" ? kFloat16 : kBFloat16);
      loss = cross_entropy(model(x), y);
    }
    scaler.scale(loss).backward();
    scaler.step(opt);
    scaler.update();
    return loss.detach();
  };
  std::optional<CompiledFunction> compiled;
  if (o.compile)
    compiled.emplace(compile(train_step, {.name = "cnn_train_step", .input_names = {"x", "y"}}));

  fmt::print("kiln train: CNN ({} parameters: channels {}, hidden {}) on Fashion-MNIST ({})\n",
             model.num_parameters(), IntArrayRef(model.config().channels), model.config().hidden,
             dir);
  fmt::print(
      "{} training images, {} test images, batch {}, {} epochs ({} steps), lr {}, seed {}, "
      "threads {}, device {}{}\n",
      train.size(), test.size(), o.batch, o.epochs, total_steps, o.lr, o.seed, common.threads,
      device, o.amp.empty() ? "" : ", amp " + o.amp);
  std::fflush(stdout);

  using Clock = std::chrono::steady_clock;
  const auto start = Clock::now();
  double train_seconds = 0;
  Evaluation last{0, 0};
  int64_t step = 0;
  for (int64_t epoch = 0; epoch < o.epochs && step < total_steps; ++epoch) {
    const auto epoch_start = Clock::now();
    Tensor loss_sum = zeros({}, kFloat64, device);
    int64_t steps_this_epoch = 0;
    train.start_epoch(epoch);
    while (step < total_steps) {
      std::optional<data::Batch> b = train.next();
      if (!b) break;
      opt.set_lr(schedule(step));
      Tensor x = (*b)[0].to(device), y = (*b)[1].to(device);
      Tensor loss = compiled ? (*compiled)({x, y}).at(0) : train_step(x, y);
      loss_sum = add(loss_sum, loss.to(kFloat64));
      ++step;
      ++steps_this_epoch;
    }
    const double train_loss = loss_sum.item<double>() / static_cast<double>(steps_this_epoch);
    KILN_CHECK(std::isfinite(train_loss),
               "[train] the training loss became {} in epoch {} (try a lower --lr)", train_loss,
               epoch + 1);
    const double seconds = std::chrono::duration<double>(Clock::now() - epoch_start).count();
    train_seconds += seconds;
    last = evaluate(model, test, device);
    fmt::print(
        "epoch {}/{}: train loss {:.4f}, test loss {:.4f}, test accuracy {:.2f}% ({:.1f} s, "
        "{:.0f} images/s)\n",
        epoch + 1, o.epochs, train_loss, last.loss, 100 * last.accuracy, seconds,
        static_cast<double>(steps_this_epoch * o.batch) / seconds);
    std::fflush(stdout);
  }
  const double total = std::chrono::duration<double>(Clock::now() - start).count();
  if (scaler.is_enabled()) fmt::print("loss scale {}\n", scaler.get_scale());
  if (compiled) {
    CacheEntryInfo e = compiled->entries().at(0);
    fmt::print("compile: {} cache entr{}, {} replays, {} eager (warm-up) calls{}\n",
               compiled->entries().size(), compiled->entries().size() == 1 ? "y" : "ies", e.hits,
               compiled->eager_calls(), e.device_graphs ? "; replayed as a device graph" : "");
  }
  io::StateDict state;
  for (const auto& [name, t] : model.state_dict()) state.emplace_back(name, t);
  io::save_safetensors(state, o.out, {{"model", "cnn"}});
  fmt::print(
      "done: {} steps in {:.1f} s ({:.1f} s training, the rest evaluating); test accuracy "
      "{:.2f}%\ncheckpoint: {}\n",
      step, total, train_seconds, 100 * last.accuracy, o.out);
  return 0;
}

}  // namespace kiln::tool

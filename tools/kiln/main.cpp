// The `kiln` program: command-line wiring for train, generate and bench. Every failure ends
// as one line on stderr, "kiln: error: ...", and a non-zero exit status.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <limits>

#include <fmt/format.h>
#include <CLI/CLI.hpp>

#include "kiln/backend/backend.h"
#include "kiln/core/device.h"
#include "kiln/core/error.h"
#include "kiln/data/fashion_mnist.h"
#include "tools/kiln/commands.h"
#include "tools/kiln/data.h"
#include "tools/kiln/progress.h"
#include "tools/kiln/workloads.h"

namespace kiln::tool {

// OMP_NUM_THREADS where the user (or `mpirun -x`) set it; else every idle core, shared among
// the ranks a launcher started on this host.
int default_threads() {
  auto positive = [](const char* name) {
    const char* v = std::getenv(name);
    int n = v && *v ? std::atoi(v) : 0;
    return n > 0 ? n : 0;
  };
  if (int n = positive("OMP_NUM_THREADS")) return n;
  int cores = omp_get_num_procs();
  double load[1];
  int idle = getloadavg(load, 1) != 1
                 ? cores
                 : std::clamp(cores - static_cast<int>(std::lround(load[0])), 1, cores);
  int local_ranks = std::max(1, positive("OMPI_COMM_WORLD_LOCAL_SIZE"));
  return std::max(1, idle / local_ranks);
}

Common apply_common(const CommonOptions& o) {
  KILN_CHECK(o.threads >= 0, "[threads] --threads must be >= 1 (or 0 for the default), got {}",
             o.threads);
  omp_set_num_threads(o.threads > 0 ? o.threads : default_threads());
  std::string type = o.device.substr(0, o.device.find(':'));
  const int known = find_device_type(type);
  if (known >= 0 && device_interface(static_cast<DeviceType>(known)) == nullptr) {
    // Built in by name, its backend a plugin (cuda): load it, or say why it cannot be.
    try {
      load_backend(type);
    } catch (const Error& e) {
      KILN_THROW(Device, "[device] device '{}' is not available: {}", o.device, e.what());
    }
  }
  if (known < 0) {
    try {
      load_backend(type);
    } catch (const Error&) {
      KILN_THROW(Device,
                 "[device] unknown device type '{}': not built in, and no plugin libkiln_{}.so "
                 "beside libkiln or in $KILN_PLUGIN_PATH",
                 type, type);
    }
  }
  Device device(o.device);
  KILN_CHECK_DEVICE(device.is_cpu() || device_interface(device.type()) != nullptr,
                    "[device] device '{}' is not available: no backend for it is loaded (this "
                    "build has cpu and the sim plugin)",
                    o.device);
  return {omp_get_max_threads(), device};
}

namespace {

// Range checks on numbers are left to the subcommands, whose messages name the option and
// the accepted range; CLI11 checks only what it can say clearly (names, files, choices).
void add_common(CLI::App* cmd, CommonOptions& o) {
  cmd->add_option("--device", o.device, "Device to run on: cpu, cuda[:N], or a plugin's (sim)")
      ->capture_default_str();
  cmd->add_option("--threads", o.threads,
                  "OpenMP threads (default: OMP_NUM_THREADS, else the idle cores shared among this "
                  "host's ranks)");
}

CLI::App* add_train(CLI::App& app, TrainOptions& o) {
  CLI::App* cmd = app.add_subcommand(
      "train", "Train a byte-level GPT on a text corpus, or a CNN on Fashion-MNIST (--model cnn)");
  cmd->add_option("--model", o.model,
                  "gpt, or cnn: conv-batch-norm-ReLU-pool blocks on Fashion-MNIST, reporting the "
                  "test accuracy per epoch (options: --epochs, --train-limit, --steps, --batch, "
                  "--lr, --seed, --data, --out, --compile, --amp)")
      ->check(CLI::IsMember({"gpt", "cnn"}))
      ->capture_default_str();
  cmd->add_option("--data", o.data,
                  fmt::format("gpt: text corpus (default: {}); cnn: directory of the "
                              "Fashion-MNIST IDX files (default: {})",
                              kDefaultCorpus, data::kFashionMnistDir))
      ->check(CLI::ExistingPath);
  cmd->add_option("--epochs", o.epochs, "cnn: passes over the training set")->capture_default_str();
  cmd->add_option("--train-limit", o.train_limit,
                  "cnn: train on the first N images only (0: all 60,000)")
      ->capture_default_str();
  cmd->add_option("--config", o.config, "Model size")
      ->check(CLI::IsMember({"tiny", "small"}))
      ->capture_default_str();
  cmd->add_option("--steps", o.steps, "Training steps")->capture_default_str();
  cmd->add_option("--batch", o.batch, "Sequences per step")->capture_default_str();
  cmd->add_option("--seq", o.seq, "Tokens per sequence (at most the context)")
      ->capture_default_str();
  cmd->add_option("--lr", o.lr, "Peak learning rate (warm-up, then cosine decay to lr/10)")
      ->capture_default_str();
  cmd->add_option("--seed", o.seed, "Seed for initialisation and batch sampling")
      ->capture_default_str();
  cmd->add_option("--eval-every", o.eval_every, "Evaluate every N steps (0: only at the end)")
      ->capture_default_str();
  cmd->add_option("--out", o.out, "Checkpoint to write (safetensors)")->capture_default_str();
  cmd->add_flag("--compile", o.compile,
                "Compile the training step (trace once, replay without the dispatcher)");
  cmd->add_option("--profile", o.profile,
                  "Write a Chrome trace (Perfetto) of ops, compiles and replays to this file");
  cmd->add_option("--save-every", o.save_every,
                  "Also write the checkpoint (--out) every N steps, atomically: a killed run "
                  "resumes from the last one with --resume");
  cmd->add_option("--resume", o.resume,
                  "Continue the run that wrote this checkpoint (the same --config, --steps, "
                  "--batch, --seq, --lr, --seed and corpus) to --steps; bitwise the same result "
                  "as a run never stopped, at the same --threads");
  cmd->add_flag("--ddp", o.ddp,
                "Data parallel over the ranks of mpirun -n N: each rank trains on its share of "
                "--batch; rank 0 logs and writes the checkpoint");
  cmd->add_option("--tp", o.tp,
                  "Tensor parallel over the N ranks of mpirun -n N (N must be the world size): "
                  "heads and MLP split, every rank trains on the whole --batch; rank 0 logs and "
                  "writes a single-process checkpoint");
  cmd->add_flag("--fsdp", o.fsdp,
                "Fully sharded data parallel over the ranks of mpirun -n N: each rank holds a "
                "Shard(0) piece of every parameter and trains on its share of --batch");
  cmd->add_option("--amp", o.amp,
                  "Mixed precision: bf16 (products in bfloat16 under autocast, float32 master "
                  "weights) or fp16 (float16, with dynamic loss scaling: a step whose gradients "
                  "overflow is skipped)");
  // A test hook, not for users: see TrainOptions::stop_after.
  cmd->add_option("--stop-after", o.stop_after)->group("");
  add_common(cmd, o.common);
  return cmd;
}

CLI::App* add_generate(CLI::App& app, GenerateOptions& o) {
  CLI::App* cmd = app.add_subcommand("generate", "Sample text from a kiln train checkpoint");
  cmd->add_option("--ckpt", o.ckpt, "Checkpoint written by kiln train")->capture_default_str();
  cmd->add_option("--prompt", o.prompt, "Text to continue")->capture_default_str();
  cmd->add_option("--tokens", o.tokens, "Bytes to generate")->capture_default_str();
  cmd->add_option("--temperature", o.temperature, "Sampling temperature (0: greedy)")
      ->capture_default_str();
  cmd->add_option("--top-k", o.top_k, "Sample among the K likeliest bytes (0: all)")
      ->capture_default_str();
  cmd->add_option("--seed", o.seed, "Seed for sampling")->capture_default_str();
  add_common(cmd, o.common);
  return cmd;
}

CLI::App* add_bench(CLI::App& app, BenchOptions& o) {
  CLI::App* cmd = app.add_subcommand("bench", "Time one of BENCHMARKS.md's workloads");
  std::vector<std::string> names;
  std::string help = "Workload:";
  for (const auto& w : workloads::all()) {
    names.push_back(w.name);
    help += fmt::format("\n  {:<9} {} (default {} iters)", w.name, w.description, w.default_iters);
  }
  cmd->add_option("workload", o.workload, help)->required()->check(CLI::IsMember(names));
  cmd->add_option("--iters", o.iters, "Timed iterations per repeat (default: per workload)");
  cmd->add_flag("--json", o.json, "Print JSON with torch_anchor.py's keys");
  cmd->add_flag("--small", o.small, "gpt: width 128 (reported as gpt_small_eager_us)");
  cmd->add_flag("--math-attention", o.math_attention,
                "Attention on the math path, not the fused kernels (for comparison)");
  cmd->add_option("--amp", o.amp,
                  "gpt, gpt_large: bf16 runs the forward and loss under bfloat16 autocast (keys "
                  "gpt_bf16_*, gpt_large_bf16_*, as anchors/torch_gpt_large_bf16.py's)")
      ->check(CLI::IsMember({"bf16"}));
  cmd->add_option("--bucket-mb", o.bucket_mb,
                  "gpt_ddp, gpt_large_ddp: DDP's bucket cap in MiB (keys gain _b<MiB>)");
  cmd->add_flag("--no-sync", o.no_sync,
                "gpt_ddp, gpt_large_ddp: backward under no_sync(), no all-reduces (keys gain "
                "_nosync): what the communication costs");
  cmd->add_flag("--pipelined", o.pipelined,
                "gpt_*_ddp|tp|fsdp: steps back to back, one synchronize a repeat (keys gain "
                "_pipelined)");
  cmd->add_flag("--explain", o.explain,
                "gpt_*_ddp|tp|fsdp: rank 0 prints the compiled step's explain() (its steps, "
                "streams and graphs) to stderr");
  cmd->add_flag("--compiled-only", o.compiled_only,
                "gpt_*_ddp|tp|fsdp on a device with graphs: only the compiled step, no eager "
                "model before it (no _eager_ keys)");
  cmd->add_flag("--probe", o.probe,
                "gpt_*_ddp|tp|fsdp on a device with graphs: time a fixed compiled function "
                "between the phases, one line a rank and phase on stderr (device_probe.cpp)");
  cmd->add_option("--probe-allreduces", o.probe_allreduces,
                  "with --probe: this many eager all-reduces of 4 KiB, then of 12 MiB, before "
                  "the models, the probe after the first of each and the last");
  add_common(cmd, o.common);
  return cmd;
}

// --model cnn's defaults where the option was not given: batch 64, lr 2e-3, no step cap (the
// epochs decide), and its own checkpoint name.
void apply_cnn_defaults(const CLI::App& cmd, TrainOptions& o) {
  if (cmd.count("--batch") == 0) o.batch = 64;
  if (cmd.count("--lr") == 0) o.lr = 2e-3;
  if (cmd.count("--steps") == 0) o.steps = std::numeric_limits<int64_t>::max();
  if (cmd.count("--out") == 0) o.out = "kiln_cnn.safetensors";
}

int run(int argc, char** argv) {
  CLI::App app{"kiln: train, sample and benchmark with the Kiln runtime", "kiln"};
  app.set_version_flag("--version", KILN_VERSION_STRING);
  // Not require_subcommand(1): an unknown word must be reported as such, not as a missing
  // subcommand.
  app.require_subcommand(0, 1);
  // CLI11 prints a usage hint after the message; one line is all a script or a person needs.
  app.failure_message([](const CLI::App*, const CLI::Error& e) {
    return fmt::format("kiln: error: {} (see kiln --help)\n", e.what());
  });
  TrainOptions train;
  GenerateOptions generate;
  BenchOptions bench;
  CLI::App* train_cmd = add_train(app, train);
  CLI::App* generate_cmd = add_generate(app, generate);
  CLI::App* bench_cmd = add_bench(app, bench);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  if (train_cmd->parsed()) {
    for (const CLI::Option* opt : train_cmd->get_options())
      if (opt->count() > 0) train.given.push_back(opt->get_name());
    if (train.model == "cnn") apply_cnn_defaults(*train_cmd, train);
    return run_train(train);
  }
  if (generate_cmd->parsed()) return run_generate(generate);
  if (bench_cmd->parsed()) return run_bench(bench);
  KILN_THROW(Value, "a subcommand is required: train, generate or bench (see kiln --help)");
}

}  // namespace
}  // namespace kiln::tool

int main(int argc, char** argv) {
  try {
    return kiln::tool::run(argc, argv);
  } catch (const std::exception& e) {
    // An in-place progress line on a terminal would run into the message: erase it.
    if (kiln::tool::stdout_is_tty()) fmt::print("\r\033[K");
    std::fflush(stdout);
    fmt::print(stderr, "kiln: error: {}\n", e.what());
  } catch (...) {
    std::fflush(stdout);
    fmt::print(stderr, "kiln: error: unknown exception\n");
  }
  return 1;
}

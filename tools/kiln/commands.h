#pragma once
// The `kiln` program's subcommands: their options (filled in by main.cpp's CLI wiring) and
// entry points. Each returns the process exit status and throws kiln::Error on bad input.
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "kiln/core/device.h"

namespace kiln::tool {

// Options every subcommand shares.
struct CommonOptions {
  std::string device = "cpu";  // parsed by kiln::Device; a plugin of that name is loaded
  int threads = 0;             // OpenMP threads; 0: default_threads()
};

struct TrainOptions {
  CommonOptions common;
  // "gpt" (a byte-level GPT on a text corpus) or "cnn" (nn::CNN on Fashion-MNIST; see
  // run_train_cnn for the options it takes).
  std::string model = "gpt";
  // The options named on the command line ("--steps", ...): what --model cnn checks.
  std::vector<std::string> given;
  // gpt: the text corpus (empty: kDefaultCorpus in data.h); cnn: the directory of the IDX
  // files (empty: data::kFashionMnistDir).
  std::string data;
  // cnn: passes over the training set, and the training images used (0: all 60,000).
  int64_t epochs = 10;
  int64_t train_limit = 0;
  std::string config = "tiny";
  int64_t steps = 500;
  int64_t batch = 16;
  int64_t seq = 64;
  double lr = 6e-3;
  uint64_t seed = 0;
  int64_t eval_every = 100;  // 0: only at the end
  std::string out = "kiln_ckpt.safetensors";
  bool compile = false;
  std::string profile;  // Chrome trace JSON to write; empty: no profiling
  // Also write the checkpoint (--out) every N steps; unset: only at the end.
  std::optional<int64_t> save_every;
  std::string resume;  // a checkpoint to continue from; empty: a fresh run
  // Data parallel over the ranks of `mpirun -n N` (DistributedDataParallel): each rank trains
  // on its share of --batch; rank 0 alone logs and writes checkpoints.
  bool ddp = false;
  // Tensor parallel over the ranks of `mpirun -n N` (a 1-D mesh of the world; --tp N, N the
  // world size): every rank trains on the whole batch with its share of the heads and the MLP
  // (parallel::gpt_tensor_parallel_plan); 0: off. See Note [Tensor-parallel training].
  int64_t tp = 0;
  // Fully sharded data parallel (parallel::fully_shard): each rank trains on its share of
  // --batch and holds a Shard(0) piece of every parameter.
  bool fsdp = false;
  // Mixed precision: "bf16" runs the forward and the loss under amp::AutocastGuard (products in
  // bfloat16, float32 master weights); "fp16" the same in float16 with loss scaling
  // (amp::GradScaler, its state in the checkpoint); empty: off.
  std::string amp;
  // Test hook (hidden): end the process after this step without the final evaluation and
  // save, as a kill would, so that tests can resume from the last --save-every checkpoint.
  std::optional<int64_t> stop_after;
};

struct GenerateOptions {
  CommonOptions common;
  std::string ckpt = "kiln_ckpt.safetensors";
  std::string prompt = "The ";
  int64_t tokens = 200;
  double temperature = 0.8;  // 0: greedy
  int64_t top_k = 40;        // 0: the whole vocabulary
  uint64_t seed = 0;
};

struct BenchOptions {
  CommonOptions common;
  std::string workload;
  int64_t iters = 0;  // 0: the workload's default
  bool json = false;
  bool small = false;
  bool math_attention = false;  // set_fused_attention(false)
  // gpt and gpt_large: "bf16" times the step with the forward and loss under bfloat16
  // autocast (keys gpt_bf16_*, gpt_large_bf16_*); empty: float32.
  std::string amp;
  // gpt_ddp, gpt_large_ddp: DDP's bucket cap in MiB (0: DDPOptions' default), and whether
  // backward runs under no_sync() (the step without its all-reduces: what they cost).
  double bucket_mb = 0;
  bool no_sync = false;
  // gpt_{ddp,tp,fsdp} and gpt_large_*: steps back to back, a synchronize at the end of each
  // repeat only (how a training loop runs), reported under keys ending in _pipelined.
  bool pipelined = false;
  // gpt_{ddp,tp,fsdp} and gpt_large_*: rank 0 prints the compiled step's explain() to stderr.
  bool explain = false;
  // gpt_{ddp,tp,fsdp} and gpt_large_*: the compiled step alone, no eager model before it.
  bool compiled_only = false;
  // gpt_{ddp,tp,fsdp} and gpt_large_*: the device probe between phases (tools/kiln/device_probe.h).
  bool probe = false;
  int64_t probe_allreduces = 0;  // with probe: eager all-reduces before the models
};

int run_train(const TrainOptions& o);
// `kiln train --model cnn` (tools/kiln/train_cnn.cpp); run_train hands it over.
int run_train_cnn(const TrainOptions& o);
// Checks that `path` (the value of `option`) names a file that can be written, creating and
// removing a file beside it: an output that cannot be written fails before training, not after.
void check_writable(const std::string& path, const std::string& option);
int run_generate(const GenerateOptions& o);
int run_bench(const BenchOptions& o);

// Every idle core: the cores less the 1-minute load average, at least 1. OpenMP's barriers
// spin, so a thread sharing its core with another process stalls every parallel region (on a
// busy 2-core machine, 2 threads trained 14 times slower than 1).
int default_threads();

// What the common options resolve to.
struct Common {
  int threads;
  Device device;
};
// Resolves --device (loading a backend plugin of that name when the type is not registered:
// `--device sim` loads libkiln_sim.so), checks that the device has a backend, and applies the
// thread count.
Common apply_common(const CommonOptions& o);

}  // namespace kiln::tool

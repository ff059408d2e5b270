#pragma once
// `kiln train` checkpoints: a safetensors file holding a GPT's state dict, with the model's
// configuration and training facts in its string metadata, and the training state a resumed
// run needs (see Note [Resumable checkpoints]).
#include <cstdint>
#include <map>
#include <optional>
#include <string>

#include "kiln/io/safetensors.h"
#include "kiln/nn/transformer.h"

namespace kiln::tool {

// Where a training run stands: everything `kiln train --resume` restores, and the options
// that must match for the resumed run to continue the stopped one bitwise.
struct TrainState {
  // The options a resumed run must share with the stopped one, by name ("--batch" -> "16",
  // "corpus" -> its size and fingerprint), compared as strings.
  std::map<std::string, std::string> run;
  // Philox states (seed, offset): the generator that initialised the model and draws the
  // batches (its offset is the position in the data), and the process's default generator.
  uint64_t rng_seed = 0, rng_offset = 0;
  uint64_t default_rng_seed = 0, default_rng_offset = 0;
  // The optimizers' state dicts, each entry named "<optimizer>.<entry>" ("decay.exp_avg.0").
  io::StateDict optim;
  // --amp fp16's GradScaler state dict ("scale", "growth_tracker", ...); empty otherwise.
  io::StateDict scaler;
};

struct Checkpoint {
  nn::GPTConfig config;
  std::string config_name;          // --config ("tiny"); empty when the file does not say
  int64_t steps = 0;                // steps trained
  io::StateDict state;              // the model's
  std::optional<TrainState> train;  // absent in checkpoints written before resuming existed
};

// Writes model.state_dict() and the training state, with metadata: the config's numbers,
// `steps` (trained so far), `config_name` and tokenizer "bytes". Atomic: a temporary file
// renamed over `path`, so a crash while saving leaves the previous checkpoint whole.
void save_checkpoint(const nn::GPT& model, const std::string& config_name, int64_t steps,
                     const TrainState& train, const std::string& path);
// The same for a model's state dict given whole (a sharded run's, gathered by every rank).
void save_checkpoint(const nn::GPTConfig& config, const io::StateDict& model_state,
                     const std::string& config_name, int64_t steps, const TrainState& train,
                     const std::string& path);

// Reads and validates a checkpoint: the metadata must describe a byte-level GPT whose
// embeddings and layer count match the stored tensors. ValueError naming the file otherwise.
Checkpoint load_checkpoint(const std::string& path);

}  // namespace kiln::tool

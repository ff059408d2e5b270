#pragma once
// `kiln train` checkpoints: a safetensors file holding a GPT's state dict, with the model's
// configuration and training facts in its string metadata.
#include <cstdint>
#include <map>
#include <string>

#include "kiln/io/safetensors.h"
#include "kiln/nn/transformer.h"

namespace kiln::tool {

struct Checkpoint {
  nn::GPTConfig config;
  int64_t steps = 0;
  io::StateDict state;
};

// Writes model.state_dict() with metadata: the config's numbers, `steps`, `config_name` and
// tokenizer "bytes".
void save_checkpoint(const nn::GPT& model, const std::string& config_name, int64_t steps,
                     const std::string& path);

// Reads and validates a checkpoint: the metadata must describe a byte-level GPT whose
// embeddings and layer count match the stored tensors. ValueError naming the file otherwise.
Checkpoint load_checkpoint(const std::string& path);

}  // namespace kiln::tool

#include "tools/kiln/checkpoint.h"

#include <charconv>
#include <filesystem>
#include <string_view>

#include "kiln/core/error.h"
#include "tools/kiln/data.h"

namespace kiln::tool {

namespace {

int64_t get_int(const std::map<std::string, std::string>& meta, const std::string& key,
                const std::string& path) {
  auto it = meta.find(key);
  KILN_CHECK(it != meta.end(),
             "[checkpoint] '{}' has no '{}' in its metadata (not written by kiln train?)", path,
             key);
  const std::string& s = it->second;
  int64_t v = 0;
  auto [ptr, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  KILN_CHECK(ec == std::errc() && ptr == s.data() + s.size() && v > 0,
             "[checkpoint] '{}': metadata '{}' must be a positive integer, got '{}'", path, key, s);
  return v;
}

uint64_t get_u64(const std::map<std::string, std::string>& meta, const std::string& key,
                 const std::string& path) {
  auto it = meta.find(key);
  KILN_CHECK(it != meta.end(), "[checkpoint] '{}' has no '{}' in its metadata", path, key);
  const std::string& s = it->second;
  uint64_t v = 0;
  auto [ptr, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  KILN_CHECK(ec == std::errc() && ptr == s.data() + s.size(),
             "[checkpoint] '{}': metadata '{}' must be an integer >= 0, got '{}'", path, key, s);
  return v;
}

// Note [Resumable checkpoints]
// Every checkpoint `kiln train` writes, periodic (--save-every) or final, can be resumed from.
// Besides the model's tensors it holds the optimizers' state dicts (tensors named
// "optim.<optimizer>.<entry>", see Note [Optimizer state dicts] in kiln/optim/optimizer.cpp),
// and in its metadata the steps trained, the generators' Philox (seed, offset) pairs
// ("train.rng_seed", ...: the model's initialisation and the batches are drawn from one
// generator, so its offset is also the position in the data) and the options the run must
// be resumed with ("run.--batch", ...). Under --amp fp16 it also holds the GradScaler's state
// dict ("scaler.scale", ...: the loss scale and its growth tracker). The learning-rate schedule
// is a pure function of the step and of options that must match, so the step is its position.
// Nothing in the file depends on when or how often the run was stopped: a resumed run's final
// checkpoint is the same file, byte for byte, as an uninterrupted run's (tests/tools checks
// this).
constexpr std::string_view kOptimPrefix = "optim.";
constexpr std::string_view kScalerPrefix = "scaler.";
constexpr std::string_view kRunPrefix = "run.";

// Sizes of a stored tensor, or an empty list when it is absent.
std::vector<int64_t> stored_sizes(const io::StateDict& state, const std::string& name) {
  for (const auto& [n, t] : state)
    if (n == name) return std::vector<int64_t>(t.sizes().begin(), t.sizes().end());
  return {};
}

}  // namespace

void save_checkpoint(const nn::GPT& model, const std::string& config_name, int64_t steps,
                     const TrainState& train, const std::string& path) {
  save_checkpoint(model.config(), model.state_dict(), config_name, steps, train, path);
}

void save_checkpoint(const nn::GPTConfig& c, const io::StateDict& model_state,
                     const std::string& config_name, int64_t steps, const TrainState& train,
                     const std::string& path) {
  std::map<std::string, std::string> meta = {
      {"format", "kiln-gpt"},
      {"config", config_name},
      {"vocab_size", std::to_string(c.vocab_size)},
      {"context", std::to_string(c.context)},
      {"width", std::to_string(c.width)},
      {"layers", std::to_string(c.layers)},
      {"heads", std::to_string(c.heads)},
      {"bias", c.bias ? "true" : "false"},
      {"steps", std::to_string(steps)},
      {"tokenizer", "bytes"},
      {"train.rng_seed", std::to_string(train.rng_seed)},
      {"train.rng_offset", std::to_string(train.rng_offset)},
      {"train.default_rng_seed", std::to_string(train.default_rng_seed)},
      {"train.default_rng_offset", std::to_string(train.default_rng_offset)},
  };
  for (const auto& [name, value] : train.run)
    meta.emplace(fmt::format("{}{}", kRunPrefix, name), value);
  io::StateDict tensors = model_state;
  for (const auto& [name, t] : train.optim)
    tensors.emplace_back(fmt::format("{}{}", kOptimPrefix, name), t);
  for (const auto& [name, t] : train.scaler)
    tensors.emplace_back(fmt::format("{}{}", kScalerPrefix, name), t);
  io::save_safetensors(tensors, path, meta);
}

Checkpoint load_checkpoint(const std::string& path) {
  KILN_CHECK(std::filesystem::is_regular_file(path), "[checkpoint] no such file: '{}'", path);
  std::map<std::string, std::string> meta;
  Checkpoint ck;
  io::StateDict tensors;
  try {
    tensors = io::load_safetensors(path, &meta);
  } catch (const Error& e) {
    KILN_THROW(Value, "[checkpoint] '{}' is not a readable safetensors file: {}", path, e.what());
  }
  io::StateDict optim, scaler;
  for (auto& [name, t] : tensors) {
    if (name.starts_with(kOptimPrefix))
      optim.emplace_back(name.substr(kOptimPrefix.size()), std::move(t));
    else if (name.starts_with(kScalerPrefix))
      scaler.emplace_back(name.substr(kScalerPrefix.size()), std::move(t));
    else
      ck.state.emplace_back(name, std::move(t));
  }
  if (meta.count("train.rng_seed")) {
    TrainState& train = ck.train.emplace();
    train.rng_seed = get_u64(meta, "train.rng_seed", path);
    train.rng_offset = get_u64(meta, "train.rng_offset", path);
    train.default_rng_seed = get_u64(meta, "train.default_rng_seed", path);
    train.default_rng_offset = get_u64(meta, "train.default_rng_offset", path);
    for (const auto& [key, value] : meta)
      if (key.starts_with(kRunPrefix)) train.run.emplace(key.substr(kRunPrefix.size()), value);
    train.optim = std::move(optim);
    train.scaler = std::move(scaler);
  }
  auto config_name = meta.find("config");
  if (config_name != meta.end()) ck.config_name = config_name->second;
  auto tokenizer = meta.find("tokenizer");
  KILN_CHECK(tokenizer != meta.end() && tokenizer->second == "bytes",
             "[checkpoint] '{}' does not use the byte tokenizer (metadata 'tokenizer' is '{}')",
             path, tokenizer == meta.end() ? "" : tokenizer->second);
  nn::GPTConfig& c = ck.config;
  c.vocab_size = get_int(meta, "vocab_size", path);
  c.context = get_int(meta, "context", path);
  c.width = get_int(meta, "width", path);
  c.layers = get_int(meta, "layers", path);
  c.heads = get_int(meta, "heads", path);
  auto bias = meta.find("bias");
  c.bias = bias == meta.end() || bias->second != "false";
  ck.steps = get_int(meta, "steps", path);
  KILN_CHECK(c.vocab_size == kByteVocab, "[checkpoint] '{}': vocab_size {} is not {} (bytes)", path,
             c.vocab_size, kByteVocab);
  KILN_CHECK(c.width % c.heads == 0, "[checkpoint] '{}': width {} is not divisible by heads {}",
             path, c.width, c.heads);
  // Checked against the tensors before a model is built, so that metadata cannot make us
  // allocate far more than the file holds.
  auto wte = stored_sizes(ck.state, "transformer.wte.weight");
  auto wpe = stored_sizes(ck.state, "transformer.wpe.weight");
  KILN_CHECK(wte == std::vector<int64_t>({c.vocab_size, c.width}) &&
                 wpe == std::vector<int64_t>({c.context, c.width}),
             "[checkpoint] '{}': the embeddings ([{}] and [{}]) do not match the metadata "
             "(vocab_size {}, context {}, width {})",
             path, fmt::join(wte, ", "), fmt::join(wpe, ", "), c.vocab_size, c.context, c.width);
  auto layer_key = [](int64_t i) { return fmt::format("transformer.h.{}.ln_1.weight", i); };
  KILN_CHECK(!stored_sizes(ck.state, layer_key(c.layers - 1)).empty() &&
                 stored_sizes(ck.state, layer_key(c.layers)).empty(),
             "[checkpoint] '{}': the stored blocks do not match the metadata's {} layers", path,
             c.layers);
  return ck;
}

}  // namespace kiln::tool

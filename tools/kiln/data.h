#pragma once
// Text corpora for `kiln train`: a byte-level tokenizer (token = byte value, vocab 256), a
// train/validation split, and random batch sampling driven by a kiln::Generator.
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "kiln/core/generator.h"
#include "kiln/core/tensor.h"

namespace kiln::tool {

// Debian's base-files ships the GPL-3 text (about 35 KB) on every system.
inline constexpr const char* kDefaultCorpus = "/usr/share/common-licenses/GPL-3";
inline constexpr int64_t kByteVocab = 256;

std::vector<int64_t> encode_bytes(std::string_view text);
// Token ids outside [0, 256) raise ValueError.
std::string decode_bytes(const std::vector<int64_t>& tokens);

// The whole file; ValueError naming the path and the system's reason when it cannot be read.
std::string read_text_file(const std::string& path);

// Identifies a corpus by content, so a resumed run can check that it reads the same text:
// "<size> bytes, FNV-1a <64-bit hash in hex>".
std::string fingerprint(std::string_view text);

struct Corpus {
  std::vector<int64_t> train, val;
};
// The first `train_fraction` of the tokens train, the rest validate. Each part must hold at
// least seq + 1 tokens (one input window and its shifted targets); ValueError otherwise.
Corpus split_corpus(const std::vector<int64_t>& tokens, double train_fraction, int64_t seq);

// `batch` windows at offsets drawn from `gen`: inputs [batch, seq] and targets [batch, seq]
// (the inputs shifted by one), both int64 on the cpu.
std::pair<Tensor, Tensor> sample_batch(const std::vector<int64_t>& tokens, int64_t batch,
                                       int64_t seq, Generator& gen);

}  // namespace kiln::tool

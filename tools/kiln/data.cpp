#include "tools/kiln/data.h"

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include <fmt/format.h>

#include "kiln/core/error.h"
#include "kiln/ops/ops.h"

namespace kiln::tool {

std::vector<int64_t> encode_bytes(std::string_view text) {
  std::vector<int64_t> tokens(text.size());
  for (size_t i = 0; i < text.size(); ++i) tokens[i] = static_cast<unsigned char>(text[i]);
  return tokens;
}

std::string decode_bytes(const std::vector<int64_t>& tokens) {
  std::string text(tokens.size(), '\0');
  for (size_t i = 0; i < tokens.size(); ++i) {
    KILN_CHECK(tokens[i] >= 0 && tokens[i] < kByteVocab,
               "[tokenizer] token {} at position {} is not a byte (0 to 255)", tokens[i], i);
    text[i] = static_cast<char>(static_cast<unsigned char>(tokens[i]));
  }
  return text;
}

std::string read_text_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  KILN_CHECK(in.good(), "[data] cannot read '{}': {}", path, std::strerror(errno));
  std::ostringstream text;
  text << in.rdbuf();
  KILN_CHECK(!in.bad(), "[data] error while reading '{}'", path);
  return std::move(text).str();
}

std::string fingerprint(std::string_view text) {
  uint64_t hash = 0xcbf29ce484222325;  // FNV-1a, 64-bit
  for (char c : text) hash = (hash ^ static_cast<unsigned char>(c)) * 0x100000001b3;
  return fmt::format("{} bytes, FNV-1a {:016x}", text.size(), hash);
}

Corpus split_corpus(const std::vector<int64_t>& tokens, double train_fraction, int64_t seq) {
  auto n = static_cast<int64_t>(tokens.size());
  auto n_train = static_cast<int64_t>(static_cast<double>(n) * train_fraction);
  KILN_CHECK(n_train >= seq + 1 && n - n_train >= seq + 1,
             "[data] the corpus has {} bytes: too few for a {:.0f}/{:.0f} train/val split with "
             "sequences of {} (each part needs at least {} bytes)",
             n, train_fraction * 100, (1 - train_fraction) * 100, seq, seq + 1);
  return {std::vector<int64_t>(tokens.begin(), tokens.begin() + n_train),
          std::vector<int64_t>(tokens.begin() + n_train, tokens.end())};
}

std::pair<Tensor, Tensor> sample_batch(const std::vector<int64_t>& tokens, int64_t batch,
                                       int64_t seq, Generator& gen) {
  auto n = static_cast<int64_t>(tokens.size());
  KILN_CHECK(batch > 0 && seq > 0 && n >= seq + 1,
             "[data] cannot sample {} windows of {} tokens from {} tokens", batch, seq, n);
  std::vector<int64_t> offsets = randint(0, n - seq, {batch}, &gen).to_vector<int64_t>();
  std::vector<int64_t> x(batch * seq), y(batch * seq);
  for (int64_t b = 0; b < batch; ++b) {
    const int64_t* src = tokens.data() + offsets[b];
    std::copy(src, src + seq, x.begin() + b * seq);
    std::copy(src + 1, src + seq + 1, y.begin() + b * seq);
  }
  return {from_vector(x, {batch, seq}), from_vector(y, {batch, seq})};
}

}  // namespace kiln::tool

#pragma once
// Reading IDX files (the format of MNIST and Fashion-MNIST: a big-endian header of magic and
// dims, then the elements row-major), raw or gzip-compressed, into cpu tensors. Every file is
// treated as hostile: anything malformed is a ValueError "[idx] '<path>': <what, with the
// values>", raised before the data is trusted. See Note [IDX files] in idx.cpp.
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "kiln/core/tensor.h"

namespace kiln::data {

struct IdxOptions {
  // The element type the file must hold (its header's type code); unset accepts any of uint8,
  // int32, float32, float64.
  std::optional<DType> dtype;
  // The dims the file must have, -1 for any size: {-1, 28, 28} for 28x28 images, {-1} for
  // labels. Empty accepts any.
  std::vector<int64_t> dims;
  // The most bytes the decoded file (header and data) may hold; a header that implies more is
  // refused before anything is allocated, and a compressed stream is never inflated past it.
  int64_t max_bytes = int64_t{1} << 31;
};

// The file at `path` as a cpu tensor of the header's dims and dtype (elements converted from big
// endian). Compression is detected by the gzip magic (1f 8b), not by the name. ValueError when
// the file cannot be read, when its header is malformed (magic, type code, ndims) or disagrees
// with `options`, when the data is truncated or followed by trailing bytes, when a gzip stream is
// corrupt or inflates to more than its header implies, or when the file exceeds max_bytes.
Tensor read_idx(const std::string& path, const IdxOptions& options = {});

// Writes `t` (cpu; uint8, int32, float32 or float64; at least one dim) as an uncompressed IDX
// file: what the tests build their inputs from.
void write_idx(const Tensor& t, const std::string& path);

// A labelled data set: inputs [N, ...] and int64 labels [N].
struct LabelledSet {
  Tensor inputs;
  Tensor labels;
  int64_t size() const { return labels.size(0); }
};

// Reads a pair of IDX files, uint8 inputs of `input_dims` ({-1, 28, 28}: any count of 28x28
// images; the first dim must be -1 or the count) and uint8 labels [N], and checks that both hold
// the same number of samples and, when `num_classes` > 0, that every label is below it. Labels
// come back as int64 (what cross_entropy takes).
LabelledSet load_labelled_idx(const std::string& inputs_path, const std::string& labels_path,
                              const std::vector<int64_t>& input_dims, int64_t num_classes = 0,
                              int64_t max_bytes = IdxOptions{}.max_bytes);

}  // namespace kiln::data

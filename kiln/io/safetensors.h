#pragma once
// Reading and writing state dicts in the safetensors format
// (https://github.com/huggingface/safetensors): an 8-byte little-endian header length N, N
// bytes of JSON naming each tensor's dtype, shape and byte range, then the tensors' bytes.
#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "kiln/core/tensor.h"

namespace kiln::io {

// Named tensors, in order.
using StateDict = std::vector<std::pair<std::string, Tensor>>;

// Writes `tensors` (any layout, any device with host copies) and string `metadata` to `path`,
// via a temporary file in the same directory that is renamed over `path`: a failed save leaves
// no partial file. Data is laid out by descending element size, then name, as the reference
// implementation does. Throws ValueError on an empty, duplicate or reserved name, an undefined
// or meta tensor, or an I/O failure.
void save_safetensors(const StateDict& tensors, const std::string& path,
                      const std::map<std::string, std::string>& metadata = {});

// Reads a safetensors file into cpu tensors, sorted by name; fills `metadata` when given.
// The file is untrusted: anything malformed throws ValueError naming the offending values.
StateDict load_safetensors(const std::string& path,
                           std::map<std::string, std::string>* metadata = nullptr);
// The same as load_safetensors, from the bytes of a whole file held in memory.
StateDict load_safetensors_bytes(std::span<const uint8_t> bytes,
                                 std::map<std::string, std::string>* metadata = nullptr);

}  // namespace kiln::io

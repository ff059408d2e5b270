#pragma once
// Reading and writing state dicts in the safetensors format
// (https://github.com/huggingface/safetensors): an 8-byte little-endian header length N, N
// bytes of JSON naming each tensor's dtype, shape and byte range, then the tensors' bytes.
#include <cstdint>
#include <map>
#include <memory>
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

// A safetensors file opened to read some of its tensors: the header is read and validated whole
// on opening (as load_safetensors does, so a malformed file throws there), each tensor's bytes
// only when read. Not thread-safe.
class SafetensorsReader {
 public:
  explicit SafetensorsReader(const std::string& path);
  ~SafetensorsReader();
  SafetensorsReader(const SafetensorsReader&) = delete;
  SafetensorsReader& operator=(const SafetensorsReader&) = delete;

  struct Info {
    DType dtype;
    std::vector<int64_t> shape;
  };
  // The dtype and shape of the tensor `name`, or null when the file has none.
  const Info* find(const std::string& name) const;
  const std::map<std::string, std::string>& metadata() const;
  // The tensor `name` as a new cpu tensor; a ValueError when the file has none, or when its bytes
  // cannot be read or are invalid (a BOOL byte other than 0 and 1).
  Tensor read(const std::string& name) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace kiln::io

#pragma once
// Random numbers at a shard's global positions (internal to kiln/dtensor): what the sharded
// dropout and the random DTensor factories share, so that a shard holds the values the unsharded
// op gives at its positions. See Note [Global positions] in global_positions.cpp.
#include <cstdint>
#include <optional>

#include "kiln/core/generator.h"
#include "kiln/core/tensor.h"
#include "kiln/dtensor/spec.h"

namespace kiln::dtensor::detail {

// Values per Philox block of each random kernel (Note [Philox layout] in kiln/core/generator.h):
// the CPU kernels' (kiln/backend/cpu/common.cpp, dropout) and the CUDA ones' (random.h) alike.
int rand_per_block(DType dtype);   // 2 for float64, else 4
int randn_per_block(DType dtype);  // 1 for float64, else 2 (a normal is a pair of uniforms)
inline constexpr int kRandintPerBlock = 2;
inline constexpr int kDropoutPerBlock = 4;

// This rank's box of a global tensor: shape [..] starting at offset [..] of the global shape.
struct Box {
  Shape shape;    // the global shape
  Shape offset;   // where this rank's shard starts
  Shape local;    // its shape
  Shape strides;  // the global row-major strides
};
// The box `spec` gives this rank (its placements must have no Partial).
Box box_of(const DTensorSpec& spec);

// How this rank draws its box of a random op over the global shape (Note [Global positions]):
// construct it (which reserves the global draw's blocks on the generator), run the op on a
// tensor of sizes() with generator(), and read the box out of each result with view(). Lives
// on the stack of the call: generator() may be a generator of its own.
class BoxDraw {
 public:
  // `gen` is the call's generator (null: the device's default); `per_block` the op's values per
  // Philox block.
  BoxDraw(const Box& box, Generator* gen, Device device, int per_block);
  BoxDraw(const BoxDraw&) = delete;
  BoxDraw& operator=(const BoxDraw&) = delete;

  IntArrayRef sizes() const { return sizes_; }
  Generator* generator() const { return gen_; }
  // The box, as a view of a tensor of sizes() (make it contiguous to keep it).
  Tensor view(const Tensor& drawn) const;

 private:
  const Box& box_;
  Shape sizes_;
  Generator* gen_ = nullptr;
  std::optional<Generator> at_;  // a generator at the span's first block
  int64_t lane_ = -1;            // the box's first element in the span; -1: drawn whole
};

}  // namespace kiln::dtensor::detail

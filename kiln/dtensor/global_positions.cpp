#include "kiln/dtensor/global_positions.h"

#include "kiln/compile/trace.h"
#include "kiln/ops/ops.h"

namespace kiln::dtensor::detail {

// Note [Global positions]
// A random op over a tensor of n elements (rand, randn, randint, native_dropout's mask) draws
// element i, in row-major order, from Philox block (offset + i / per_block), lanes chosen by
// i % per_block, and advances the generator by ceil(n / per_block) blocks (Note [Philox layout]
// in kiln/core/generator.h; per_block is the kernel's: 4 for 32-bit uniforms, 2 for doubles,
// for normals of floats (Box-Muller on a pair of lanes) and for randint's 64-bit draws, 1 for
// normals of doubles). A shard gets the unsharded op's values at its global positions, and
// leaves the generator where the unsharded op would, by:
//   - reserving the global draw's blocks on the call's generator (every rank alike, so later
//     replicated draws agree across ranks), then
//   - drawing only the span of global positions from the box's first element to its last, with
//     a generator of the same seed at the block of the first one. The span is preceded by the
//     first element's lane (first % per_block elements), so that span element k falls on the
//     lanes of global element first - first % per_block + k: block and lane line up exactly,
//     whatever per_block is (a normal's pair of lanes is never split). The box is a strided
//     view of the span: a row shard's span is the shard itself; a column shard's nearly the
//     whole tensor (the price of matching the unsharded values without a kernel that draws a
//     strided box).
// Where the generator's state is not on the host (no generator given, on a device other than the
// CPU: the device's own generator, read by the kernel), on the meta device (no values; the
// unsharded call decides whether a generator moves), or while a trace is recording (it would
// keep the temporary generator), the op draws the whole global shape with the call's generator
// and the box is read out of it: the same values, at the whole tensor's cost per rank.

int rand_per_block(DType dtype) { return dtype == kFloat64 ? 2 : 4; }
int randn_per_block(DType dtype) { return dtype == kFloat64 ? 1 : 2; }

Box box_of(const DTensorSpec& spec) {
  Box b{Shape(spec.shape()), Shape(spec.local_offset()), Shape(spec.local_shape()),
        Shape(spec.shape())};
  int64_t stride = 1;
  for (int64_t k = spec.ndim() - 1; k >= 0; --k) {
    b.strides[k] = stride;
    stride *= spec.shape()[k];
  }
  return b;
}

BoxDraw::BoxDraw(const Box& box, Generator* gen, Device device, int per_block) : box_(box) {
  Generator* g = gen;
  if (!g && device.type() == kCPU) g = &default_generator();
  const compiler::Tracer* tracer = compiler::current_tracer();
  if (!g || device.is_meta() || (tracer && tracer->tracing())) {
    sizes_ = box.shape;
    gen_ = gen;
    return;
  }
  int64_t global_n = 1, local_n = 1;
  for (size_t d = 0; d < box.shape.size(); ++d) global_n *= box.shape[d], local_n *= box.local[d];
  const uint64_t blocks = static_cast<uint64_t>((global_n + per_block - 1) / per_block);
  const uint64_t base = g->advance(blocks * 4);
  int64_t first = 0, last = -1;
  if (local_n > 0) {
    last = 0;
    for (size_t d = 0; d < box.shape.size(); ++d) {
      first += box.offset[d] * box.strides[d];
      last += (box.offset[d] + box.local[d] - 1) * box.strides[d];
    }
  }
  lane_ = first % per_block;
  at_.emplace(g->seed());
  at_->set_offset(base + static_cast<uint64_t>(first / per_block));
  sizes_ = Shape{last - first + 1 + lane_};
  gen_ = &*at_;
}

Tensor BoxDraw::view(const Tensor& drawn) const {
  if (lane_ >= 0) return as_strided(drawn, box_.local, box_.strides, lane_);
  Tensor v = drawn;
  for (size_t d = 0; d < box_.shape.size(); ++d)
    v = narrow(v, static_cast<int64_t>(d), box_.offset[d], box_.local[d]);
  return v;
}

}  // namespace kiln::dtensor::detail

#pragma once
// Launch functions of the random and range factories (rand, randn, randint, native_dropout,
// arange, linspace). Random draws follow Note [Philox layout] (kiln/core/generator.h) exactly
// as the CPU kernels do, so a draw with the same (seed, offset) gives the CPU's values.
// Internal to kiln/backend/cuda.
#include <cuda_runtime.h>

#include <cstdint>

#include "kiln/backend/cuda/kernel_args.h"

namespace kiln::cuda {

// Where a draw's Philox key and first block come from: `state` ({seed, offset} in device
// memory, read when the kernel runs) when not null, else `seed` and `offset` by value.
struct PhiloxArgs {
  const uint64_t* state = nullptr;
  uint64_t seed = 0;
  uint64_t offset = 0;
};

// Values per Philox block of each draw, as the CPU kernels use them (Note [Philox layout]).
inline int rand_per_block(Dt d) { return d == Dt::Float64 ? 2 : 4; }
inline int randn_per_block(Dt d) { return d == Dt::Float64 ? 1 : 2; }
inline constexpr int kRandintPerBlock = 2;
inline constexpr int kDropoutPerBlock = 4;

// out (n contiguous values of floating dtype d) = uniforms in [0, 1).
void launch_rand(Dt d, void* out, int64_t n, PhiloxArgs ph, cudaStream_t stream);
// out (n contiguous values of floating dtype d) = standard normals (Box-Muller).
void launch_randn(Dt d, void* out, int64_t n, PhiloxArgs ph, cudaStream_t stream);
// out (n contiguous values of dtype d) = low + (64 random bits) % range, cast to d.
void launch_randint(Dt d, void* out, int64_t n, int64_t low, uint64_t range, PhiloxArgs ph,
                    cudaStream_t stream);
// x, out and mask are n contiguous values (x and out of floating dtype d, mask bool):
// mask = u >= p, out = mask ? x / (1 - p) : 0 with u a float uniform per element.
void launch_dropout(Dt d, const void* x, void* out, bool* mask, int64_t n, double p, PhiloxArgs ph,
                    cudaStream_t stream);
// Adds `blocks` to the offset of a device generator state {seed, offset}, on the device.
void advance_philox(uint64_t* state, uint64_t blocks, cudaStream_t stream);

// out (n contiguous values of dtype d) = start + step * i: fstart/fstep for floating d
// (fused, in double, or float for the 16-bit types), istart/istep in int64 otherwise.
void launch_arange(Dt d, void* out, int64_t n, double fstart, double fstep, int64_t istart,
                   int64_t istep, cudaStream_t stream);
// out (steps contiguous values of dtype d) = steps evenly spaced values from start to end.
void launch_linspace(Dt d, void* out, int64_t steps, double start, double end, cudaStream_t stream);

}  // namespace kiln::cuda

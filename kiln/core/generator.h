#pragma once
// Counter-based random numbers: Philox4x32-10 with explicit (seed, offset) state.
#include <array>
#include <atomic>
#include <cstdint>

namespace kiln {

// Philox4x32 with 10 rounds (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3").
// Output block `counter` under `key` is a pure function, so any element can be drawn
// independently: element i of a draw uses block (offset + i / 4), lane i % 4.
std::array<uint32_t, 4> philox4x32(uint64_t counter_lo, uint64_t counter_hi, uint64_t key);

// Note [Philox layout]
// A draw of n values reserves ceil(n / per_block) blocks of 4 x 32 bits and element i reads
// block (offset + i / per_block), lanes chosen by i % per_block (per_block is 4 for 32-bit
// uniforms, 2 for doubles and normals). Values therefore depend only on (seed, offset, i):
// not on thread count, loop order or device, which is what lets a captured graph replay a
// draw by restoring the offset.
// Generator state is (seed, offset): a draw of n values reads blocks [offset, offset + ceil(n/4))
// and advances offset by that many. Saving and restoring the pair replays a draw exactly, which
// is what a captured graph needs.
// Draws from several threads are safe: each reserves its own blocks atomically.
class Generator {
 public:
  explicit Generator(uint64_t seed = 0) : seed_(seed) {}
  Generator(const Generator&) = delete;
  Generator& operator=(const Generator&) = delete;
  uint64_t seed() const { return seed_.load(std::memory_order_relaxed); }
  uint64_t offset() const { return offset_.load(std::memory_order_relaxed); }
  void set_seed(uint64_t s) {
    seed_.store(s, std::memory_order_relaxed);
    offset_.store(0, std::memory_order_relaxed);
  }
  void set_offset(uint64_t o) { offset_.store(o, std::memory_order_relaxed); }
  // Reserves the blocks for `n` 32-bit draws and returns the first block's offset.
  uint64_t advance(uint64_t n) { return offset_.fetch_add((n + 3) / 4, std::memory_order_relaxed); }

 private:
  std::atomic<uint64_t> seed_;
  std::atomic<uint64_t> offset_{0};
};

// The process-wide default generator (seeded with 0; `manual_seed` reseeds it).
Generator& default_generator();
void manual_seed(uint64_t seed);

}  // namespace kiln

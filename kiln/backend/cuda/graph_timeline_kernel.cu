// The stamp kernel of the graph timelines (Note [Graph timelines] in graph_timeline.cpp). This
// file includes no Kiln header; graph_timeline.h declares what it defines.
#include <cuda_runtime.h>

#include <cstdint>

namespace kiln::cuda::detail {

namespace {

// Stamp `index` of the replay in progress: the global timer (ns) into that replay's row of the
// ring. Stamp 0 opens a replay: it takes the next replay number from state[0] and publishes it
// in state[1], which every other stamp of the replay reads (they all run after it).
__global__ void graph_timeline_stamp(uint64_t* rows, uint32_t* state, int index, int stamps,
                                     int ring) {
  uint64_t now;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
  uint32_t replay;
  if (index == 0) {
    replay = state[0];
    state[0] = replay + 1;
    state[1] = replay;
  } else {
    replay = *static_cast<volatile uint32_t*>(state + 1);
  }
  rows[static_cast<int64_t>(replay % static_cast<uint32_t>(ring)) * stamps + index] = now;
}

}  // namespace

const void* graph_timeline_stamp_kernel() {
  return reinterpret_cast<const void*>(&graph_timeline_stamp);
}

}  // namespace kiln::cuda::detail

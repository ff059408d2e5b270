#pragma once
// Timelines of replayed device graphs, for finding where a compiled step's device time goes
// without a profiler (Note [Graph timelines] in graph_timeline.cpp). Internal to
// kiln/backend/cuda.
#include <cuda_runtime.h>

namespace kiln::cuda {

// Whether KILN_GRAPH_TIMELINE names a folder to write timelines into (read at each call).
bool graph_timeline_on();
// With timelines on: adds stamp nodes to `g` (captured on `device`, not yet instantiated) and
// returns what the executable made from it must carry; nullptr when timelines are off.
void* graph_timeline_instrument(int device, cudaGraph_t g);
// `e` was instantiated from the graph that `timeline` instrumented; e owns it from now on.
void graph_timeline_adopt(cudaGraphExec_t e, void* timeline);
// Before `e` is destroyed: writes the timeline of its replays (if it has one) and frees it.
// Synchronizes e's device first.
void graph_timeline_release(cudaGraphExec_t e);

namespace detail {
const void* graph_timeline_stamp_kernel();  // graph_timeline_kernel.cu
}  // namespace detail

}  // namespace kiln::cuda

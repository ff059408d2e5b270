#pragma once
// Empty-kernel launches, timed: the floor under any eager op and under any graph node.
#include <cuda_runtime.h>

namespace kiln::cuda {

// Host microseconds per launch of an empty kernel on `stream` (iters launches, then a sync).
double time_empty_launches(cudaStream_t stream, int iters);
// The same through the driver's cuLaunchKernel (fetched at run time), or -1 where unavailable.
double time_empty_driver_launches(cudaStream_t stream, int iters);
// Microseconds per node of a graph of `nodes` empty kernels, replayed `iters` times on `stream`.
double time_empty_graph_nodes(cudaStream_t stream, int nodes, int iters);

}  // namespace kiln::cuda

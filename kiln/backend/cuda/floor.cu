// The launch floors that bound what any eager op or graph node can cost (kernels do nothing).
#include <cuda.h>

#include <chrono>

#include "kiln/backend/cuda/floor.h"

namespace kiln::cuda {
namespace {
__global__ void empty_kernel() {}
double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}
}  // namespace

double time_empty_launches(cudaStream_t stream, int iters) {
  empty_kernel<<<1, 32, 0, stream>>>();
  cudaStreamSynchronize(stream);
  auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < iters; ++i) empty_kernel<<<1, 32, 0, stream>>>();
  cudaStreamSynchronize(stream);
  return seconds_since(t0) / iters * 1e6;
}

double time_empty_driver_launches(cudaStream_t stream, int iters) {
  using LaunchFn = CUresult (*)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned,
                                unsigned, unsigned, CUstream, void**, void**);
  void* entry = nullptr;
  cudaDriverEntryPointQueryResult found{};
  cudaFunction_t fn = nullptr;
  if (cudaGetDriverEntryPointByVersion("cuLaunchKernel", &entry, 12000, cudaEnableDefault,
                                       &found) != cudaSuccess ||
      found != cudaDriverEntryPointSuccess ||
      cudaGetFuncBySymbol(&fn, reinterpret_cast<const void*>(&empty_kernel)) != cudaSuccess)
    return -1;
  auto launch = reinterpret_cast<LaunchFn>(entry);
  auto f = reinterpret_cast<CUfunction>(fn);
  auto s = reinterpret_cast<CUstream>(stream);
  launch(f, 1, 1, 1, 32, 1, 1, 0, s, nullptr, nullptr);
  cudaStreamSynchronize(stream);
  auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < iters; ++i) launch(f, 1, 1, 1, 32, 1, 1, 0, s, nullptr, nullptr);
  cudaStreamSynchronize(stream);
  return seconds_since(t0) / iters * 1e6;
}

double time_empty_graph_nodes(cudaStream_t stream, int nodes, int iters) {
  cudaStream_t s;
  cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
  cudaGraph_t g;
  cudaGraphExec_t e;
  cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal);
  for (int i = 0; i < nodes; ++i) empty_kernel<<<1, 32, 0, s>>>();
  cudaStreamEndCapture(s, &g);
  cudaGraphInstantiate(&e, g, 0);
  cudaGraphLaunch(e, stream);
  cudaStreamSynchronize(stream);
  auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < iters; ++i) cudaGraphLaunch(e, stream);
  cudaStreamSynchronize(stream);
  double us = seconds_since(t0) / iters / nodes * 1e6;
  cudaGraphExecDestroy(e);
  cudaGraphDestroy(g);
  cudaStreamDestroy(s);
  return us;
}

}  // namespace kiln::cuda

// CUDA convolution through cuDNN: the three canonical kernels of Note [Convolution]
// (kiln/ops/conv_meta.cpp); the bias and its gradient go through Kiln's add_ and sum.
#include <cudnn.h>

#include <algorithm>
#include <cstdlib>
#include <map>
#include <string>
#include <unordered_map>
#include <vector>

#include "kiln/backend/cuda/common.h"
#include "kiln/backend/cuda/conv_graph.h"
#include "kiln/backend/cuda/cudnn_graph.h"
#include "kiln/ops/conv_meta.h"
#include "kiln/ops/ops.h"

namespace kiln::cuda {
namespace {

using detail::ConvGeom;

void check_cudnn(cudnnStatus_t s, const char* what) {
  KILN_CHECK_DEVICE(s == CUDNN_STATUS_SUCCESS, "[convolution] cuDNN: {} failed: {}", what,
                    cudnnGetErrorString(s));
}
#define KILN_CUDNN_CHECK(expr) check_cudnn((expr), #expr)

// Note [cuDNN convolution]
// The legacy cuDNN API (descriptors, cudnnConvolution*): tensors are fully packed NC(D)HW, 1-D
// convolutions are 2-D with a height of 1. float32 computes with TF32 tensor cores when
// set_allow_tf32 is on (PyTorch's cudnn.allow_tf32) and with FMA math otherwise (the results
// then match the CPU's float32); float64 with FMA; float16 and bfloat16 in float32 with tensor
// cores. Workspaces come from Kiln's caching allocator. The algorithm: Note [cuDNN algorithm
// choice].
struct Descs {
  cudnnTensorDescriptor_t x = nullptr, y = nullptr;
  cudnnFilterDescriptor_t w = nullptr;
  cudnnConvolutionDescriptor_t conv = nullptr;
  Descs() {
    KILN_CUDNN_CHECK(cudnnCreateTensorDescriptor(&x));
    KILN_CUDNN_CHECK(cudnnCreateTensorDescriptor(&y));
    KILN_CUDNN_CHECK(cudnnCreateFilterDescriptor(&w));
    KILN_CUDNN_CHECK(cudnnCreateConvolutionDescriptor(&conv));
  }
  ~Descs() {
    cudnnDestroyTensorDescriptor(x);
    cudnnDestroyTensorDescriptor(y);
    cudnnDestroyFilterDescriptor(w);
    cudnnDestroyConvolutionDescriptor(conv);
  }
  Descs(const Descs&) = delete;
  Descs& operator=(const Descs&) = delete;
};

// The math the descriptor allows (Note [cuDNN convolution]).
cudnnMathType_t math_for(DType dt) {
  if (dt == kFloat16 || dt == kBFloat16) return CUDNN_TENSOR_OP_MATH;
  if (dt == kFloat32 && allow_tf32()) return CUDNN_DEFAULT_MATH;  // TF32 allowed
  return CUDNN_FMA_MATH;
}

void set_tensor(cudnnTensorDescriptor_t d, DType dt, int64_t n, int64_t c,
                const std::array<int64_t, 3>& sp, int nsp) {
  std::vector<int> dims{static_cast<int>(n), static_cast<int>(c)};
  for (int i = 3 - nsp; i < 3; ++i) dims.push_back(static_cast<int>(sp[static_cast<size_t>(i)]));
  std::vector<int> strides(dims.size());
  int s = 1;
  for (size_t i = dims.size(); i-- > 0;) {
    strides[i] = s;
    s *= dims[i];
  }
  KILN_CUDNN_CHECK(cudnnSetTensorNdDescriptor(d, cudnn_data_type(dt), static_cast<int>(dims.size()),
                                              dims.data(), strides.data()));
}

void set_descs(Descs& d, const ConvGeom& g, DType dt) {
  const int nsp = static_cast<int>(std::max<int64_t>(g.nd, 2));  // 1-D as 2-D
  set_tensor(d.x, dt, g.n, g.ci, g.x, nsp);
  set_tensor(d.y, dt, g.n, g.co, g.y, nsp);
  std::vector<int> wd{static_cast<int>(g.co), static_cast<int>(g.ci / g.groups)};
  std::vector<int> pad, stride, dil;
  for (int i = 3 - nsp; i < 3; ++i) {
    auto j = static_cast<size_t>(i);
    wd.push_back(static_cast<int>(g.k[j]));
    pad.push_back(static_cast<int>(g.pad[j]));
    stride.push_back(static_cast<int>(g.stride[j]));
    dil.push_back(static_cast<int>(g.dil[j]));
  }
  KILN_CUDNN_CHECK(cudnnSetFilterNdDescriptor(d.w, cudnn_data_type(dt), CUDNN_TENSOR_NCHW,
                                              static_cast<int>(wd.size()), wd.data()));
  const bool half = dt == kFloat16 || dt == kBFloat16;
  KILN_CUDNN_CHECK(cudnnSetConvolutionNdDescriptor(d.conv, nsp, pad.data(), stride.data(),
                                                   dil.data(), CUDNN_CROSS_CORRELATION,
                                                   half ? CUDNN_DATA_FLOAT : cudnn_data_type(dt)));
  KILN_CUDNN_CHECK(cudnnSetConvolutionGroupCount(d.conv, static_cast<int>(g.groups)));
  KILN_CUDNN_CHECK(cudnnSetConvolutionMathType(d.conv, math_for(dt)));
}

Shape sizes_of(int64_t n, int64_t c, const std::array<int64_t, 3>& sp, int64_t nd) {
  Shape s{n, c};
  for (int64_t i = 3 - nd; i < 3; ++i) s.push_back(sp[static_cast<size_t>(i)]);
  return s;
}

Tensor workspace(size_t bytes, Device dev) {
  return empty_cuda({static_cast<int64_t>(std::max<size_t>(bytes, 1))}, kUInt8, dev);
}

const void* data(const Tensor& t) { return t.impl()->data(); }
void* mut_data(const Tensor& t) { return const_cast<void*>(t.impl()->data()); }

using Pass = ConvPass;

// One algorithm's entry of cuDNN's perf results, whichever pass.
struct Perf {
  int algo;
  cudnnStatus_t status;
  size_t memory;
  cudnnDeterminism_t determinism;
  cudnnMathType_t math;
  float ms;  // measured by cudnnFind*AlgorithmEx; -1 for a heuristic's entry
};
template <class P>
std::vector<Perf> perfs_of(const P* p, int n) {
  std::vector<Perf> out;
  for (int i = 0; i < n; ++i)
    out.push_back({static_cast<int>(p[i].algo), p[i].status, p[i].memory, p[i].determinism,
                   p[i].mathType, p[i].time});
  return out;
}

constexpr int kMaxAlgos = 16;

// cuDNN's heuristic ranking (no measurement).
std::vector<Perf> heuristics(Pass pass, cudnnHandle_t h, const Descs& d) {
  int n = 0;
  switch (pass) {
    case Pass::Forward: {
      cudnnConvolutionFwdAlgoPerf_t p[kMaxAlgos];
      KILN_CUDNN_CHECK(
          cudnnGetConvolutionForwardAlgorithm_v7(h, d.x, d.w, d.conv, d.y, kMaxAlgos, &n, p));
      return perfs_of(p, n);
    }
    case Pass::BackwardData: {
      cudnnConvolutionBwdDataAlgoPerf_t p[kMaxAlgos];
      KILN_CUDNN_CHECK(
          cudnnGetConvolutionBackwardDataAlgorithm_v7(h, d.w, d.y, d.conv, d.x, kMaxAlgos, &n, p));
      return perfs_of(p, n);
    }
    case Pass::BackwardFilter: {
      cudnnConvolutionBwdFilterAlgoPerf_t p[kMaxAlgos];
      KILN_CUDNN_CHECK(cudnnGetConvolutionBackwardFilterAlgorithm_v7(h, d.x, d.y, d.conv, d.w,
                                                                     kMaxAlgos, &n, p));
      return perfs_of(p, n);
    }
  }
  return {};
}

// Every algorithm run and timed on the call's own buffers, fastest first.
std::vector<Perf> measured(Pass pass, cudnnHandle_t h, const Descs& d, const Tensor& a,
                           const Tensor& b, const Tensor& out, const Tensor& ws) {
  int n = 0;
  const size_t bytes = static_cast<size_t>(ws.numel());
  switch (pass) {
    case Pass::Forward: {
      cudnnConvolutionFwdAlgoPerf_t p[kMaxAlgos];
      KILN_CUDNN_CHECK(cudnnFindConvolutionForwardAlgorithmEx(h, d.x, data(a), d.w, data(b), d.conv,
                                                              d.y, mut_data(out), kMaxAlgos, &n, p,
                                                              mut_data(ws), bytes));
      return perfs_of(p, n);
    }
    case Pass::BackwardData: {
      cudnnConvolutionBwdDataAlgoPerf_t p[kMaxAlgos];
      KILN_CUDNN_CHECK(cudnnFindConvolutionBackwardDataAlgorithmEx(
          h, d.w, data(b), d.y, data(a), d.conv, d.x, mut_data(out), kMaxAlgos, &n, p, mut_data(ws),
          bytes));
      return perfs_of(p, n);
    }
    case Pass::BackwardFilter: {
      cudnnConvolutionBwdFilterAlgoPerf_t p[kMaxAlgos];
      KILN_CUDNN_CHECK(cudnnFindConvolutionBackwardFilterAlgorithmEx(
          h, d.x, data(a), d.y, data(b), d.conv, d.w, mut_data(out), kMaxAlgos, &n, p, mut_data(ws),
          bytes));
      return perfs_of(p, n);
    }
  }
  return {};
}

// The first usable entry: it succeeded, fits `max_ws` and is deterministic when asked.
const Perf* first_usable(const std::vector<Perf>& perfs, size_t max_ws) {
  for (const Perf& p : perfs)
    if (p.status == CUDNN_STATUS_SUCCESS && p.memory <= max_ws &&
        (!deterministic_algorithms() || p.determinism == CUDNN_DETERMINISTIC))
      return &p;
  return nullptr;
}

// Note [cuDNN algorithm choice]
// As PyTorch's cudnn.benchmark: the first call of a key (the pass, dtype, math allowed,
// determinism, device and every number of the geometry) times every algorithm cuDNN offers on
// the call's own buffers (cudnnFind*AlgorithmEx), with a workspace as large as the largest any
// heuristic candidate asks for (at most kMaxSearchWorkspace), and keeps the fastest that
// succeeded (a deterministic one under set_deterministic_algorithms) with its workspace size and
// math type; then it times the graph API's engines (Note [cuDNN graph convolutions]) and takes
// the fastest of those instead when it is faster still. Every later call runs the choice
// directly. Choices are kept per thread: a graph plan belongs to the thread's cuDNN handle.
// A search synchronizes, so it never runs while the stream is being captured into a device
// graph: an uncached key then takes cuDNN's first usable heuristic choice, uncached (compiled
// steps run eagerly before they capture, so their keys are cached by then). Keeping only the
// heuristic's first choice made ResNet-50's shapes 3 to 50 times slower than PyTorch on the
// H100 (bench/gpu_runs.md, run I14). KILN_CUDNN_GRAPH=0 leaves the graph API out (to compare).
constexpr size_t kMaxSearchWorkspace = size_t{1} << 30;

struct Choice {
  Perf legacy;
  std::shared_ptr<const ConvGraphPlan> graph;  // taken instead of `legacy` when set
};

bool graph_api_enabled() {
  static const bool on = [] {
    const char* v = std::getenv("KILN_CUDNN_GRAPH");
    return !(v && std::string(v) == "0");
  }();
  return on;
}

Choice choose(Pass pass, cudnnHandle_t h, const Descs& d, const ConvGeom& g, DType dt,
              const Tensor& a, const Tensor& b, const Tensor& out) {
  using Key = std::vector<int64_t>;
  thread_local std::map<Key, Choice> cache;
  Key key{static_cast<int64_t>(pass),
          static_cast<int64_t>(dt),
          math_for(dt),
          int64_t{deterministic_algorithms()},
          a.device().index(),
          g.nd,
          g.n,
          g.ci,
          g.co,
          g.groups};
  for (const auto* v : {&g.x, &g.y, &g.k, &g.stride, &g.pad, &g.dil})
    key.insert(key.end(), v->begin(), v->end());
  auto it = cache.find(key);
  if (it != cache.end()) return it->second;
  std::vector<Perf> heur = heuristics(pass, h, d);
  cudaStream_t stream = nullptr;
  KILN_CUDNN_CHECK(cudnnGetStream(h, &stream));
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  KILN_CUDA_CHECK(cudaStreamIsCapturing(stream, &status));
  if (status != cudaStreamCaptureStatusNone) {
    const Perf* p = first_usable(heur, SIZE_MAX);
    check_cudnn(p ? CUDNN_STATUS_SUCCESS : CUDNN_STATUS_NOT_SUPPORTED,
                "choosing an algorithm (no heuristic candidate)");
    return {*p, nullptr};
  }
  size_t ws_bytes = 0;
  for (const Perf& p : heur)
    if (p.status == CUDNN_STATUS_SUCCESS && p.memory <= kMaxSearchWorkspace)
      ws_bytes = std::max(ws_bytes, p.memory);
  Tensor ws = workspace(ws_bytes, a.device());
  std::vector<Perf> found = measured(pass, h, d, a, b, out, ws);
  const Perf* best = first_usable(found, ws_bytes);
  float legacy_ms = best ? best->ms : -1;
  if (!best) best = first_usable(heur, SIZE_MAX);
  Choice c{best ? *best : Perf{}, nullptr};
  if (graph_api_enabled()) {
    std::shared_ptr<const ConvGraphPlan> plan = find_conv_graph_plan(pass, h, g, dt, a, b, out);
    if (plan && (legacy_ms < 0 || conv_graph_plan_ms(*plan) < legacy_ms)) c.graph = plan;
  }
  check_cudnn(best || c.graph ? CUDNN_STATUS_SUCCESS : CUDNN_STATUS_NOT_SUPPORTED,
              "choosing an algorithm (none succeeded)");
  return cache.emplace(key, c).first->second;
}

// Runs `pass` with `p`'s algorithm and math type into `out`.
cudnnStatus_t run_pass(Pass pass, cudnnHandle_t h, const Descs& d, const Perf& p, DType dt,
                       const Tensor& a, const Tensor& b, const Tensor& out) {
  KILN_CUDNN_CHECK(cudnnSetConvolutionMathType(d.conv, p.math));
  Tensor ws = workspace(p.memory, a.device());
  const double one = 1, zero = 0;
  const float onef = 1, zerof = 0;
  const void* alpha = dt == kFloat64 ? static_cast<const void*>(&one) : &onef;
  const void* beta = dt == kFloat64 ? static_cast<const void*>(&zero) : &zerof;
  switch (pass) {
    case Pass::Forward:
      return cudnnConvolutionForward(h, alpha, d.x, data(a), d.w, data(b), d.conv,
                                     static_cast<cudnnConvolutionFwdAlgo_t>(p.algo), mut_data(ws),
                                     p.memory, beta, d.y, mut_data(out));
    case Pass::BackwardData:
      return cudnnConvolutionBackwardData(h, alpha, d.w, data(b), d.y, data(a), d.conv,
                                          static_cast<cudnnConvolutionBwdDataAlgo_t>(p.algo),
                                          mut_data(ws), p.memory, beta, d.x, mut_data(out));
    case Pass::BackwardFilter:
      return cudnnConvolutionBackwardFilter(h, alpha, d.x, data(a), d.y, data(b), d.conv,
                                            static_cast<cudnnConvolutionBwdFilterAlgo_t>(p.algo),
                                            mut_data(ws), p.memory, beta, d.w, mut_data(out));
  }
  return CUDNN_STATUS_NOT_SUPPORTED;
}

// One pass on contiguous copies of a and b into a new tensor of `out_sizes`.
Tensor run(Pass pass, const Tensor& a_, const Tensor& b_, Shape out_sizes, const ConvGeom& g) {
  static constexpr const char* kNames[] = {
      "cudnnConvolutionForward", "cudnnConvolutionBackwardData", "cudnnConvolutionBackwardFilter"};
  DType dt = a_.dtype();
  // Fresh buffers for views that do not start on a 16-byte boundary: graph plans assume it.
  auto aligned = [dt](const Tensor& t) {
    Tensor c = contiguous_as(t, dt);
    return reinterpret_cast<uintptr_t>(data(c)) % 16 == 0 ? c : c.clone();
  };
  Tensor a = aligned(a_), b = aligned(b_);
  Tensor out = empty_cuda(out_sizes, dt, a.device());
  Descs d;
  set_descs(d, g, dt);
  cudnnHandle_t h = cudnn_handle_for(a);
  Choice c = choose(pass, h, d, g, dt, a, b, out);
  if (c.graph)
    run_conv_graph_plan(*c.graph, h, a, b, out);
  else
    check_cudnn(run_pass(pass, h, d, c.legacy, dt, a, b, out), kNames[static_cast<int>(pass)]);
  return out;
}

Tensor forward(const Tensor& x, const Tensor& w, const ConvGeom& g) {
  return run(Pass::Forward, x, w, sizes_of(g.n, g.co, g.y, g.nd), g);
}
Tensor backward_data(const Tensor& gy, const Tensor& w, const ConvGeom& g) {
  return run(Pass::BackwardData, gy, w, sizes_of(g.n, g.ci, g.x, g.nd), g);
}
Tensor backward_weight(const Tensor& x, const Tensor& gy, const ConvGeom& g) {
  Shape sizes{g.co, g.ci / g.groups};
  for (int64_t i = 3 - g.nd; i < 3; ++i) sizes.push_back(g.k[static_cast<size_t>(i)]);
  return run(Pass::BackwardFilter, x, gy, sizes, g);
}

constexpr detail::ConvKernels kKernels{&forward, &backward_data, &backward_weight};

Tensor convolution_kernel(const Tensor& input, const Tensor& weight, const Tensor& bias,
                          IntArrayRef stride, IntArrayRef padding, IntArrayRef dilation,
                          bool transposed, IntArrayRef output_padding, int64_t groups) {
  return detail::run_convolution(kKernels, input, weight, bias, stride, padding, dilation,
                                 transposed, output_padding, groups);
}
TensorTriple convolution_backward_kernel(const Tensor& grad_output, const Tensor& input,
                                         const Tensor& weight, IntArrayRef bias_sizes,
                                         IntArrayRef stride, IntArrayRef padding,
                                         IntArrayRef dilation, bool transposed,
                                         IntArrayRef output_padding, int64_t groups,
                                         IntArrayRef output_mask) {
  return detail::run_convolution_backward(kKernels, grad_output, input, weight, bias_sizes, stride,
                                          padding, dilation, transposed, output_padding, groups,
                                          output_mask);
}

}  // namespace
}  // namespace kiln::cuda

KILN_CUDA_KERNELS(::kiln::backend_kernel(::kiln::ops::op_convolution,
                                         &::kiln::cuda::convolution_kernel),
                  ::kiln::backend_kernel(::kiln::ops::op_convolution_backward,
                                         &::kiln::cuda::convolution_backward_kernel));

// CUDA convolution through cuDNN: the three canonical kernels of Note [Convolution]
// (kiln/ops/conv_meta.cpp); the bias and its gradient go through Kiln's add_ and sum.
#include <cudnn.h>

#include <mutex>
#include <unordered_map>
#include <vector>

#include "kiln/backend/cuda/common.h"
#include "kiln/ops/conv_meta.h"

namespace kiln::cuda {
namespace {

using detail::ConvGeom;

void check_cudnn(cudnnStatus_t s, const char* what) {
  KILN_CHECK_DEVICE(s == CUDNN_STATUS_SUCCESS, "[convolution] cuDNN: {} failed: {}", what,
                    cudnnGetErrorString(s));
}
#define KILN_CUDNN_CHECK(expr) check_cudnn((expr), #expr)

// One cuDNN handle per thread and device, bound to the current stream at each call.
cudnnHandle_t handle_for(const Tensor& t) {
  thread_local std::unordered_map<int, cudnnHandle_t> handles;
  int index = t.device().index();
  cudaStream_t stream = stream_for(t);  // also makes `index` current
  auto it = handles.find(index);
  if (it == handles.end()) {
    cudnnHandle_t h;
    KILN_CUDNN_CHECK(cudnnCreate(&h));
    it = handles.emplace(index, h).first;
  }
  KILN_CUDNN_CHECK(cudnnSetStream(it->second, stream));
  return it->second;
}

// Note [cuDNN convolution]
// The legacy cuDNN API (descriptors, cudnnGet*Algorithm_v7, cudnnConvolution*): tensors are
// fully packed NC(D)HW, 1-D convolutions are 2-D with a height of 1. float32 and float64 compute
// in their own dtype with FMA math (no TF32: the results match the CPU's float32), float16 and
// bfloat16 in float32 with tensor cores. The algorithm is cuDNN's first heuristic choice whose
// workspace fits; workspaces come from Kiln's caching allocator.
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

cudnnDataType_t data_type(DType d) {
  switch (d) {
    case kFloat16:
      return CUDNN_DATA_HALF;
    case kBFloat16:
      return CUDNN_DATA_BFLOAT16;
    case kFloat64:
      return CUDNN_DATA_DOUBLE;
    default:
      return CUDNN_DATA_FLOAT;
  }
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
  KILN_CUDNN_CHECK(cudnnSetTensorNdDescriptor(d, data_type(dt), static_cast<int>(dims.size()),
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
  KILN_CUDNN_CHECK(cudnnSetFilterNdDescriptor(d.w, data_type(dt), CUDNN_TENSOR_NCHW,
                                              static_cast<int>(wd.size()), wd.data()));
  const bool half = dt == kFloat16 || dt == kBFloat16;
  KILN_CUDNN_CHECK(cudnnSetConvolutionNdDescriptor(d.conv, nsp, pad.data(), stride.data(),
                                                   dil.data(), CUDNN_CROSS_CORRELATION,
                                                   half ? CUDNN_DATA_FLOAT : data_type(dt)));
  KILN_CUDNN_CHECK(cudnnSetConvolutionGroupCount(d.conv, static_cast<int>(g.groups)));
  KILN_CUDNN_CHECK(
      cudnnSetConvolutionMathType(d.conv, half ? CUDNN_TENSOR_OP_MATH : CUDNN_FMA_MATH));
}

Shape sizes_of(int64_t n, int64_t c, const std::array<int64_t, 3>& sp, int64_t nd) {
  Shape s{n, c};
  for (int64_t i = 3 - nd; i < 3; ++i) s.push_back(sp[static_cast<size_t>(i)]);
  return s;
}

Tensor workspace(size_t bytes, Device dev) {
  return empty_cuda({static_cast<int64_t>(std::max<size_t>(bytes, 1))}, kUInt8, dev);
}

// Picks the first algorithm of cuDNN's heuristic list that succeeds with its workspace.
template <class Perf, class Get>
std::vector<Perf> candidates(Get get) {
  int n = 0;
  std::vector<Perf> perf(16);
  get(static_cast<int>(perf.size()), &n, perf.data());
  perf.resize(static_cast<size_t>(n));
  return perf;
}

const void* data(const Tensor& t) { return t.impl()->data(); }

Tensor forward(const Tensor& x_, const Tensor& w_, const ConvGeom& g) {
  DType dt = x_.dtype();
  Tensor x = contiguous_as(x_, dt), w = contiguous_as(w_, dt);
  Tensor y = empty_cuda(sizes_of(g.n, g.co, g.y, g.nd), dt, x.device());
  Descs d;
  set_descs(d, g, dt);
  cudnnHandle_t h = handle_for(x);
  auto perf = candidates<cudnnConvolutionFwdAlgoPerf_t>([&](int req, int* n, auto* p) {
    KILN_CUDNN_CHECK(cudnnGetConvolutionForwardAlgorithm_v7(h, d.x, d.w, d.conv, d.y, req, n, p));
  });
  const double one = 1, zero = 0;
  const float onef = 1, zerof = 0;
  const void* alpha = dt == kFloat64 ? static_cast<const void*>(&one) : &onef;
  const void* beta = dt == kFloat64 ? static_cast<const void*>(&zero) : &zerof;
  cudnnStatus_t last = CUDNN_STATUS_NOT_SUPPORTED;
  for (const auto& p : perf) {
    if (p.status != CUDNN_STATUS_SUCCESS) continue;
    Tensor ws = workspace(p.memory, x.device());
    last = cudnnConvolutionForward(h, alpha, d.x, data(x), d.w, data(w), d.conv, p.algo,
                                   const_cast<void*>(data(ws)), p.memory, beta, d.y,
                                   const_cast<void*>(data(y)));
    if (last == CUDNN_STATUS_SUCCESS) return y;
  }
  check_cudnn(last, "cudnnConvolutionForward");
  return y;
}

Tensor backward_data(const Tensor& gy_, const Tensor& w_, const ConvGeom& g) {
  DType dt = gy_.dtype();
  Tensor gy = contiguous_as(gy_, dt), w = contiguous_as(w_, dt);
  Tensor gx = empty_cuda(sizes_of(g.n, g.ci, g.x, g.nd), dt, gy.device());
  Descs d;
  set_descs(d, g, dt);
  cudnnHandle_t h = handle_for(gy);
  auto perf = candidates<cudnnConvolutionBwdDataAlgoPerf_t>([&](int req, int* n, auto* p) {
    KILN_CUDNN_CHECK(
        cudnnGetConvolutionBackwardDataAlgorithm_v7(h, d.w, d.y, d.conv, d.x, req, n, p));
  });
  const double one = 1, zero = 0;
  const float onef = 1, zerof = 0;
  const void* alpha = dt == kFloat64 ? static_cast<const void*>(&one) : &onef;
  const void* beta = dt == kFloat64 ? static_cast<const void*>(&zero) : &zerof;
  cudnnStatus_t last = CUDNN_STATUS_NOT_SUPPORTED;
  for (const auto& p : perf) {
    if (p.status != CUDNN_STATUS_SUCCESS) continue;
    Tensor ws = workspace(p.memory, gy.device());
    last = cudnnConvolutionBackwardData(h, alpha, d.w, data(w), d.y, data(gy), d.conv, p.algo,
                                        const_cast<void*>(data(ws)), p.memory, beta, d.x,
                                        const_cast<void*>(data(gx)));
    if (last == CUDNN_STATUS_SUCCESS) return gx;
  }
  check_cudnn(last, "cudnnConvolutionBackwardData");
  return gx;
}

Tensor backward_weight(const Tensor& x_, const Tensor& gy_, const ConvGeom& g) {
  DType dt = x_.dtype();
  Tensor x = contiguous_as(x_, dt), gy = contiguous_as(gy_, dt);
  Shape ws_sizes{g.co, g.ci / g.groups};
  for (int64_t i = 3 - g.nd; i < 3; ++i) ws_sizes.push_back(g.k[static_cast<size_t>(i)]);
  Tensor gw = empty_cuda(ws_sizes, dt, x.device());
  Descs d;
  set_descs(d, g, dt);
  cudnnHandle_t h = handle_for(x);
  auto perf = candidates<cudnnConvolutionBwdFilterAlgoPerf_t>([&](int req, int* n, auto* p) {
    KILN_CUDNN_CHECK(
        cudnnGetConvolutionBackwardFilterAlgorithm_v7(h, d.x, d.y, d.conv, d.w, req, n, p));
  });
  const double one = 1, zero = 0;
  const float onef = 1, zerof = 0;
  const void* alpha = dt == kFloat64 ? static_cast<const void*>(&one) : &onef;
  const void* beta = dt == kFloat64 ? static_cast<const void*>(&zero) : &zerof;
  cudnnStatus_t last = CUDNN_STATUS_NOT_SUPPORTED;
  for (const auto& p : perf) {
    if (p.status != CUDNN_STATUS_SUCCESS) continue;
    Tensor ws = workspace(p.memory, x.device());
    last = cudnnConvolutionBackwardFilter(h, alpha, d.x, data(x), d.y, data(gy), d.conv, p.algo,
                                          const_cast<void*>(data(ws)), p.memory, beta, d.w,
                                          const_cast<void*>(data(gw)));
    if (last == CUDNN_STATUS_SUCCESS) return gw;
  }
  check_cudnn(last, "cudnnConvolutionBackwardFilter");
  return gw;
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

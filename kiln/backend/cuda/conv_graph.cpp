// Note [cuDNN graph convolutions]
// cuDNN's legacy convolution API (cudnnFind*AlgorithmEx, cudnnConvolutionForward, ...) only
// reaches its pre-Hopper kernels: on the H200 its search picks FFMA implicit GEMM, FFT and
// Winograd kernels, 1.1 to 4.5 times PyTorch's time at ResNet-50's shapes, where PyTorch, which
// goes through the graph (backend) API, runs sm90 TF32 implicit-GEMM engines (ncu of both,
// bench/gpu_runs.md run P13). So each pass is also built as a one-operation graph: tensors
// (packed NC(D)HW; 1-D as 2-D, as the legacy path), a convolution descriptor and the pass's
// operation, then cuDNN's heuristics (mode A) rank engine configurations, the first kMaxTimed
// that finalize into execution plans are timed on the call's buffers, and the fastest is kept.
// conv.cpp's choice (Note [cuDNN algorithm choice]) takes it when it beats the legacy search's
// best, so nothing gets slower. Engines are filtered by their numerical notes as PyTorch's
// filter does: tensor cores for float32 only when TF32 is allowed, never down-converted
// inputs, and no nondeterministic engine under deterministic_algorithms. A plan is finalized
// against one cuDNN handle, and handles are per thread and device, so the caller caches plans
// per thread.
#include "kiln/backend/cuda/conv_graph.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <vector>

#include "kiln/backend/cuda/common.h"
#include "kiln/ops/ops.h"

namespace kiln::cuda {

namespace {

constexpr int kMaxTimed = 8;
constexpr int64_t kMaxWorkspace = int64_t{1} << 30;
constexpr int64_t kAlignment = 16;

// A backend descriptor, destroyed with its owner.
class Desc {
 public:
  explicit Desc(cudnnBackendDescriptorType_t type) {
    ok_ = cudnnBackendCreateDescriptor(type, &d_) == CUDNN_STATUS_SUCCESS;
  }
  ~Desc() {
    if (d_) cudnnBackendDestroyDescriptor(d_);
  }
  Desc(const Desc&) = delete;
  Desc& operator=(const Desc&) = delete;
  cudnnBackendDescriptor_t get() const { return d_; }
  // Each setter records the first failure; finalize() reports whether all succeeded.
  Desc& set(cudnnBackendAttributeName_t name, cudnnBackendAttributeType_t type, int64_t count,
            const void* values) {
    if (ok_) ok_ = cudnnBackendSetAttribute(d_, name, type, count, values) == CUDNN_STATUS_SUCCESS;
    return *this;
  }
  Desc& set(cudnnBackendAttributeName_t name, const Desc& other) {
    cudnnBackendDescriptor_t d = other.get();
    return set(name, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &d);
  }
  Desc& set_ints(cudnnBackendAttributeName_t name, const std::vector<int64_t>& v) {
    return set(name, CUDNN_TYPE_INT64, static_cast<int64_t>(v.size()), v.data());
  }
  bool finalize() {
    if (ok_) ok_ = cudnnBackendFinalize(d_) == CUDNN_STATUS_SUCCESS;
    return ok_;
  }

 private:
  cudnnBackendDescriptor_t d_ = nullptr;
  bool ok_ = false;
};

// A packed NC(D)HW tensor of `n` x `c` x the spatial sizes (at least two: 1-D as 2-D).
std::unique_ptr<Desc> tensor_desc(DType dt, int64_t uid, int64_t n, int64_t c,
                                  const std::array<int64_t, 3>& sp, int nsp) {
  std::vector<int64_t> dims{n, c};
  for (int i = 3 - nsp; i < 3; ++i) dims.push_back(sp[static_cast<size_t>(i)]);
  std::vector<int64_t> strides(dims.size());
  int64_t s = 1;
  for (size_t i = dims.size(); i-- > 0;) {
    strides[i] = s;
    s *= dims[i];
  }
  auto d = std::make_unique<Desc>(CUDNN_BACKEND_TENSOR_DESCRIPTOR);
  cudnnDataType_t type = cudnn_data_type(dt);
  d->set(CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &type)
      .set_ints(CUDNN_ATTR_TENSOR_DIMENSIONS, dims)
      .set_ints(CUDNN_ATTR_TENSOR_STRIDES, strides)
      .set(CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &uid)
      .set(CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, 1, &kAlignment);
  return d->finalize() ? std::move(d) : nullptr;
}

bool has_note(cudnnBackendDescriptor_t engine, cudnnBackendNumericalNote_t note) {
  std::array<cudnnBackendNumericalNote_t, CUDNN_NUMERICAL_NOTE_TYPE_COUNT> notes{};
  int64_t n = 0;
  if (cudnnBackendGetAttribute(engine, CUDNN_ATTR_ENGINE_NUMERICAL_NOTE, CUDNN_TYPE_NUMERICAL_NOTE,
                               static_cast<int64_t>(notes.size()), &n,
                               notes.data()) != CUDNN_STATUS_SUCCESS)
    return true;  // unknown numerics: treat as excluded
  return std::find(notes.begin(), notes.begin() + n, note) != notes.begin() + n;
}

// Whether Kiln's settings allow the engine of `cfg` for dtype `dt`.
bool allowed(cudnnBackendDescriptor_t cfg, DType dt) {
  Desc engine(CUDNN_BACKEND_ENGINE_DESCRIPTOR);
  cudnnBackendDescriptor_t e = engine.get();
  int64_t n = 0;
  if (!e ||
      cudnnBackendGetAttribute(cfg, CUDNN_ATTR_ENGINECFG_ENGINE, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1,
                               &n, &e) != CUDNN_STATUS_SUCCESS)
    return false;
  if (has_note(e, CUDNN_NUMERICAL_NOTE_DOWN_CONVERT_INPUTS)) return false;
  if (dt == kFloat32 && !allow_tf32() && has_note(e, CUDNN_NUMERICAL_NOTE_TENSOR_CORE))
    return false;
  if (deterministic_algorithms() && has_note(e, CUDNN_NUMERICAL_NOTE_NONDETERMINISTIC))
    return false;
  return true;
}

void* ptr(const Tensor& t) { return const_cast<void*>(t.impl()->data()); }

}  // namespace

cudnnDataType_t cudnn_data_type(DType d) {
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

class ConvGraphPlan {
 public:
  std::unique_ptr<Desc> cfg, plan;
  int64_t workspace = 0;
  float ms = 0;
};

namespace {

// Runs `plan` once on `h`'s stream with a variant pack of the three buffers and `ws`.
cudnnStatus_t execute(const ConvGraphPlan& p, cudnnHandle_t h, const Tensor& a, const Tensor& b,
                      const Tensor& out, const Tensor& ws) {
  std::array<int64_t, 3> uids{1, 2, 3};
  std::array<void*, 3> ptrs{ptr(a), ptr(b), ptr(out)};
  void* w = ptr(ws);
  Desc pack(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR);
  pack.set(CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, 3, uids.data())
      .set(CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, 3, ptrs.data())
      .set(CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &w);
  if (!pack.finalize()) return CUDNN_STATUS_BAD_PARAM;
  return cudnnBackendExecute(h, p.plan->get(), pack.get());
}

Tensor workspace_of(int64_t bytes, Device dev) {
  return empty_cuda({std::max<int64_t>(bytes, 1)}, kUInt8, dev);
}

bool aligned(const Tensor& t) { return reinterpret_cast<uintptr_t>(ptr(t)) % kAlignment == 0; }

// The time of `reps` runs of the plan after one untimed run; a negative time when it fails.
float time_ms(const ConvGraphPlan& p, cudnnHandle_t h, const Tensor& a, const Tensor& b,
              const Tensor& out, const Tensor& ws, cudaStream_t stream) {
  if (execute(p, h, a, b, out, ws) != CUDNN_STATUS_SUCCESS) return -1;
  constexpr int reps = 3;
  cudaEvent_t start, stop;
  KILN_CUDA_CHECK(cudaEventCreate(&start));
  KILN_CUDA_CHECK(cudaEventCreate(&stop));
  KILN_CUDA_CHECK(cudaEventRecord(start, stream));
  bool ok = true;
  for (int i = 0; i < reps && ok; ++i) ok = execute(p, h, a, b, out, ws) == CUDNN_STATUS_SUCCESS;
  KILN_CUDA_CHECK(cudaEventRecord(stop, stream));
  KILN_CUDA_CHECK(cudaEventSynchronize(stop));
  float ms = 0;
  KILN_CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  return ok ? ms / reps : -1;
}

}  // namespace

std::shared_ptr<const ConvGraphPlan> find_conv_graph_plan(ConvPass pass, cudnnHandle_t h,
                                                          const detail::ConvGeom& g, DType dt,
                                                          const Tensor& a, const Tensor& b,
                                                          const Tensor& out) {
  if (!aligned(a) || !aligned(b) || !aligned(out)) return nullptr;
  const int nsp = static_cast<int>(std::max<int64_t>(g.nd, 2));
  // The x-, y- and w-shaped tensors; which of them are a, b and out depends on the pass.
  // Unique ids 1, 2, 3 are a, b and out (execute's variant pack).
  int64_t uid_x = 1, uid_w = 2, uid_y = 3;
  if (pass == ConvPass::BackwardData) uid_y = 1, uid_w = 2, uid_x = 3;
  if (pass == ConvPass::BackwardFilter) uid_x = 1, uid_y = 2, uid_w = 3;
  auto x = tensor_desc(dt, uid_x, g.n, g.ci, g.x, nsp);
  auto y = tensor_desc(dt, uid_y, g.n, g.co, g.y, nsp);
  auto w = tensor_desc(dt, uid_w, g.co, g.ci / g.groups, g.k, nsp);
  if (!x || !y || !w) return nullptr;

  std::vector<int64_t> pad, stride, dil;
  for (int i = 3 - nsp; i < 3; ++i) {
    auto j = static_cast<size_t>(i);
    pad.push_back(g.pad[j]);
    stride.push_back(g.stride[j]);
    dil.push_back(g.dil[j]);
  }
  const bool half = dt == kFloat16 || dt == kBFloat16;
  cudnnDataType_t compute = half ? CUDNN_DATA_FLOAT : cudnn_data_type(dt);
  cudnnConvolutionMode_t mode = CUDNN_CROSS_CORRELATION;
  const int64_t spatial = nsp;
  Desc conv(CUDNN_BACKEND_CONVOLUTION_DESCRIPTOR);
  conv.set(CUDNN_ATTR_CONVOLUTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &compute)
      .set(CUDNN_ATTR_CONVOLUTION_CONV_MODE, CUDNN_TYPE_CONVOLUTION_MODE, 1, &mode)
      .set(CUDNN_ATTR_CONVOLUTION_SPATIAL_DIMS, CUDNN_TYPE_INT64, 1, &spatial)
      .set_ints(CUDNN_ATTR_CONVOLUTION_DILATIONS, dil)
      .set_ints(CUDNN_ATTR_CONVOLUTION_FILTER_STRIDES, stride)
      .set_ints(CUDNN_ATTR_CONVOLUTION_PRE_PADDINGS, pad)
      .set_ints(CUDNN_ATTR_CONVOLUTION_POST_PADDINGS, pad);
  if (!conv.finalize()) return nullptr;

  const double one = 1, zero = 0;
  const float onef = 1, zerof = 0;
  const bool dbl = dt == kFloat64;
  const cudnnBackendAttributeType_t scalar = dbl ? CUDNN_TYPE_DOUBLE : CUDNN_TYPE_FLOAT;
  const void* alpha = dbl ? static_cast<const void*>(&one) : &onef;
  const void* beta = dbl ? static_cast<const void*>(&zero) : &zerof;
  std::unique_ptr<Desc> op;
  switch (pass) {
    case ConvPass::Forward:
      op = std::make_unique<Desc>(CUDNN_BACKEND_OPERATION_CONVOLUTION_FORWARD_DESCRIPTOR);
      op->set(CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_X, *x)
          .set(CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_W, *w)
          .set(CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_Y, *y)
          .set(CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_CONV_DESC, conv)
          .set(CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_ALPHA, scalar, 1, alpha)
          .set(CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_BETA, scalar, 1, beta);
      break;
    case ConvPass::BackwardData:
      op = std::make_unique<Desc>(CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_DATA_DESCRIPTOR);
      op->set(CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_DX, *x)
          .set(CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_W, *w)
          .set(CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_DY, *y)
          .set(CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_CONV_DESC, conv)
          .set(CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_ALPHA, scalar, 1, alpha)
          .set(CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_BETA, scalar, 1, beta);
      break;
    case ConvPass::BackwardFilter:
      op = std::make_unique<Desc>(CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_FILTER_DESCRIPTOR);
      op->set(CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_X, *x)
          .set(CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_DW, *w)
          .set(CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_DY, *y)
          .set(CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_CONV_DESC, conv)
          .set(CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_ALPHA, scalar, 1, alpha)
          .set(CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_BETA, scalar, 1, beta);
      break;
  }
  if (!op->finalize()) return nullptr;

  Desc graph(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR);
  cudnnBackendDescriptor_t op_d = op->get();
  graph.set(CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &op_d)
      .set(CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, 1, &h);
  if (!graph.finalize()) return nullptr;

  Desc heur(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR);
  cudnnBackendHeurMode_t heur_mode = CUDNN_HEUR_MODE_A;
  heur.set(CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, graph)
      .set(CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &heur_mode);
  if (!heur.finalize()) return nullptr;
  int64_t count = 0;
  if (cudnnBackendGetAttribute(heur.get(), CUDNN_ATTR_ENGINEHEUR_RESULTS,
                               CUDNN_TYPE_BACKEND_DESCRIPTOR, 0, &count,
                               nullptr) != CUDNN_STATUS_SUCCESS ||
      count <= 0)
    return nullptr;
  std::vector<std::unique_ptr<Desc>> cfgs;
  std::vector<cudnnBackendDescriptor_t> raw;
  for (int64_t i = 0; i < count; ++i) {
    cfgs.push_back(std::make_unique<Desc>(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR));
    raw.push_back(cfgs.back()->get());
  }
  int64_t got = 0;
  if (cudnnBackendGetAttribute(heur.get(), CUDNN_ATTR_ENGINEHEUR_RESULTS,
                               CUDNN_TYPE_BACKEND_DESCRIPTOR, count, &got,
                               raw.data()) != CUDNN_STATUS_SUCCESS)
    return nullptr;

  cudaStream_t stream = nullptr;
  if (cudnnGetStream(h, &stream) != CUDNN_STATUS_SUCCESS) return nullptr;
  std::shared_ptr<ConvGraphPlan> best;
  int timed = 0;
  for (int64_t i = 0; i < got && timed < kMaxTimed; ++i) {
    if (!allowed(raw[static_cast<size_t>(i)], dt)) continue;
    auto p = std::make_shared<ConvGraphPlan>();
    p->plan = std::make_unique<Desc>(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR);
    cudnnBackendDescriptor_t cfg = raw[static_cast<size_t>(i)];
    p->plan->set(CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, 1, &h)
        .set(CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &cfg);
    if (!p->plan->finalize()) continue;
    int64_t n = 0;
    if (cudnnBackendGetAttribute(p->plan->get(), CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE,
                                 CUDNN_TYPE_INT64, 1, &n, &p->workspace) != CUDNN_STATUS_SUCCESS ||
        p->workspace > kMaxWorkspace)
      continue;
    p->cfg = std::move(cfgs[static_cast<size_t>(i)]);  // the plan's configuration stays alive
    ++timed;
    Tensor ws = workspace_of(p->workspace, a.device());
    p->ms = time_ms(*p, h, a, b, out, ws, stream);
    if (p->ms >= 0 && (!best || p->ms < best->ms)) best = p;
  }
  if (best) {  // `out` holds the best plan's result, as a search's caller expects a result
    Tensor ws = workspace_of(best->workspace, a.device());
    if (execute(*best, h, a, b, out, ws) != CUDNN_STATUS_SUCCESS) return nullptr;
  }
  return best;
}

float conv_graph_plan_ms(const ConvGraphPlan& plan) { return plan.ms; }

void run_conv_graph_plan(const ConvGraphPlan& plan, cudnnHandle_t h, const Tensor& a,
                         const Tensor& b, const Tensor& out) {
  Tensor ws = workspace_of(plan.workspace, a.device());
  cudnnStatus_t s = execute(plan, h, a, b, out, ws);
  KILN_CHECK_DEVICE(s == CUDNN_STATUS_SUCCESS,
                    "[convolution] cuDNN: cudnnBackendExecute failed: {}", cudnnGetErrorString(s));
}

}  // namespace kiln::cuda

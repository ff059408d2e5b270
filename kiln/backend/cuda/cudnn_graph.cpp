// cuDNN's graph (backend) API: the pieces its users share (cudnn_graph.h).
#include "kiln/backend/cuda/cudnn_graph.h"

#include <algorithm>
#include <array>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <unordered_map>

#include "kiln/backend/cuda/common.h"
#include "kiln/ops/ops.h"

namespace kiln::cuda {

namespace {

// With KILN_CUDNN_DEBUG=1 each failed step prints cuDNN's own reason (cuDNN declines silently
// otherwise, and the caller falls back).
void report_failure(const char* step, int type) {
  static const bool on = [] {
    const char* v = std::getenv("KILN_CUDNN_DEBUG");
    return v && std::string(v) == "1";
  }();
  if (!on) return;
  std::array<char, 1024> reason{};
  cudnnGetLastErrorString(reason.data(), reason.size());
  std::fprintf(stderr, "[cudnn] %s of a descriptor of type %d failed: %s\n", step, type,
               reason.data());
}

}  // namespace

CudnnDesc::CudnnDesc(cudnnBackendDescriptorType_t type) : type_(type) {
  ok_ = cudnnBackendCreateDescriptor(type, &d_) == CUDNN_STATUS_SUCCESS;
  if (!ok_) report_failure("creation", type_);
}

CudnnDesc::~CudnnDesc() {
  if (d_) cudnnBackendDestroyDescriptor(d_);
}

CudnnDesc& CudnnDesc::set(cudnnBackendAttributeName_t name, cudnnBackendAttributeType_t type,
                          int64_t count, const void* values) {
  if (ok_) {
    ok_ = cudnnBackendSetAttribute(d_, name, type, count, values) == CUDNN_STATUS_SUCCESS;
    if (!ok_)
      report_failure(fmt::format("setting attribute {}", static_cast<int>(name)).c_str(), type_);
  }
  return *this;
}

CudnnDesc& CudnnDesc::set(cudnnBackendAttributeName_t name, const CudnnDesc& other) {
  cudnnBackendDescriptor_t d = other.get();
  return set(name, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &d);
}

CudnnDesc& CudnnDesc::set_ints(cudnnBackendAttributeName_t name, const std::vector<int64_t>& v) {
  return set(name, CUDNN_TYPE_INT64, static_cast<int64_t>(v.size()), v.data());
}

bool CudnnDesc::finalize() {
  if (ok_) {
    ok_ = cudnnBackendFinalize(d_) == CUDNN_STATUS_SUCCESS;
    if (!ok_) report_failure("finalizing", type_);
  }
  return ok_;
}

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

cudnnHandle_t cudnn_handle_for(const Tensor& t) {
  thread_local std::unordered_map<int, cudnnHandle_t> handles;
  int index = t.device().index();
  cudaStream_t stream = stream_for(t);  // also makes `index` current
  auto it = handles.find(index);
  if (it == handles.end()) {
    cudnnHandle_t h = nullptr;
    cudnnStatus_t s = cudnnCreate(&h);
    KILN_CHECK_DEVICE(s == CUDNN_STATUS_SUCCESS, "[cudnn] cudnnCreate on {} failed: {}",
                      t.device().str(), cudnnGetErrorString(s));
    it = handles.emplace(index, h).first;
  }
  cudnnStatus_t s = cudnnSetStream(it->second, stream);
  KILN_CHECK_DEVICE(s == CUDNN_STATUS_SUCCESS, "[cudnn] cudnnSetStream failed: {}",
                    cudnnGetErrorString(s));
  return it->second;
}

namespace {

bool has_note(cudnnBackendDescriptor_t engine, cudnnBackendNumericalNote_t note) {
  std::array<cudnnBackendNumericalNote_t, CUDNN_NUMERICAL_NOTE_TYPE_COUNT> notes{};
  int64_t n = 0;
  if (cudnnBackendGetAttribute(engine, CUDNN_ATTR_ENGINE_NUMERICAL_NOTE, CUDNN_TYPE_NUMERICAL_NOTE,
                               static_cast<int64_t>(notes.size()), &n,
                               notes.data()) != CUDNN_STATUS_SUCCESS)
    return true;  // unknown numerics: treat as excluded
  return std::find(notes.begin(), notes.begin() + n, note) != notes.begin() + n;
}

}  // namespace

bool cudnn_engine_allowed(cudnnBackendDescriptor_t cfg, DType dt) {
  CudnnDesc engine(CUDNN_BACKEND_ENGINE_DESCRIPTOR);
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

std::vector<std::shared_ptr<CudnnPlan>> cudnn_plans(
    const std::vector<cudnnBackendDescriptor_t>& ops, cudnnHandle_t h, DType dt, int max_plans,
    int64_t max_workspace) {
  std::vector<std::shared_ptr<CudnnPlan>> plans;
  CudnnDesc graph(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR);
  graph
      .set(CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR,
           static_cast<int64_t>(ops.size()), ops.data())
      .set(CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, 1, &h);
  if (!graph.finalize()) return plans;

  CudnnDesc heur(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR);
  cudnnBackendHeurMode_t heur_mode = CUDNN_HEUR_MODE_A;
  heur.set(CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, graph)
      .set(CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &heur_mode);
  if (!heur.finalize()) return plans;
  int64_t count = 0;
  if (cudnnBackendGetAttribute(heur.get(), CUDNN_ATTR_ENGINEHEUR_RESULTS,
                               CUDNN_TYPE_BACKEND_DESCRIPTOR, 0, &count,
                               nullptr) != CUDNN_STATUS_SUCCESS ||
      count <= 0)
    return plans;
  std::vector<std::unique_ptr<CudnnDesc>> cfgs;
  std::vector<cudnnBackendDescriptor_t> raw;
  for (int64_t i = 0; i < count; ++i) {
    cfgs.push_back(std::make_unique<CudnnDesc>(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR));
    raw.push_back(cfgs.back()->get());
  }
  int64_t got = 0;
  if (cudnnBackendGetAttribute(heur.get(), CUDNN_ATTR_ENGINEHEUR_RESULTS,
                               CUDNN_TYPE_BACKEND_DESCRIPTOR, count, &got,
                               raw.data()) != CUDNN_STATUS_SUCCESS)
    return plans;
  for (int64_t i = 0; i < got && static_cast<int>(plans.size()) < max_plans; ++i) {
    auto j = static_cast<size_t>(i);
    if (!cudnn_engine_allowed(raw[j], dt)) continue;
    auto p = std::make_shared<CudnnPlan>();
    p->plan = std::make_unique<CudnnDesc>(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR);
    cudnnBackendDescriptor_t cfg = raw[j];
    p->plan->set(CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, 1, &h)
        .set(CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &cfg);
    if (!p->plan->finalize()) continue;
    int64_t n = 0;
    if (cudnnBackendGetAttribute(p->plan->get(), CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE,
                                 CUDNN_TYPE_INT64, 1, &n, &p->workspace) != CUDNN_STATUS_SUCCESS ||
        p->workspace > max_workspace)
      continue;
    p->cfg = std::move(cfgs[j]);  // the plan's configuration stays alive
    plans.push_back(std::move(p));
  }
  return plans;
}

cudnnStatus_t cudnn_execute(const CudnnPlan& plan, cudnnHandle_t h,
                            const std::vector<int64_t>& uids, const std::vector<void*>& ptrs,
                            void* ws) {
  CudnnDesc pack(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR);
  pack.set(CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, static_cast<int64_t>(uids.size()),
           uids.data())
      .set(CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR,
           static_cast<int64_t>(ptrs.size()), ptrs.data())
      .set(CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &ws);
  if (!pack.finalize()) return CUDNN_STATUS_BAD_PARAM;
  cudnnStatus_t s = cudnnBackendExecute(h, plan.plan->get(), pack.get());
  if (s != CUDNN_STATUS_SUCCESS)
    report_failure("executing", CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR);
  return s;
}

// Note [Timing cuDNN plans]
// Plans are chosen by timing them (attention_cudnn.cpp, conv_graph.cpp) on kernels of a few
// microseconds, while cudnnBackendExecute costs the host about as much a call. Timed as queued,
// back to back after the events, the runs were paced by the host: the events measured the
// host's cost between launches as much as the kernels, and which plan won changed from process
// to process (two ranks of one GPT step, on two H200s, took an sm90 forward attention plan in one
// run and an sm80 one in the next). Now a kernel holds the stream (hold_stream) for
// kTimingHoldNs, longer than the host takes to queue the kTimedRuns runs behind it, so they run
// back to back, as in a replay, and the events time the device alone. Measured on the `gpt` DDP
// step (bench/gpu_runs.md, U5): every rank of every run took the same plans, and with each of
// the first four plans forced in turn the timed choice was the fastest step (1.241M tokens/s at
// one GPU against 1.154M-1.226M).
constexpr uint64_t kTimingHoldNs = 1'000'000;
constexpr int kTimedRuns = 5;

float cudnn_time_ms(const CudnnPlan& plan, cudnnHandle_t h, const std::vector<int64_t>& uids,
                    const std::vector<void*>& ptrs, void* ws) {
  cudaStream_t stream = nullptr;
  if (cudnnGetStream(h, &stream) != CUDNN_STATUS_SUCCESS) return -1;
  if (cudnn_execute(plan, h, uids, ptrs, ws) != CUDNN_STATUS_SUCCESS) return -1;
  cudaEvent_t start, stop;
  KILN_CUDA_CHECK(cudaEventCreate(&start));
  KILN_CUDA_CHECK(cudaEventCreate(&stop));
  // Note [Timing cuDNN plans]: the device waits while the host queues the timed runs.
  hold_stream(stream, kTimingHoldNs);
  KILN_CUDA_CHECK(cudaEventRecord(start, stream));
  bool ok = true;
  for (int i = 0; i < kTimedRuns && ok; ++i)
    ok = cudnn_execute(plan, h, uids, ptrs, ws) == CUDNN_STATUS_SUCCESS;
  KILN_CUDA_CHECK(cudaEventRecord(stop, stream));
  KILN_CUDA_CHECK(cudaEventSynchronize(stop));
  float ms = 0;
  KILN_CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  return ok ? ms / kTimedRuns : -1;
}

}  // namespace kiln::cuda

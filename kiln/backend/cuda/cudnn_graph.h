// What the users of cuDNN's graph (backend) API share: descriptors that free themselves, the
// per-thread handle, the engine filter and plans from cuDNN's heuristics. Internal to
// kiln/backend/cuda (convolutions: Note [cuDNN graph convolutions]; attention: Note [cuDNN
// fused attention]).
#pragma once

#include <cudnn.h>

#include <memory>
#include <vector>

#include "kiln/core/tensor.h"

namespace kiln::cuda {

// A backend descriptor, destroyed with its owner. Each setter records the first failure;
// finalize() reports whether all succeeded. With KILN_CUDNN_DEBUG=1 a failure prints cuDNN's
// reason on stderr.
class CudnnDesc {
 public:
  explicit CudnnDesc(cudnnBackendDescriptorType_t type);
  ~CudnnDesc();
  CudnnDesc(const CudnnDesc&) = delete;
  CudnnDesc& operator=(const CudnnDesc&) = delete;
  cudnnBackendDescriptor_t get() const { return d_; }
  CudnnDesc& set(cudnnBackendAttributeName_t name, cudnnBackendAttributeType_t type, int64_t count,
                 const void* values);
  CudnnDesc& set(cudnnBackendAttributeName_t name, const CudnnDesc& other);
  CudnnDesc& set_ints(cudnnBackendAttributeName_t name, const std::vector<int64_t>& v);
  bool finalize();

 private:
  cudnnBackendDescriptorType_t type_;
  cudnnBackendDescriptor_t d_ = nullptr;
  bool ok_ = false;
};

// cuDNN's data type for a float dtype (float32 for any other; callers check dtypes first).
cudnnDataType_t cudnn_data_type(DType d);

// The calling thread's cuDNN handle for t's device, bound to t's current stream.
cudnnHandle_t cudnn_handle_for(const Tensor& t);

// Whether Kiln's settings allow the engine of configuration `cfg` for dtype `dt`: as PyTorch's
// filter, tensor cores for float32 only when TF32 is allowed, never down-converted inputs, and
// no nondeterministic engine under deterministic_algorithms.
bool cudnn_engine_allowed(cudnnBackendDescriptor_t cfg, DType dt);

// A finalized execution plan with its workspace size; `cfg` keeps the configuration alive.
struct CudnnPlan {
  std::unique_ptr<CudnnDesc> cfg, plan;
  int64_t workspace = 0;
};

// The allowed engine configurations cuDNN's heuristics (mode A) rank for the graph of `ops`,
// best first, each finalized into a plan on `h` (at most `max_plans`, none whose workspace
// exceeds `max_workspace`); empty when the graph does not finalize or no engine takes it.
std::vector<std::shared_ptr<CudnnPlan>> cudnn_plans(
    const std::vector<cudnnBackendDescriptor_t>& ops, cudnnHandle_t h, DType dt, int max_plans,
    int64_t max_workspace);

// Runs `plan` on h's stream with the variant pack of `uids` and `ptrs` and workspace `ws`.
cudnnStatus_t cudnn_execute(const CudnnPlan& plan, cudnnHandle_t h,
                            const std::vector<int64_t>& uids, const std::vector<void*>& ptrs,
                            void* ws);

// The mean device time in milliseconds of 5 runs of `plan` queued back to back behind a held
// stream (Note [Timing cuDNN plans] in cudnn_graph.cpp) after an untimed one, on the same
// buffers (which it overwrites); negative when a run fails. Synchronizes: never during a capture.
float cudnn_time_ms(const CudnnPlan& plan, cudnnHandle_t h, const std::vector<int64_t>& uids,
                    const std::vector<void*>& ptrs, void* ws);

}  // namespace kiln::cuda

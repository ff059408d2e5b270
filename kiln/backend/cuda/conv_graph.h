// Convolutions through cuDNN's graph (backend) API: the engines PyTorch's convolutions use, which
// the legacy cudnnConvolution* API does not reach (Note [cuDNN graph convolutions]).
#pragma once

#include <cudnn.h>

#include <memory>

#include "kiln/core/tensor.h"
#include "kiln/ops/conv_meta.h"

namespace kiln::cuda {

// The three canonical passes: forward (x, w -> y), backward data (gy, w -> gx) and backward
// filter (x, gy -> gw); `a` and `b` are the inputs in that order.
enum class ConvPass : int64_t { Forward, BackwardData, BackwardFilter };

// A finalized execution plan for one pass of one geometry and dtype, with its workspace size
// and the time its best run took when it was chosen.
class ConvGraphPlan;

// The fastest engine cuDNN's heuristics offer for `pass`, each candidate timed on the call's
// own contiguous buffers (which must be 16-byte aligned) and `out` left holding a result;
// nullptr when no engine runs it. Engines are filtered as the legacy search filters
// algorithms: no TF32 for float32 unless allow_tf32, no down-converted inputs, deterministic
// ones only under deterministic_algorithms. Synchronizes: never call it during a capture.
std::shared_ptr<const ConvGraphPlan> find_conv_graph_plan(ConvPass pass, cudnnHandle_t h,
                                                          const detail::ConvGeom& g, DType dt,
                                                          const Tensor& a, const Tensor& b,
                                                          const Tensor& out);

// The plan's best time in milliseconds, as measured by find_conv_graph_plan.
float conv_graph_plan_ms(const ConvGraphPlan& plan);

// Runs the plan on `h`'s stream: out = pass(a, b).
void run_conv_graph_plan(const ConvGraphPlan& plan, cudnnHandle_t h, const Tensor& a,
                         const Tensor& b, const Tensor& out);

}  // namespace kiln::cuda

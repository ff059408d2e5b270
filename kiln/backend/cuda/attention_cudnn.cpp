// Note [cuDNN fused attention]
// cuDNN's fused flash-attention engines (sm90 kernels on the H100/H200) take a graph of plain
// operations in one fixed shape and run it as one kernel: the forward is
//   S = Q Kᵀ (matmul), S·scale, [causal: row >= col ? S : -inf], M = max S, E = exp(S - M),
//   Z = Σ E, Stats = M + log Z, P = E / Z (in Q's dtype), O = P V;
// the backward recomputes P = exp(S·scale [masked] - Stats) and gives
//   dV = Pᵀ dO, D = Σ dO∘O (a float buffer of the caller's), dS = P∘(dO Vᵀ - D)·scale,
//   dK = dSᵀ Q, dQ = dS K,
// dQ straight from a float scratch of b·h·l·s halves in cuDNN's workspace (cudnn-frontend's path
// under determinism; its other path, dQ added into a float buffer with atomics, is left out, so
// a shape whose scratch would pass kMaxWorkspace stays on Kiln's kernels).
// This file builds those graphs with the backend API (what cudnn-frontend's SDPA nodes expand to
// for cuDNN 9.19; the unified SDPA operation takes a causal mask only from 9.21). Stats is the
// natural-log logsumexp of each query's scaled scores, which is what flash_attention returns, so
// cuDNN's forward and Kiln's backward (or the reverse) can be mixed. Operands are viewed as
// [b, h, rows, e] with the strides AttnOperand gives (b the outer, h the inner leading dim), Kᵀ
// and Vᵀ as the transposed views of K and V; the scale and -inf are by-value scalars, so one
// plan serves every scale. Plans are cached per thread (plans belong to the thread's handle),
// keyed by pass, dtype, causality, sizes, strides, device and determinism; a key cuDNN declines
// is remembered too, and the caller then runs Kiln's kernels (attention16.cu). A key's first
// call times the first kMaxTimed engine configurations cuDNN's heuristics rank on its own
// buffers and keeps the fastest; during a capture, where nothing may synchronize, it takes the
// first (compiled steps run eagerly before they capture, so their keys are timed by then). cuDNN's
// kernels take 16-byte aligned operands with e a multiple of 8; anything else stays on Kiln's
// kernels, and so does a key whose plan fails to execute (KILN_CUDNN_DEBUG=1 prints cuDNN's
// reason). KILN_CUDNN_ATTENTION=0 (or set_cudnn_attention(false)) leaves cuDNN out, to compare.
#include <cudnn.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdlib>
#include <limits>
#include <map>
#include <string>
#include <vector>

#include "kiln/backend/cuda/attention.h"
#include "kiln/backend/cuda/common.h"
#include "kiln/backend/cuda/cuda.h"
#include "kiln/backend/cuda/cudnn_graph.h"
#include "kiln/ops/ops.h"

namespace kiln::cuda {
namespace {

constexpr int64_t kAlignment = 16;
constexpr int kMaxTimed = 4;
constexpr int64_t kMaxWorkspace = int64_t{4} << 30;

// The variant pack's unique ids; virtual tensors take ids from kFirstVirtual up.
enum Uid : int64_t {
  kQ = 1,
  kK,
  kV,
  kO,
  kStats,
  kScale,
  kNegInf,
  kOne,
  kGradOut,
  kGradQ,
  kGradK,
  kGradV,
  kRowSum,
  kFirstVirtual = 100
};

using Dims = std::vector<int64_t>;

// The descriptors of one operation graph, kept alive until its plans are made.
class GraphBuilder {
 public:
  explicit GraphBuilder(DType dt) : io_(cudnn_data_type(dt)) {}

  bool ok() const { return ok_; }
  cudnnDataType_t io() const { return io_; }
  // The unique ids of the tensors the caller binds, in the order they were made.
  const std::vector<int64_t>& bound() const { return bound_; }
  const std::vector<cudnnBackendDescriptor_t>& ops() const { return ops_; }

  // A tensor the caller binds by `uid` (or a virtual one when uid is 0).
  const CudnnDesc* tensor(int64_t uid, const Dims& dims, const Dims& strides, cudnnDataType_t type,
                          bool by_value = false) {
    const bool is_virtual = uid == 0;
    if (is_virtual) uid = next_virtual_++;
    if (!is_virtual && std::find(bound_.begin(), bound_.end(), uid) == bound_.end())
      bound_.push_back(uid);
    auto d = std::make_unique<CudnnDesc>(CUDNN_BACKEND_TENSOR_DESCRIPTOR);
    d->set(CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &type)
        .set_ints(CUDNN_ATTR_TENSOR_DIMENSIONS, dims)
        .set_ints(CUDNN_ATTR_TENSOR_STRIDES, strides)
        .set(CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &uid)
        .set(CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, 1, &kAlignment)
        .set(CUDNN_ATTR_TENSOR_IS_VIRTUAL, CUDNN_TYPE_BOOLEAN, 1, &is_virtual)
        .set(CUDNN_ATTR_TENSOR_IS_BY_VALUE, CUDNN_TYPE_BOOLEAN, 1, &by_value);
    return keep(std::move(d));
  }
  const CudnnDesc* virt(const Dims& dims, const Dims& strides,
                        cudnnDataType_t type = CUDNN_DATA_FLOAT) {
    return tensor(0, dims, strides, type);
  }
  const CudnnDesc* scalar(int64_t uid) {
    return tensor(uid, {1, 1, 1, 1}, {1, 1, 1, 1}, CUDNN_DATA_FLOAT, true);
  }

  // y = mode(x[, b[, t]]), computed in `math`; `axis` for GEN_INDEX.
  void pointwise(cudnnPointwiseMode_t mode, const CudnnDesc* x, const CudnnDesc* b,
                 const CudnnDesc* y, cudnnDataType_t math = CUDNN_DATA_FLOAT,
                 const CudnnDesc* t = nullptr, int64_t axis = -1) {
    auto pw = std::make_unique<CudnnDesc>(CUDNN_BACKEND_POINTWISE_DESCRIPTOR);
    pw->set(CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, 1, &mode)
        .set(CUDNN_ATTR_POINTWISE_MATH_PREC, CUDNN_TYPE_DATA_TYPE, 1, &math);
    if (axis >= 0) pw->set(CUDNN_ATTR_POINTWISE_AXIS, CUDNN_TYPE_INT64, 1, &axis);
    const CudnnDesc* desc = keep(std::move(pw));
    auto op = std::make_unique<CudnnDesc>(CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR);
    op->set(CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, *desc)
        .set(CUDNN_ATTR_OPERATION_POINTWISE_XDESC, *x)
        .set(CUDNN_ATTR_OPERATION_POINTWISE_YDESC, *y);
    if (b) op->set(CUDNN_ATTR_OPERATION_POINTWISE_BDESC, *b);
    if (t) op->set(CUDNN_ATTR_OPERATION_POINTWISE_TDESC, *t);
    add_op(std::move(op));
  }
  void reduction(cudnnReduceTensorOp_t mode, const CudnnDesc* x, const CudnnDesc* y) {
    auto red = std::make_unique<CudnnDesc>(CUDNN_BACKEND_REDUCTION_DESCRIPTOR);
    cudnnDataType_t math = CUDNN_DATA_FLOAT;
    red->set(CUDNN_ATTR_REDUCTION_OPERATOR, CUDNN_TYPE_REDUCTION_OPERATOR_TYPE, 1, &mode)
        .set(CUDNN_ATTR_REDUCTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &math);
    const CudnnDesc* desc = keep(std::move(red));
    auto op = std::make_unique<CudnnDesc>(CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR);
    op->set(CUDNN_ATTR_OPERATION_REDUCTION_XDESC, *x)
        .set(CUDNN_ATTR_OPERATION_REDUCTION_YDESC, *y)
        .set(CUDNN_ATTR_OPERATION_REDUCTION_DESC, *desc);
    add_op(std::move(op));
  }
  void matmul(const CudnnDesc* a, const CudnnDesc* b, const CudnnDesc* c) {
    auto mm = std::make_unique<CudnnDesc>(CUDNN_BACKEND_MATMUL_DESCRIPTOR);
    cudnnDataType_t math = CUDNN_DATA_FLOAT;
    mm->set(CUDNN_ATTR_MATMUL_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &math);
    const CudnnDesc* desc = keep(std::move(mm));
    auto op = std::make_unique<CudnnDesc>(CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR);
    op->set(CUDNN_ATTR_OPERATION_MATMUL_ADESC, *a)
        .set(CUDNN_ATTR_OPERATION_MATMUL_BDESC, *b)
        .set(CUDNN_ATTR_OPERATION_MATMUL_CDESC, *c)
        .set(CUDNN_ATTR_OPERATION_MATMUL_DESC, *desc);
    add_op(std::move(op));
  }
  void reshape(const CudnnDesc* x, const CudnnDesc* y) {
    auto op = std::make_unique<CudnnDesc>(CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR);
    op->set(CUDNN_ATTR_OPERATION_RESHAPE_XDESC, *x).set(CUDNN_ATTR_OPERATION_RESHAPE_YDESC, *y);
    add_op(std::move(op));
  }

  // Scores [b, h, l, s] -> the same with keys after the query set to -inf (top-left aligned).
  const CudnnDesc* causal_mask(const CudnnDesc* scores, const Dims& dims, const Dims& strides) {
    const CudnnDesc* row = virt(dims, strides, CUDNN_DATA_INT32);
    const CudnnDesc* col = virt(dims, strides, CUDNN_DATA_INT32);
    pointwise(CUDNN_POINTWISE_GEN_INDEX, scores, nullptr, row, CUDNN_DATA_FLOAT, nullptr, 2);
    pointwise(CUDNN_POINTWISE_GEN_INDEX, scores, nullptr, col, CUDNN_DATA_FLOAT, nullptr, 3);
    const CudnnDesc* keep_mask = virt(dims, strides, CUDNN_DATA_BOOLEAN);
    pointwise(CUDNN_POINTWISE_CMP_GE, row, col, keep_mask, CUDNN_DATA_BOOLEAN);
    const CudnnDesc* masked = virt(dims, strides);
    pointwise(CUDNN_POINTWISE_BINARY_SELECT, scores, scalar(kNegInf), masked, CUDNN_DATA_FLOAT,
              keep_mask);
    return masked;
  }

 private:
  const CudnnDesc* keep(std::unique_ptr<CudnnDesc> d) {
    if (!d->finalize()) ok_ = false;
    descs_.push_back(std::move(d));
    return descs_.back().get();
  }
  void add_op(std::unique_ptr<CudnnDesc> op) { ops_.push_back(keep(std::move(op))->get()); }

  cudnnDataType_t io_;
  bool ok_ = true;
  int64_t next_virtual_ = kFirstVirtual;
  std::vector<std::unique_ptr<CudnnDesc>> descs_;
  std::vector<cudnnBackendDescriptor_t> ops_;
  std::vector<int64_t> bound_;
};

// Operand `op` as [b, h, rows, e] strides (transposed: [b, h, e, rows]).
Dims strides_of(const AttnOperand& op, bool transposed = false) {
  if (transposed) return {op.outer_stride, op.inner_stride, 1, op.row_stride};
  return {op.outer_stride, op.inner_stride, op.row_stride, 1};
}
Dims packed(const Dims& d) { return {d[1] * d[2] * d[3], d[2] * d[3], d[3], 1}; }

// The outer stride as cuDNN needs it: with one outer entry AttnOperand may report 0.
AttnOperand normalized(AttnOperand op, const AttnShape& sh, int64_t rows) {
  if (sh.n / sh.inner <= 1)
    op.outer_stride = sh.inner * std::max(op.inner_stride, rows * op.row_stride);
  if (sh.inner <= 1) op.inner_stride = rows * op.row_stride;
  return op;
}

struct Operands {
  AttnOperand q, k, v, out, grad_out, dq, dk, dv;
};

void forward_graph(GraphBuilder& g, const AttnShape& sh, const Operands& o) {
  const int64_t b = sh.n / sh.inner, h = sh.inner, l = sh.l, s = sh.s, e = sh.e;
  const Dims qd{b, h, l, e}, ktd{b, h, e, s}, vd{b, h, s, e}, sd{b, h, l, s}, rd{b, h, l, 1};
  const Dims ss = packed(sd), rs = packed(rd);
  const CudnnDesc* q = g.tensor(kQ, qd, strides_of(o.q), g.io());
  const CudnnDesc* kt = g.tensor(kK, ktd, strides_of(o.k, true), g.io());
  const CudnnDesc* v = g.tensor(kV, vd, strides_of(o.v), g.io());
  const CudnnDesc* out = g.tensor(kO, qd, strides_of(o.out), g.io());
  const CudnnDesc* stats = g.tensor(kStats, rd, rs, CUDNN_DATA_FLOAT);

  const CudnnDesc* scores = g.virt(sd, ss);
  g.matmul(q, kt, scores);
  const CudnnDesc* scaled = g.virt(sd, ss);
  g.pointwise(CUDNN_POINTWISE_MUL, scores, g.scalar(kScale), scaled);
  if (sh.causal) scaled = g.causal_mask(scaled, sd, ss);
  const CudnnDesc* max = g.virt(rd, rs);
  g.reduction(CUDNN_REDUCE_TENSOR_MAX, scaled, max);
  const CudnnDesc* shifted = g.virt(sd, ss);
  g.pointwise(CUDNN_POINTWISE_SUB, scaled, max, shifted);
  const CudnnDesc* exps = g.virt(sd, ss);
  g.pointwise(CUDNN_POINTWISE_EXP, shifted, nullptr, exps);
  const CudnnDesc* sum = g.virt(rd, rs);
  g.reduction(CUDNN_REDUCE_TENSOR_ADD, exps, sum);
  const CudnnDesc* log_sum = g.virt(rd, rs);
  g.pointwise(CUDNN_POINTWISE_LOG, sum, nullptr, log_sum);
  g.pointwise(CUDNN_POINTWISE_ADD, max, log_sum, stats);
  const CudnnDesc* probs = g.virt(sd, ss, g.io());
  g.pointwise(CUDNN_POINTWISE_DIV, exps, sum, probs);
  g.matmul(probs, v, out);
}

void backward_graph(GraphBuilder& g, const AttnShape& sh, const Operands& o) {
  const int64_t b = sh.n / sh.inner, h = sh.inner, l = sh.l, s = sh.s, e = sh.e;
  const Dims qd{b, h, l, e}, ktd{b, h, e, s}, kd{b, h, s, e}, sd{b, h, l, s}, std_{b, h, s, l},
      rd{b, h, l, 1};
  const Dims ss = packed(sd), rs = packed(rd), sts{h * l * s, l * s, 1, s};
  const CudnnDesc* q = g.tensor(kQ, qd, strides_of(o.q), g.io());
  const CudnnDesc* kt = g.tensor(kK, ktd, strides_of(o.k, true), g.io());
  const CudnnDesc* vt = g.tensor(kV, ktd, strides_of(o.v, true), g.io());
  const CudnnDesc* out = g.tensor(kO, qd, strides_of(o.out), g.io());
  const CudnnDesc* grad_out = g.tensor(kGradOut, qd, strides_of(o.grad_out), g.io());
  const CudnnDesc* stats = g.tensor(kStats, rd, rs, CUDNN_DATA_FLOAT);
  const CudnnDesc* dq = g.tensor(kGradQ, qd, strides_of(o.dq), g.io());
  const CudnnDesc* dk = g.tensor(kGradK, kd, strides_of(o.dk), g.io());
  const CudnnDesc* dv = g.tensor(kGradV, kd, strides_of(o.dv), g.io());

  // D = Σ dO∘O per query, into the caller's float buffer.
  const CudnnDesc* prod = g.virt(qd, {h * l * e, l * e, h * e, 1});
  g.pointwise(CUDNN_POINTWISE_MUL, grad_out, out, prod);
  const CudnnDesc* prod_sum = g.virt(rd, rs);
  g.reduction(CUDNN_REDUCE_TENSOR_ADD, prod, prod_sum);
  const CudnnDesc* row_sum = g.tensor(kRowSum, rd, rs, CUDNN_DATA_FLOAT);
  g.pointwise(CUDNN_POINTWISE_MUL, prod_sum, g.scalar(kOne), row_sum);

  // P = exp(S·scale [masked] - Stats).
  const CudnnDesc* scores = g.virt(sd, ss);
  g.matmul(q, kt, scores);
  const CudnnDesc* scaled = g.virt(sd, ss);
  const CudnnDesc* scale = g.scalar(kScale);
  g.pointwise(CUDNN_POINTWISE_MUL, scores, scale, scaled);
  const CudnnDesc* shifted = g.virt(sd, ss);
  g.pointwise(CUDNN_POINTWISE_SUB, scaled, stats, shifted);
  if (sh.causal) shifted = g.causal_mask(shifted, sd, ss);
  const CudnnDesc* probs = g.virt(sd, ss);
  g.pointwise(CUDNN_POINTWISE_EXP, shifted, nullptr, probs);

  // dV = Pᵀ dO.
  const CudnnDesc* probs_t = g.virt(std_, sts, g.io());
  g.reshape(probs, probs_t);
  g.matmul(probs_t, grad_out, dv);

  // dS = P∘(dO Vᵀ - D)·scale.
  const CudnnDesc* dp = g.virt(sd, ss);
  g.matmul(grad_out, vt, dp);
  const CudnnDesc* dp_centered = g.virt(sd, ss);
  g.pointwise(CUDNN_POINTWISE_SUB, dp, row_sum, dp_centered);
  const CudnnDesc* ds_unscaled = g.virt(sd, ss);
  g.pointwise(CUDNN_POINTWISE_MUL, dp_centered, probs, ds_unscaled);
  const CudnnDesc* ds = g.virt(sd, ss);
  g.pointwise(CUDNN_POINTWISE_MUL, ds_unscaled, scale, ds);

  // dK = dSᵀ Q; dQ = dS K.
  const CudnnDesc* ds_t = g.virt(std_, sts, g.io());
  g.reshape(ds, ds_t);
  g.matmul(ds_t, q, dk);
  Dims k_strides = strides_of(o.k);
  const CudnnDesc* k = g.virt(kd, k_strides, g.io());
  g.reshape(kt, k);
  g.matmul(ds, k, dq);
}

std::atomic<bool>& enabled_flag() {
  static std::atomic<bool> on{[] {
    const char* v = std::getenv("KILN_CUDNN_ATTENTION");
    return !(v && std::string(v) == "0");
  }()};
  return on;
}
bool enabled() { return enabled_flag().load(std::memory_order_relaxed); }
std::atomic<int64_t> g_runs{0};

bool aligned(const void* p) { return reinterpret_cast<uintptr_t>(p) % kAlignment == 0; }

// Whether cuDNN's engines can take these operands at all (Note [cuDNN fused attention]).
bool shape_fits(Dt dt, const AttnShape& sh, std::initializer_list<const AttnOperand*> ops) {
  if (!enabled() || (dt != Dt::Float16 && dt != Dt::BFloat16) || sh.e % 8 != 0 || sh.l <= 0 ||
      sh.s <= 0 || sh.inner <= 0 || sh.n % sh.inner != 0)
    return false;
  for (const AttnOperand* op : ops)
    if (!aligned(op->data) || op->row_stride % 8 != 0 || op->inner_stride % 8 != 0 ||
        op->outer_stride % 8 != 0)
      return false;
  return true;
}

DType dtype_of(Dt dt) { return dt == Dt::BFloat16 ? kBFloat16 : kFloat16; }

// A plan with the unique ids its variant pack binds; no plan when cuDNN declines the graph.
struct AttnPlan {
  std::shared_ptr<CudnnPlan> plan;
  std::vector<int64_t> uids;
};

// The thread's plans by key (plans belong to the thread's handle); an entry without a plan is
// a key cuDNN declined.
std::map<std::vector<int64_t>, AttnPlan>& plan_cache() {
  thread_local std::map<std::vector<int64_t>, AttnPlan> cache;
  return cache;
}

bool declined(const std::vector<int64_t>& key) {
  auto it = plan_cache().find(key);
  return it != plan_cache().end() && !it->second.plan;
}

// A workspace of `bytes`, or an undefined tensor when the device has no memory for it (the
// caller then skips the plan: Kiln's kernels need none).
Tensor workspace_or_none(int64_t bytes, Device device) {
  try {
    return empty_cuda({std::max<int64_t>(bytes, 1)}, kUInt8, device);
  } catch (const DeviceError&) {
    return {};
  }
}

std::vector<int64_t> key_of(int pass, Dt dt, const AttnShape& sh, int device,
                            std::initializer_list<const AttnOperand*> ops) {
  std::vector<int64_t> key{pass,   static_cast<int64_t>(dt),
                           sh.n,   sh.inner,
                           sh.l,   sh.s,
                           sh.e,   int64_t{sh.causal},
                           device, int64_t{deterministic_algorithms()}};
  for (const AttnOperand* op : ops)
    key.insert(key.end(), {op->outer_stride, op->inner_stride, op->row_stride});
  return key;
}

std::vector<void*> pointers(const AttnPlan& p, const std::array<void*, kFirstVirtual>& bind) {
  std::vector<void*> ptrs;
  for (int64_t uid : p.uids) ptrs.push_back(bind[static_cast<size_t>(uid)]);
  return ptrs;
}

// The fastest of the first kMaxTimed plans cuDNN's heuristics offer for g, each timed on the
// call's buffers `bind`; during a capture (no timing then) the first.
AttnPlan best_plan(const GraphBuilder& g, cudnnHandle_t h, Dt dt,
                   const std::array<void*, kFirstVirtual>& bind, const Tensor& like) {
  if (!g.ok()) return {};
  const bool timing = !capturing(like.device().index());
  AttnPlan best;
  float best_ms = 0;
  for (std::shared_ptr<CudnnPlan>& p :
       cudnn_plans(g.ops(), h, dtype_of(dt), timing ? kMaxTimed : 1, kMaxWorkspace)) {
    AttnPlan candidate{std::move(p), g.bound()};
    if (!timing) return candidate;
    Tensor ws = workspace_or_none(candidate.plan->workspace, like.device());
    if (!ws.defined()) continue;
    float ms = cudnn_time_ms(*candidate.plan, h, candidate.uids, pointers(candidate, bind),
                             ws.impl()->data());
    if (ms >= 0 && (!best.plan || ms < best_ms)) best = std::move(candidate), best_ms = ms;
  }
  return best;
}

// Runs the plan of `key` (built by `build` on the key's first call) with the buffers of `bind`
// (indexed by unique id). False when there is none, when its workspace does not fit in memory
// now, or when it fails, which drops it: the key falls back to Kiln's kernels from then on.
template <class Build>
bool run(const std::vector<int64_t>& key, Build&& build, cudnnHandle_t h,
         const std::array<void*, kFirstVirtual>& bind, const Tensor& like) {
  auto& cache = plan_cache();
  auto it = cache.find(key);
  if (it == cache.end()) it = cache.emplace(key, build()).first;
  AttnPlan& p = it->second;
  if (!p.plan) return false;
  Tensor ws = workspace_or_none(p.plan->workspace, like.device());
  if (!ws.defined()) return false;
  if (cudnn_execute(*p.plan, h, p.uids, pointers(p, bind), ws.impl()->data()) !=
      CUDNN_STATUS_SUCCESS) {
    p.plan = nullptr;
    return false;
  }
  g_runs.fetch_add(1, std::memory_order_relaxed);
  return true;
}

}  // namespace

void set_cudnn_attention(bool on) { enabled_flag().store(on, std::memory_order_relaxed); }
int64_t cudnn_attention_runs() { return g_runs.load(std::memory_order_relaxed); }

bool cudnn_flash_forward(Dt dt, const AttnShape& sh, const AttnOperand& q0, const AttnOperand& k0,
                         const AttnOperand& v0, const AttnOperand& out0, float* lse,
                         const Tensor& like) {
  if (!shape_fits(dt, sh, {&q0, &k0, &v0, &out0}) || !aligned(lse)) return false;
  Operands o{normalized(q0, sh, sh.l),
             normalized(k0, sh, sh.s),
             normalized(v0, sh, sh.s),
             normalized(out0, sh, sh.l),
             {},
             {},
             {},
             {}};
  const std::vector<int64_t> key =
      key_of(0, dt, sh, like.device().index(), {&o.q, &o.k, &o.v, &o.out});
  if (declined(key)) return false;
  cudnnHandle_t h = cudnn_handle_for(like);
  float scale = sh.scale, neg_inf = -std::numeric_limits<float>::infinity();
  std::array<void*, kFirstVirtual> bind{};
  bind[kQ] = const_cast<void*>(q0.data);
  bind[kK] = const_cast<void*>(k0.data);
  bind[kV] = const_cast<void*>(v0.data);
  bind[kO] = const_cast<void*>(out0.data);
  bind[kStats] = lse;
  bind[kScale] = &scale;
  bind[kNegInf] = &neg_inf;
  auto build = [&] {
    GraphBuilder g(dtype_of(dt));
    forward_graph(g, sh, o);
    return best_plan(g, h, dt, bind, like);
  };
  return run(key, build, h, bind, like);
}

bool cudnn_flash_backward(Dt dt, const AttnShape& sh, const AttnOperand& q0, const AttnOperand& k0,
                          const AttnOperand& v0, const AttnOperand& out0,
                          const AttnOperand& grad_out0, const float* lse, const AttnOperand& dq0,
                          const AttnOperand& dk0, const AttnOperand& dv0, const Tensor& like) {
  if (!shape_fits(dt, sh, {&q0, &k0, &v0, &out0, &grad_out0, &dq0, &dk0, &dv0}) || !aligned(lse))
    return false;
  Operands o{normalized(q0, sh, sh.l),   normalized(k0, sh, sh.s),        normalized(v0, sh, sh.s),
             normalized(out0, sh, sh.l), normalized(grad_out0, sh, sh.l), normalized(dq0, sh, sh.l),
             normalized(dk0, sh, sh.s),  normalized(dv0, sh, sh.s)};
  const std::vector<int64_t> key =
      key_of(1, dt, sh, like.device().index(),
             {&o.q, &o.k, &o.v, &o.out, &o.grad_out, &o.dq, &o.dk, &o.dv});
  if (declined(key)) return false;
  cudnnHandle_t h = cudnn_handle_for(like);
  float scale = sh.scale, neg_inf = -std::numeric_limits<float>::infinity(), one = 1;
  Tensor row_sum = empty_cuda({sh.n * sh.l}, kFloat32, like.device());
  std::array<void*, kFirstVirtual> bind{};
  bind[kQ] = const_cast<void*>(q0.data);
  bind[kK] = const_cast<void*>(k0.data);
  bind[kV] = const_cast<void*>(v0.data);
  bind[kO] = const_cast<void*>(out0.data);
  bind[kGradOut] = const_cast<void*>(grad_out0.data);
  bind[kStats] = const_cast<float*>(lse);
  bind[kGradQ] = const_cast<void*>(dq0.data);
  bind[kGradK] = const_cast<void*>(dk0.data);
  bind[kGradV] = const_cast<void*>(dv0.data);
  bind[kRowSum] = row_sum.impl()->data();
  bind[kScale] = &scale;
  bind[kNegInf] = &neg_inf;
  bind[kOne] = &one;
  auto build = [&] {
    GraphBuilder g(dtype_of(dt));
    backward_graph(g, sh, o);
    return best_plan(g, h, dt, bind, like);
  };
  return run(key, build, h, bind, like);
}

}  // namespace kiln::cuda

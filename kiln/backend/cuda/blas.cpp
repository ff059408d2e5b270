// CUDA matrix products (mm, bmm, addmm): cuBLASLt for the floating dtypes, a tiled kernel for
// the integer ones (blas.cu). Kiln is row-major and cuBLAS column-major, so y = a @ b is run as
// y^T = b^T a^T: a row-major (r, c) matrix with strides (ld, 1) is a column-major (c, r) one,
// and a transposed view (strides (1, ld)) is the same data read with a transpose flag.
#include <cublasLt.h>

#include <algorithm>
#include <array>
#include <climits>
#include <map>
#include <mutex>
#include <unordered_map>

#include "kiln/backend/cuda/blas.h"
#include "kiln/backend/cuda/common.h"
#include "kiln/backend/cuda/cuda.h"
#include "kiln/ops/ops.h"
#include "kiln/ops/other_meta.h"

namespace kiln::cuda {
namespace {

constexpr int kMaxDevices = 64;
constexpr int64_t kWorkspaceBytes = int64_t{32} << 20;
constexpr size_t kMaxPlans = 1024;

const char* status_name(cublasStatus_t s) {
  switch (s) {
    case CUBLAS_STATUS_SUCCESS:
      return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_NOT_INITIALIZED:
      return "CUBLAS_STATUS_NOT_INITIALIZED";
    case CUBLAS_STATUS_ALLOC_FAILED:
      return "CUBLAS_STATUS_ALLOC_FAILED";
    case CUBLAS_STATUS_INVALID_VALUE:
      return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_ARCH_MISMATCH:
      return "CUBLAS_STATUS_ARCH_MISMATCH";
    case CUBLAS_STATUS_MAPPING_ERROR:
      return "CUBLAS_STATUS_MAPPING_ERROR";
    case CUBLAS_STATUS_EXECUTION_FAILED:
      return "CUBLAS_STATUS_EXECUTION_FAILED";
    case CUBLAS_STATUS_INTERNAL_ERROR:
      return "CUBLAS_STATUS_INTERNAL_ERROR";
    case CUBLAS_STATUS_NOT_SUPPORTED:
      return "CUBLAS_STATUS_NOT_SUPPORTED";
    case CUBLAS_STATUS_LICENSE_ERROR:
      return "CUBLAS_STATUS_LICENSE_ERROR";
  }
  return "CUBLAS_STATUS_UNKNOWN";
}
void check_lt(cublasStatus_t s, const char* op, const char* call) {
  if (s != CUBLAS_STATUS_SUCCESS)
    KILN_THROW(Device, "[{}] {} failed: {}", op, call, status_name(s));
}
// Calls the cuBLASLt function `fn` and throws a DeviceError naming `op`, `fn` and the status.
#define KILN_LT_CHECK(op, fn, ...) check_lt(fn(__VA_ARGS__), op, #fn)

void check_device(const char* op, int index) {
  KILN_CHECK_DEVICE(index >= 0 && index < kMaxDevices,
                    "[{}] cuda:{} is beyond the {} devices "
                    "the cuBLASLt state is kept for",
                    op, index, kMaxDevices);
}

// Guards the handles, the workspaces and the plan cache; held across a matmul's enqueue too,
// since the cached descriptor's epilogue pointers are set per call.
std::mutex& lt_mutex() {
  static std::mutex mu;
  return mu;
}

// The device's cuBLASLt handle, made on first use and kept for the process.
cublasLtHandle_t lt_handle(const char* op, int index) {
  static std::array<cublasLtHandle_t, kMaxDevices> handles{};
  if (!handles[index]) KILN_LT_CHECK(op, cublasLtCreate, &handles[index]);
  return handles[index];
}

// Note [cuBLASLt workspaces]
// Each (device, stream) has a 32 MiB workspace of its own, so products queued on two streams
// never write one buffer at the same time. It comes from the caching allocator on the stream's
// first product, outside any capture: begin_capture reserves the capturing stream's first
// (reserve_lt_workspace), so a graph records an address that stays valid and no capture
// allocates one from its private pool; destroy_stream releases it once the stream is done
// (and the device, for a stream that was captured: its graphs may be running on others).
// The default stream and the pool's streams keep theirs for the process.
struct Workspace {
  Tensor buffer;
  bool captured = false;  // a capture began on the stream: graphs may use it on other streams
};
std::map<std::pair<int, cudaStream_t>, Workspace>& workspaces() {
  static auto* slots = new std::map<std::pair<int, cudaStream_t>, Workspace>();
  return *slots;
}
// The workspace of (index, stream), made when it has none; lt_mutex held.
Workspace& workspace(const char* op, int index, cudaStream_t stream) {
  auto it = workspaces().find({index, stream});
  if (it != workspaces().end()) return it->second;
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  KILN_CUDA_CHECK(cudaStreamIsCapturing(stream, &status));
  KILN_CHECK_DEVICE(status == cudaStreamCaptureStatusNone,
                    "[{}] stream {} of cuda:{} is capturing and has no cuBLASLt workspace: "
                    "captures begun through Kiln reserve one (a capture begun outside Kiln "
                    "must run one product on the stream first)",
                    op, fmt::ptr(stream), index);
  Workspace w{empty_cuda({kWorkspaceBytes}, kUInt8, Device(kCUDA, index))};
  return workspaces().emplace(std::pair{index, stream}, std::move(w)).first->second;
}

// The largest power of two up to 256 dividing the address (what cuBLASLt's kernels may assume).
uint32_t alignment(const void* p) {
  auto v = reinterpret_cast<uintptr_t>(p);
  uint32_t a = 256;
  while (a > 1 && v % a != 0) a /= 2;
  return a;
}

// A (batch, rows, cols) operand as cuBLAS reads it: data, leading dim, batch stride, and
// whether the stored column-major matrix is the transpose of the wanted one.
struct LtMat {
  Tensor keep;  // owns a contiguous copy when one was needed
  const void* data;
  int64_t ld;
  int64_t batch_stride;
  bool trans;
};
LtMat lt_operand(const Tensor& t, DType dtype) {
  int64_t d = t.dim();
  int64_t r = t.sizes()[d - 2], c = t.sizes()[d - 1];
  int64_t sr = t.strides()[d - 2], sc = t.strides()[d - 1];
  int64_t sb = d == 3 && t.sizes()[0] > 1 ? t.strides()[0] : 0;
  if (t.dtype() == dtype) {
    if ((sc == 1 || c == 1) && sr >= std::max<int64_t>(1, c))
      return {t, t.impl()->data(), sr, sb, false};
    if ((sr == 1 || r == 1) && sc >= std::max<int64_t>(1, r))
      return {t, t.impl()->data(), sc, sb, true};
  }
  Tensor cm = contiguous_as(t, dtype);
  return {cm, cm.impl()->data(), std::max<int64_t>(1, c), d == 3 ? r * c : 0, false};
}

// What cuBLASLt applies to the product before writing y: a bias (an n-vector, when `bias` is
// set), then GELU (tanh form) when `gelu_aux` is set, which is where the preactivation goes,
// laid out like y (Note [GELU epilogue] in kiln/ops/ops.h).
struct Epilogue {
  const void* bias = nullptr;
  void* gelu_aux = nullptr;
};

// Everything the descriptors and the chosen algorithm depend on.
struct PlanKey {
  int device;
  DType dtype;
  bool tf32;
  int64_t m, n, k, batch;
  bool trans_a, trans_b;
  int64_t lda, ldb, stride_a, stride_b;
  bool bias, gelu;
  uint32_t align_a, align_b, align_y, align_bias, align_aux;
  bool operator==(const PlanKey&) const = default;
};
struct PlanKeyHash {
  size_t operator()(const PlanKey& k) const {
    size_t h = 0;
    auto mix = [&h](int64_t v) {
      h ^= std::hash<int64_t>()(v) + 0x9e3779b97f4a7c15ULL + (h << 6) + (h >> 2);
    };
    for (int64_t v : {int64_t{k.device},
                      int64_t(k.dtype),
                      int64_t{k.tf32},
                      k.m,
                      k.n,
                      k.k,
                      k.batch,
                      int64_t{k.trans_a},
                      int64_t{k.trans_b},
                      k.lda,
                      k.ldb,
                      k.stride_a,
                      k.stride_b,
                      int64_t{k.bias},
                      int64_t{k.gelu},
                      int64_t{k.align_a},
                      int64_t{k.align_b},
                      int64_t{k.align_y},
                      int64_t{k.align_bias},
                      int64_t{k.align_aux}})
      mix(v);
    return h;
  }
};
// The descriptors of one problem in cuBLAS terms (A = Kiln's b, B = Kiln's a, C = D = y^T) and
// the algorithm the heuristic picked for them.
struct Plan {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, y = nullptr;
  cublasLtMatmulAlgo_t algo = {};
};
void destroy(Plan& p) {
  // Statuses ignored: only dropping a cache that is being reset.
  if (p.desc) cublasLtMatmulDescDestroy(p.desc);
  for (cublasLtMatrixLayout_t l : {p.a, p.b, p.y})
    if (l) cublasLtMatrixLayoutDestroy(l);
}
std::unordered_map<PlanKey, Plan, PlanKeyHash>& plan_cache() {
  static auto* cache = new std::unordered_map<PlanKey, Plan, PlanKeyHash>();
  return *cache;
}

cudaDataType_t cuda_type(DType t) {
  switch (t) {
    case kFloat16:
      return CUDA_R_16F;
    case kBFloat16:
      return CUDA_R_16BF;
    case kFloat64:
      return CUDA_R_64F;
    default:
      return CUDA_R_32F;
  }
}

cublasLtMatrixLayout_t make_layout(const char* op, cudaDataType_t type, int64_t rows, int64_t cols,
                                   int64_t ld, int64_t batch, int64_t batch_stride) {
  cublasLtMatrixLayout_t l = nullptr;
  KILN_LT_CHECK(op, cublasLtMatrixLayoutCreate, &l, type, static_cast<uint64_t>(rows),
                static_cast<uint64_t>(cols), ld);
  if (batch > 1) {
    auto count = static_cast<int32_t>(batch);
    KILN_LT_CHECK(op, cublasLtMatrixLayoutSetAttribute, l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT,
                  &count, sizeof(count));
    KILN_LT_CHECK(op, cublasLtMatrixLayoutSetAttribute, l,
                  CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &batch_stride, sizeof(batch_stride));
  }
  return l;
}

// Points the plan's descriptor at this call's bias and GELU preactivation buffers.
void set_epilogue_pointers(const char* op, Plan& p, const Epilogue& e) {
  if (e.bias)
    KILN_LT_CHECK(op, cublasLtMatmulDescSetAttribute, p.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER,
                  &e.bias, sizeof(e.bias));
  if (e.gelu_aux)
    KILN_LT_CHECK(op, cublasLtMatmulDescSetAttribute, p.desc,
                  CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &e.gelu_aux, sizeof(e.gelu_aux));
}

// Builds the descriptors of `key` and asks the heuristic for the best algorithm (once per key).
Plan make_plan(const char* op, cublasLtHandle_t handle, const PlanKey& key, const Epilogue& e) {
  Plan p;
  try {
    cudaDataType_t type = cuda_type(key.dtype);
    bool dbl = key.dtype == kFloat64;
    cublasComputeType_t compute = dbl        ? CUBLAS_COMPUTE_64F
                                  : key.tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32
                                             : CUBLAS_COMPUTE_32F;
    KILN_LT_CHECK(op, cublasLtMatmulDescCreate, &p.desc, compute, dbl ? CUDA_R_64F : CUDA_R_32F);
    cublasOperation_t ta = key.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
    cublasOperation_t tb = key.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
    KILN_LT_CHECK(op, cublasLtMatmulDescSetAttribute, p.desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta,
                  sizeof(ta));
    KILN_LT_CHECK(op, cublasLtMatmulDescSetAttribute, p.desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb,
                  sizeof(tb));
    if (key.bias || key.gelu) {
      cublasLtEpilogue_t epi = !key.gelu  ? CUBLASLT_EPILOGUE_BIAS
                               : key.bias ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS
                                          : CUBLASLT_EPILOGUE_GELU_AUX;
      KILN_LT_CHECK(op, cublasLtMatmulDescSetAttribute, p.desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi,
                    sizeof(epi));
      if (key.gelu) {  // the preactivation has y^T's layout: leading dim n
        int64_t ld = key.n;
        KILN_LT_CHECK(op, cublasLtMatmulDescSetAttribute, p.desc,
                      CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &ld, sizeof(ld));
      }
      // The heuristic reads the pointers' alignment from them.
      set_epilogue_pointers(op, p, e);
    }
    // cuBLAS's A is Kiln's b: stored (n, k) column-major, or (k, n) read transposed.
    p.a = key.trans_b ? make_layout(op, type, key.k, key.n, key.ldb, key.batch, key.stride_b)
                      : make_layout(op, type, key.n, key.k, key.ldb, key.batch, key.stride_b);
    p.b = key.trans_a ? make_layout(op, type, key.m, key.k, key.lda, key.batch, key.stride_a)
                      : make_layout(op, type, key.k, key.m, key.lda, key.batch, key.stride_a);
    p.y = make_layout(op, type, key.n, key.m, key.n, key.batch, key.m * key.n);

    cublasLtMatmulPreference_t pref = nullptr;
    KILN_LT_CHECK(op, cublasLtMatmulPreferenceCreate, &pref);
    cublasLtMatmulHeuristicResult_t result = {};
    int found = 0;
    cublasStatus_t st = [&] {
      uint64_t ws = kWorkspaceBytes;
      cublasStatus_t s = cublasLtMatmulPreferenceSetAttribute(
          pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws));
      std::pair<cublasLtMatmulPreferenceAttributes_t, uint32_t> aligns[] = {
          {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, key.align_b},
          {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, key.align_a},
          {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, key.align_y},
          {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, key.align_y}};
      for (auto& [attr, v] : aligns)
        if (s == CUBLAS_STATUS_SUCCESS)
          s = cublasLtMatmulPreferenceSetAttribute(pref, attr, &v, sizeof(v));
      if (s == CUBLAS_STATUS_SUCCESS && (key.dtype == kFloat16 || key.dtype == kBFloat16)) {
        // Sums stay in float32, as on the CPU: no split-K reduction in the 16-bit output type.
        uint32_t mask = CUBLASLT_REDUCTION_SCHEME_MASK & ~CUBLASLT_REDUCTION_SCHEME_OUTPUT_TYPE;
        s = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK,
                                                 &mask, sizeof(mask));
      }
      if (s == CUBLAS_STATUS_SUCCESS)
        s = cublasLtMatmulAlgoGetHeuristic(handle, p.desc, p.a, p.b, p.y, p.y, pref, 1, &result,
                                           &found);
      return s;
    }();
    cublasLtMatmulPreferenceDestroy(pref);
    check_lt(st, op, "cublasLtMatmulAlgoGetHeuristic");
    KILN_CHECK_DEVICE(found > 0,
                      "[{}] cuBLASLt has no algorithm for a {} product of ({}, {}) @ ({}, {}) "
                      "(batch {})",
                      op, key.dtype, key.m, key.k, key.k, key.n, key.batch);
    p.algo = result.algo;
  } catch (...) {
    destroy(p);
    throw;
  }
  return p;
}

// y (batch, m, n), contiguous in `t`, = alpha * a @ b + beta * y, then the epilogue's bias (an
// n-vector of dtype `t` on the device; then beta is 0) and GELU (batch 1, k > 0, n a multiple
// of 8, as addmm_gelu_kernel checks; its preactivation buffer is like y). a is (batch, m, k)
// and b (batch, k, n), or 2-D with batch 1; both already of dtype `t`.
void gemm(const char* op, const Tensor& y, const Tensor& a, const Tensor& b, double alpha,
          double beta, const Epilogue& e = {}) {
  int64_t d = a.dim();
  int64_t batch = d == 3 ? a.sizes()[0] : 1;
  int64_t m = a.sizes()[d - 2], k = a.sizes()[d - 1], n = b.sizes()[d - 1];
  if (batch == 0 || m == 0 || n == 0) return;
  DType t = y.dtype();
  int index = y.device().index();
  cudaStream_t stream = current_stream(index);
  if (k == 0) {  // an empty sum: y = beta * y
    if (beta == 0)
      KILN_CUDA_CHECK(cudaMemsetAsync(y.impl()->data(), 0, y.nbytes(), stream));
    else
      launch_scale(dt(t), y.impl()->data(), y.numel(), beta, stream);
    check_launch(op);
    return;
  }
  if (!is_floating(t)) {
    auto mat = [&](const Tensor& x) {
      int64_t xd = x.dim();
      return MatArg{x.impl()->data(), xd == 3 ? x.strides()[0] : 0, x.strides()[xd - 2],
                    x.strides()[xd - 1]};
    };
    launch_int_gemm(dt(t), mat(a), mat(b), y.impl()->data(), batch, m, n, k,
                    static_cast<int64_t>(alpha), static_cast<int64_t>(beta), stream);
    check_launch(op);
    return;
  }
  check_device(op, index);
  KILN_CHECK(batch <= INT32_MAX, "[{}] a batch of {} matrices is more than cuBLASLt takes ({})", op,
             batch, INT32_MAX);
  LtMat A = lt_operand(a, t), B = lt_operand(b, t);
  void* yp = y.impl()->data();
  PlanKey key{};
  key.device = index;
  key.dtype = t;
  key.tf32 = t == kFloat32 && allow_tf32();
  key.m = m, key.n = n, key.k = k, key.batch = batch;
  key.trans_a = A.trans, key.trans_b = B.trans;
  key.lda = A.ld, key.ldb = B.ld, key.stride_a = A.batch_stride, key.stride_b = B.batch_stride;
  key.bias = e.bias != nullptr;
  key.gelu = e.gelu_aux != nullptr;
  key.align_a = alignment(A.data), key.align_b = alignment(B.data), key.align_y = alignment(yp);
  key.align_bias = e.bias ? alignment(e.bias) : 0;
  key.align_aux = e.gelu_aux ? alignment(e.gelu_aux) : 0;
  float alpha_f = static_cast<float>(alpha), beta_f = static_cast<float>(beta);
  const void* alpha_p = t == kFloat64 ? static_cast<const void*>(&alpha) : &alpha_f;
  const void* beta_p = t == kFloat64 ? static_cast<const void*>(&beta) : &beta_f;

  std::lock_guard<std::mutex> lock(lt_mutex());
  cublasLtHandle_t handle = lt_handle(op, index);
  void* ws = workspace(op, index, stream).buffer.impl()->data();
  auto& cache = plan_cache();
  auto it = cache.find(key);
  if (it == cache.end()) {
    if (cache.size() >= kMaxPlans) {
      for (auto& kv : cache) destroy(kv.second);
      cache.clear();
    }
    it = cache.emplace(key, make_plan(op, handle, key, e)).first;
  }
  Plan& plan = it->second;
  set_epilogue_pointers(op, plan, e);
  KILN_LT_CHECK(op, cublasLtMatmul, handle, plan.desc, alpha_p, B.data, plan.a, A.data, plan.b,
                beta_p, yp, plan.y, yp, plan.y, &plan.algo, ws, kWorkspaceBytes, stream);
}

void mm_impl(const Tensor& out, const Tensor& a, const Tensor& b) {
  with_result(out, a.dtype(), true, [&](const Tensor& y) { gemm("mm", y, a, b, 1.0, 0.0); });
}

void bmm_impl(const Tensor& out, const Tensor& a, const Tensor& b) {
  with_result(out, a.dtype(), true, [&](const Tensor& y) { gemm("bmm", y, a, b, 1.0, 0.0); });
}

// Whether a product's dims suit cuBLASLt's epilogues: none degenerate or huge (where PyTorch
// found them unreliable).
bool epilogue_dims(int64_t m, int64_t n, int64_t k) {
  constexpr int64_t kHuge = int64_t{65535} * 32;
  return m > 1 && n > 1 && k > 1 && m < kHuge && n < kHuge && k < kHuge;
}

// Whether addmm can add `self` through cuBLASLt's bias epilogue: an n-vector (or (1, n)) of a
// floating dtype with beta 1, and epilogue_dims.
bool bias_epilogue(const Tensor& self, const Tensor& a, const Tensor& b, double beta) {
  int64_t m = a.sizes()[0], k = a.sizes()[1], n = b.sizes()[1];
  bool vector = (self.dim() == 1 && self.sizes()[0] == n) ||
                (self.dim() == 2 && self.sizes()[0] == 1 && self.sizes()[1] == n);
  return vector && beta == 1 && is_floating(a.dtype()) && epilogue_dims(m, n, k);
}

void addmm_impl(const Tensor& out, const Tensor& self, const Tensor& a, const Tensor& b,
                const Scalar& beta, const Scalar& alpha) {
  double be = beta.to_double(), al = alpha.to_double();
  DType t = a.dtype();
  with_result(out, t, true, [&](const Tensor& y) {
    if (bias_epilogue(self, a, b, be)) {
      Tensor bias = contiguous_as(self, t);
      if (alignment(bias.impl()->data()) >= 16) {
        gemm("addmm", y, a, b, al, 0.0, {.bias = bias.impl()->data()});
        return;
      }
    }
    if (be != 0) copy_kernel(y, self);  // self broadcast into y, then y = alpha*ab + beta*y
    gemm("addmm", y, a, b, al, be);
  });
}

// Note [GELU epilogue]: one cuBLASLt product writes gelu_tanh(z) and z (GELU_AUX_BIAS, or
// GELU_AUX without a bias) for float16 and bfloat16 where cuBLASLt takes it: n a multiple of 8
// (the preactivation's leading dim must be), epilogue_dims, a bias aligned to 16 bytes, and a
// plan the heuristic finds (a product it refuses writes nothing and falls back). Otherwise
// addmm (or mm) and then gelu: float32 too, where the epilogue's kernels measured slower than
// the plain product and a gelu launch on an H100 (a [8192, 768] @ [768, 3072] layer: 220 µs
// against 182 with TF32, 901 against 858 without; bfloat16 83 against 98).
TensorPair addmm_gelu_kernel(const Tensor& bias, const Tensor& a, const Tensor& b) {
  TensorSpec s = meta::addmm_gelu(bias, a, b);
  int64_t m = s.sizes[0], k = a.sizes()[1], n = s.sizes[1];
  DType t = s.dtype;
  Tensor bias_t = bias.defined() ? contiguous_as(bias, t) : Tensor();
  bool fused = (t == kFloat16 || t == kBFloat16) && epilogue_dims(m, n, k) && n % 8 == 0 &&
               (!bias_t.defined() || alignment(bias_t.impl()->data()) >= 16);
  if (!fused) return detail::addmm_gelu_unfused(bias, a, b);
  Tensor out = empty_cuda(s.sizes, t, s.device), pre = empty_cuda(s.sizes, t, s.device);
  try {
    gemm("addmm_gelu", out, a, b, 1.0, 0.0,
         {.bias = bias_t.defined() ? bias_t.impl()->data() : nullptr,
          .gelu_aux = pre.impl()->data()});
  } catch (const DeviceError&) {  // no algorithm for the epilogue: nothing was queued
    return detail::addmm_gelu_unfused(bias, a, b);
  }
  return {out, pre};
}

KILN_CUDA_STRUCTURED(mm, &mm_impl);
KILN_CUDA_STRUCTURED(addmm, &addmm_impl);
KILN_CUDA_STRUCTURED(bmm, &bmm_impl);
KILN_CUDA_KERNELS(backend_kernel(ops::op_addmm_gelu, &addmm_gelu_kernel));

}  // namespace

void reserve_lt_workspace(int device, cudaStream_t stream) {
  check_device("begin_capture", device);
  std::lock_guard<std::mutex> lock(lt_mutex());
  workspace("begin_capture", device, stream).captured = true;
}
void release_lt_workspace(int device, cudaStream_t stream) {
  Workspace w;
  {
    std::lock_guard<std::mutex> lock(lt_mutex());
    auto it = workspaces().find({device, stream});
    if (it == workspaces().end()) return;
    w = std::move(it->second);
    workspaces().erase(it);
  }
  // The caller has synchronized the stream itself; graphs captured on it may have been
  // launched on others and still be running (outside the lock: products go on meanwhile).
  if (w.captured) KILN_CUDA_CHECK(cudaDeviceSynchronize());
}
int64_t lt_workspace_count(int device) {
  std::lock_guard<std::mutex> lock(lt_mutex());
  int64_t n = 0;
  for (const auto& kv : workspaces()) n += kv.first.first == device;
  return n;
}

}  // namespace kiln::cuda

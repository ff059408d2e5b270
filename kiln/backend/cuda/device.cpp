// The CUDA device interface (DESIGN.md "Core objects"): devices, the caching allocator,
// streams, events, copies and graph capture, and the plugin entry point (libkiln_cuda.so, loaded
// with kiln::load_backend("cuda")).
//
// Note [CUDA streams and capture]
// Stream id 0 is CUDA's legacy default stream; created streams are non-blocking, so they never
// wait for it implicitly. A thread's current stream is per device. Capture runs in CUDA's
// thread-local mode on a created stream, allocating from the executable's pool (Note [CUDA
// caching allocator]); what CUDA would reject inside a capture (synchronising, copies through
// the host) is refused by name before CUDA sees it, so the error names the operation instead
// of invalidating the capture silently.
#include <cuda_runtime.h>

#include <atomic>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

#include "kiln/backend/cuda/allocator.h"
#include "kiln/backend/cuda/blas.h"
#include "kiln/backend/cuda/common.h"
#include "kiln/backend/cuda/cuda.h"
#include "kiln/backend/cuda/custom_allreduce.h"
#include "kiln/backend/cuda/floor.h"
#include "kiln/backend/cuda/graph_timeline.h"
#include "kiln/backend/cuda/nccl.h"

namespace kiln::cuda {

static_assert(static_cast<int>(Dt::Float64) == static_cast<int>(DType::Float64) &&
                  static_cast<int>(Dt::Bool) == static_cast<int>(DType::Bool) &&
                  static_cast<int>(Dt::BFloat16) == static_cast<int>(DType::BFloat16),
              "Dt must number the element types as kiln::DType does");

namespace {

constexpr int kMaxDevices = 16;

// Per device, made on first use.
struct DeviceState {
  explicit DeviceState(int index) : allocator(index) {}
  CachingAllocator allocator;
  int* error_word_host = nullptr;  // pinned, mapped: the host reads it after a synchronize
  int* error_word_device = nullptr;
  uint64_t* philox = nullptr;  // {seed, offset} in device memory
  // A failure found off the streams (post_device_error), raised by the next synchronize.
  std::atomic<bool> has_posted{false};
  std::mutex posted_mu;
  std::exception_ptr posted;
};

std::once_flag g_count_once;
int g_count = 0;
cudaError_t g_count_error = cudaSuccess;

int count() {
  std::call_once(g_count_once, [] {
    g_count_error = cudaGetDeviceCount(&g_count);
    if (g_count_error != cudaSuccess) {
      cudaGetLastError();
      g_count = 0;
    }
    g_count = std::min(g_count, kMaxDevices);
  });
  return g_count;
}

void set_device(int index) {
  thread_local int current = -1;
  if (current == index) return;
  KILN_CUDA_CHECK(cudaSetDevice(index));
  current = index;
}

DeviceState& state(int index) {
  static std::atomic<DeviceState*> states[kMaxDevices] = {};
  static std::mutex mu;
  if (index >= 0 && index < kMaxDevices) {
    if (DeviceState* s = states[index].load(std::memory_order_acquire)) return *s;
  }
  KILN_CHECK_DEVICE(index >= 0 && index < count(),
                    "[cuda] device index {} is out of range: there are {} CUDA devices", index,
                    count());
  std::lock_guard<std::mutex> lock(mu);
  if (DeviceState* s = states[index].load(std::memory_order_acquire)) return *s;
  set_device(index);
  auto* s = new DeviceState(index);  // lives until exit: tensors may outlive static objects
  KILN_CUDA_CHECK(cudaHostAlloc(&s->error_word_host, sizeof(int), cudaHostAllocMapped));
  *s->error_word_host = 0;
  KILN_CUDA_CHECK(cudaHostGetDevicePointer(reinterpret_cast<void**>(&s->error_word_device),
                                           s->error_word_host, 0));
  KILN_CUDA_CHECK(cudaMalloc(&s->philox, 2 * sizeof(uint64_t)));
  const uint64_t init[2] = {default_generator().seed(), 0};
  KILN_CUDA_CHECK(cudaMemcpy(s->philox, init, sizeof init, cudaMemcpyHostToDevice));
  states[index].store(s, std::memory_order_release);
  return *s;
}

thread_local cudaStream_t tls_current[kMaxDevices] = {};
thread_local cudaStream_t tls_capturing[kMaxDevices] = {};
thread_local bool tls_is_capturing[kMaxDevices] = {};

cudaStream_t as_stream(uint64_t id) { return reinterpret_cast<cudaStream_t>(id); }
uint64_t as_id(cudaStream_t s) { return reinterpret_cast<uint64_t>(s); }

std::mutex g_codes_mu;
std::vector<std::string>& codes() {
  static std::vector<std::string> v;
  return v;
}

// Raises what a kernel reported through the device's error word (after a synchronize).
void raise_device_error(int index) {
  DeviceState& s = state(index);
  if (s.has_posted.load(std::memory_order_acquire)) {
    std::exception_ptr e;
    {
      std::lock_guard<std::mutex> lock(s.posted_mu);
      e = std::exchange(s.posted, nullptr);
      s.has_posted.store(false, std::memory_order_release);
    }
    if (e) std::rethrow_exception(e);
  }
  int code = __atomic_exchange_n(s.error_word_host, 0, __ATOMIC_ACQ_REL);
  if (code == 0) return;
  std::string msg;
  {
    std::lock_guard<std::mutex> lock(g_codes_mu);
    msg = code > 0 && static_cast<size_t>(code) <= codes().size()
              ? codes()[code - 1]
              : fmt::format("[cuda] a kernel reported error code {}", code);
  }
  KILN_THROW(Index, "{} (found by a kernel on cuda:{}; the op's output is not valid)", msg, index);
}

void forbid_in_capture(int index, const char* what) {
  KILN_CHECK_DEVICE(!tls_is_capturing[index],
                    "[cuda] {} is not permitted while stream {} of cuda:{} is capturing "
                    "(cudaErrorStreamCaptureUnsupported)",
                    what, fmt::ptr(tls_capturing[index]), index);
}

class Interface final : public DeviceInterface {
 public:
  DeviceCaps caps() const override { return {.host_memory = false, .async = true, .graphs = true}; }
  Allocator* allocator(int index) override { return &state(index).allocator; }
  int device_count() const override { return count(); }
  void copy_bytes(void* dst, bool dst_dev, const void* src, bool src_dev, size_t n,
                  int index) override {
    if (n == 0) return;
    cudaStream_t s = cuda::current_stream(index);
    if (dst_dev && src_dev) {
      KILN_CUDA_CHECK(cudaMemcpyAsync(dst, src, n, cudaMemcpyDeviceToDevice, s));
      return;
    }
    forbid_in_capture(index, "a copy between host and device");
    KILN_CUDA_CHECK(cudaMemcpyAsync(dst, src, n, cudaMemcpyDefault, s));
    KILN_CUDA_CHECK(cudaStreamSynchronize(s));
    raise_device_error(index);
  }
  void synchronize(int index) override {
    forbid_in_capture(index, "synchronizing the device");
    set_device(index);
    KILN_CUDA_CHECK(cudaDeviceSynchronize());
    raise_device_error(index);
  }
  void manual_seed(uint64_t seed) override {
    for (int i = 0; i < count(); ++i) {
      DeviceState& s = state(i);
      set_device(i);
      const uint64_t v[2] = {seed, 0};
      KILN_CUDA_CHECK(cudaDeviceSynchronize());  // queued draws first
      KILN_CUDA_CHECK(cudaMemcpy(s.philox, v, sizeof v, cudaMemcpyHostToDevice));
    }
  }
  uint64_t create_stream(int index) override {
    set_device(index);
    cudaStream_t s;
    KILN_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    return as_id(s);
  }
  void destroy_stream(int index, uint64_t id) override {
    KILN_CHECK_DEVICE(id != 0, "[cuda] the default stream of cuda:{} cannot be destroyed", index);
    set_device(index);
    KILN_CUDA_CHECK(cudaStreamSynchronize(as_stream(id)));
    release_lt_workspace(index, as_stream(id));
    KILN_CUDA_CHECK(cudaStreamDestroy(as_stream(id)));
  }
  uint64_t current_stream(int index) override { return as_id(cuda::current_stream(index)); }
  void set_current_stream(int index, uint64_t id) override {
    state(index);  // checks the index
    tls_current[index] = as_stream(id);
  }
  void synchronize_stream(int index, uint64_t id) override {
    forbid_in_capture(index, "synchronizing a stream");
    set_device(index);
    KILN_CUDA_CHECK(cudaStreamSynchronize(as_stream(id)));
    raise_device_error(index);
  }
  uint64_t create_event(int index) override {
    set_device(index);
    cudaEvent_t e;
    KILN_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    return reinterpret_cast<uint64_t>(e);
  }
  void destroy_event(int index, uint64_t e) override {
    set_device(index);
    KILN_CUDA_CHECK(cudaEventDestroy(reinterpret_cast<cudaEvent_t>(e)));
  }
  void record_event(int index, uint64_t e, uint64_t s) override {
    set_device(index);
    KILN_CUDA_CHECK(cudaEventRecord(reinterpret_cast<cudaEvent_t>(e), as_stream(s)));
  }
  void stream_wait_event(int index, uint64_t s, uint64_t e) override {
    set_device(index);
    KILN_CUDA_CHECK(cudaStreamWaitEvent(as_stream(s), reinterpret_cast<cudaEvent_t>(e), 0));
  }
  void synchronize_event(int index, uint64_t e) override {
    forbid_in_capture(index, "synchronizing an event");
    KILN_CUDA_CHECK(cudaEventSynchronize(reinterpret_cast<cudaEvent_t>(e)));
    raise_device_error(index);
  }
  bool query_event(int, uint64_t e) override {
    cudaError_t r = cudaEventQuery(reinterpret_cast<cudaEvent_t>(e));
    if (r == cudaErrorNotReady) {
      cudaGetLastError();
      return false;
    }
    KILN_CUDA_CHECK(r);
    return true;
  }
  // cudaLaunchHostFunc: `fn` runs on CUDA's callback thread when the stream reaches it, and must
  // not call CUDA. Captured, it is recorded into the graph and kept until exit (each replay
  // runs it). An exception it throws is posted to the device (post_device_error).
  bool capturing(int index) override { return ::kiln::cuda::capturing(index); }
  std::optional<DeviceMemoryStats> memory_stats(int index) override {
    const MemoryStats m = ::kiln::cuda::memory_stats(index);
    return DeviceMemoryStats{m.allocated, m.reserved, m.peak_allocated};
  }
  void reset_peak_memory(int index) override { ::kiln::cuda::reset_peak_memory(index); }
  void launch_host_task(int index, std::string_view, std::function<void()> fn) override {
    struct Task {
      int index;
      std::function<void()> fn;
      bool once;
    };
    cudaStream_t s = cuda::current_stream(index);
    cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
    KILN_CUDA_CHECK(cudaStreamIsCapturing(s, &capture));
    auto* task = new Task{index, std::move(fn), capture == cudaStreamCaptureStatusNone};
    cudaError_t err = cudaLaunchHostFunc(
        s,
        [](void* p) {
          auto* t = static_cast<Task*>(p);
          try {
            t->fn();
          } catch (...) {
            post_device_error(t->index, std::current_exception());
          }
          if (t->once) delete t;
        },
        task);
    if (err != cudaSuccess) delete task;
    KILN_CUDA_CHECK(err);
  }
  uint64_t create_pool(int index) override { return state(index).allocator.create_pool(); }
  void release_pool(int index, uint64_t pool) override {
    state(index).allocator.release_pool(pool);
  }
  void begin_capture(int index, uint64_t s, uint64_t pool) override {
    KILN_CHECK_DEVICE(s != 0,
                      "[cuda] cannot capture the default stream of cuda:{}: capture a stream made "
                      "with create_stream (cudaErrorStreamCaptureUnsupported)",
                      index);
    KILN_CHECK_DEVICE(!tls_is_capturing[index],
                      "[cuda] this thread is already capturing stream {} of cuda:{} "
                      "(cudaErrorIllegalState)",
                      fmt::ptr(tls_capturing[index]), index);
    set_device(index);
    reserve_lt_workspace(index, as_stream(s));  // Note [cuBLASLt workspaces]: not from the pool
    state(index).allocator.begin_capture(pool);
    cudaError_t err = cudaStreamBeginCapture(as_stream(s), cudaStreamCaptureModeThreadLocal);
    if (err != cudaSuccess) state(index).allocator.end_capture();
    KILN_CUDA_CHECK(err);
    tls_is_capturing[index] = true;
    tls_capturing[index] = as_stream(s);
  }
  uint64_t end_capture(int index, uint64_t s) override {
    KILN_CHECK_DEVICE(tls_is_capturing[index] && tls_capturing[index] == as_stream(s),
                      "[cuda] stream {} of cuda:{} is not being captured by this thread "
                      "(cudaErrorIllegalState)",
                      fmt::ptr(as_stream(s)), index);
    cudaGraph_t g = nullptr;
    cudaError_t err = cudaStreamEndCapture(as_stream(s), &g);
    tls_is_capturing[index] = false;
    tls_capturing[index] = nullptr;
    state(index).allocator.end_capture();
    if (err != cudaSuccess) {
      cudaGetLastError();
      if (g) cudaGraphDestroy(g);
      KILN_THROW(Device, "[cuda] the capture of stream {} on cuda:{} failed: {} ({})",
                 fmt::ptr(as_stream(s)), index, cudaGetErrorName(err), cudaGetErrorString(err));
    }
    try {  // the capture's custom all-reduce registrations (Note [Custom all-reduce on CUDA])
      CustomAllReduce::end_capture(index);
    } catch (...) {
      cudaGraphDestroy(g);
      throw;
    }
    return reinterpret_cast<uint64_t>(g);
  }
  uint64_t instantiate(int index, uint64_t g) override {
    set_device(index);
    cudaGraphExec_t e = nullptr;
    auto graph = reinterpret_cast<cudaGraph_t>(g);
    void* timeline = graph_timeline_instrument(index, graph);  // Note [Graph timelines]
    const cudaError_t err = cudaGraphInstantiate(&e, graph, 0);
    graph_timeline_adopt(err == cudaSuccess ? e : nullptr, timeline);
    KILN_CUDA_CHECK(err);
    return reinterpret_cast<uint64_t>(e);
  }
  bool update(int index, uint64_t exec, uint64_t g) override {
    if (graph_timeline_on()) return false;  // the update would drop the stamps
    set_device(index);
    cudaGraphExecUpdateResultInfo info{};
    cudaError_t err = cudaGraphExecUpdate(reinterpret_cast<cudaGraphExec_t>(exec),
                                          reinterpret_cast<cudaGraph_t>(g), &info);
    if (err == cudaErrorGraphExecUpdateFailure) {
      cudaGetLastError();
      return false;
    }
    KILN_CUDA_CHECK(err);
    return true;
  }
  void launch(int index, uint64_t exec, uint64_t s) override {
    forbid_in_capture(index, "launching a graph");
    set_device(index);
    KILN_CUDA_CHECK(cudaGraphLaunch(reinterpret_cast<cudaGraphExec_t>(exec), as_stream(s)));
  }
  int graph_nodes(int, uint64_t g) override {
    size_t n = 0;
    KILN_CUDA_CHECK(cudaGraphGetNodes(reinterpret_cast<cudaGraph_t>(g), nullptr, &n));
    return static_cast<int>(n);
  }
  void destroy_graph(int, uint64_t g) override {
    cudaGraphDestroy(reinterpret_cast<cudaGraph_t>(g));
  }
  void destroy_exec(int, uint64_t e) override {
    graph_timeline_release(reinterpret_cast<cudaGraphExec_t>(e));
    cudaGraphExecDestroy(reinterpret_cast<cudaGraphExec_t>(e));
  }
};

Interface g_interface;

}  // namespace

void check_cuda(cudaError_t err, const char* what) {
  if (err == cudaSuccess) return;
  cudaGetLastError();  // clear non-sticky errors so the next call is not blamed
  KILN_THROW(Device, "[cuda] {} failed: {} ({})", what, cudaGetErrorName(err),
             cudaGetErrorString(err));
}

void check_launch(const char* op) {
  cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess)
    KILN_THROW(Device, "[{}] kernel launch failed: {} ({})", op, cudaGetErrorName(err),
               cudaGetErrorString(err));
}

cudaStream_t current_stream(int index) {
  set_device(index);
  return tls_current[index];
}

bool capturing(int index) { return tls_is_capturing[index]; }

int* error_word(int index) { return state(index).error_word_device; }

void post_device_error(int index, std::exception_ptr error) {
  DeviceState& s = state(index);
  std::lock_guard<std::mutex> lock(s.posted_mu);
  if (!s.posted) s.posted = std::move(error);  // the first failure explains the others
  s.has_posted.store(true, std::memory_order_release);
}

int error_code(const char* message) {
  std::lock_guard<std::mutex> lock(g_codes_mu);
  for (size_t i = 0; i < codes().size(); ++i)
    if (codes()[i] == message) return static_cast<int>(i + 1);
  codes().emplace_back(message);
  return static_cast<int>(codes().size());
}

uint64_t* philox_state(int index) { return state(index).philox; }

std::vector<BackendKernel>& kernel_list() {
  static std::vector<BackendKernel> v;
  return v;
}

int device_count() { return count(); }

DeviceProperties device_properties(int index) {
  (void)state(index);  // checks the index
  cudaDeviceProp p{};
  KILN_CUDA_CHECK(cudaGetDeviceProperties(&p, index));
  return {p.name,           p.major,
          p.minor,          p.multiProcessorCount,
          p.totalGlobalMem, p.sharedMemPerBlockOptin,
          p.l2CacheSize,    p.warpSize};
}

void record_stream(const Tensor& t, const Stream& stream) {
  KILN_CHECK(t.defined(), "[record_stream] undefined tensor");
  KILN_CHECK_DEVICE(t.device().dispatch_key() == DispatchKey::CUDA,
                    "[record_stream] expects a cuda tensor, got one on {}", t.device());
  KILN_CHECK_DEVICE(stream.device() == t.device(),
                    "[record_stream] the stream is on {}, the tensor on {}", stream.device(),
                    t.device());
  const int index = t.device().index();
  StorageImpl* st = t.impl()->storage();
  KILN_CHECK_DEVICE(st->allocator() == &state(index).allocator,
                    "[record_stream] the tensor's memory is not from {}'s caching allocator (a "
                    "compiled function's buffer, or borrowed)",
                    t.device());
  if (st->nbytes() == 0) return;
  state(index).allocator.record_stream(st->data(), as_stream(stream.id()));
}
MemoryStats memory_stats(int index) { return state(index).allocator.stats(); }
void reset_peak_memory(int index) { state(index).allocator.reset_peak(); }
size_t empty_cache(int index) {
  set_device(index);
  return state(index).allocator.empty_cache();
}

void hold_current_stream(int index, uint64_t ns) {
  set_device(index);
  hold_stream(current_stream(index), ns);
}

double empty_launch_us(int index, int iters) {
  return time_empty_launches(current_stream(index), iters);
}
double empty_driver_launch_us(int index, int iters) {
  return time_empty_driver_launches(current_stream(index), iters);
}
double empty_graph_node_us(int index, int nodes, int iters) {
  return time_empty_graph_nodes(current_stream(index), nodes, iters);
}

namespace {
const char* describe(BackendSpec* spec) {
  if (count() == 0) {
    static std::string why;
    why = g_count_error != cudaSuccess
              ? fmt::format("no CUDA device is usable (cudaGetDeviceCount: {}: {})",
                            cudaGetErrorName(g_count_error), cudaGetErrorString(g_count_error))
              : std::string("no CUDA device is present");
    return why.c_str();
  }
  spec->interface = &g_interface;
  spec->kernels = kernel_list();
  spec->on_registered = &register_collective_backends;
  return nullptr;
}
}  // namespace

}  // namespace kiln::cuda

extern "C" __attribute__((visibility("default"))) const KilnBackendEntry* kiln_backend_entry() {
  static const KilnBackendEntry entry{KILN_BACKEND_ABI_VERSION, "cuda", &kiln::cuda::describe};
  return &entry;
}

// Page-locked host memory and asynchronous copies (pin_memory, copy_async), and the stream
// pool: the host side of the CUDA backend's public calls (cuda.h).
//
// Note [Pinned host memory]
// cudaHostAlloc costs as much as a cudaMalloc, so freed pinned blocks are cached by size (a
// power of two, 512 bytes and up) and reused, as PyTorch's CachingHostAllocator does. A block
// is reused only when every copy queued from or to it has finished: copy_async records an event
// on the copying stream against the block, and a cached block whose events have not all
// passed is skipped. Pinned memory is portable (usable from every device).
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <map>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "kiln/backend/cuda/common.h"
#include "kiln/backend/cuda/cuda.h"

namespace kiln::cuda {
namespace {

class PinnedAllocator final : public Allocator {
 public:
  void* allocate(size_t nbytes) override {
    if (nbytes == 0) return nullptr;
    size_t size = 512;
    while (size < nbytes) size *= 2;
    std::lock_guard<std::mutex> lock(mu_);
    auto& cached = free_[size];
    for (auto it = cached.begin(); it != cached.end(); ++it) {
      if (!finished(it->events)) continue;
      void* p = it->ptr;
      cached.erase(it);
      live_[p] = {size, {}};
      return p;
    }
    void* p = nullptr;
    cudaError_t err = cudaHostAlloc(&p, size, cudaHostAllocPortable);
    if (err != cudaSuccess) {
      cudaGetLastError();
      KILN_THROW(Device, "[pin_memory] cudaHostAlloc of {} bytes failed: {} ({})", size,
                 cudaGetErrorName(err), cudaGetErrorString(err));
    }
    live_[p] = {size, {}};
    return p;
  }
  void deallocate(void* p, size_t) override {
    if (!p) return;
    std::lock_guard<std::mutex> lock(mu_);
    auto it = live_.find(p);
    if (it == live_.end()) return;
    free_[it->second.size].push_back({p, std::move(it->second.events)});
    live_.erase(it);
  }
  // A copy from or to the live block at p was just queued on `stream` (of the current
  // device); `e` is an event made for it beforehand (so the copy never goes unrecorded).
  void record(void* p, cudaStream_t stream, cudaEvent_t e) {
    if (cudaEventRecord(e, stream) != cudaSuccess) {  // no event: wait for the copy instead
      cudaGetLastError();
      cudaEventDestroy(e);
      KILN_CUDA_CHECK(cudaStreamSynchronize(stream));
      return;
    }
    std::lock_guard<std::mutex> lock(mu_);
    auto it = live_.find(p);
    if (it == live_.end()) {
      cudaEventDestroy(e);
      return;
    }
    // Keep the list short: events already passed are dropped.
    (void)finished(it->second.events);
    it->second.events.push_back(e);
  }

 private:
  struct Live {
    size_t size;
    std::vector<cudaEvent_t> events;
  };
  struct Cached {
    void* ptr;
    std::vector<cudaEvent_t> events;
  };
  // Destroys the events that have passed; whether all have.
  static bool finished(std::vector<cudaEvent_t>& events) {
    auto pending = std::remove_if(events.begin(), events.end(), [](cudaEvent_t e) {
      cudaError_t r = cudaEventQuery(e);
      if (r == cudaErrorNotReady) {
        cudaGetLastError();
        return false;
      }
      if (r != cudaSuccess) cudaGetLastError();
      cudaEventDestroy(e);
      return true;
    });
    events.erase(pending, events.end());
    return events.empty();
  }

  std::mutex mu_;
  std::unordered_map<void*, Live> live_;
  std::map<size_t, std::vector<Cached>> free_;
};

PinnedAllocator& pinned() {
  static auto* a = new PinnedAllocator();  // lives until exit: pinned tensors may outlive it
  return *a;
}

bool is_cuda(const Tensor& t) { return t.device().dispatch_key() == DispatchKey::CUDA; }

}  // namespace

Tensor pin_memory(const Tensor& t) {
  KILN_CHECK(t.defined(), "[pin_memory] undefined tensor");
  KILN_CHECK_DEVICE(t.device().is_cpu(), "[pin_memory] expects a cpu tensor, got one on {}",
                    t.device());
  Tensor c = t.contiguous();
  auto storage = make_ref<StorageImpl>(c.nbytes(), Device(kCPU), &pinned());
  Tensor out(make_ref<TensorImpl>(std::move(storage), c.dtype(), c.sizes(),
                                  contiguous_strides(c.sizes()), 0));
  if (c.nbytes() > 0) std::memcpy(out.impl()->data(), c.impl()->data(), c.nbytes());
  return out;
}

bool is_pinned(const Tensor& t) {
  return t.defined() && t.device().is_cpu() && t.impl()->storage()->allocator() == &pinned();
}

void copy_async(const Tensor& dst, const Tensor& src) {
  KILN_CHECK(dst.defined() && src.defined(), "[copy_async] undefined tensor");
  const bool to_device = is_pinned(src) && is_cuda(dst);
  const bool to_host = is_cuda(src) && is_pinned(dst);
  KILN_CHECK_DEVICE(to_device || to_host,
                    "[copy_async] copies between a pinned cpu tensor (pin_memory) and a cuda "
                    "tensor, got a destination on {}{} and a source on {}{}",
                    dst.device(), is_pinned(dst) ? " (pinned)" : "", src.device(),
                    is_pinned(src) ? " (pinned)" : "");
  KILN_CHECK_TYPE(dst.dtype() == src.dtype(),
                  "[copy_async] copies without casting: destination {}, source {}", dst.dtype(),
                  src.dtype());
  KILN_CHECK(dst.sizes() == src.sizes(),
             "[copy_async] destination and source shapes differ: {} and {}", dst.sizes(),
             src.sizes());
  KILN_CHECK(dst.is_contiguous() && src.is_contiguous(),
             "[copy_async] needs contiguous tensors (strides {} and {})", dst.strides(),
             src.strides());
  const Tensor& dev = to_device ? dst : src;
  const Tensor& host = to_device ? src : dst;
  const int index = dev.device().index();
  KILN_CHECK_DEVICE(!capturing(index),
                    "[copy_async] a copy with the host cannot be captured into a graph on {} "
                    "(cudaErrorStreamCaptureUnsupported)",
                    dev.device());
  if (dst.nbytes() == 0) return;
  cudaStream_t stream = current_stream(index);
  cudaEvent_t done = nullptr;
  KILN_CUDA_CHECK(cudaEventCreateWithFlags(&done, cudaEventDisableTiming));
  cudaError_t err =
      cudaMemcpyAsync(dst.impl()->data(), src.impl()->data(), dst.nbytes(),
                      to_device ? cudaMemcpyHostToDevice : cudaMemcpyDeviceToHost, stream);
  if (err != cudaSuccess) cudaEventDestroy(done);
  KILN_CUDA_CHECK(err);
  pinned().record(host.impl()->storage()->data(), stream, done);
  dst.impl()->storage()->bump_version();
}

Stream stream_from_pool(int device) {
  constexpr int kMaxDevices = 16;
  KILN_CHECK_DEVICE(device >= 0 && device < std::min(device_count(), kMaxDevices),
                    "[stream_from_pool] device index {} is out of range: there are {} CUDA "
                    "devices",
                    device, device_count());
  static std::mutex mu;
  static auto* pools = new std::vector<std::vector<Stream>>(kMaxDevices);  // lives until exit
  static std::atomic<unsigned> next[kMaxDevices];
  std::lock_guard<std::mutex> lock(mu);
  std::vector<Stream>& pool = (*pools)[static_cast<size_t>(device)];
  if (pool.empty())
    for (int i = 0; i < kStreamPoolSize; ++i) pool.push_back(Stream::create(Device(kCUDA, device)));
  return pool[next[device].fetch_add(1, std::memory_order_relaxed) % kStreamPoolSize];
}

}  // namespace kiln::cuda

#pragma once
// What the files of the sim plugin share: its settings, streams, captures and pools, the device
// state, and the kernels the plugin registers. Internal to kiln/backend/sim; see Note [The sim
// device] in sim.cpp for how the device behaves.
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "kiln/backend/backend.h"
#include "kiln/core/generator.h"
#include "kiln/core/tensor.h"

namespace kiln::sim {

inline constexpr int kMaxDevices = 8;

// Settings from the environment (Note [The sim device]).
extern const int64_t g_launch_ns;  // KILN_SIM_LAUNCH_NS: what a launch costs its stream
extern const int64_t g_node_ns;    // KILN_SIM_NODE_NS: what a graph node costs at replay
extern const int g_devices;        // KILN_SIM_DEVICES: the number of devices
// The backend's dispatch key, set when the loader describes the backend.
extern DispatchKey g_key;

// Busy-waits `ns` nanoseconds (the simulated cost of a launch or a graph node).
void spin_ns(int64_t ns);

// ---------------------------------------------------------------- streams (stream.cpp)

struct Task {
  std::function<void()> fn;
  int64_t cost_ns = 0;
};

// A worker thread running its queue of tasks in order.
class Stream {
 public:
  Stream(int device, uint64_t id, int threads);
  ~Stream();
  uint64_t id() const { return id_; }
  void push(Task t);
  uint64_t submitted();
  // Waits until `target` tasks have run.
  void wait_for(uint64_t target);
  // Waits for everything queued so far; reports (once) a kernel that failed on the worker.
  void synchronize();

 private:
  void loop(int threads);

  int device_;
  uint64_t id_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Task> q_;
  uint64_t submitted_ = 0;
  std::atomic<uint64_t> done_{0};
  bool stop_ = false;
  std::string error_;
  std::exception_ptr distributed_error_;  // a failed collective's own error, rethrown as is
  std::thread worker_;
};

// ---------------------------------------------------------------- captures and pools

struct Node {
  std::string_view name;  // the kernel: update() requires the same ones in order
  std::function<void()> fn;
};
using Nodes = std::vector<Node>;

// Note [Streams joining a capture]
// As on CUDA, a capture may fork: a stream that waits for an event recorded on a stream of the
// capture joins it, and its launches are recorded too. Sim records every stream's launches into
// the one node list, in the order they were issued: that order already satisfies each stream's
// order and every wait, so a serial replay is a legal schedule. The capture must end joined:
// after its last launch, a stream that joined must have recorded an event that the origin
// stream then waited for; otherwise end_capture raises (cudaErrorStreamCaptureUnjoined). A
// capturing stream may not wait for an event recorded outside the capture
// (cudaErrorStreamCaptureIsolation).
struct Capture {
  int device;
  uint64_t stream;  // the origin: the stream begin_capture was given
  uint64_t pool;
  Nodes nodes;
  std::string invalid;  // the first error, once the capture is invalidated
  struct Joined {
    uint64_t work = 0;      // its join and launches since, counted
    uint64_t rejoined = 0;  // how much of that work the origin has waited for
  };
  std::map<uint64_t, Joined> joined;  // streams that joined, by id
  struct Recorded {
    uint64_t stream = 0;
    uint64_t work = 0;  // the stream's work count when the event was recorded
  };
  std::map<uint64_t, Recorded> events;  // events recorded on the capture's streams
  bool has(uint64_t s) const { return s == stream || joined.count(s) > 0; }
};

extern thread_local Capture* tls_capture;  // the capture this thread is running, if any

struct Pool {
  std::vector<std::pair<void*, size_t>> blocks;  // everything allocated into it
  std::unordered_set<void*> freed;               // freed while the pool lives: kept
};

// ---------------------------------------------------------------- the device

class SimDevice;
// The state of sim:`index`; raises a DeviceError for an index out of range.
SimDevice& device_state(int index);

struct Allocator final : kiln::Allocator {
  int device = 0;
  void* allocate(size_t nbytes) override;
  void deallocate(void* p, size_t nbytes) override;
};

// One sim device: its streams (device.cpp), memory and pools (memory.cpp), and captures and
// graphs (graph.cpp).
class SimDevice {
 public:
  explicit SimDevice(int index) : index_(index) { alloc_.device = index; }

  // Streams are shared: a thread synchronizing one keeps it alive while another destroys it.
  std::shared_ptr<Stream> stream(uint64_t id);
  uint64_t create_stream();
  void destroy_stream(uint64_t id);
  std::vector<std::shared_ptr<Stream>> all_streams();

  // What capturing forbids: the error invalidates the capture and is thrown.
  void forbid_in_capture(const char* what, const char* cuda_error);

  // A kernel launch on the current stream: recorded when it is capturing, queued otherwise.
  void launch(std::string_view name, std::function<void()> fn);

  // Waits for every stream, then reports the first kernel that failed on one.
  void synchronize();
  void synchronize_current() { stream(current())->synchronize(); }

  // Memory. Freed blocks are cached by size class for reuse, as a GPU's caching allocator does
  // (up to kMaxCached bytes); without it, blocks allocated on the host and freed on a worker
  // made glibc's heaps trim and fault pages on every op. A free is ordered on the stream the
  // block was allocated on (current then), as the CUDA caching allocator orders it: the block
  // is reused only after that stream has run what was queued before the free.
  static size_t size_class(size_t n);
  void* allocate(size_t nbytes);
  // Never throws (it runs in StorageImpl's destructor).
  void deallocate(void* p, size_t nbytes) noexcept;
  void* take_cached(size_t cls);
  void cache(void* p, size_t cls);
  uint64_t create_pool();
  void release_pool(uint64_t id);
  // The bytes of live blocks (by size class) and of cached ones, and the peak of the first
  // since reset_peak_memory (DeviceInterface::memory_stats).
  DeviceMemoryStats memory_stats();
  void reset_peak_memory();

  // Capture.
  void begin_capture(uint64_t stream_id, uint64_t pool);
  uint64_t end_capture(uint64_t stream_id);
  // A graph, or an executable graph: its nodes, and (executable) where it was last launched.
  struct GraphEntry {
    std::shared_ptr<const Nodes> nodes;
    std::shared_ptr<Stream> last_stream;
    uint64_t last_seq = 0;  // that stream's count once the last launch was queued
  };
  GraphEntry& graph(uint64_t id, const char* what);
  int graph_nodes(uint64_t id);
  uint64_t instantiate(uint64_t g);
  bool update(uint64_t exec, uint64_t g);
  // Launches of one executable graph run one after another, as CUDA orders them, even on two
  // streams: the second stream first waits for the first launch.
  void launch_graph(uint64_t exec, uint64_t stream_id);
  void destroy(uint64_t id);

  uint64_t current() const { return current_[index_]; }
  void set_current(uint64_t id);

  Allocator* allocator() { return &alloc_; }
  int index() const { return index_; }
  // The device's default generator (as CUDA devices have their own): kernels draw from it
  // when they run, in stream order; manual_seed reseeds it.
  Generator& generator() { return generator_; }

 private:
  static thread_local uint64_t current_[kMaxDevices];
  int index_;
  Allocator alloc_;
  Generator generator_;
  std::mutex mu_;
  uint64_t next_id_ = 1;
  std::map<uint64_t, std::shared_ptr<Stream>> streams_;
  std::map<uint64_t, GraphEntry> graphs_;  // graphs and executable graphs
  std::map<uint64_t, Pool> pools_;
  std::unordered_map<void*, uint64_t> pool_of_;
  std::unordered_map<void*, uint64_t> stream_of_;  // live blocks: the stream they belong to
  std::vector<std::pair<void*, size_t>> frees_after_capture_;
  std::mutex cache_mu_;
  std::unordered_map<size_t, std::vector<void*>> cache_;
  size_t cached_bytes_ = 0;
  std::atomic<size_t> allocated_bytes_{0}, peak_bytes_{0};
};

// ---------------------------------------------------------------- kernels (fallback.cpp)

// Every op without a kernel of its own: the meta function, then the CPU kernel on the stream.
void fallback(const OpDef& op, DispatchKey key, Stack& stack);
// copy_ and to_copy, within a device, between devices and to or from the host.
void copy_(const Tensor& self, const Tensor& src);
Tensor to_copy(const Tensor& self, DType dtype, Device device);
// nonzero: its size depends on the values, so they are read on the host (a synchronizing copy)
// and the result comes back, as on CUDA.
Tensor nonzero(const Tensor& self);

}  // namespace kiln::sim

// The `sim` accelerator: a device that behaves like a GPU, for testing without one. Built as a
// plugin (libkiln_sim.so) and loaded with kiln::load_backend("sim").
//
// Note [The sim device]
// - Memory is its own: host code cannot read it (data_ptr() raises); item(), printing and
//   .to("cpu") go through copies that wait for the stream.
// - Each stream is a worker thread running a queue in order. A kernel launch validates its
//   arguments and allocates its outputs on the calling thread (the op's meta function, so an
//   error is raised before anything is queued), then queues the CPU kernel over CPU views of
//   the same bytes. Each launch costs the stream KILN_SIM_LAUNCH_NS (default 5000 ns) before
//   it runs: launch-bound code shows up in timings as on a GPU.
// - Graphs behave like CUDA's: capture on a non-default stream records launches instead of
//   running them; synchronising, copies to or from the host, work on the default stream, and
//   allocations outside the capture's pool are errors that invalidate the capture (the CUDA
//   error each stands for is named in the message). An instantiated graph replays at
//   KILN_SIM_NODE_NS (default 500 ns) per node plus one launch; update() takes a graph of the
//   same kernels with other arguments.
// - Frees are stream-ordered: a block freed on the host is returned once the stream has run
//   everything queued before the free (blocks allocated in a capture's pool live as long as
//   the pool).
// KILN_SIM_DEVICES (default 2) sets the number of devices.
#include <omp.h>

#include <atomic>
#include <bit>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <unordered_set>

#include "kiln/backend/backend.h"
#include "kiln/core/storage.h"
#include "kiln/core/tensor_impl.h"
#include "kiln/ops/op_list.h"
#include "kiln/ops/ops.h"
#include "kiln/ops/other_meta.h"

namespace kiln::sim {
namespace {

constexpr int kMaxDevices = 8;

int64_t env_int(const char* name, int64_t dflt) {
  const char* v = std::getenv(name);
  return v && *v ? std::strtoll(v, nullptr, 10) : dflt;
}
const int64_t g_launch_ns = env_int("KILN_SIM_LAUNCH_NS", 5000);
const int64_t g_node_ns = env_int("KILN_SIM_NODE_NS", 500);
const int g_devices =
    static_cast<int>(std::clamp<int64_t>(env_int("KILN_SIM_DEVICES", 2), 1, kMaxDevices));

void spin_ns(int64_t ns) {
  if (ns <= 0) return;
  auto until = std::chrono::steady_clock::now() + std::chrono::nanoseconds(ns);
  while (std::chrono::steady_clock::now() < until) {
  }
}

DispatchKey g_key = DispatchKey::Undefined;  // set when the loader describes the backend

// ---------------------------------------------------------------- streams

struct Task {
  std::function<void()> fn;
  int64_t cost_ns = 0;
};

class Stream {
 public:
  Stream(int device, uint64_t id, int threads) : device_(device), id_(id) {
    worker_ = std::thread([this, threads] { loop(threads); });
  }
  ~Stream() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_one();
    worker_.join();
  }
  uint64_t id() const { return id_; }
  void push(Task t) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      q_.push_back(std::move(t));
      ++submitted_;
    }
    cv_.notify_one();
  }
  uint64_t submitted() {
    std::lock_guard<std::mutex> lock(mu_);
    return submitted_;
  }
  void wait_for(uint64_t target) {
    uint64_t d;
    while ((d = done_.load(std::memory_order_acquire)) < target) done_.wait(d);
  }
  // Waits for everything queued so far; reports (once) a kernel that failed on the worker.
  void synchronize() {
    wait_for(submitted());
    std::string err;
    {
      std::lock_guard<std::mutex> lock(mu_);
      err.swap(error_);
    }
    KILN_CHECK_DEVICE(err.empty(), "[sim] a kernel failed asynchronously on sim:{} stream {}: {}",
                      device_, id_, err);
  }

 private:
  void loop(int threads) {
    set_num_threads(threads);
    while (true) {
      Task t;
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [&] { return stop_ || !q_.empty(); });
        if (q_.empty()) return;
        t = std::move(q_.front());
        q_.pop_front();
      }
      spin_ns(t.cost_ns);
      try {
        t.fn();
      } catch (const std::exception& e) {
        std::lock_guard<std::mutex> lock(mu_);
        if (error_.empty()) error_ = e.what();
      }
      t.fn = nullptr;  // what the task held goes before the stream moves on
      done_.fetch_add(1, std::memory_order_release);
      done_.notify_all();
    }
  }

  int device_;
  uint64_t id_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Task> q_;
  uint64_t submitted_ = 0;
  std::atomic<uint64_t> done_{0};
  bool stop_ = false;
  std::string error_;
  std::thread worker_;
};

// ---------------------------------------------------------------- graphs

struct Node {
  std::string_view name;  // the kernel: update() requires the same ones in order
  std::function<void()> fn;
};
using Nodes = std::vector<Node>;

struct Capture {
  int device;
  uint64_t stream;
  uint64_t pool;
  Nodes nodes;
  std::string invalid;  // the first error, once the capture is invalidated
};

thread_local Capture* tls_capture = nullptr;  // the capture this thread is running, if any

struct Pool {
  std::vector<std::pair<void*, size_t>> blocks;  // everything allocated into it
  std::unordered_set<void*> freed;               // freed while the pool lives: kept
};

// ---------------------------------------------------------------- the device

class SimDevice;
SimDevice& device_state(int index);

struct Allocator final : kiln::Allocator {
  int device = 0;
  void* allocate(size_t nbytes) override;
  void deallocate(void* p, size_t nbytes) override;
};

class SimDevice {
 public:
  explicit SimDevice(int index) : index_(index) { alloc_.device = index; }

  // Streams are shared: a thread synchronizing one keeps it alive while another destroys it.
  std::shared_ptr<Stream> stream(uint64_t id) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = streams_.find(id);
    if (it == streams_.end()) {
      KILN_CHECK_DEVICE(id == 0, "[sim] sim:{} has no stream {}", index_, id);
      it = streams_.emplace(0, std::make_shared<Stream>(index_, 0, get_num_threads())).first;
    }
    return it->second;
  }
  uint64_t create_stream() {
    std::lock_guard<std::mutex> lock(mu_);
    uint64_t id = next_id_++;
    streams_.emplace(id, std::make_shared<Stream>(index_, id, get_num_threads()));
    return id;
  }
  void destroy_stream(uint64_t id) {
    KILN_CHECK_DEVICE(id != 0, "[sim] the default stream of sim:{} cannot be destroyed", index_);
    std::shared_ptr<Stream> s;
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = streams_.find(id);
      KILN_CHECK_DEVICE(it != streams_.end(), "[sim] sim:{} has no stream {}", index_, id);
      s = std::move(it->second);
      streams_.erase(it);
    }
    s->synchronize();
  }
  std::vector<std::shared_ptr<Stream>> all_streams() {
    std::lock_guard<std::mutex> lock(mu_);
    std::vector<std::shared_ptr<Stream>> v;
    for (auto& [id, s] : streams_) v.push_back(s);
    return v;
  }

  // What capturing forbids: the error invalidates the capture and is thrown.
  void forbid_in_capture(const char* what, const char* cuda_error) {
    Capture* c = tls_capture;
    if (!c || c->device != index_) return;
    std::string msg = fmt::format("[sim] {} is not permitted while stream {} is capturing ({})",
                                  what, c->stream, cuda_error);
    if (c->invalid.empty()) c->invalid = msg;
    KILN_THROW(Device, "{}", msg);
  }

  // A kernel launch on the current stream: recorded when it is capturing, queued otherwise.
  void launch(std::string_view name, std::function<void()> fn);

  // Waits for every stream, then reports the first kernel that failed on one.
  void synchronize() {
    forbid_in_capture("synchronizing the device", "cudaErrorStreamCaptureUnsupported");
    std::string first;
    for (const auto& s : all_streams()) {
      try {
        s->synchronize();
      } catch (const Error& e) {
        if (first.empty()) first = e.what();
      }
    }
    if (!first.empty()) KILN_THROW(Device, "{}", first);
  }
  void synchronize_current() { stream(current())->synchronize(); }

  // Memory. Freed blocks are cached by size class for reuse, as a GPU's caching allocator does
  // (up to kMaxCached bytes); without it, blocks allocated on the host and freed on a worker
  // made glibc's heaps trim and fault pages on every op. A free is ordered on the stream the
  // block was allocated on (current then), as the CUDA caching allocator orders it: the block
  // is reused only after that stream has run what was queued before the free.
  static size_t size_class(size_t n) {
    n = (n + 511) & ~size_t{511};
    return n <= (size_t{1} << 20) ? std::bit_ceil(n)
                                  : (n + (size_t{1} << 20) - 1) & ~((size_t{1} << 20) - 1);
  }
  void* allocate(size_t nbytes) {
    if (nbytes == 0) return nullptr;
    Capture* c = tls_capture;
    if (c && c->device == index_ && c->pool == 0)
      forbid_in_capture(
          fmt::format("allocating {} bytes outside a graph memory pool", nbytes).c_str(),
          "cudaErrorStreamCaptureUnsupported");
    const size_t cls = size_class(nbytes);
    void* p = take_cached(cls);
    if (!p) p = std::aligned_alloc(64, cls);
    KILN_CHECK(p != nullptr, "[sim] out of memory allocating {} bytes on sim:{}", nbytes, index_);
    std::lock_guard<std::mutex> lock(mu_);
    if (c && c->device == index_) {
      pools_[c->pool].blocks.push_back({p, nbytes});
      pool_of_[p] = c->pool;
    } else {
      stream_of_[p] = current();
    }
    return p;
  }
  // Never throws (it runs in StorageImpl's destructor).
  void deallocate(void* p, size_t nbytes) noexcept {
    if (!p) return;
    try {
      std::shared_ptr<Stream> owner;
      {
        std::lock_guard<std::mutex> lock(mu_);
        if (auto it = pool_of_.find(p); it != pool_of_.end()) {
          pools_[it->second].freed.insert(p);  // the pool's graph may still replay into it
          return;
        }
        Capture* c = tls_capture;
        if (c && c->device == index_) {  // the capturing stream must not record the free
          frees_after_capture_.push_back({p, nbytes});
          return;
        }
        uint64_t sid = 0;
        if (auto it = stream_of_.find(p); it != stream_of_.end()) {
          sid = it->second;
          stream_of_.erase(it);
        }
        if (auto it = streams_.find(sid); it != streams_.end()) owner = it->second;
      }
      // A destroyed stream had finished its work: the block is free now.
      if (!owner) return cache(p, size_class(nbytes));
      owner->push({[this, p, cls = size_class(nbytes)] { cache(p, cls); }, 0});
    } catch (...) {  // NOLINT: out of memory for the bookkeeping; the block is lost, not reused
    }
  }
  void* take_cached(size_t cls) {
    std::lock_guard<std::mutex> lock(cache_mu_);
    auto it = cache_.find(cls);
    if (it == cache_.end() || it->second.empty()) return nullptr;
    void* p = it->second.back();
    it->second.pop_back();
    cached_bytes_ -= cls;
    return p;
  }
  void cache(void* p, size_t cls) {
    static constexpr size_t kMaxCached = size_t{1} << 30;
    {
      std::lock_guard<std::mutex> lock(cache_mu_);
      if (cached_bytes_ + cls <= kMaxCached) {
        cache_[cls].push_back(p);
        cached_bytes_ += cls;
        return;
      }
    }
    std::free(p);
  }
  uint64_t create_pool() {
    std::lock_guard<std::mutex> lock(mu_);
    uint64_t id = next_id_++;
    pools_[id];
    return id;
  }
  void release_pool(uint64_t id) {
    std::vector<std::pair<void*, size_t>> freed;
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = pools_.find(id);
      if (it == pools_.end()) return;
      for (auto [b, n] : it->second.blocks) {
        pool_of_.erase(b);
        if (it->second.freed.count(b))
          freed.push_back({b, n});
        else
          stream_of_[b] = 0;  // still in use: freed later, like any block
      }
      pools_.erase(it);
    }
    // Graphs queued so far may still replay into the pool: let them finish first.
    if (freed.empty()) return;
    for (const auto& s : all_streams()) s->wait_for(s->submitted());
    for (auto [b, n] : freed) cache(b, size_class(n));
  }

  // Capture.
  void begin_capture(uint64_t stream_id, uint64_t pool) {
    KILN_CHECK_DEVICE(stream_id != 0,
                      "[sim] cannot capture the default stream of sim:{}: capture a stream made "
                      "with create_stream (cudaErrorStreamCaptureUnsupported)",
                      index_);
    KILN_CHECK_DEVICE(!tls_capture,
                      "[sim] this thread is already capturing stream {} (cudaErrorIllegalState)",
                      tls_capture ? tls_capture->stream : 0);
    {
      std::lock_guard<std::mutex> lock(mu_);
      KILN_CHECK_DEVICE(streams_.count(stream_id), "[sim] sim:{} has no stream {}", index_,
                        stream_id);
      KILN_CHECK_DEVICE(pool == 0 || pools_.count(pool), "[sim] sim:{} has no pool {}", index_,
                        pool);
    }
    tls_capture = new Capture{index_, stream_id, pool, {}, {}};
  }
  uint64_t end_capture(uint64_t stream_id) {
    Capture* c = tls_capture;
    KILN_CHECK_DEVICE(c && c->device == index_ && c->stream == stream_id,
                      "[sim] stream {} of sim:{} is not being captured by this thread "
                      "(cudaErrorIllegalState)",
                      stream_id, index_);
    std::unique_ptr<Capture> done(c);
    tls_capture = nullptr;
    std::vector<std::pair<void*, size_t>> frees;
    {
      std::lock_guard<std::mutex> lock(mu_);
      frees.swap(frees_after_capture_);
    }
    for (auto [p, n] : frees) deallocate(p, n);
    KILN_CHECK_DEVICE(done->invalid.empty(),
                      "[sim] the capture of stream {} was invalidated "
                      "(cudaErrorStreamCaptureInvalidated) by: {}",
                      stream_id, done->invalid);
    std::lock_guard<std::mutex> lock(mu_);
    uint64_t id = next_id_++;
    graphs_[id] = {std::make_shared<Nodes>(std::move(done->nodes)), {}, 0};
    return id;
  }
  // A graph, or an executable graph: its nodes, and (executable) where it was last launched.
  struct GraphEntry {
    std::shared_ptr<const Nodes> nodes;
    std::shared_ptr<Stream> last_stream;
    uint64_t last_seq = 0;  // that stream's count once the last launch was queued
  };
  GraphEntry& graph(uint64_t id, const char* what) {
    auto it = graphs_.find(id);
    KILN_CHECK_DEVICE(it != graphs_.end(), "[sim] sim:{} has no {} {}", index_, what, id);
    return it->second;
  }
  int graph_nodes(uint64_t id) {
    std::lock_guard<std::mutex> lock(mu_);
    return static_cast<int>(graph(id, "graph").nodes->size());
  }
  uint64_t instantiate(uint64_t g) {
    std::lock_guard<std::mutex> lock(mu_);
    auto nodes = graph(g, "graph").nodes;
    uint64_t id = next_id_++;
    graphs_[id] = {nodes, {}, 0};
    return id;
  }
  bool update(uint64_t exec, uint64_t g) {
    std::lock_guard<std::mutex> lock(mu_);
    GraphEntry& e = graph(exec, "graph exec");
    auto nodes = graph(g, "graph").nodes;
    if (e.nodes->size() != nodes->size()) return false;
    for (size_t i = 0; i < e.nodes->size(); ++i)
      if ((*e.nodes)[i].name != (*nodes)[i].name) return false;
    e.nodes = nodes;  // queued launches keep the old nodes
    return true;
  }
  // Launches of one executable graph run one after another, as CUDA orders them, even on two
  // streams: the second stream first waits for the first launch.
  void launch_graph(uint64_t exec, uint64_t stream_id) {
    forbid_in_capture("launching a graph", "cudaErrorStreamCaptureUnsupported");
    std::shared_ptr<Stream> s = stream(stream_id);
    std::lock_guard<std::mutex> lock(mu_);
    GraphEntry& e = graph(exec, "graph exec");
    if (e.last_stream && e.last_stream != s)
      s->push({[prev = e.last_stream, seq = e.last_seq] { prev->wait_for(seq); }, 0});
    std::shared_ptr<const Nodes> nodes = e.nodes;
    s->push({[nodes] {
               for (const Node& n : *nodes) {
                 spin_ns(g_node_ns);
                 n.fn();
               }
             },
             g_launch_ns});
    e.last_stream = s;
    e.last_seq = s->submitted();
  }
  void destroy(uint64_t id) {
    std::lock_guard<std::mutex> lock(mu_);
    graphs_.erase(id);
  }

  uint64_t current() const { return current_[index_]; }
  void set_current(uint64_t id) {
    if (id != 0) {
      std::lock_guard<std::mutex> lock(mu_);
      KILN_CHECK_DEVICE(streams_.count(id), "[sim] sim:{} has no stream {}", index_, id);
    }
    current_[index_] = id;
  }

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
};

thread_local uint64_t SimDevice::current_[kMaxDevices] = {};

void SimDevice::launch(std::string_view name, std::function<void()> fn) {
  Capture* c = tls_capture;
  const uint64_t s = current();
  if (c && c->device == index_) {
    if (s == c->stream) {
      KILN_CHECK_DEVICE(c->invalid.empty(), "[sim] launching {} into an invalidated capture: {}",
                        name, c->invalid);
      c->nodes.push_back({name, std::move(fn)});
      return;
    }
    if (s == 0)
      forbid_in_capture(fmt::format("launching {} on the default stream", name).c_str(),
                        "cudaErrorStreamCaptureImplicit");
  }
  stream(s)->push({std::move(fn), g_launch_ns});
}

void* Allocator::allocate(size_t nbytes) { return device_state(device).allocate(nbytes); }
void Allocator::deallocate(void* p, size_t nbytes) { device_state(device).deallocate(p, nbytes); }

SimDevice& device_state(int index) {
  static SimDevice* devices[kMaxDevices] = {};
  static std::once_flag once;
  std::call_once(once, [] {
    for (int i = 0; i < g_devices; ++i) devices[i] = new SimDevice(i);  // lives until exit
  });
  KILN_CHECK_DEVICE(index >= 0 && index < g_devices,
                    "[sim] device index {} is out of range: there are {} sim devices", index,
                    g_devices);
  return *devices[index];
}

class Interface final : public DeviceInterface {
 public:
  DeviceCaps caps() const override { return {.host_memory = false, .async = true, .graphs = true}; }
  kiln::Allocator* allocator(int index) override { return device_state(index).allocator(); }
  int device_count() const override { return g_devices; }
  void copy_bytes(void* dst, bool, const void* src, bool, size_t nbytes, int index) override {
    SimDevice& d = device_state(index);
    d.forbid_in_capture("a copy between host and device", "cudaErrorStreamCaptureUnsupported");
    d.synchronize();
    if (nbytes) std::memcpy(dst, src, nbytes);
  }
  void synchronize(int index) override { device_state(index).synchronize(); }
  void manual_seed(uint64_t seed) override {
    for (int i = 0; i < g_devices; ++i) {
      device_state(i).synchronize();  // queued draws first
      device_state(i).generator().set_seed(seed);
    }
  }
  uint64_t create_stream(int index) override { return device_state(index).create_stream(); }
  void destroy_stream(int index, uint64_t s) override { device_state(index).destroy_stream(s); }
  uint64_t current_stream(int index) override { return device_state(index).current(); }
  void set_current_stream(int index, uint64_t s) override { device_state(index).set_current(s); }
  void synchronize_stream(int index, uint64_t s) override {
    SimDevice& d = device_state(index);
    d.forbid_in_capture("synchronizing a stream", "cudaErrorStreamCaptureUnsupported");
    d.stream(s)->synchronize();
  }
  // Events: a recorded sequence number and the last one the stream reached. Queued work holds
  // its event, so destroying one with work pending is safe (as cudaEventDestroy is).
  struct Event {
    std::atomic<uint64_t> recorded{0}, reached{0};
  };
  uint64_t create_event(int) override {
    std::lock_guard<std::mutex> lock(events_mu_);
    events_[++next_event_] = std::make_shared<Event>();
    return next_event_;
  }
  void destroy_event(int, uint64_t e) override {
    std::lock_guard<std::mutex> lock(events_mu_);
    events_.erase(e);
  }
  void record_event(int index, uint64_t e, uint64_t s) override {
    SimDevice& d = device_state(index);
    d.forbid_in_capture("recording an event (sim captures one stream; no event nodes)",
                        "cudaErrorStreamCaptureUnsupported");
    std::shared_ptr<Event> x = ev(e);
    std::shared_ptr<Stream> st = d.stream(s);  // first: a missing stream must not count a record
    uint64_t seq = x->recorded.fetch_add(1) + 1;
    st->push({[x, seq] {
                uint64_t r = x->reached.load();
                while (r < seq && !x->reached.compare_exchange_weak(r, seq)) {
                }
                x->reached.notify_all();
              },
              0});
  }
  void stream_wait_event(int index, uint64_t s, uint64_t e) override {
    SimDevice& d = device_state(index);
    d.forbid_in_capture("waiting for an event (sim captures one stream; no event nodes)",
                        "cudaErrorStreamCaptureUnsupported");
    std::shared_ptr<Event> x = ev(e);
    uint64_t target = x->recorded.load();
    d.stream(s)->push({[x, target] { wait(*x, target); }, 0});
  }
  void synchronize_event(int index, uint64_t e) override {
    device_state(index).forbid_in_capture("synchronizing an event",
                                          "cudaErrorStreamCaptureUnsupported");
    std::shared_ptr<Event> x = ev(e);
    wait(*x, x->recorded.load());
  }
  bool query_event(int, uint64_t e) override {
    std::shared_ptr<Event> x = ev(e);
    return x->reached >= x->recorded;
  }
  uint64_t create_pool(int index) override { return device_state(index).create_pool(); }
  void release_pool(int index, uint64_t p) override { device_state(index).release_pool(p); }
  void begin_capture(int index, uint64_t s, uint64_t pool) override {
    device_state(index).begin_capture(s, pool);
  }
  uint64_t end_capture(int index, uint64_t s) override {
    return device_state(index).end_capture(s);
  }
  uint64_t instantiate(int index, uint64_t g) override {
    return device_state(index).instantiate(g);
  }
  bool update(int index, uint64_t e, uint64_t g) override {
    return device_state(index).update(e, g);
  }
  void launch(int index, uint64_t e, uint64_t s) override {
    device_state(index).launch_graph(e, s);
  }
  int graph_nodes(int index, uint64_t g) override { return device_state(index).graph_nodes(g); }
  void destroy_graph(int index, uint64_t g) override { device_state(index).destroy(g); }
  void destroy_exec(int index, uint64_t e) override { device_state(index).destroy(e); }

 private:
  std::shared_ptr<Event> ev(uint64_t e) {
    std::lock_guard<std::mutex> lock(events_mu_);
    auto it = events_.find(e);
    KILN_CHECK_DEVICE(it != events_.end(), "[sim] no event {}", e);
    return it->second;
  }
  static void wait(Event& x, uint64_t target) {
    uint64_t r;
    while ((r = x.reached.load()) < target) x.reached.wait(r);
  }
  std::mutex events_mu_;
  uint64_t next_event_ = 0;
  std::map<uint64_t, std::shared_ptr<Event>> events_;
};

// ---------------------------------------------------------------- kernels

bool is_sim(Device d) { return d.dispatch_key() == g_key; }

// `impl` as a tensor standing for `t`: the wrapped-number flag carries over.
Tensor like(Ref<TensorImpl> impl, const Tensor& t) {
  impl->set_wrapped_number(t.impl()->is_wrapped_number());
  return Tensor(std::move(impl));
}
bool on_sim(const Tensor& t) { return t.defined() && is_sim(t.device()); }
// A sim Device argument as `to` (cpu for the CPU kernel, meta for the meta function).
IValue device_as(const IValue& v, Device to) {
  auto* d = std::get_if<Device>(&v);
  return d && is_sim(*d) ? IValue(to) : v;
}
IValue cpu_for_sim(const IValue& v) { return device_as(v, Device(kCPU)); }

// CPU tensors over the bytes of sim storages, one CPU storage per sim storage so that
// arguments which alias still alias for the CPU kernel's overlap checks.
struct Wrapper {
  std::unordered_map<const StorageImpl*, Ref<StorageImpl>> storages;
  Tensor operator()(const Tensor& t) {
    if (!on_sim(t)) return t;
    const TensorImpl* i = t.impl();
    Ref<StorageImpl>& s = storages[i->storage()];
    if (!s) s = make_ref<StorageImpl>(i->storage()->data(), i->storage()->nbytes(), Device(kCPU));
    return like(make_ref<TensorImpl>(s, i->dtype(), i->sizes(), i->strides(), i->storage_offset()),
                t);
  }
  // A 0-d cpu tensor by value; a wrapped number stays one (it promotes like a Scalar).
  static Tensor copy(const Tensor& t) { return like(t.clone().impl_ref(), t); }
  // The stack the CPU kernel runs on: sim tensors wrapped, sim devices made cpu, 0-d cpu
  // tensors copied (a launch takes host values by value, as CUDA's do).
  // The default generator (a null Generator*) becomes the device's own.
  Stack stack(const Stack& in, Generator* device_generator) {
    return detail::map_stack(
        in, [&](const Tensor& t) { return on_sim(t) || !t.defined() ? (*this)(t) : copy(t); },
        [&](const IValue& v) -> IValue {
          if (auto* g = std::get_if<Generator*>(&v)) return *g ? *g : device_generator;
          return cpu_for_sim(v);
        });
  }
};

// Meta twins of the arguments (one meta storage per storage), to run the op's meta function.
struct Twins {
  std::unordered_map<const StorageImpl*, Ref<StorageImpl>> storages;
  std::vector<std::pair<const StorageImpl*, StorageImpl*>> pairs;  // original, twin
  Tensor operator()(const Tensor& t) {
    if (!t.defined()) return t;
    const TensorImpl* i = t.impl();
    Ref<StorageImpl>& s = storages[i->storage()];
    if (!s) {
      s = make_ref<StorageImpl>(i->storage()->nbytes(), Device(kMeta), nullptr);
      pairs.push_back({i->storage(), s.get()});
    }
    return like(make_ref<TensorImpl>(s, i->dtype(), i->sizes(), i->strides(), i->storage_offset()),
                t);
  }
};

Device check_devices(const OpDef& op, const Stack& stack) {
  std::optional<Device> dev;
  auto see = [&](Device d) {
    if (!dev) dev = d;
    KILN_CHECK_DEVICE(*dev == d,
                      "[{}] expected all tensors to be on the same device, but found {} and {}",
                      op.name(), *dev, d);
  };
  auto look = [&](const Tensor& t) {
    if (!t.defined() || (t.dim() == 0 && t.device().is_cpu())) return;
    see(t.device());
  };
  for (const IValue& v : stack) {
    if (auto* t = std::get_if<Tensor>(&v)) look(*t);
    if (auto* l = std::get_if<TensorList>(&v))
      for (const Tensor& t : *l) look(t);
    if (auto* d = std::get_if<Device>(&v)) see(*d);
  }
  KILN_ASSERT(dev && is_sim(*dev), "[sim] {}: a sim kernel was called without a sim device",
              op.name());
  return *dev;
}

// Every op without a kernel of its own: Note [The sim device].
void fallback(const OpDef& op, DispatchKey, Stack& stack) {
  const Device dev = check_devices(op, stack);
  SimDevice& d = device_state(dev.index());

  // 1. The meta function on twins: validation, result geometry, what is written.
  Twins twins;
  std::vector<const Tensor*> originals;
  std::vector<const TensorImpl*> twin_impls;
  auto twin = [&](const Tensor& t) {
    Tensor m = twins(t);
    originals.push_back(&t);
    twin_impls.push_back(m.impl());
    return m;
  };
  Stack meta =
      detail::map_stack(stack, twin, [](const IValue& v) { return device_as(v, Device(kMeta)); });
  op.call_boxed_at(DispatchKey::Meta, meta);

  // 2. Results: an argument itself, a view of an argument's storage, or a fresh buffer.
  std::vector<Tensor> fresh;
  std::vector<size_t> fresh_at;  // position of each fresh result among the tensor results
  size_t position = 0;
  auto result = [&](const Tensor& m) -> Tensor {
    size_t at = position++;
    if (!m.defined()) return m;
    for (size_t i = 0; i < twin_impls.size(); ++i)
      if (twin_impls[i] == m.impl()) return *originals[i];
    const TensorImpl* mi = m.impl();
    for (auto [orig, tw] : twins.pairs)
      if (tw == mi->storage())
        for (const Tensor* o : originals)
          if (o->impl()->storage() == orig)
            return Tensor(make_ref<TensorImpl>(o->impl()->storage_ref(), mi->dtype(), mi->sizes(),
                                               mi->strides(), mi->storage_offset()));
    auto s = make_ref<StorageImpl>(mi->storage()->nbytes(), dev, d.allocator());
    Tensor t(make_ref<TensorImpl>(std::move(s), mi->dtype(), mi->sizes(), mi->strides(),
                                  mi->storage_offset()));
    fresh.push_back(t);
    fresh_at.push_back(at);
    return t;
  };
  Stack results = detail::map_stack(meta, result, detail::same_value);
  // What the meta function wrote, the kernel will write: the version moves now, on the host.
  for (auto [orig, tw] : twins.pairs)
    if (tw->version() != 0) const_cast<StorageImpl*>(orig)->bump_version();

  // 3. The launch: the CPU kernel over wrapped arguments, on the stream.
  if (&op == &ops::op_empty.def) {
    stack = std::move(results);
    return;
  }
  Wrapper wrap;
  Stack args = wrap.stack(stack, &d.generator());
  const bool random = std::any_of(stack.begin(), stack.end(), [](const IValue& v) {
    return std::holds_alternative<Generator*>(v);
  });
  // A draw from a generator of the caller's: its state is read when the kernel runs, and the
  // caller may drop it as soon as the op returns, so the op runs now, in order (a draw from
  // the default generator, which lives for good, is queued like any kernel).
  const bool user_generator = std::any_of(stack.begin(), stack.end(), [](const IValue& v) {
    auto* g = std::get_if<Generator*>(&v);
    return g && *g != nullptr;
  });
  if (user_generator) {
    d.forbid_in_capture(
        fmt::format("{} with a generator of the caller's (its state would be read at replay)",
                    op.name())
            .c_str(),
        "cudaErrorStreamCaptureUnsupported");
    d.synchronize_current();
  }
  const OpDef* out_op = nullptr;
  if (!random && fresh.size() == 1 && results.size() == 1 && op.kind() == OpKind::Functional)
    out_op = op.out_variant();
  // The CPU kernel bound to its arguments once (OpDef::bind): a graph runs a node many times.
  std::function<void()> fn;
  if (fresh.empty()) {
    std::shared_ptr<BoundCall> call = op.bind(DispatchKey::CPU, args);
    fn = [call] { call->run(); };
  } else if (out_op) {
    args.insert(args.begin(), wrap(fresh[0]));
    std::shared_ptr<BoundCall> call = out_op->bind(DispatchKey::CPU, args);
    fn = [call] { call->run(); };
  } else {
    TensorList outs;
    for (const Tensor& f : fresh) outs.push_back(wrap(f));
    std::shared_ptr<BoundCall> call = op.bind(DispatchKey::CPU, args);
    fn = [call, outs = std::move(outs), at = std::move(fresh_at)] {
      call->run();
      TensorList got;  // the results, in order; the fresh ones are copied over
      for (const IValue& v : call->results) {
        if (auto* t = std::get_if<Tensor>(&v)) got.push_back(*t);
        if (auto* l = std::get_if<TensorList>(&v)) got.insert(got.end(), l->begin(), l->end());
      }
      for (size_t k = 0; k < outs.size(); ++k)
        ops::op_copy_.call_at(DispatchKey::CPU, outs[k], got.at(at[k]));
      call->results.clear();
    };
  }
  if (user_generator)
    fn();
  else
    d.launch(op.name(), std::move(fn));
  stack = std::move(results);
}

void copy_(const Tensor& self, const Tensor& src) {
  meta::copy_(self, src);
  const bool ds = on_sim(self), ss = on_sim(src);
  Wrapper wrap;
  Tensor dst = wrap(self), from = wrap(src);
  if (ds && ss && self.device() == src.device()) {
    device_state(self.device().index()).launch("copy_", [dst, from] {
      ops::op_copy_.call_at(DispatchKey::CPU, dst, from);
    });
  } else {  // through the host: waits for the streams, as a pageable cudaMemcpy does
    for (const Tensor* t : {&self, &src}) {
      if (!on_sim(*t)) continue;
      SimDevice& d = device_state(t->device().index());
      d.forbid_in_capture("a copy between host and device", "cudaErrorStreamCaptureUnsupported");
      d.synchronize();
    }
    ops::op_copy_.call_at(DispatchKey::CPU, dst, from);
  }
  self.impl()->storage()->bump_version();
}

Tensor to_copy(const Tensor& self, DType dtype, Device device) {
  TensorSpec s = meta::to_copy(self, dtype, device);
  Tensor out = empty(s.sizes, dtype, device);
  copy_(out, self);
  return out;
}

Interface g_interface;

const char* describe(BackendSpec* spec) {
  g_key = spec->key;
  spec->interface = &g_interface;
  spec->fallback = &fallback;
  spec->kernels = {backend_kernel(ops::op_copy_, &copy_),
                   backend_kernel(ops::op_to_copy, &to_copy)};
  return nullptr;
}

}  // namespace

}  // namespace kiln::sim

extern "C" __attribute__((visibility("default"))) const KilnBackendEntry* kiln_backend_entry() {
  static const KilnBackendEntry entry{KILN_BACKEND_ABI_VERSION, "sim", &kiln::sim::describe};
  return &entry;
}

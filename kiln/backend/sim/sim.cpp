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
//   running them (streams may fork from it and join it again through events, Note [Streams
//   joining a capture] in sim_impl.h); synchronising, copies to or from the host, work on the
//   default stream, and allocations outside the capture's pool are errors that invalidate the
//   capture (the CUDA error each stands for is named in the message). An instantiated graph replays
//   at KILN_SIM_NODE_NS (default 500 ns) per node plus one launch; update() takes a graph of the
//   same kernels with other arguments.
// - Frees are stream-ordered: a block freed on the host is returned once the stream has run
//   everything queued before the free (blocks allocated in a capture's pool live as long as
//   the pool).
// KILN_SIM_DEVICES (default 2) sets the number of devices.
#include <algorithm>
#include <atomic>
#include <map>
#include <memory>
#include <mutex>

#include "kiln/backend/sim/sim_impl.h"
#include "kiln/ops/op_list.h"

// The plugin's files: sim_impl.h (what they share), stream.cpp (streams), device.cpp (streams
// of a device, synchronisation), memory.cpp (allocator, pools), graph.cpp (launches, captures,
// graphs), fallback.cpp (kernels) and this one (the device interface and the entry point).
namespace kiln::sim {

DispatchKey g_key = DispatchKey::Undefined;

namespace {

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
  // While capturing, an event recorded on a stream of the capture is the capture's (Note
  // [Streams joining a capture] in sim_impl.h): waiting for it forks or joins streams.
  void record_event(int index, uint64_t e, uint64_t s) override {
    SimDevice& d = device_state(index);
    std::shared_ptr<Event> x = ev(e);
    std::shared_ptr<Stream> st = d.stream(s);  // first: a missing stream must not count a record
    if (Capture* c = capture_on(index)) {
      if (c->has(s)) {
        c->events[e] = {s, s == c->stream ? 0 : c->joined[s].work};
        return;
      }
      c->events.erase(e);  // recorded outside the capture now
    }
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
    std::shared_ptr<Event> x = ev(e);
    (void)d.stream(s);
    if (Capture* c = capture_on(index)) {
      if (auto it = c->events.find(e); it != c->events.end()) {
        const Capture::Recorded r = it->second;
        if (s != c->stream) {
          ++c->joined[s].work;  // joins the capture, or depends on more of it
        } else if (r.stream != c->stream) {
          uint64_t& rejoined = c->joined[r.stream].rejoined;
          rejoined = std::max(rejoined, r.work);
        }
        return;
      }
      if (c->has(s))
        d.forbid_in_capture("a capturing stream waiting for an event recorded outside the capture",
                            "cudaErrorStreamCaptureIsolation");
    }
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
  // Host tasks run on the stream's worker like kernels (and are recorded like kernels while
  // capturing); sim memory is host memory, so they may address it directly.
  void launch_host_task(int index, std::string_view name, std::function<void()> fn) override {
    device_state(index).launch(name, std::move(fn));
  }
  void* host_task_address(int, void* p) override { return p; }
  bool capturing(int index) override {
    const Capture* c = capture_on(index);
    return c && c->has(device_state(index).current());
  }
  std::optional<DeviceMemoryStats> memory_stats(int index) override {
    return device_state(index).memory_stats();
  }
  void reset_peak_memory(int index) override { device_state(index).reset_peak_memory(); }
  uint64_t create_pool(int index) override { return device_state(index).create_pool(); }
  void release_pool(int index, uint64_t p) override { device_state(index).release_pool(p); }
  void begin_capture(int index, uint64_t s, uint64_t pool) override {
    device_state(index).begin_capture(s, pool);
  }
  uint64_t end_capture(int index, uint64_t s) override {
    const uint64_t g = device_state(index).end_capture(s);
    try {  // the capture's custom all-reduce registrations (Note [Custom all-reduce])
      run_capture_end_hooks(this, index);
    } catch (...) {
      device_state(index).destroy(g);
      throw;
    }
    return g;
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
  // The capture this thread runs on sim:`index`, if any.
  static Capture* capture_on(int index) {
    Capture* c = tls_capture;
    return c && c->device == index ? c : nullptr;
  }
  static void wait(Event& x, uint64_t target) {
    uint64_t r;
    while ((r = x.reached.load()) < target) x.reached.wait(r);
  }
  std::mutex events_mu_;
  uint64_t next_event_ = 0;
  std::map<uint64_t, std::shared_ptr<Event>> events_;
};

Interface g_interface;

const char* describe(BackendSpec* spec) {
  g_key = spec->key;
  spec->interface = &g_interface;
  spec->fallback = &fallback;
  spec->kernels = {backend_kernel(ops::op_copy_, &copy_), backend_kernel(ops::op_to_copy, &to_copy),
                   backend_kernel(ops::op_nonzero, &nonzero)};
  return nullptr;
}

}  // namespace

}  // namespace kiln::sim

extern "C" __attribute__((visibility("default"))) const KilnBackendEntry* kiln_backend_entry() {
  static const KilnBackendEntry entry{KILN_BACKEND_ABI_VERSION, "sim", &kiln::sim::describe};
  return &entry;
}

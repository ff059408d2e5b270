#pragma once
// Devices and the device registry. See DESIGN.md "Core objects": one canonical identity.
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>

#include <fmt/format.h>

#include "kiln/core/dispatch_key.h"

namespace kiln {

class Allocator;

// An id handed out by the device registry. cpu, meta and cuda are always registered.
using DeviceType = uint8_t;
inline constexpr DeviceType kCPU = 0;
inline constexpr DeviceType kMeta = 1;
inline constexpr DeviceType kCUDA = 2;
inline constexpr int kMaxDeviceTypes = 16;

// A device's memory as its allocator counts it (DeviceInterface::memory_stats, memory_stats).
struct DeviceMemoryStats {
  size_t allocated = 0;       // in live tensors, as the allocator rounds their sizes
  size_t reserved = 0;        // held from the device: in use or cached for reuse
  size_t peak_allocated = 0;  // the most `allocated` has been since the last reset
};

// What a device type can do beyond allocating and copying.
struct DeviceCaps {
  bool host_memory = true;  // host code may read its memory directly (cpu)
  bool async = false;       // kernels run asynchronously on streams; copies to the host wait
  bool graphs = false;      // graph capture: begin/end_capture, instantiate, launch, update
};

// What a backend provides for its device type (DESIGN.md "Core objects"). Streams, events,
// pools and graphs are opaque 64-bit handles made by the interface; stream 0 is each device's
// default stream. The defaults describe a synchronous device without graphs (the CPU): streams
// and events exist but every operation has already finished, and graph calls throw
// NotImplementedError. See Note [Device graphs] in kiln/compile/device_graphs.cpp for how compile
// uses the graph calls.
class DeviceInterface {
 public:
  virtual ~DeviceInterface() = default;
  virtual DeviceCaps caps() const { return {}; }
  // Allocator for tensors on this device; nullptr for devices without memory (meta).
  virtual Allocator* allocator(int index) = 0;
  // Number of devices of this type present.
  virtual int device_count() const = 0;
  // Copies nbytes between two buffers, either of which may live on this device or the host.
  // Copies that touch the host finish before returning.
  virtual void copy_bytes(void* dst, bool dst_on_device, const void* src, bool src_on_device,
                          size_t nbytes, int index) = 0;
  // Waits for all work on every stream of the device.
  virtual void synchronize(int index) = 0;
  // Reseeds the device type's own generators, if it has any (manual_seed calls it).
  virtual void manual_seed(uint64_t) {}

  // Streams. The current stream is per thread; kernels are enqueued on it.
  virtual uint64_t create_stream(int index);
  virtual void destroy_stream(int index, uint64_t stream);
  virtual uint64_t current_stream(int index);
  virtual void set_current_stream(int index, uint64_t stream);
  virtual void synchronize_stream(int index, uint64_t stream);
  // Events: recorded on a stream; a stream or the host waits for them.
  virtual uint64_t create_event(int index);
  virtual void destroy_event(int index, uint64_t event);
  virtual void record_event(int index, uint64_t event, uint64_t stream);
  virtual void stream_wait_event(int index, uint64_t stream, uint64_t event);
  virtual void synchronize_event(int index, uint64_t event);
  virtual bool query_event(int index, uint64_t event);
  // Graphs (caps().graphs). A pool holds the memory allocated during a capture for as long as
  // a graph may replay into it. Work enqueued on a capturing stream is recorded, not run.
  virtual uint64_t create_pool(int index);
  virtual void release_pool(int index, uint64_t pool);
  virtual void begin_capture(int index, uint64_t stream, uint64_t pool);
  virtual uint64_t end_capture(int index, uint64_t stream);  // the captured graph
  virtual uint64_t instantiate(int index, uint64_t graph);   // an executable graph
  // Replaces an executable graph's nodes by `graph`'s when only their arguments (addresses)
  // differ; false (and nothing changed) when the topology differs.
  virtual bool update(int index, uint64_t exec, uint64_t graph);
  virtual void launch(int index, uint64_t exec, uint64_t stream);
  virtual int graph_nodes(int index, uint64_t graph);
  virtual void destroy_graph(int index, uint64_t graph);
  virtual void destroy_exec(int index, uint64_t exec);

  // Host tasks (cudaLaunchHostFunc): queues `fn` on the current stream of device `index`; it
  // runs on a host thread once the stream reaches it, in order with kernels, and a capturing
  // stream records it into its graph (each replay runs it again). `name` names it in errors.
  // The default, for a synchronous device, runs it at once.
  virtual void launch_host_task(int index, std::string_view name, std::function<void()> fn);
  // The host address of this device's memory at `p` where host tasks may read and write it
  // directly (sim: its memory is host memory behind the interface); nullptr where they cannot
  // (CUDA), the default.
  virtual void* host_task_address(int index, void* p);
  // Whether the calling thread is capturing the current stream of device `index`: work queued
  // now is recorded into a graph, not run. False on a device without graphs, the default.
  virtual bool capturing(int index);
  // Device `index`'s memory as its allocator counts it; nullopt, the default, where the
  // backend keeps no count. reset_peak_memory starts a new peak from what is allocated now.
  virtual std::optional<DeviceMemoryStats> memory_stats(int index);
  virtual void reset_peak_memory(int index);
};

// Capture-end hooks: a device plugin's end_capture calls run_capture_end_hooks once a capture
// has succeeded, on the capturing thread, before it returns the graph, so that a layer above
// (the custom all-reduce: Note [Custom all-reduce] in kiln/distributed/shm_allreduce.cpp) can
// complete what the capture registered. A hook that throws makes end_capture throw, and the
// plugin drops the graph.
using CaptureEndHook = void (*)(DeviceInterface* iface, int index);
void add_capture_end_hook(CaptureEndHook hook);
void run_capture_end_hooks(DeviceInterface* iface, int index);

// Note [Canonical devices]
// A Device is only ever built by the registry's rules: a name or alias is looked up once, at
// parse time, and single-device types (cpu, meta) normalise their index to 0. So every
// spelling of one device ("cpu", "cpu:0", Device(kCPU), an alias of cpu) yields the same
// value, and equality, hashing, printing and cache guards never see an alias.
//
// {type, index}. Constructed only in canonical form: aliases are resolved by the registry, and
// single-device types (cpu, meta) always have index 0, so equal devices compare, hash and print
// equal however they were spelled.
namespace detail {
// Note [Aliased types]: type id -> the type it stands for (itself unless aliased).
extern DeviceType g_canonical_type[kMaxDeviceTypes];
}  // namespace detail

class Device {
 public:
  constexpr Device() = default;
  // Index -1 means "the type's default index" (0).
  Device(DeviceType type, int index = -1);  // NOLINT: a type alone is a device
  // Parses "cpu", "meta", "cuda", "cuda:1", or any registered name or alias.
  Device(std::string_view spec);                                // NOLINT
  Device(const char* spec) : Device(std::string_view(spec)) {}  // NOLINT
  // A type name and an index: Device("cuda", 1) is Device("cuda:1").
  Device(std::string_view type, int index);
  // An index alone names an accelerator, as in PyTorch: Device::from_index(1) is "cuda:1"
  // (and so whatever "cuda" is aliased to).
  static Device from_index(int index);

  DeviceType type() const { return detail::g_canonical_type[type_]; }
  int index() const { return index_; }
  bool is_cpu() const { return type() == kCPU; }
  bool is_meta() const { return type() == kMeta; }
  DispatchKey dispatch_key() const;
  std::string str() const;
  bool operator==(const Device& o) const { return type() == o.type() && index_ == o.index_; }

 private:
  DeviceType type_ = kCPU;
  int16_t index_ = 0;
};

// Registers a device type; returns its id. Throws if the name is taken or the key is in use.
DeviceType register_device_type(std::string_view name, DispatchKey key, DeviceInterface* interface,
                                bool single_device);
// Installs the interface of an already named type (e.g. the CUDA backend filling in "cuda").
void set_device_interface(DeviceType type, DeviceInterface* interface);
// Makes `alias` stand for `target`, e.g. alias_device("cuda", "sim"): see Note [Aliased types].
// Aliasing a type that has a backend of its own, or re-aliasing a name to another target, is
// an error; aliasing again to the same target does nothing.
void alias_device(std::string_view alias, std::string_view target);
std::string_view device_type_name(DeviceType type);
DeviceInterface* device_interface(DeviceType type);  // nullptr when none is installed
// The device type registered with a dispatch key, or -1 when none is.
int device_type_for_key(DispatchKey key);
// The type a name resolves to (through aliases), or -1 for an unknown name.
int find_device_type(std::string_view name);
// Waits for all work queued on a device (a no-op on synchronous devices such as cpu).
void synchronize(Device device);
// `device`'s memory as its backend's allocator counts it (PyTorch's torch.cuda.memory_stats),
// and the start of a new peak; both raise a DeviceError on a device whose backend keeps no
// count (cpu, meta).
DeviceMemoryStats memory_stats(Device device);
void reset_peak_memory(Device device);
// Whether `device`'s backend keeps that count (memory_stats would not raise).
bool counts_memory(Device device);
// Waits for all work queued on every device with an interface.
void synchronize_all_devices();
// Reseeds every device type's own generators (DeviceInterface::manual_seed).
void manual_seed_devices(uint64_t seed);

// The device factory functions use when none is given.
Device default_device();
void set_default_device(Device d);

}  // namespace kiln

template <>
struct std::hash<kiln::Device> {
  // The index alone: a hash must not change when an alias redirects a device's type (Note
  // [Aliased types]), or a set built before the alias would lose its devices. Equality tells
  // the types apart; processes hold few devices.
  size_t operator()(const kiln::Device& d) const noexcept { return std::hash<int>()(d.index()); }
};

template <>
struct fmt::formatter<kiln::Device> : fmt::formatter<std::string_view> {
  auto format(const kiln::Device& d, format_context& ctx) const {
    return fmt::formatter<std::string_view>::format(d.str(), ctx);
  }
};

#include "kiln/core/device.h"

#include <array>
#include <charconv>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "kiln/core/error.h"
#include "kiln/core/storage.h"

namespace kiln {

// Note [Aliased types]
// alias_device(alias, target) either adds a name (a new spelling resolved at parse time) or,
// when `alias` names a type without a backend of its own (such as "cuda" on a machine without
// the CUDA backend), redirects that type id to the target. Device::type() reads the redirect,
// so a Device made from the type before the alias was declared (the default device, a device
// a module stored) compares, hashes, prints and dispatches as the target: nothing can hold a
// stale "cuda" that differs from the new "cuda". This is the failure of a vendor plugin that
// patched the device constructor after the framework had stored a device made with the old
// one, which made every call of a compiled function miss its guards.
namespace detail {
DeviceType g_canonical_type[kMaxDeviceTypes] = {0, 1, 2,  3,  4,  5,  6,  7,
                                                8, 9, 10, 11, 12, 13, 14, 15};
}  // namespace detail

namespace {

[[noreturn]] void throw_unsupported(const char* what, int index) {
  KILN_THROW(NotImplemented, "[device] device {} of this type has no {}", index, what);
}

class CpuInterface final : public DeviceInterface {
 public:
  Allocator* allocator(int) override { return cpu_allocator(); }
  int device_count() const override { return 1; }
  void copy_bytes(void* dst, bool, const void* src, bool, size_t nbytes, int) override {
    if (nbytes) std::memcpy(dst, src, nbytes);
  }
  void synchronize(int) override {}
  // Host tasks run at once (the default) on memory the host owns.
  void* host_task_address(int, void* p) override { return p; }
};

class MetaInterface final : public DeviceInterface {
 public:
  Allocator* allocator(int) override { return nullptr; }
  int device_count() const override { return 1; }
  void copy_bytes(void*, bool, const void*, bool, size_t, int) override {}
  void synchronize(int) override {}
};

struct TypeEntry {
  std::string name;
  DispatchKey key = DispatchKey::Undefined;
  DeviceInterface* interface = nullptr;
  bool single_device = false;
};

// See Note [Canonical devices]: the registry is the only place a device name is turned into a
// type, so an alias can never leak into a Device value.
struct Registry {
  std::mutex mu;
  std::array<TypeEntry, kMaxDeviceTypes> types;
  int count = 0;
  std::unordered_map<std::string, DeviceType> by_name;  // canonical names and aliases
  Device default_device{};

  Registry() {
    static CpuInterface cpu;
    static MetaInterface meta;
    add("cpu", DispatchKey::CPU, &cpu, true);
    add("meta", DispatchKey::Meta, &meta, true);
    add("cuda", DispatchKey::CUDA, nullptr, false);
  }
  DeviceType add(std::string_view name, DispatchKey key, DeviceInterface* iface, bool single) {
    KILN_CHECK(!by_name.count(std::string(name)),
               "[device registry] device type '{}' is already registered", name);
    KILN_CHECK(count < kMaxDeviceTypes, "[device registry] too many device types (max {})",
               kMaxDeviceTypes);
    for (int i = 0; i < count; ++i)
      KILN_CHECK(types[i].key != key, "[device registry] dispatch key {} is already used by '{}'",
                 key_name(key), types[i].name);
    types[count] = {std::string(name), key, iface, single};
    by_name[std::string(name)] = static_cast<DeviceType>(count);
    return static_cast<DeviceType>(count++);
  }
};

Registry& registry() {
  static Registry r;
  return r;
}

}  // namespace

std::string_view key_name(DispatchKey k) {
  constexpr std::string_view names[] = {"Undefined",   "CPU",         "CUDA",     "PrivateUse1",
                                        "PrivateUse2", "PrivateUse3", "Meta",     "Profile",
                                        "Trace",       "Sharded",     "Autograd", "Autocast"};
  static_assert(std::size(names) == kNumDispatchKeys);
  return names[static_cast<int>(k)];
}

Device::Device(DeviceType type, int index) {
  auto& r = registry();
  KILN_CHECK_DEVICE(type < r.count, "[device] unknown device type id {}", static_cast<int>(type));
  type = detail::g_canonical_type[type];
  type_ = type;
  KILN_CHECK_DEVICE(index >= -1 && index < 32768, "[device] bad device index {} for '{}'", index,
                    r.types[type].name);
  KILN_CHECK_DEVICE(!(r.types[type].single_device && index > 0),
                    "[device] '{}' has a single device; index {} is out of range",
                    r.types[type].name, index);
  index_ = static_cast<int16_t>(index < 0 ? 0 : index);
}

Device::Device(std::string_view spec) {
  std::string_view type_part = spec;
  int index = -1;
  if (auto colon = spec.find(':'); colon != std::string_view::npos) {
    type_part = spec.substr(0, colon);
    std::string_view idx = spec.substr(colon + 1);
    auto [ptr, ec] = std::from_chars(idx.data(), idx.data() + idx.size(), index);
    KILN_CHECK_DEVICE(
        !idx.empty() && ec == std::errc() && ptr == idx.data() + idx.size() && index >= 0,
        "[device] invalid device string '{}': the index after ':' must be a "
        "non-negative integer",
        spec);
  }
  auto& r = registry();
  DeviceType type;
  {
    std::lock_guard<std::mutex> lock(r.mu);
    auto it = r.by_name.find(std::string(type_part));
    KILN_CHECK_DEVICE(it != r.by_name.end(),
                      "[device] invalid device string '{}': unknown device type '{}'", spec,
                      type_part);
    type = it->second;
  }
  *this = Device(type, index);
}

Device::Device(std::string_view type, int index) {
  int t = find_device_type(type);
  KILN_CHECK_DEVICE(t >= 0, "[device] unknown device type '{}'", type);
  *this = Device(static_cast<DeviceType>(t), index);
}

Device Device::from_index(int index) { return Device("cuda", index); }

int find_device_type(std::string_view name) {
  auto& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  auto it = r.by_name.find(std::string(name));
  return it == r.by_name.end() ? -1 : detail::g_canonical_type[it->second];
}

int device_type_for_key(DispatchKey key) {
  auto& r = registry();
  for (int i = 0; i < r.count; ++i)
    if (r.types[i].key == key && detail::g_canonical_type[i] == i) return i;
  return -1;
}

void synchronize(Device device) {
  if (DeviceInterface* iface = device_interface(device.type())) iface->synchronize(device.index());
}

void synchronize_all_devices() {
  auto& r = registry();
  for (int i = 0; i < r.count; ++i) {
    DeviceInterface* iface = r.types[i].interface;
    if (!iface || detail::g_canonical_type[i] != i || !iface->caps().async) continue;
    for (int d = 0; d < iface->device_count(); ++d) iface->synchronize(d);
  }
}

void manual_seed_devices(uint64_t seed) {
  auto& r = registry();
  for (int i = 0; i < r.count; ++i)
    if (r.types[i].interface && detail::g_canonical_type[i] == i)
      r.types[i].interface->manual_seed(seed);
}

// The defaults: a synchronous device without graphs (Note in device.h).
uint64_t DeviceInterface::create_stream(int) { return 0; }
void DeviceInterface::launch_host_task(int, std::string_view, std::function<void()> fn) { fn(); }
void* DeviceInterface::host_task_address(int, void*) { return nullptr; }
bool DeviceInterface::capturing(int) { return false; }
std::optional<DeviceMemoryStats> DeviceInterface::memory_stats(int) { return std::nullopt; }
void DeviceInterface::reset_peak_memory(int) {}

bool counts_memory(Device device) {
  DeviceInterface* iface = device_interface(device.type());
  return iface && iface->memory_stats(device.index());
}

namespace {
DeviceInterface& counting_interface(Device device, std::string_view op) {
  KILN_CHECK_DEVICE(counts_memory(device),
                    "[{}] {} keeps no count of its memory (the cuda and sim backends do)", op,
                    device);
  return *device_interface(device.type());
}
}  // namespace

DeviceMemoryStats memory_stats(Device device) {
  return *counting_interface(device, "memory_stats").memory_stats(device.index());
}

void reset_peak_memory(Device device) {
  counting_interface(device, "reset_peak_memory").reset_peak_memory(device.index());
}

namespace {
std::mutex g_capture_end_mu;
std::vector<CaptureEndHook>& capture_end_hooks() {
  static auto* v = new std::vector<CaptureEndHook>();  // never destroyed: plugins call at exit
  return *v;
}
}  // namespace

void add_capture_end_hook(CaptureEndHook hook) {
  std::lock_guard<std::mutex> lock(g_capture_end_mu);
  capture_end_hooks().push_back(hook);
}

void run_capture_end_hooks(DeviceInterface* iface, int index) {
  std::vector<CaptureEndHook> hooks;
  {
    std::lock_guard<std::mutex> lock(g_capture_end_mu);
    hooks = capture_end_hooks();
  }
  for (CaptureEndHook h : hooks) h(iface, index);
}
void DeviceInterface::destroy_stream(int, uint64_t) {}
uint64_t DeviceInterface::current_stream(int) { return 0; }
void DeviceInterface::set_current_stream(int, uint64_t) {}
void DeviceInterface::synchronize_stream(int index, uint64_t) { synchronize(index); }
uint64_t DeviceInterface::create_event(int) { return 1; }
void DeviceInterface::destroy_event(int, uint64_t) {}
void DeviceInterface::record_event(int, uint64_t, uint64_t) {}
void DeviceInterface::stream_wait_event(int, uint64_t, uint64_t) {}
void DeviceInterface::synchronize_event(int, uint64_t) {}
bool DeviceInterface::query_event(int, uint64_t) { return true; }
uint64_t DeviceInterface::create_pool(int index) {
  throw_unsupported("memory pools for graphs", index);
}
void DeviceInterface::release_pool(int, uint64_t) {}
void DeviceInterface::begin_capture(int index, uint64_t, uint64_t) {
  throw_unsupported("graph capture", index);
}
uint64_t DeviceInterface::end_capture(int index, uint64_t) {
  throw_unsupported("graph capture", index);
}
uint64_t DeviceInterface::instantiate(int index, uint64_t) { throw_unsupported("graphs", index); }
bool DeviceInterface::update(int index, uint64_t, uint64_t) { throw_unsupported("graphs", index); }
void DeviceInterface::launch(int index, uint64_t, uint64_t) { throw_unsupported("graphs", index); }
int DeviceInterface::graph_nodes(int index, uint64_t) { throw_unsupported("graphs", index); }
void DeviceInterface::destroy_graph(int, uint64_t) {}
void DeviceInterface::destroy_exec(int, uint64_t) {}

DispatchKey Device::dispatch_key() const { return registry().types[type()].key; }

std::string Device::str() const {
  const auto& e = registry().types[type()];
  return e.single_device ? e.name : fmt::format("{}:{}", e.name, index_);
}

DeviceType register_device_type(std::string_view name, DispatchKey key, DeviceInterface* interface,
                                bool single_device) {
  auto& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  return r.add(name, key, interface, single_device);
}

void set_device_interface(DeviceType type, DeviceInterface* interface) {
  auto& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  KILN_CHECK_DEVICE(type < r.count, "[device registry] unknown device type id {}",
                    static_cast<int>(type));
  KILN_CHECK_DEVICE(detail::g_canonical_type[type] == type,
                    "[device registry] '{}' is aliased to '{}'; it cannot get a backend of its own",
                    r.types[type].name, r.types[detail::g_canonical_type[type]].name);
  r.types[type].interface = interface;
}

void alias_device(std::string_view alias, std::string_view target) {
  auto& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  auto t = r.by_name.find(std::string(target));
  KILN_CHECK_DEVICE(t != r.by_name.end(), "[alias_device] unknown target device type '{}'", target);
  KILN_CHECK_DEVICE(alias != target, "[alias_device] cannot alias '{}' to itself", alias);
  const DeviceType to = detail::g_canonical_type[t->second];
  auto a = r.by_name.find(std::string(alias));
  if (a == r.by_name.end()) {  // a new spelling
    r.by_name[std::string(alias)] = to;
    return;
  }
  const DeviceType from = a->second;
  const DeviceType now = detail::g_canonical_type[from];
  if (now == to) return;  // already so
  KILN_CHECK_DEVICE(r.types[from].name != alias || now == from,
                    "[alias_device] '{}' is already an alias of '{}'", alias, r.types[now].name);
  KILN_CHECK_DEVICE(r.types[from].name == alias, "[alias_device] '{}' is already an alias of '{}'",
                    alias, r.types[now].name);
  KILN_CHECK_DEVICE(r.types[from].interface == nullptr,
                    "[alias_device] '{}' has a backend of its own; aliasing it would change the "
                    "device of its tensors",
                    alias);
  KILN_CHECK_DEVICE(to != from, "[alias_device] cannot alias '{}' to itself", alias);
  // A type without a backend: every Device of it, made before or after, now means the target,
  // and so do the types already aliased to it.
  for (int i = 0; i < r.count; ++i)
    if (detail::g_canonical_type[i] == from) detail::g_canonical_type[i] = to;
  r.by_name[std::string(alias)] = to;
}

std::string_view device_type_name(DeviceType type) { return registry().types[type].name; }

DeviceInterface* device_interface(DeviceType type) {
  auto& r = registry();
  return type < r.count ? r.types[type].interface : nullptr;
}

Device default_device() { return registry().default_device; }
void set_default_device(Device d) { registry().default_device = d; }

}  // namespace kiln

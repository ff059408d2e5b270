#include "kiln/core/device.h"

#include <array>
#include <charconv>
#include <mutex>
#include <string>
#include <unordered_map>

#include "kiln/core/error.h"
#include "kiln/core/storage.h"

namespace kiln {

namespace {

class CpuInterface final : public DeviceInterface {
 public:
  Allocator* allocator(int) override { return cpu_allocator(); }
  int device_count() const override { return 1; }
  void copy_bytes(void* dst, bool, const void* src, bool, size_t nbytes, int) override {
    if (nbytes) std::memcpy(dst, src, nbytes);
  }
  void synchronize(int) override {}
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
  constexpr std::string_view names[] = {"Undefined",   "CPU",         "CUDA",    "PrivateUse1",
                                        "PrivateUse2", "PrivateUse3", "Meta",    "Profile",
                                        "Trace",       "Sharded",     "Autograd"};
  static_assert(std::size(names) == kNumDispatchKeys);
  return names[static_cast<int>(k)];
}

Device::Device(DeviceType type, int index) : type_(type) {
  auto& r = registry();
  KILN_CHECK_DEVICE(type < r.count, "[device] unknown device type id {}", static_cast<int>(type));
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

DispatchKey Device::dispatch_key() const { return registry().types[type_].key; }

std::string Device::str() const {
  const auto& e = registry().types[type_];
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
  r.types[type].interface = interface;
}

void alias_device(std::string_view alias, std::string_view target) {
  auto& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  auto t = r.by_name.find(std::string(target));
  KILN_CHECK_DEVICE(t != r.by_name.end(), "[alias_device] unknown target device type '{}'", target);
  KILN_CHECK_DEVICE(alias != target, "[alias_device] cannot alias '{}' to itself", alias);
  r.by_name[std::string(alias)] = t->second;
}

std::string_view device_type_name(DeviceType type) { return registry().types[type].name; }

DeviceInterface* device_interface(DeviceType type) {
  auto& r = registry();
  return type < r.count ? r.types[type].interface : nullptr;
}

Device default_device() { return registry().default_device; }
void set_default_device(Device d) { registry().default_device = d; }

}  // namespace kiln

#pragma once
// Devices and the device registry. See DESIGN.md "Core objects": one canonical identity.
#include <cstdint>
#include <functional>
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

// What a backend provides for its device type. Later waves add streams, events and graphs.
class DeviceInterface {
 public:
  virtual ~DeviceInterface() = default;
  // Allocator for tensors on this device; nullptr for devices without memory (meta).
  virtual Allocator* allocator(int index) = 0;
  // Number of devices of this type present.
  virtual int device_count() const = 0;
  // Copies nbytes between two buffers, either of which may live on this device or the host.
  virtual void copy_bytes(void* dst, bool dst_on_device, const void* src, bool src_on_device,
                          size_t nbytes, int index) = 0;
  virtual void synchronize(int index) = 0;
};

// Note [Canonical devices]
// A Device is only ever built by the registry's rules: a name or alias is looked up once, at
// parse time, and single-device types (cpu, meta) normalise their index to 0. So every
// spelling of one device ("cpu", "cpu:0", Device(kCPU), an alias of cpu) yields the same
// value, and equality, hashing, printing and cache guards never see an alias.
//
// {type, index}. Constructed only in canonical form: aliases are resolved by the registry, and
// single-device types (cpu, meta) always have index 0, so equal devices compare, hash and print
// equal however they were spelled.
class Device {
 public:
  constexpr Device() = default;
  // Index -1 means "the type's default index" (0).
  Device(DeviceType type, int index = -1);  // NOLINT: a type alone is a device
  // Parses "cpu", "meta", "cuda", "cuda:1", or any registered name or alias.
  Device(std::string_view spec);                                // NOLINT
  Device(const char* spec) : Device(std::string_view(spec)) {}  // NOLINT

  DeviceType type() const { return type_; }
  int index() const { return index_; }
  bool is_cpu() const { return type_ == kCPU; }
  bool is_meta() const { return type_ == kMeta; }
  DispatchKey dispatch_key() const;
  std::string str() const;
  constexpr bool operator==(const Device&) const = default;

 private:
  DeviceType type_ = kCPU;
  int16_t index_ = 0;
};

// Registers a device type; returns its id. Throws if the name is taken or the key is in use.
DeviceType register_device_type(std::string_view name, DispatchKey key, DeviceInterface* interface,
                                bool single_device);
// Installs the interface of an already named type (e.g. the CUDA backend filling in "cuda").
void set_device_interface(DeviceType type, DeviceInterface* interface);
// Makes `alias` parse as `target`, e.g. alias_device("cuda", "sim"). Devices already made keep
// their canonical type; new spellings of the alias resolve to the target.
void alias_device(std::string_view alias, std::string_view target);
std::string_view device_type_name(DeviceType type);
DeviceInterface* device_interface(DeviceType type);  // nullptr when none is installed

// The device factory functions use when none is given.
Device default_device();
void set_default_device(Device d);

}  // namespace kiln

template <>
struct std::hash<kiln::Device> {
  size_t operator()(const kiln::Device& d) const noexcept {
    return std::hash<int>()(d.type() * 65536 + d.index());
  }
};

template <>
struct fmt::formatter<kiln::Device> : fmt::formatter<std::string_view> {
  auto format(const kiln::Device& d, format_context& ctx) const {
    return fmt::formatter<std::string_view>::format(d.str(), ctx);
  }
};

#pragma once
// Streams and events of a device, over its DeviceInterface (DESIGN.md "Core objects"): the
// work of a thread is queued on its device's current stream; events order streams and the
// host. On the CPU (a synchronous device) everything has already happened.
#include <cstdint>
#include <memory>

#include "kiln/core/device.h"

namespace kiln {

// A stream of a device. Streams made with create() are destroyed (after finishing their work)
// when the last handle goes; the default stream lives for good.
class Stream {
 public:
  static Stream create(Device device);
  static Stream current(Device device);
  static Stream default_stream(Device device);
  Device device() const { return device_; }
  uint64_t id() const { return id_; }
  // Waits for everything queued on the stream so far.
  void synchronize() const;
  bool operator==(const Stream& o) const { return device_ == o.device_ && id_ == o.id_; }

 private:
  Stream(Device device, uint64_t id, std::shared_ptr<void> owner)
      : device_(device), id_(id), owner_(std::move(owner)) {}
  Device device_;
  uint64_t id_ = 0;
  std::shared_ptr<void> owner_;  // destroys a created stream
};

// Makes `stream` its device's current stream on this thread; restores the previous one.
class StreamGuard {
 public:
  explicit StreamGuard(const Stream& stream);
  ~StreamGuard();
  StreamGuard(const StreamGuard&) = delete;
  StreamGuard& operator=(const StreamGuard&) = delete;

 private:
  Stream stream_;
  uint64_t previous_;
};

// An event of a device: record() marks the point a stream has reached; wait() makes another
// stream wait for it, synchronize() the host.
class Event {
 public:
  explicit Event(Device device);
  ~Event();
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;
  void record(const Stream& stream);
  void record() { record(Stream::current(device_)); }
  void wait(const Stream& stream) const;  // `stream` waits (the host does not)
  void synchronize() const;
  bool query() const;  // whether the stream reached the last record()
  Device device() const { return device_; }

 private:
  Device device_;
  uint64_t id_;
};

}  // namespace kiln

#include "kiln/core/stream.h"

#include "kiln/core/error.h"

namespace kiln {

namespace {
DeviceInterface& iface(Device d, const char* what) {
  DeviceInterface* i = d.is_cpu() ? device_interface(kCPU) : device_interface(d.type());
  KILN_CHECK_DEVICE(i != nullptr, "[{}] no backend is loaded for device {}", what, d);
  return *i;
}
void check_same(const char* what, Device a, Device b) {
  KILN_CHECK_DEVICE(a == b, "[{}] the event is on {}, the stream on {}", what, a, b);
}
}  // namespace

Stream Stream::create(Device device) {
  DeviceInterface& i = iface(device, "Stream::create");
  uint64_t id = i.create_stream(device.index());
  DeviceInterface* p = &i;
  int index = device.index();
  // The owner's deleter destroys the stream; destructors never throw.
  std::shared_ptr<void> owner(nullptr, [p, index, id](void*) {
    try {
      p->destroy_stream(index, id);
    } catch (...) {  // NOLINT: a failed kernel was the stream's to report
    }
  });
  return Stream(device, id, std::move(owner));
}

Stream Stream::current(Device device) {
  return Stream(device, iface(device, "Stream::current").current_stream(device.index()), {});
}

Stream Stream::default_stream(Device device) { return Stream(device, 0, {}); }

void Stream::synchronize() const {
  iface(device_, "Stream::synchronize").synchronize_stream(device_.index(), id_);
}

StreamGuard::StreamGuard(const Stream& stream)
    : stream_(stream),
      previous_(iface(stream.device(), "StreamGuard").current_stream(stream.device().index())) {
  iface(stream.device(), "StreamGuard").set_current_stream(stream.device().index(), stream.id());
}
StreamGuard::~StreamGuard() {
  try {
    iface(stream_.device(), "StreamGuard").set_current_stream(stream_.device().index(), previous_);
  } catch (...) {  // NOLINT: destructors never throw
  }
}

Event::Event(Device device)
    : device_(device), id_(iface(device, "Event").create_event(device.index())) {}
Event::~Event() {
  try {
    iface(device_, "Event").destroy_event(device_.index(), id_);
  } catch (...) {  // NOLINT: destructors never throw
  }
}
void Event::record(const Stream& stream) {
  check_same("Event::record", device_, stream.device());
  iface(device_, "Event::record").record_event(device_.index(), id_, stream.id());
}
void Event::wait(const Stream& stream) const {
  check_same("Event::wait", device_, stream.device());
  iface(device_, "Event::wait").stream_wait_event(device_.index(), stream.id(), id_);
}
void Event::synchronize() const {
  iface(device_, "Event::synchronize").synchronize_event(device_.index(), id_);
}
bool Event::query() const {
  return iface(device_, "Event::query").query_event(device_.index(), id_);
}

}  // namespace kiln

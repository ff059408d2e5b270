// A sim device's streams, current stream and synchronisation, and the table of devices.
#include <exception>

#include "kiln/backend/sim/sim_impl.h"
#include "kiln/ops/ops.h"

namespace kiln::sim {

thread_local Capture* tls_capture = nullptr;
thread_local uint64_t SimDevice::current_[kMaxDevices] = {};

std::shared_ptr<Stream> SimDevice::stream(uint64_t id) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = streams_.find(id);
  if (it == streams_.end()) {
    KILN_CHECK_DEVICE(id == 0, "[sim] sim:{} has no stream {}", index_, id);
    it = streams_.emplace(0, std::make_shared<Stream>(index_, 0, get_num_threads())).first;
  }
  return it->second;
}

uint64_t SimDevice::create_stream() {
  std::lock_guard<std::mutex> lock(mu_);
  uint64_t id = next_id_++;
  streams_.emplace(id, std::make_shared<Stream>(index_, id, get_num_threads()));
  return id;
}

void SimDevice::destroy_stream(uint64_t id) {
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

std::vector<std::shared_ptr<Stream>> SimDevice::all_streams() {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<std::shared_ptr<Stream>> v;
  for (auto& [id, s] : streams_) v.push_back(s);
  return v;
}

void SimDevice::forbid_in_capture(const char* what, const char* cuda_error) {
  Capture* c = tls_capture;
  if (!c || c->device != index_) return;
  std::string msg = fmt::format("[sim] {} is not permitted while stream {} is capturing ({})", what,
                                c->stream, cuda_error);
  if (c->invalid.empty()) c->invalid = msg;
  KILN_THROW(Device, "{}", msg);
}

void SimDevice::synchronize() {
  forbid_in_capture("synchronizing the device", "cudaErrorStreamCaptureUnsupported");
  // Every stream is waited for; the first failure is raised as it is (a collective's
  // DistributedError stays one).
  std::exception_ptr first;
  for (const auto& s : all_streams()) {
    try {
      s->synchronize();
    } catch (const Error&) {
      if (!first) first = std::current_exception();
    }
  }
  if (first) std::rethrow_exception(first);
}

void SimDevice::set_current(uint64_t id) {
  if (id != 0) {
    std::lock_guard<std::mutex> lock(mu_);
    KILN_CHECK_DEVICE(streams_.count(id), "[sim] sim:{} has no stream {}", index_, id);
  }
  current_[index_] = id;
}

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

}  // namespace kiln::sim

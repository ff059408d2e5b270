#pragma once
// `kiln bench gpt_*_ddp|tp|fsdp --probe`: a fixed compiled function replayed between the
// bench's phases, to tell a slower device (or CUDA state of the process) from a slower step.
// See Note [The device probe] in device_probe.cpp.
#include <memory>
#include <string>

#include "kiln/core/device.h"

namespace kiln::workloads {

class DeviceProbe {
 public:
  // Makes the probe's tensors and captures its graphs on `device` (one with graphs).
  explicit DeviceProbe(Device device);
  ~DeviceProbe();
  DeviceProbe(const DeviceProbe&) = delete;
  DeviceProbe& operator=(const DeviceProbe&) = delete;
  // Times the probe's replays and prints one line to stderr, tagged with this rank and `phase`.
  void report(const std::string& phase);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace kiln::workloads

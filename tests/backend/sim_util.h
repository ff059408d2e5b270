#pragma once
// Loads the sim plugin once per test process (its path comes from the build).
#include "kiln/backend/backend.h"
#include "kiln/core/device.h"

namespace kiln::test {

inline Device sim(int index = 0) {
  static const bool loaded = [] {
    load_backend(KILN_SIM_PLUGIN);
    return true;
  }();
  (void)loaded;
  return Device("sim", index);
}

inline DeviceInterface& sim_interface() { return *device_interface(sim().type()); }

}  // namespace kiln::test

#pragma once
// One thread per process that watches the deadlines of collectives in flight and runs a call's
// expiry action when its deadline passes (Note [Deadlines] in mpi_comm.cpp). Arming and
// disarming cost a lock, not a thread wake-up, unless the new deadline is earlier than the one
// the thread sleeps until (Note [Waking the watchdog] in watchdog.cpp).
#include <chrono>
#include <cstdint>
#include <functional>

namespace kiln::distributed {

using Clock = std::chrono::steady_clock;

// Arms a deadline: `on_expiry` runs on the watchdog thread if disarm() has not been called by
// then. Returns the handle for disarm().
uint64_t watchdog_arm(Clock::time_point deadline, std::function<void()> on_expiry);
// Disarms; returns false when the expiry action already ran (or is running).
bool watchdog_disarm(uint64_t handle);

// RAII over arm/disarm.
class Deadline {
 public:
  Deadline(Clock::time_point deadline, std::function<void()> on_expiry)
      : handle_(watchdog_arm(deadline, std::move(on_expiry))) {}
  ~Deadline() { watchdog_disarm(handle_); }
  Deadline(const Deadline&) = delete;
  Deadline& operator=(const Deadline&) = delete;

 private:
  uint64_t handle_;
};

}  // namespace kiln::distributed

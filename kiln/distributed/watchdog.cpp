#include "kiln/distributed/watchdog.h"

#include <condition_variable>
#include <map>
#include <mutex>
#include <thread>

namespace kiln::distributed {
namespace {

class Watchdog {
 public:
  uint64_t arm(Clock::time_point deadline, std::function<void()> fn) {
    std::lock_guard<std::mutex> lock(mu_);
    if (!thread_.joinable()) thread_ = std::thread([this] { loop(); });
    uint64_t h = next_++;
    armed_.emplace(std::make_pair(deadline, h), std::move(fn));
    handles_.emplace(h, deadline);
    // See Note [Waking the watchdog].
    if (deadline < waiting_until_) cv_.notify_one();
    return h;
  }
  bool disarm(uint64_t h) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = handles_.find(h);
    if (it == handles_.end()) return false;
    armed_.erase(std::make_pair(it->second, h));
    handles_.erase(it);
    return true;
  }

 private:
  // Note [Waking the watchdog]
  // A process usually has one collective in flight, so nearly every arm() is the earliest
  // deadline; waking the thread for each (a context switch, on a machine whose cores the ranks
  // already share) cost a 4 KB all-reduce 17 us against a bare MPI loop's 2. So the thread
  // sleeps until `waiting_until_`, which is kept when the calls it watched are disarmed, and
  // arm() wakes it only for a deadline earlier than that: with a fixed timeout, once per
  // timeout at most. Waking early is harmless (it finds nothing expired and sleeps again).
  void loop() {
    std::unique_lock<std::mutex> lock(mu_);
    for (;;) {
      const Clock::time_point now = Clock::now();
      if (armed_.empty() || now < armed_.begin()->first.first) {
        // Sleep until the earliest deadline, or on until the one it slept for before.
        if (!armed_.empty())
          waiting_until_ = armed_.begin()->first.first;
        else if (waiting_until_ <= now)
          waiting_until_ = Clock::time_point::max();
        if (waiting_until_ == Clock::time_point::max())
          cv_.wait(lock);
        else
          cv_.wait_until(lock, waiting_until_);
        continue;
      }
      auto first = armed_.begin();
      std::function<void()> fn = std::move(first->second);
      handles_.erase(first->first.second);
      armed_.erase(first);
      lock.unlock();
      fn();
      lock.lock();
    }
  }

  std::mutex mu_;
  std::condition_variable cv_;
  std::map<std::pair<Clock::time_point, uint64_t>, std::function<void()>> armed_;
  std::map<uint64_t, Clock::time_point> handles_;
  uint64_t next_ = 1;
  // When the thread wakes by itself; max() while it waits for an arm().
  Clock::time_point waiting_until_ = Clock::time_point::max();
  std::thread thread_;
};

// Never destroyed, its thread never joined: collectives may still run at exit (a sim stream's
// host task arming and disarming deadlines while static destructors run), and a process ending
// with a collective in flight must not wait for its deadline.
Watchdog& watchdog() {
  static Watchdog* w = new Watchdog;
  return *w;
}

}  // namespace

uint64_t watchdog_arm(Clock::time_point deadline, std::function<void()> on_expiry) {
  return watchdog().arm(deadline, std::move(on_expiry));
}
bool watchdog_disarm(uint64_t handle) { return watchdog().disarm(handle); }

}  // namespace kiln::distributed

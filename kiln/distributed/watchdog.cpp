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
    bool earliest = armed_.empty() || deadline < armed_.begin()->first.first;
    armed_.emplace(std::make_pair(deadline, h), std::move(fn));
    handles_.emplace(h, deadline);
    if (earliest) cv_.notify_one();
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
  // The thread is detached at exit: a process ending with a collective in flight does not wait
  // for its deadline.
  ~Watchdog() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
      cv_.notify_one();
    }
    if (thread_.joinable()) thread_.join();
  }

 private:
  void loop() {
    std::unique_lock<std::mutex> lock(mu_);
    while (!stop_) {
      if (armed_.empty()) {
        cv_.wait(lock);
        continue;
      }
      auto first = armed_.begin();
      if (Clock::now() < first->first.first) {
        cv_.wait_until(lock, first->first.first);
        continue;
      }
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
  bool stop_ = false;
  std::thread thread_;
};

Watchdog& watchdog() {
  static Watchdog w;
  return w;
}

}  // namespace

uint64_t watchdog_arm(Clock::time_point deadline, std::function<void()> on_expiry) {
  return watchdog().arm(deadline, std::move(on_expiry));
}
bool watchdog_disarm(uint64_t handle) { return watchdog().disarm(handle); }

}  // namespace kiln::distributed

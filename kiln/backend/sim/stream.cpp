// The sim device's streams: a worker thread per stream runs its queue in order, each task
// after its simulated launch cost (Note [The sim device] in sim.cpp).
#include <algorithm>
#include <chrono>
#include <cstdlib>

#include <exception>

#include "kiln/backend/sim/sim_impl.h"
#include "kiln/ops/ops.h"

namespace kiln::sim {
namespace {

int64_t env_int(const char* name, int64_t dflt) {
  const char* v = std::getenv(name);
  return v && *v ? std::strtoll(v, nullptr, 10) : dflt;
}

}  // namespace

const int64_t g_launch_ns = env_int("KILN_SIM_LAUNCH_NS", 5000);
const int64_t g_node_ns = env_int("KILN_SIM_NODE_NS", 500);
const int g_devices =
    static_cast<int>(std::clamp<int64_t>(env_int("KILN_SIM_DEVICES", 2), 1, kMaxDevices));

void spin_ns(int64_t ns) {
  if (ns <= 0) return;
  auto until = std::chrono::steady_clock::now() + std::chrono::nanoseconds(ns);
  while (std::chrono::steady_clock::now() < until) {
  }
}

Stream::Stream(int device, uint64_t id, int threads) : device_(device), id_(id) {
  worker_ = std::thread([this, threads] { loop(threads); });
}

Stream::~Stream() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_one();
  worker_.join();
}

void Stream::push(Task t) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    q_.push_back(std::move(t));
    ++submitted_;
  }
  cv_.notify_one();
}

uint64_t Stream::submitted() {
  std::lock_guard<std::mutex> lock(mu_);
  return submitted_;
}

void Stream::wait_for(uint64_t target) {
  uint64_t d;
  while ((d = done_.load(std::memory_order_acquire)) < target) done_.wait(d);
}

void Stream::synchronize() {
  wait_for(submitted());
  std::string err;
  std::exception_ptr distributed;
  {
    std::lock_guard<std::mutex> lock(mu_);
    err.swap(error_);
    std::swap(distributed, distributed_error_);
  }
  // A collective's host task (kiln/distributed) failed: its caller gets that DistributedError.
  if (distributed) std::rethrow_exception(distributed);
  KILN_CHECK_DEVICE(err.empty(), "[sim] a kernel failed asynchronously on sim:{} stream {}: {}",
                    device_, id_, err);
}

void Stream::loop(int threads) {
  set_num_threads(threads);
  while (true) {
    Task t;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stop_ || !q_.empty(); });
      if (q_.empty()) return;
      t = std::move(q_.front());
      q_.pop_front();
    }
    spin_ns(t.cost_ns);
    try {
      t.fn();
    } catch (const DistributedError&) {
      std::lock_guard<std::mutex> lock(mu_);
      if (error_.empty() && !distributed_error_) distributed_error_ = std::current_exception();
    } catch (const std::exception& e) {
      std::lock_guard<std::mutex> lock(mu_);
      if (error_.empty() && !distributed_error_) error_ = e.what();
    }
    t.fn = nullptr;  // what the task held goes before the stream moves on
    done_.fetch_add(1, std::memory_order_release);
    done_.notify_all();
  }
}

}  // namespace kiln::sim

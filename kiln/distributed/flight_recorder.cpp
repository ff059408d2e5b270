#include "kiln/distributed/flight_recorder.h"

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <mutex>

#include <fmt/format.h>

namespace kiln::distributed {

// Note [Flight recorder]
// A ring of the last N calls, each recorded when it starts and marked when it ends. When a
// collective times out, every rank that notices writes its ring: the rank whose last entry is
// an older sequence number than the others' (or that shows a different op) is where the job
// went wrong. Entries are strings copied at start (a group may be gone by the dump).
namespace {

struct Ring {
  std::mutex mu;
  std::vector<FlightEntry> slots;
  uint64_t next = 0;  // slots written so far
  std::chrono::steady_clock::time_point t0 = std::chrono::steady_clock::now();
  double now() const {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
};
// Never destroyed: host tasks and the watchdog may record or dump while statics are destroyed.
Ring& ring() {
  static Ring* r = new Ring;
  return *r;
}

std::string_view state_name(CallState s) {
  switch (s) {
    case CallState::Started:
      return "started";
    case CallState::Completed:
      return "completed";
    case CallState::Failed:
      return "failed";
  }
  return "?";
}

}  // namespace

FlightRecorder& FlightRecorder::get() {
  static FlightRecorder r;
  return r;
}

size_t FlightRecorder::capacity() {
  static const size_t n = [] {
    const char* v = std::getenv("KILN_DIST_FLIGHT_ENTRIES");
    long x = v ? std::strtol(v, nullptr, 10) : 0;
    return x > 0 ? static_cast<size_t>(x) : size_t{256};
  }();
  return n;
}

uint64_t FlightRecorder::start(std::string_view op, std::string_view group, uint64_t seq,
                               int64_t numel, DType dtype, int peer) {
  Ring& r = ring();
  std::lock_guard<std::mutex> lock(r.mu);
  if (r.slots.size() < capacity()) r.slots.resize(capacity());
  uint64_t slot = r.next++;
  FlightEntry& e = r.slots[slot % r.slots.size()];
  e.op.assign(op);
  e.group.assign(group);
  e.seq = seq;
  e.numel = numel;
  e.dtype = dtype;
  e.peer = peer;
  e.state = CallState::Started;
  e.started_s = r.now();
  e.ended_s = 0;
  return slot;
}

void FlightRecorder::finish(uint64_t slot, CallState state) {
  Ring& r = ring();
  std::lock_guard<std::mutex> lock(r.mu);
  if (slot + r.slots.size() < r.next) return;  // overwritten since
  FlightEntry& e = r.slots[slot % r.slots.size()];
  e.state = state;
  e.ended_s = r.now();
}

std::vector<FlightEntry> FlightRecorder::entries() const {
  Ring& r = ring();
  std::lock_guard<std::mutex> lock(r.mu);
  std::vector<FlightEntry> out;
  uint64_t n = std::min<uint64_t>(r.next, r.slots.size());
  for (uint64_t i = r.next - n; i < r.next; ++i) out.push_back(r.slots[i % r.slots.size()]);
  return out;
}

// "all_reduce_ group world seq 2 numel 4 float32 started at 1.250000s" for a call in flight;
// a finished one gives its span: "completed 1.000000s-1.000093s".
std::string FlightRecorder::format(const FlightEntry& e) {
  std::string peer = e.peer >= 0 ? fmt::format(" peer {}", e.peer) : "";
  std::string when = e.state == CallState::Started
                         ? fmt::format("at {:.6f}s", e.started_s)
                         : fmt::format("{:.6f}s-{:.6f}s", e.started_s, e.ended_s);
  return fmt::format("{} group {} seq {} numel {} {}{} {} {}", e.op, e.group, e.seq, e.numel,
                     name(e.dtype), peer, state_name(e.state), when);
}

std::string FlightRecorder::dump(int rank) const {
  const char* dir = std::getenv("KILN_DIST_DUMP_DIR");
  std::string path = fmt::format("{}/kiln_flight_rank{}.txt", dir && *dir ? dir : ".", rank);
  std::FILE* f = std::fopen(path.c_str(), "w");
  if (!f) return "";
  std::vector<FlightEntry> es = entries();
  std::fprintf(f,
               "# kiln flight recorder, rank %d: the last %zu collectives, oldest first; times "
               "in seconds from this process's first collective\n",
               rank, es.size());
  for (const FlightEntry& e : es) std::fprintf(f, "%s\n", format(e).c_str());
  std::fclose(f);
  return path;
}

}  // namespace kiln::distributed

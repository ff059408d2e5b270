#pragma once
// Timeline events (eager ops, replayed steps, compiles, guard misses, graph captures) and their
// export as Chrome trace JSON, which Perfetto and chrome://tracing open. See DESIGN.md layers.
//
//   kiln::profiler::Session session;      // profiles this thread's ops from now on
//   ... run ...
//   session.save_chrome_trace("trace.json");
#include <atomic>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "kiln/dispatch/op.h"

namespace kiln::profiler {

namespace detail {
extern std::atomic<bool> g_enabled;
}
// Whether a session is recording (one relaxed load: cheap enough for every replay).
inline bool enabled() { return detail::g_enabled.load(std::memory_order_relaxed); }
// Monotonic nanoseconds.
int64_t now_ns();

struct Event {
  std::string name;
  std::string category;  // "op", "replay", "compile", "guard", "graph"
  int64_t start_ns = 0;
  int64_t dur_ns = 0;
  uint32_t tid = 0;
  std::vector<std::pair<std::string, std::string>> args;  // shown in the viewer's details pane
};

// Records a complete event when a session is on (else does nothing).
void record(std::string_view name, std::string_view category, int64_t start_ns, int64_t end_ns,
            std::vector<std::pair<std::string, std::string>> args = {});

// One profiling session at a time. While it lives, ops called on the thread that made it are
// recorded (through the Profile dispatch key), and so are replays, compiles and guard misses
// on every thread.
class Session {
 public:
  Session();
  ~Session();
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;

  std::vector<Event> events() const;
  // {"traceEvents": [{"name", "cat", "ph": "X", "ts", "dur", "pid", "tid", "args"}, ...]},
  // times in microseconds.
  std::string chrome_trace_json() const;
  // Writes chrome_trace_json() to `path`: "[profiler] cannot write <path>: <reason>" on failure.
  void save_chrome_trace(const std::string& path) const;

 private:
  IncludeKeyGuard include_;
};

}  // namespace kiln::profiler

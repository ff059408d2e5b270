#include "kiln/profiler/profiler.h"

#include <cerrno>
#include <chrono>
#include <cstring>
#include <fstream>
#include <mutex>
#include <thread>

#include <nlohmann/json.hpp>

namespace kiln::profiler {

namespace detail {
std::atomic<bool> g_enabled{false};
}

namespace {

std::mutex g_mu;
std::vector<Event>& events_store() {
  static auto* e = new std::vector<Event>;  // never destroyed: sessions may end at exit
  return *e;
}

uint32_t thread_id() {
  static std::atomic<uint32_t> next{1};
  thread_local uint32_t id = next++;
  return id;
}

// The Profile layer: times each op that reaches it, then runs it below.
void profile_fallback(const OpDef& op, DispatchKey, Stack& stack) {
  int64_t t0 = now_ns();
  {
    ExcludeKeyGuard guard(DispatchKey::Profile);
    op.call_boxed(stack);
  }
  record(op.name(), "op", t0, now_ns());
}

const bool registered = [] {
  register_fallback(DispatchKey::Profile, &profile_fallback);
  return true;
}();

}  // namespace

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

void record(std::string_view name, std::string_view category, int64_t start_ns, int64_t end_ns,
            std::vector<std::pair<std::string, std::string>> args) {
  if (!enabled()) return;
  Event e{std::string(name), std::string(category), start_ns,
          end_ns - start_ns, thread_id(),           std::move(args)};
  std::lock_guard<std::mutex> lock(g_mu);
  events_store().push_back(std::move(e));
}

Session::Session() : include_(DispatchKey::Profile) {
  bool was = detail::g_enabled.exchange(true);
  KILN_CHECK(!was, "[profiler] a profiling session is already running");
  std::lock_guard<std::mutex> lock(g_mu);
  events_store().clear();
}

Session::~Session() { detail::g_enabled.store(false); }

std::vector<Event> Session::events() const {
  std::lock_guard<std::mutex> lock(g_mu);
  return events_store();
}

std::string Session::chrome_trace_json() const {
  nlohmann::json trace = nlohmann::json::array();
  for (const Event& e : events()) {
    nlohmann::json args = nlohmann::json::object();
    for (const auto& [k, v] : e.args) args[k] = v;
    trace.push_back({{"name", e.name},
                     {"cat", e.category},
                     {"ph", "X"},
                     {"ts", static_cast<double>(e.start_ns) / 1e3},
                     {"dur", static_cast<double>(e.dur_ns) / 1e3},
                     {"pid", 0},
                     {"tid", e.tid},
                     {"args", args}});
  }
  return nlohmann::json{{"traceEvents", trace}, {"displayTimeUnit", "ns"}}.dump();
}

void Session::save_chrome_trace(const std::string& path) const {
  std::string text = chrome_trace_json();
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  KILN_CHECK(f.good(), "[profiler] cannot write {}: {}", path, std::strerror(errno));
  f << text;
  f.close();
  KILN_CHECK(!f.fail(), "[profiler] cannot write {}: {}", path, std::strerror(errno));
}

}  // namespace kiln::profiler

// Host values as guards of a compiled function's cache entries. See host_guard.h.
#include "kiln/compile/host_guard.h"

#include <fmt/format.h>

namespace kiln::compiler {

// Note [Host values steer traces]
// A trace records the ops a call ran, not the host code that chose them: a Dropout module in
// eval() runs no dropout, so a trace taken in training replayed after eval() would keep
// dropping values. Every host value that steers a trace is therefore a guard of the entry,
// registered by the code that reads it, at the point where it reads it: nothing else knows
// which values a function consulted.
//
// Where the value lives decides how a guard re-reads it at each call:
// - in an object (a module's training flag, DDP's no_sync, a Python wrapper's scalar
//   argument): the owner keeps it in a HostCell, shared by the owner and every guard on it.
//   A check is a load and a compare; a guard never dangles, and once the owner is destroyed
//   (HostCell::release) the guard fails with "its owner was destroyed" instead of reading
//   freed memory.
// - outside any object (thread-local or global state, such as autocast's flag and dtype): a
//   static HostReader whose function reads the calling thread's value.
// HostCell::get and guard_host_value cost one thread-local load when no trace is recorded on
// the thread; while one is, they add the value to the Tracer's HostGuardRecorder, once per
// value. A check is one compare per value (HostValue is a kind and 64 bits), so entries
// without host values pay nothing, and one Dropout adds about a nanosecond.
//
// A guard checks the value at the start of the call, but the traced function may change the
// value itself (model.eval() ... model.train() around an evaluation). So the value a guard
// expects is the one the value had when the trace first touched it, read or written:
// HostCell::set and host_value_changing note the old value before the first change. A value
// the call changes and does not restore is a CompileError: a replay runs no host code, so
// the host state after a replay would differ from the eager call's. A value whose owner the
// call destroyed (a module made inside the function) is no guard: the call made it, and will
// make it again.
//
// Values fixed for the life of their owner (an SGD's momentum, a Linear's shape) need no
// guard: the trace holds the owner's tensors by identity, and nothing can change them.

}  // namespace kiln::compiler

namespace kiln::detail {
thread_local compiler::HostGuardRecorder* tls_host_guards
    __attribute__((tls_model("initial-exec"))) = nullptr;
void host_guard_read(const compiler::HostCell& cell) { tls_host_guards->read(cell); }
void host_guard_change(const compiler::HostCell& cell) { tls_host_guards->changing(cell); }
void host_guard_read(const compiler::HostReader& reader) { tls_host_guards->read(reader); }
void host_guard_change(const compiler::HostReader& reader) { tls_host_guards->changing(reader); }
}  // namespace kiln::detail

namespace kiln::compiler {

std::string HostValue::str() const {
  switch (kind_) {
    case Kind::Bool:
      return as_bool() ? "true" : "false";
    case Kind::Int:
      return fmt::format("{}", as_int());
    case Kind::Double:
      return fmt::format("{}", as_double());
    case Kind::DType:
      return std::string(name(as_dtype()));
    case Kind::Enum:
      return name_ ? std::string(name_) : fmt::format("{}", as_int());
  }
  return "?";
}

std::shared_ptr<HostCell> HostCell::make(HostValue value, const void* owner, Describe describe) {
  return std::shared_ptr<HostCell>(new HostCell(value, owner, describe));
}

std::string HostGuard::why() const {
  if (cell && !cell->alive())
    return fmt::format("{}: its owner was destroyed after the trace", what);
  const HostValue now = current();
  if (now == expected) return "";
  return fmt::format("{}: expected {}, got {}", what, expected.str(), now.str());
}

std::string HostGuard::str() const { return fmt::format("{} == {}", what, expected.str()); }

HostGuard* HostGuardRecorder::find(const void* key) {
  for (HostGuard& g : guards_)
    if ((g.cell ? static_cast<const void*>(g.cell.get()) : g.reader) == key) return &g;
  return nullptr;
}

void HostGuardRecorder::read(const HostCell& cell) {
  if (find(&cell)) return;
  guards_.push_back({cell.shared_from_this(), nullptr, cell.peek(), cell.describe()});
}
// Called before the change: the value now is the one the call started with.
void HostGuardRecorder::changing(const HostCell& cell) { read(cell); }
void HostGuardRecorder::read(const HostReader& reader) {
  if (find(&reader)) return;
  guards_.push_back({nullptr, &reader, reader.read(), reader.what});
}
void HostGuardRecorder::changing(const HostReader& reader) { read(reader); }

void HostGuardRecorder::forget_released() {
  std::erase_if(guards_, [](const HostGuard& g) { return g.cell && !g.cell->alive(); });
}

std::vector<std::string> HostGuardRecorder::unrestored() const {
  std::vector<std::string> out;
  for (const HostGuard& g : guards_) {
    if (g.cell && !g.cell->alive()) continue;  // destroyed by the call: nothing to replay
    const HostValue now = g.current();
    if (!(now == g.expected))
      out.push_back(fmt::format("{} changed from {} to {}", g.what, g.expected.str(), now.str()));
  }
  return out;
}

}  // namespace kiln::compiler

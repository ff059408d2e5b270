#pragma once
// Host values that steer a trace (a module's training flag, autocast's state, DDP's no_sync, a
// scalar from Python) become guards of the cache entry, registered where they are read. See
// Note [Host values steer traces] in host_guard.cpp and docs/compile_guards.md.
//
//   // The owner keeps the value in a cell; reading it while tracing makes it a guard:
//   std::shared_ptr<HostCell> flag = HostCell::make(true, this, &describe);
//   if (flag->get().as_bool()) ...
//   // State outside any object (thread-local) is read through a HostReader:
//   static constexpr HostReader kEnabled{"autocast enabled", &read_enabled};
//   guard_host_value(kEnabled);
#include <bit>
#include <cstdint>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

#include "kiln/core/dtype.h"

namespace kiln::compiler {

// A host value as a guard holds it: a bool, an integer, a double (compared bitwise: 0.0 and
// -0.0 differ, a NaN equals itself), a dtype or an enumerator. Comparing two is two integer
// compares.
class HostValue {
 public:
  enum class Kind : uint8_t { Bool, Int, Double, DType, Enum };
  HostValue(bool v) : bits_(v), kind_(Kind::Bool) {}  // NOLINT: implicit by design
  template <class I>
  requires(std::is_integral_v<I> && !std::is_same_v<I, bool>) HostValue(I v)  // NOLINT
      : bits_(static_cast<uint64_t>(static_cast<int64_t>(v))), kind_(Kind::Int) {}
  HostValue(double v) : bits_(std::bit_cast<uint64_t>(v)), kind_(Kind::Double) {}  // NOLINT
  HostValue(DType v) : bits_(static_cast<uint64_t>(v)), kind_(Kind::DType) {}      // NOLINT
  // A pointer (a string literal) would silently become a bool.
  template <class T>
  HostValue(T*) = delete;
  // An enumerator, named `name` (a string that outlives the value) in messages.
  template <class E>
  requires std::is_enum_v<E>
  static HostValue enumerator(E e, const char* name) {
    HostValue v(static_cast<int64_t>(e));
    v.kind_ = Kind::Enum;
    v.name_ = name;
    return v;
  }

  Kind kind() const { return kind_; }
  bool as_bool() const { return bits_ != 0; }
  int64_t as_int() const { return static_cast<int64_t>(bits_); }
  double as_double() const { return std::bit_cast<double>(bits_); }
  DType as_dtype() const { return static_cast<DType>(bits_); }
  // "true", "3", "0.5", "float16", an enumerator's name.
  std::string str() const;
  bool operator==(const HostValue& o) const { return bits_ == o.bits_ && kind_ == o.kind_; }

 private:
  uint64_t bits_;
  const char* name_ = nullptr;  // an enumerator's name; not compared
  Kind kind_;
};

class HostCell;
struct HostReader;
class HostGuardRecorder;

}  // namespace kiln::compiler

namespace kiln::detail {
// The recorder of the trace being recorded on this thread, or nullptr (set by Tracer::Scope).
extern thread_local compiler::HostGuardRecorder* tls_host_guards
    __attribute__((tls_model("initial-exec")));
void host_guard_read(const compiler::HostCell& cell);
void host_guard_change(const compiler::HostCell& cell);
void host_guard_read(const compiler::HostReader& reader);
void host_guard_change(const compiler::HostReader& reader);
}  // namespace kiln::detail

namespace kiln::compiler {

// A host value kept where a guard can re-read it: its owner (a module, a Python wrapper's
// scalar argument) and every guard on it hold it by shared_ptr, so no guard dangles. Not
// synchronised: like the owner's other state, one thread writes it at a time.
class HostCell : public std::enable_shared_from_this<HostCell> {
 public:
  // Names the value in messages ("module 'h.0.drop' (Dropout) training flag"); called with
  // `owner` (any pointer, or null) only while the owner is alive (when a trace reads or
  // changes the value).
  using Describe = std::string (*)(const void* owner);
  static std::shared_ptr<HostCell> make(HostValue value, const void* owner, Describe describe);

  // The value; while a trace is recorded on this thread, the read makes it a guard.
  HostValue get() const {
    if (detail::tls_host_guards) [[unlikely]]
      detail::host_guard_read(*this);
    return value_;
  }
  // Sets the value; a change made while a trace is recorded is noted (the guard checks the
  // value the call started with, and a change not undone by the end is a CompileError).
  void set(HostValue value) {
    if (detail::tls_host_guards && !(value == value_)) [[unlikely]]
      detail::host_guard_change(*this);
    value_ = value;
  }
  // The value, recording nothing (what a guard compares at each call).
  const HostValue& peek() const { return value_; }
  // Called by the owner as it is destroyed: a guard on the cell fails from then on, saying so.
  void release() { alive_ = false; }
  bool alive() const { return alive_; }
  // The owner's description of the value (the owner must be alive).
  std::string describe() const { return describe_(owner_); }

 private:
  HostCell(HostValue value, const void* owner, Describe describe)
      : value_(value), owner_(owner), describe_(describe) {}
  HostValue value_;
  bool alive_ = true;
  const void* owner_;
  Describe describe_;
};

// A host value kept outside any object (thread-local or global state, such as autocast's
// flag and dtype): `read` returns its current value on the calling thread. Define one as a
// static constant; guards refer to it by address.
struct HostReader {
  const char* what;  // "autocast enabled"
  HostValue (*read)();
};
// Call where the value is read: while a trace is recorded on this thread it becomes a guard.
inline void guard_host_value(const HostReader& r) {
  if (detail::tls_host_guards) [[unlikely]]
    detail::host_guard_read(r);
}
// Call before changing the value (see HostCell::set).
inline void host_value_changing(const HostReader& r) {
  if (detail::tls_host_guards) [[unlikely]]
    detail::host_guard_change(r);
}

// One host value a cache entry depends on, and the value it was traced with.
struct HostGuard {
  std::shared_ptr<const HostCell> cell;  // either a cell
  const HostReader* reader = nullptr;    // or a reader
  HostValue expected;
  std::string what;  // described when recorded: the owner may be gone by the time of a miss

  // The fast path, run at every call of the compiled function.
  bool passes() const {
    return cell ? cell->alive() && cell->peek() == expected : reader->read() == expected;
  }
  HostValue current() const { return cell ? cell->peek() : reader->read(); }
  // "module '1' (Dropout) training flag: expected true, got false", or "" when it passes.
  std::string why() const;
  // "module '1' (Dropout) training flag == true" (KILN_LOGS=guards, explain()).
  std::string str() const;
};

// The host values read or changed while one trace is recorded; a Tracer owns one.
class HostGuardRecorder {
 public:
  // Makes `r` this thread's recorder while the Scope lives.
  class Scope {
   public:
    explicit Scope(HostGuardRecorder& r) : saved_(detail::tls_host_guards) {
      detail::tls_host_guards = &r;
    }
    ~Scope() { detail::tls_host_guards = saved_; }
    Scope(const Scope&) = delete;
    Scope& operator=(const Scope&) = delete;

   private:
    HostGuardRecorder* saved_;
  };

  void read(const HostCell& cell);
  void changing(const HostCell& cell);
  void read(const HostReader& reader);
  void changing(const HostReader& reader);

  // One guard per value, expecting the value it had when the trace first touched it.
  const std::vector<HostGuard>& guards() const { return guards_; }
  // The values whose current value differs from that ("module '1' (Dropout) training flag
  // changed from true to false"): a replay would not change them.
  std::vector<std::string> unrestored() const;
  // Drops the guards on cells released during the call (a module made and destroyed inside
  // the traced function): the call set their values itself, and will again.
  void forget_released();

 private:
  HostGuard* find(const void* key);
  std::vector<HostGuard> guards_;
};

}  // namespace kiln::compiler

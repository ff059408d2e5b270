#pragma once
// Kiln's error types and check macros. See DESIGN.md "Errors".
#include <stdexcept>
#include <string>

#include <fmt/format.h>
#include <fmt/ranges.h>

namespace kiln {

// Base of every error Kiln raises. Messages start with "[op]" and carry the offending values.
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};
class ValueError : public Error {
  using Error::Error;
};
class TypeError : public Error {
  using Error::Error;
};
class IndexError : public Error {
  using Error::Error;
};
class DeviceError : public Error {
  using Error::Error;
};
class NotImplementedError : public Error {
  using Error::Error;
};
class CompileError : public Error {
  using Error::Error;
};
class DistributedError : public Error {
  using Error::Error;
};
// A bug in Kiln, never the caller's fault: a KILN_ASSERT or KILN_DEBUG_ASSERT failed.
class InternalError : public Error {
  using Error::Error;
};

namespace detail {
// Out of line so that call sites stay small. `kind` picks the exception type.
enum class ErrorKind { Value, Type, Index, Device, NotImplemented, Internal };
[[noreturn]] void throw_error(ErrorKind kind, const std::string& msg);
// Throws InternalError: "[internal] bug in Kiln: assertion `cond` failed at file:line: msg".
[[noreturn]] void throw_internal(const char* file, int line, const char* cond,
                                 const std::string& msg);
}  // namespace detail

}  // namespace kiln

// User-causable failure, always on: KILN_CHECK(cond, "[op] fmt {}", args...). Throws ValueError.
#define KILN_CHECK(cond, ...) KILN_CHECK_KIND(cond, Value, __VA_ARGS__)
#define KILN_CHECK_TYPE(cond, ...) KILN_CHECK_KIND(cond, Type, __VA_ARGS__)
#define KILN_CHECK_INDEX(cond, ...) KILN_CHECK_KIND(cond, Index, __VA_ARGS__)
#define KILN_CHECK_DEVICE(cond, ...) KILN_CHECK_KIND(cond, Device, __VA_ARGS__)
#define KILN_CHECK_KIND(cond, kind, ...)                                                      \
  do {                                                                                        \
    if (__builtin_expect(!(cond), 0))                                                         \
      ::kiln::detail::throw_error(::kiln::detail::ErrorKind::kind, fmt::format(__VA_ARGS__)); \
  } while (0)
#define KILN_THROW(kind, ...) \
  ::kiln::detail::throw_error(::kiln::detail::ErrorKind::kind, fmt::format(__VA_ARGS__))

// Internal invariant, always on; failure means a bug in Kiln. Throws InternalError.
#define KILN_ASSERT(cond, ...)                                                                \
  do {                                                                                        \
    if (__builtin_expect(!(cond), 0))                                                         \
      ::kiln::detail::throw_internal(__FILE__, __LINE__, #cond, fmt::format("" __VA_ARGS__)); \
  } while (0)

// Internal invariant on a hot path (a kernel's preconditions), checked in debug builds only.
// See Note [Debug asserts].
#ifdef NDEBUG
#define KILN_DEBUG_ASSERTS 0
#define KILN_DEBUG_ASSERT(cond, ...) ((void)sizeof(!(cond)))
#else
#define KILN_DEBUG_ASSERTS 1
#define KILN_DEBUG_ASSERT(cond, ...) KILN_ASSERT(cond, __VA_ARGS__)
#endif

// Note [Debug asserts]
// KILN_DEBUG_ASSERT states what a kernel may assume because a meta function or the dispatcher
// has already checked it: operand counts, matching sizes, non-null data, index bounds, 32-bit
// indexing on CUDA. A failure is a bug in Kiln (InternalError), never the caller's fault; bad
// user input is KILN_CHECK's job, before the kernel runs. With NDEBUG (the release and asan
// presets) the condition sits in an unevaluated sizeof: it generates no code and evaluates
// nothing, yet is still compiled, so it cannot rot and a variable read only by an assert is not
// "unused". Without NDEBUG (the debug preset) it is KILN_ASSERT. KILN_DEBUG_ASSERTS is 1 where
// they are checked. Host code only: CUDA device code cannot throw.

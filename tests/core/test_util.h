#pragma once
// Helpers shared by the core and dispatch tests.
#include <gtest/gtest.h>

#include <exception>
#include <ostream>
#include <string>
#include <string_view>
#include <vector>

#include "kiln/core/device.h"
#include "kiln/core/dispatch_key.h"
#include "kiln/core/small_vector.h"

namespace kiln {
// How gtest prints these in failure messages.
inline void PrintTo(DispatchKey k, std::ostream* os) { *os << key_name(k); }
inline void PrintTo(const Device& d, std::ostream* os) { *os << d.str(); }
}  // namespace kiln

namespace kiln_test {

// The message of the E that `f` throws, or a description of what happened instead (which
// fails any prefix or substring check made on it).
template <class E, class F>
std::string message_of(F&& f) {
  try {
    f();
  } catch (const E& e) {
    return e.what();
  } catch (const std::exception& e) {
    return std::string("<threw another exception type: ") + e.what() + ">";
  }
  return "<no exception>";
}

inline bool starts_with(const std::string& s, std::string_view prefix) {
  return std::string_view(s).starts_with(prefix);
}
inline bool contains(const std::string& s, std::string_view part) {
  return s.find(part) != std::string::npos;
}

inline std::vector<int64_t> vec(kiln::IntArrayRef r) { return {r.begin(), r.end()}; }

}  // namespace kiln_test

// Expects `stmt` to throw E whose message starts with `prefix`; prints the message otherwise.
#define EXPECT_THROW_PREFIX(stmt, E, prefix) \
  EXPECT_PRED2(::kiln_test::starts_with, ::kiln_test::message_of<E>([&] { (void)(stmt); }), prefix)
// Expects `stmt` to throw E whose message contains `part`.
#define EXPECT_THROW_CONTAINS(stmt, E, part) \
  EXPECT_PRED2(::kiln_test::contains, ::kiln_test::message_of<E>([&] { (void)(stmt); }), part)

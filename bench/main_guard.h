#pragma once
// The one top-level guard of the benchmarks' mains: an exception escaping a bench would end in
// std::terminate with no message; guarded_main prints `<name>: <what()>` on stderr and exits 1.
#include <cstdio>
#include <exception>

#include <fmt/format.h>

namespace kiln::bench {

// Runs body(argc, argv) and returns its status; an exception out of it is printed as
// `<name>: <what()>` (stdout flushed first, so the message follows any partial table) and gives 1.
inline int guarded_main(const char* name, int (*body)(int, char**), int argc, char** argv) {
  try {
    return body(argc, argv);
  } catch (const std::exception& e) {
    std::fflush(stdout);
    fmt::print(stderr, "{}: {}\n", name, e.what());
  } catch (...) {
    std::fflush(stdout);
    fmt::print(stderr, "{}: unknown exception\n", name);
  }
  return 1;
}

}  // namespace kiln::bench

#pragma once
// Loads the CUDA backend plugin once per test process, for the tests that run on a GPU and
// skip cleanly where none is (CI).
#include <string>

#include "kiln/backend/backend.h"
#include "kiln/core/error.h"

namespace kiln::test {

// The reason the CUDA backend could not be loaded (no plugin, no driver, no device), or ""
// when cuda:0 is usable.
inline const std::string& cuda_unavailable() {
  static const std::string why = []() -> std::string {
    try {
      load_backend("cuda");
      return "";
    } catch (const Error& e) {
      return e.what();
    }
  }();
  return why;
}

}  // namespace kiln::test

// A plugin built for another backend ABI: load_backend must refuse it before calling describe.
#include <cstdlib>

#include "kiln/backend/backend.h"

namespace {
const char* describe(kiln::BackendSpec*) { std::abort(); }  // never reached
}  // namespace

extern "C" __attribute__((visibility("default"))) const KilnBackendEntry* kiln_backend_entry() {
  static const KilnBackendEntry entry{KILN_BACKEND_ABI_VERSION + 998, "bad_abi", &describe};
  return &entry;
}

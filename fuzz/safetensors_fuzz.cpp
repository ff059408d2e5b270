// libFuzzer target: arbitrary bytes as a safetensors file. kiln::Error is the expected answer to
// bad input; any other exception escapes and is reported, as is a crash or sanitizer finding.
#include <cstddef>
#include <cstdint>
#include <map>
#include <string>

#include "kiln/core/error.h"
#include "kiln/io/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    std::map<std::string, std::string> metadata;
    kiln::io::StateDict sd = kiln::io::load_safetensors_bytes({data, size}, &metadata);
    // Read every loaded byte, so a wrong size or pointer is seen by AddressSanitizer.
    uint8_t sum = 0;
    for (const auto& [name, t] : sd) {
      const auto* p = static_cast<const uint8_t*>(t.numel() > 0 ? t.data_ptr() : nullptr);
      for (size_t i = 0; i < t.nbytes(); ++i) sum = static_cast<uint8_t>(sum + p[i]);
    }
    volatile uint8_t sink = sum;
    (void)sink;
  } catch (const kiln::Error&) {
  }
  return 0;
}

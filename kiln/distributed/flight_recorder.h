#pragma once
// The flight recorder: the last collectives of this process (op, group, sequence number,
// sizes, dtype, state), written to a file when a collective times out so that a user sees which
// rank stopped where. See Note [Flight recorder] in flight_recorder.cpp.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "kiln/core/dtype.h"

namespace kiln::distributed {

enum class CallState : uint8_t { Started, Completed, Failed };

struct FlightEntry {
  std::string op;
  std::string group;
  uint64_t seq = 0;  // the collective's number in its communicator, from 1
  int64_t numel = 0;
  DType dtype = DType::Float32;
  int peer = -1;
  CallState state = CallState::Started;
  double started_s = 0;  // seconds since the recorder started
  double ended_s = 0;
};

class FlightRecorder {
 public:
  // The process's recorder; keeps the last capacity() calls.
  static FlightRecorder& get();
  // KILN_DIST_FLIGHT_ENTRIES (default 256), read once.
  static size_t capacity();
  // Records a started call; returns its slot for finish().
  uint64_t start(std::string_view op, std::string_view group, uint64_t seq, int64_t numel,
                 DType dtype, int peer);
  void finish(uint64_t slot, CallState state);
  // The entries, oldest first.
  std::vector<FlightEntry> entries() const;
  // Writes the entries as text to KILN_DIST_DUMP_DIR (default the working directory)
  // /kiln_flight_rank<rank>.txt; returns the path ("" when it could not be written).
  std::string dump(int rank) const;
  // One line per entry, as dump() writes them.
  static std::string format(const FlightEntry& e);
};

}  // namespace kiln::distributed

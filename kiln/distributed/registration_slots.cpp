#include "kiln/distributed/registration_slots.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>

#include <fmt/format.h>

#include "kiln/core/error.h"
#include "kiln/distributed/mpi_comm.h"

// Note [Registration slots]
// A captured custom all-reduce reads its inputs through a registration that lives as long as
// the graphs holding the call: a RankData slot in device memory on CUDA, a slot and a range of
// the rank's shared segment on sim. A capture takes its slots on the capturing thread, so the
// slot a call gets is decided by each rank alone; they must still be the same on every rank
// (CUDA checks them at the exchange), so every rank must hold the same free slots.
//
// A slot is released when the last graph holding it is gone: on CUDA a user object that the
// capturing graph retains (cudaGraphRetainUserObject), which instantiated and updated
// executable graphs take references to, and whose destructor CUDA calls once the graph, its
// executables and their launches are all gone; on sim the registration itself, shared by the
// graph's host task. That happens at different moments on different ranks (CUDA calls the
// destructor asynchronously; a sim launch still queued keeps its graph's nodes). So a release
// only marks the slot; it becomes free when every rank has marked it: when a capture finds no
// free slot, every rank (all reach that call, since all hold the same free slots) all-gathers
// its marks and frees the slots marked everywhere, lowest first. If none is, they try again for
// up to a second (a destructor still to run), then every rank raises the same error. The free
// slots stay the same on every rank.
//
// Steps that can fail on one rank only (opening a peer's IPC handle, backing shared memory) end
// with agree_on_outcome(): every rank contributes its error, or none, to one all-gather, and all
// raise the same DistributedError naming the rank that failed, so no rank waits in a collective
// its peers have left.
namespace kiln::distributed {

int custom_all_reduce_slots() {
  static const int n = [] {
    const char* v = std::getenv("KILN_CUSTOM_AR_SLOTS");
    if (!v) return 4096;
    char* end = nullptr;
    const long x = std::strtol(v, &end, 10);
    KILN_CHECK(end != v && *end == '\0' && x >= 2 && x <= (1 << 20),
               "[all_reduce] KILN_CUSTOM_AR_SLOTS must be an integer in [2, 1048576], got '{}'", v);
    return static_cast<int>(x);
  }();
  return n;
}

void agree_on_outcome(const MpiComm& comm, std::string_view error, std::string_view op,
                      std::string_view what, std::string_view where) {
  struct Row {
    int32_t failed = 0;
    char text[500] = {};
  } mine;
  mine.failed = error.empty() ? 0 : 1;
  std::memcpy(mine.text, error.data(), std::min(error.size(), sizeof(mine.text) - 1));
  std::vector<Row> rows(comm.size());
  comm.all_gather_bytes(&mine, rows.data(), sizeof(Row));
  int first = -1, failed = 0;
  for (int r = 0; r < comm.size(); ++r)
    if (rows[r].failed) failed++, first = first < 0 ? r : first;
  if (first < 0) return;
  throw DistributedError(
      fmt::format("[{}] {} of {} failed on group rank {}{}: {}", op, what, where, first,
                  failed > 1 ? fmt::format(" (and {} more)", failed - 1) : "", rows[first].text));
}

RegistrationSlots::RegistrationSlots(int first, int end)
    : first_(first), end_(end), released_(static_cast<size_t>(end), 0) {
  for (int s = first; s < end; ++s) free_.insert(free_.end(), s);
}

int RegistrationSlots::take() {
  std::lock_guard<std::mutex> lock(mu_);
  if (free_.empty()) return -1;
  const int s = *free_.begin();
  free_.erase(free_.begin());
  return s;
}

void RegistrationSlots::untake(int slot) {
  std::lock_guard<std::mutex> lock(mu_);
  free_.insert(slot);
}

void RegistrationSlots::release(int slot) {
  std::lock_guard<std::mutex> lock(mu_);
  if (slot >= first_ && slot < end_) released_[slot] = 1;
}

std::vector<int> RegistrationSlots::reclaim(const MpiComm& comm) {
  // Every rank decides from the same gathered marks, so all retry, and stop, together.
  constexpr int kAttempts = 200;  // 5 ms apart
  for (int attempt = 0;; ++attempt) {
    std::vector<uint8_t> mine;
    {
      std::lock_guard<std::mutex> lock(mu_);
      mine = released_;
    }
    std::vector<uint8_t> all(mine.size() * comm.size());
    comm.all_gather_bytes(mine.data(), all.data(), mine.size());
    std::vector<int> freed;
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (int s = first_; s < end_; ++s) {
        int marks = 0;
        for (int r = 0; r < comm.size(); ++r) marks += all[r * mine.size() + s];
        if (marks < comm.size()) continue;
        released_[s] = 0;
        free_.insert(s);
        freed.push_back(s);
      }
    }
    if (!freed.empty() || attempt == kAttempts) return freed;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

}  // namespace kiln::distributed

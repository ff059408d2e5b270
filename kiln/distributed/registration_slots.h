#pragma once
// What CUDA's custom all-reduce and its shared-memory mirror share about registrations: the
// slots captured calls take, reclaimed once every rank's graphs holding them are gone, and the
// agreed outcome of a step that may fail on one rank only. See Note [Registration slots] in
// registration_slots.cpp.
#include <cstdint>
#include <mutex>
#include <set>
#include <string_view>
#include <vector>

namespace kiln::distributed {

class MpiComm;
class ProcessGroup;

// KILN_CUSTOM_AR_SLOTS (default 4096, read once): how many captured calls one channel of a
// custom all-reduce holds registered at once. A value that is not an integer in [2, 1048576] is
// a ValueError naming it.
int custom_all_reduce_slots();

// Collective over `comm`: all-gathers every rank's outcome of one step ("" where it succeeded)
// and, when any rank failed, throws on every rank alike a DistributedError starting `[op]` that
// names `what`, `where`, the lowest failing group rank and its error, and how many ranks failed.
void agree_on_outcome(const MpiComm& comm, std::string_view error, std::string_view op,
                      std::string_view what, std::string_view where);

// The registration slots [first, end) of one channel (Note [Registration slots]). Thread-safe.
class RegistrationSlots {
 public:
  RegistrationSlots(int first, int end);
  // The lowest free slot, or -1 when none is free: every rank holds the same free slots, so
  // the same captured call takes the same slot on every rank.
  int take();
  // Gives back a slot take() just returned, unused (every rank does so alike).
  void untake(int slot);
  // Says that no graph of this rank holds `slot` any more; any thread, any time (a graph's
  // destructor). It becomes free only once every rank has said so (reclaim()).
  void release(int slot);
  // Collective over `comm`: frees the slots every rank has released, returned lowest first.
  // While none is released everywhere, it tries again for up to a second (a graph's last launch
  // or its destructor may still be running on some rank).
  std::vector<int> reclaim(const MpiComm& comm);
  int end() const { return end_; }

 private:
  const int first_, end_;
  std::mutex mu_;
  std::set<int> free_;
  std::vector<uint8_t> released_;  // by slot
};

}  // namespace kiln::distributed

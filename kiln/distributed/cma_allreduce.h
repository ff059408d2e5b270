#pragma once
// Kiln's all-reduce for large CPU tensors between the ranks of one host: every rank reads its
// peers' buffers in place with Linux cross-memory attach (process_vm_readv), a reduce-scatter
// then an all-gather, with no copy through shared memory. See Note [Cross-memory all-reduce] in
// cma_allreduce.cpp.
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "kiln/distributed/collective_backend.h"

namespace kiln::distributed {

class MpiComm;

// What the cross-memory all-reduces of this process did (process-wide counts, for tests).
struct CmaAllReduceStats {
  uint64_t groups = 0;     // group set-ups that chose the path (every rank agreed it works)
  uint64_t fallbacks = 0;  // group set-ups that wanted it but found it not permitted
  uint64_t calls = 0;      // all-reduces that took it
  uint64_t threads = 0;    // the threads the last of them ran on (0 before any)
  std::string reason;      // why the last fallback happened ("" before any)
};
CmaAllReduceStats cma_all_reduce_stats();

// The cross-memory all-reduce of one group, for CPU tensors.
class CmaAllReduce {
 public:
  // Collective over group.base_comm(): null on every rank when the group cannot use it:
  // KILN_CPU_CMA=0 on some rank, one rank, ranks on different hosts, or a rank that cannot read
  // a peer's memory (ptrace permission, seccomp). Decided once, the same on every rank.
  static std::unique_ptr<CmaAllReduce> make(const ProcessGroup& group);
  ~CmaAllReduce();
  CmaAllReduce(const CmaAllReduce&) = delete;
  CmaAllReduce& operator=(const CmaAllReduce&) = delete;

  // Whether an all-reduce of `in` by `op` takes this path: a floating dtype, any reduction,
  // from min_bytes() up (KILN_CUSTOM_AR=1: any size; 0: never). From the mode, the dtype and
  // the size only, so every rank decides alike.
  bool eligible(const Tensor& in, ReduceOp op) const;
  // KILN_CPU_CMA_MIN_BYTES when the group was made (the smallest over its ranks).
  size_t min_bytes() const { return min_bytes_; }
  // All-reduces `in` into `out` (may be `in`; both contiguous CPU tensors of the same size and
  // dtype) over `comm`, the calling thread's communicator of the group, now.
  void all_reduce(const Tensor& in, const Tensor& out, const Collective& c, MpiComm& comm);

 private:
  CmaAllReduce(const ProcessGroup& group, std::vector<int> pids, size_t min_bytes,
               size_t chunk_bytes)
      : group_(group), pids_(std::move(pids)), min_bytes_(min_bytes), chunk_bytes_(chunk_bytes) {}
  uint64_t next_seq(const MpiComm& comm);

  const ProcessGroup& group_;
  std::vector<int> pids_;  // every group rank's process id
  size_t min_bytes_;
  size_t chunk_bytes_;  // elements reduced per block: each peer's block is read into a buffer
  std::mutex mu_;
  std::map<const MpiComm*, uint64_t> seq_;  // calls per communicator (thread), from 1
};

}  // namespace kiln::distributed

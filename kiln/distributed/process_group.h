#pragma once
// Process groups (DESIGN.md "Distributed"): the world and its sub-groups, each with one
// collective backend per device type (MPI for CPU tensors, NCCL for CUDA ones, host tasks over
// MPI for sim). See Note [Process groups] in process_group.cpp.
#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "kiln/core/device.h"

namespace kiln::distributed {

class CollectiveBackend;
class MpiComm;

// How all_reduce and reduce_scatter combine values. Avg needs a floating dtype.
enum class ReduceOp : int64_t { Sum = 0, Avg, Max, Min, Product };
std::string_view reduce_op_name(ReduceOp op);
// ReduceOp from an op's `reduce_op` argument; a DistributedError... ValueError when out of range.
ReduceOp reduce_op_from(int64_t v, std::string_view op);

// The deadline of a collective when its group sets none: KILN_DIST_TIMEOUT (seconds, default
// 600), read once.
std::chrono::milliseconds default_timeout();

// A set of ranks that run collectives together. Every rank of the parent creates a group (the
// calls are collective); ranks outside it get a null group. Groups live until exit.
class ProcessGroup {
 public:
  ~ProcessGroup();
  ProcessGroup(const ProcessGroup&) = delete;
  ProcessGroup& operator=(const ProcessGroup&) = delete;

  int64_t id() const { return id_; }                 // what collective ops take as `group`
  const std::string& name() const { return name_; }  // "world", "group1", ...
  int rank() const { return rank_; }                 // this process's rank in the group
  int size() const { return static_cast<int>(world_ranks_.size()); }
  // World ranks in group-rank order.
  const std::vector<int>& world_ranks() const { return world_ranks_; }
  // The group rank of a world rank, or -1 when it is not a member.
  int group_rank_of(int world_rank) const;

  // The deadline of each collective (default_timeout() unless set); per call, see
  // TimeoutGuard in collectives.h.
  // It is also the deadline of the group's later set-up: a thread's or stream's communicator,
  // a device backend made at first use.
  std::chrono::milliseconds timeout() const { return std::chrono::milliseconds(timeout_ms_); }
  void set_timeout(std::chrono::milliseconds t);

  // The backend serving tensors on `device`'s type; raises a DistributedError naming the group
  // when none is registered for it (e.g. CUDA tensors without the CUDA plugin loaded), when its
  // set-up failed (the same error again: a failed set-up is never retried), or when it would
  // have to be made while `device`'s stream is capturing (set-up is collective work that a
  // graph may not hold).
  CollectiveBackend& backend(Device device, std::string_view op) const;
  // The group's MPI communicator for the calling context (Note [One communicator per
  // stream]): `stream_key` is 0 for host collectives of the calling thread, else a device
  // stream's key from stream_key(). Null in a build without MPI.
  MpiComm* comm(uint64_t stream_key) const;
  // The communicator the group was made with (bootstraps, device backends' set-up).
  MpiComm* base_comm() const { return base_.get(); }

 private:
  friend struct GroupFactory;
  ProcessGroup() = default;

  int64_t id_ = 0;
  std::string name_;
  int rank_ = 0;
  std::vector<int> world_ranks_;
  std::atomic<int64_t> timeout_ms_{0};
  std::unique_ptr<MpiComm> base_;

  // See Note [Finding a group's backend and communicator] in process_group.cpp: read without a
  // lock; written under setup_mu_, once per entry.
  struct CommEntry {
    uint64_t key;
    std::unique_ptr<MpiComm> comm;
    CommEntry* next;
  };
  mutable std::array<std::atomic<CollectiveBackend*>, kMaxDeviceTypes> backend_of_type_{};
  mutable std::atomic<CommEntry*> comms_{nullptr};
  mutable std::mutex setup_mu_;  // collective set-up, one at a time
  mutable std::vector<std::unique_ptr<CollectiveBackend>> backends_;  // owned; under setup_mu_
  mutable std::vector<std::pair<int, std::string>> failed_;           // type, why; under setup_mu_
  void install_backend(int type, std::unique_ptr<CollectiveBackend> b) const;
};

// The world: every process of the job (a world of one without a launcher). Initialises the
// distributed layer on first use (init() in init.h).
ProcessGroup& world();
// A group of the given world ranks, in that order (distinct, each in [0, world size)). Every
// world rank must call it, with the same list; returns null on ranks outside the group.
std::shared_ptr<ProcessGroup> new_group(const std::vector<int>& ranks);
// Splits `parent` by colour: ranks that pass the same colour form one group, ordered by `key`
// then parent rank (MPI_Comm_split). Every rank of `parent` calls it; a negative colour joins
// no group (null).
std::shared_ptr<ProcessGroup> split_group(const ProcessGroup& parent, int color, int key = 0);
// The group with id `id`; raises a ValueError naming `op` when there is none.
const ProcessGroup& group_by_id(int64_t id, std::string_view op);

// The key of the current stream of `device` for comm(): distinct per device and stream.
uint64_t stream_key(Device device);

}  // namespace kiln::distributed

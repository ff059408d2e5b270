#pragma once
// One MPI communicator and the collectives Kiln runs over it, on host buffers, each with a
// deadline (Note [Deadlines] in mpi_comm.cpp), a flight-recorder entry and, under
// KILN_DIST_DEBUG=detail, a check that every rank calls the same collective. mpi.h stays in
// mpi_comm.cpp: a build without MPI (or a process run without a launcher) has only the
// one-rank communicator, whose collectives are copies.
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string_view>
#include <vector>

#include "kiln/core/dtype.h"
#include "kiln/distributed/process_group.h"

namespace kiln::distributed {

// What a collective is, for its deadline, the flight recorder and debug checks.
struct CallInfo {
  std::string_view op;                  // "all_reduce"
  const ProcessGroup* group = nullptr;  // names the group in errors
  DType dtype = DType::Float32;
  int64_t numel = 0;  // elements this rank contributes
  ReduceOp reduce = ReduceOp::Sum;
  int peer = -1;  // root / destination / source
  // The deadline's length, fixed where the call was issued (a host task runs on another
  // thread, which a TimeoutGuard does not reach); 0: timeout_for(group) when it runs.
  std::chrono::milliseconds timeout{0};
};

class MpiComm;

// Whether KILN_DIST_DEBUG=detail is set (read once).
bool debug_detail();
// Note [Debug checks] in mpi_comm.cpp: all-gathers what this rank is about to call (op, sizes,
// dtype, reduction, peer, `seq`) over `comm` and raises the same DistributedError on every rank
// when the calls differ. All backends (MPI, the shared-memory all-reduce, NCCL) check this way,
// so a rank on one path and a rank on another disagree too. `timeout` > 0 arms a deadline of
// that length; 0 leaves it to the caller's.
void check_same_call(const MpiComm& comm, const CallInfo& c, uint64_t seq,
                     std::chrono::milliseconds timeout);

class MpiComm {
 public:
  // The communicator of a one-rank world (no MPI calls at all).
  static std::unique_ptr<MpiComm> solo();
  // Wraps an MPI_Comm (`mpi_comm` points at it); takes ownership (freed at destruction unless it
  // is MPI_COMM_WORLD or MPI_COMM_SELF). Sets MPI_ERRORS_RETURN on it.
  static std::unique_ptr<MpiComm> adopt(void* mpi_comm);
  ~MpiComm();
  MpiComm(const MpiComm&) = delete;
  MpiComm& operator=(const MpiComm&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  bool solo_world() const { return handle_ == nullptr; }

  // The deadline of this communicator's bootstrap calls (dup, split, the byte exchanges):
  // default_timeout() until set; duplicates inherit it. ProcessGroup::set_timeout sets it.
  std::chrono::milliseconds setup_timeout() const;
  void set_setup_timeout(std::chrono::milliseconds t) { setup_timeout_ms_ = t.count(); }

  // Collective: a duplicate (MPI_Comm_dup) of this communicator.
  std::unique_ptr<MpiComm> dup() const;
  // Collective: MPI_Comm_split; null where `color` < 0.
  std::unique_ptr<MpiComm> split(int color, int key) const;

  // Collectives over host buffers. `count` is in elements of `c.dtype`; `in` may equal `out`
  // (in place). 16-bit floats are reduced in float32 and rounded once, the same on every rank.
  void all_reduce(const void* in, void* out, int64_t count, const CallInfo& c);
  // out holds size() blocks of `count` elements, block r from rank r.
  void all_gather(const void* in, void* out, int64_t count, const CallInfo& c);
  // in holds size() blocks of `count` elements; out gets the reduction of block rank().
  void reduce_scatter(const void* in, void* out, int64_t count, const CallInfo& c);
  void broadcast(void* buf, int64_t count, int root, const CallInfo& c);
  // Counts in elements, one per rank.
  void all_to_all(const void* in, std::span<const int64_t> send_counts, void* out,
                  std::span<const int64_t> recv_counts, const CallInfo& c);
  void send(const void* buf, int64_t count, int dst, const CallInfo& c);
  void recv(void* buf, int64_t count, int src, const CallInfo& c);
  void barrier(const CallInfo& c);

  // A collective started without waiting for it (MPI_Iallreduce): DDP's buckets on the CPU.
  // Open MPI progresses it only inside MPI calls, so test() is how a caller lets it advance.
  class Request {
   public:
    virtual ~Request() = default;
    virtual bool test() = 0;  // true once complete (then the result is in place)
    virtual void wait() = 0;
  };
  // In-place non-blocking all-reduce of `count` elements of `c.dtype` at `buf`. `buf` must
  // stay alive and untouched until the request completes.
  std::unique_ptr<Request> start_all_reduce(void* buf, int64_t count, const CallInfo& c);

  // Bytes, for bootstraps (NCCL's unique id, IPC handles): no flight-recorder entry.
  void broadcast_bytes(void* buf, size_t nbytes, int root) const;
  void all_gather_bytes(const void* in, void* out, size_t nbytes_per_rank) const;

  void* handle() const { return handle_; }  // points at the MPI_Comm; null for solo()

 private:
  MpiComm() = default;
  void* handle_ = nullptr;
  bool owned_ = false;
  uint64_t seq_ = 0;                          // collectives issued on this communicator
  std::atomic<int64_t> setup_timeout_ms_{0};  // 0: default_timeout()
  int rank_ = 0;
  int size_ = 1;
};

// Note [Non-blocking collectives] in mpi_comm.cpp: while one lives on a thread, the MpiComm
// collectives that thread issues start without waiting (MPI_Iallreduce, ...), and their
// requests gather here for the caller to take; a collective that needs no MPI (a world of one)
// or that another path serves at once adds none. Requests not taken are waited for when the
// scope ends. Scopes nest; the innermost one collects.
class NonBlocking {
 public:
  NonBlocking();
  ~NonBlocking();
  NonBlocking(const NonBlocking&) = delete;
  NonBlocking& operator=(const NonBlocking&) = delete;
  static NonBlocking* current();  // the calling thread's innermost scope, or null
  void add(std::unique_ptr<MpiComm::Request> r) { requests_.push_back(std::move(r)); }
  std::vector<std::unique_ptr<MpiComm::Request>> take();

 private:
  NonBlocking* previous_;
  std::vector<std::unique_ptr<MpiComm::Request>> requests_;
};

}  // namespace kiln::distributed

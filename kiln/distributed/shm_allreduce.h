#pragma once
// Kiln's own all-reduce for small messages between the ranks of one host, and its mode. On
// CUDA it runs over buffers shared by CUDA IPC (kiln/backend/cuda/custom_allreduce.h); on a
// host-task device (sim) ShmAllReduce mirrors it with POSIX shared memory standing in for IPC
// and a host task for the kernel, so the capture and registration logic runs in CI. See
// Note [Custom all-reduce] in shm_allreduce.cpp.
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>

#include "kiln/distributed/collective_backend.h"

namespace kiln::distributed {

// Whether all-reduces take Kiln's own all-reduce instead of NCCL or MPI. KILN_CUSTOM_AR unset
// (or "auto"): Auto, messages up to custom_all_reduce_max_bytes(); 1: On, every message the
// buffers hold, wherever the ranks can share memory; 0: Off.
enum class CustomAllReduceMode { Auto, On, Off };
CustomAllReduceMode custom_all_reduce_mode();
// Sets the mode of the calls issued from now on. It decides which path a collective takes, so
// every rank must set the same mode at the same point of its program.
void set_custom_all_reduce_mode(CustomAllReduceMode mode);
// KILN_CUSTOM_AR_MAX_BYTES (default 8 MiB until measured), read once: each rank's staging buffer
// holds this much, and Auto takes messages up to this size.
size_t custom_all_reduce_max_bytes();

// What the shared-memory all-reduces of this process did (process-wide counts, for tests).
struct CustomAllReduceStats {
  uint64_t eager = 0;       // calls issued outside a capture (input copied to the staging slot)
  uint64_t captured = 0;    // calls recorded into a graph (their input buffer registered, pending)
  uint64_t exchanges = 0;   // registration exchanges (one for all that were pending)
  uint64_t registered = 0;  // registrations those exchanges completed
  uint64_t runs = 0;        // all-reduces run (eager calls and graph replays)
  uint64_t reclaimed = 0;   // registration slots freed once every rank's graphs released them
};
CustomAllReduceStats shm_all_reduce_stats();

// The shared-memory all-reduce of one group, for tensors of a host-task device.
class ShmAllReduce {
 public:
  // Collective over group.base_comm(): null on every rank when the group cannot use it (one
  // rank, more than 8, or ranks on different hosts).
  static std::unique_ptr<ShmAllReduce> make(const ProcessGroup& group, DeviceInterface* iface);
  ~ShmAllReduce();
  ShmAllReduce(const ShmAllReduce&) = delete;
  ShmAllReduce& operator=(const ShmAllReduce&) = delete;

  // Whether an all-reduce of `in` by `op` takes this path: from the mode, the op, the dtype
  // and the size only, so every rank decides alike, and a warm-up as its capture does.
  bool eligible(const Tensor& in, ReduceOp op) const;
  // Whether `in` could take this path in pieces of at most capacity() bytes (the same tests
  // as eligible() but the size): CPU tensors' large all-reduces.
  bool eligible_in_pieces(const Tensor& in, ReduceOp op) const;
  size_t capacity() const { return capacity_; }
  // Queues the all-reduce of `in` into `out` (may be `in`) as a host task on the current
  // stream of their device.
  void all_reduce(const Tensor& in, const Tensor& out, const Collective& c);

  // Completes the pending registrations of every channel on device `index` of `iface`: the
  // capture-end hook (run_capture_end_hooks), on the thread that ended the capture.
  static void end_capture(DeviceInterface* iface, int index);

  struct Channel;

 private:
  ShmAllReduce(const ProcessGroup& group, DeviceInterface* iface, size_t capacity)
      : group_(group), iface_(iface), capacity_(capacity) {}
  // The channel of a stream, made (collectively) the first time the stream issues.
  std::shared_ptr<Channel> channel(uint64_t stream_key, Device device);

  const ProcessGroup& group_;
  DeviceInterface* iface_;
  size_t capacity_;  // every rank's staging slot, the same on every rank
  std::mutex mu_;
  std::map<uint64_t, std::shared_ptr<Channel>> channels_;
};

}  // namespace kiln::distributed

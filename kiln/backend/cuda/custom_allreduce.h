#pragma once
// The capture-aware custom all-reduce of cuda tensors: one-shot and two-shot kernels over
// buffers the ranks of one host share by CUDA IPC, for small messages where NCCL's latency
// dominates. The NCCL backend (nccl.cpp) asks it first; without NCCL (KILN_NCCL=0, or a build
// without NCCL) it is the only collective of cuda tensors. See Note [Custom all-reduce on CUDA]
// in custom_allreduce.cpp, and Note [Custom all-reduce] in kiln/distributed/shm_allreduce.cpp
// for the design it shares with sim. No CUDA header is needed to use this one.
#include <cstddef>
#include <cstdint>
#include <memory>

#include "kiln/distributed/collective_backend.h"

namespace kiln::cuda {

// Whether cuda tensors' groups make NCCL communicators: KILN_NCCL=0 turns NCCL off, so that two
// ranks may share one GPU (NCCL refuses them) and all_reduce runs through the custom
// all-reduce alone. Read once.
bool nccl_enabled();

// What the custom all-reduces of this process did (process-wide counts, for tests).
struct CustomAllReduceStats {
  uint64_t eager = 0;              // calls outside a capture: input copied into the staging buffer
  uint64_t captured = 0;           // calls recorded into a graph: input buffer registered, pending
  uint64_t staged_in_capture = 0;  // of those, inputs a replay copies to staging (in place or
                                   // not 16-byte aligned) instead of reading them directly
  uint64_t exchanges = 0;          // registration exchanges after a capture (one for all pending)
  uint64_t registered = 0;         // registrations those exchanges completed
  uint64_t reclaimed = 0;          // slots freed once every rank's graphs holding them were gone
  uint64_t ordered = 0;  // eager calls made to wait for the previous one, issued on another stream
  uint64_t ll = 0;       // calls the LL kernel took (eager or captured; counted in no other field)
};
CustomAllReduceStats custom_all_reduce_stats();

// The LL kernel (Note [The LL all-reduce] in custom_allreduce.cu) takes calls of whole 4-byte
// words up to its group's room: 512 KiB, or less where KILN_CUSTOM_AR_LL_MAX_BYTES says so on
// some rank when the group is made (0: none). This lowers that for every group of the process
// from now on (SIZE_MAX: no further limit), for tests: every rank must set the same, as the
// path a call takes must be every rank's. Returns the previous value.
size_t set_custom_all_reduce_ll_max_bytes(size_t bytes);

// The custom all-reduce of one group on this process's device.
class CustomAllReduce {
 public:
  // Collective over group.base_comm(), when the group is made (never inside a capture): null on
  // every rank when it cannot run (one rank or more than 8, ranks on several hosts, devices that
  // cannot map each other's memory, no co-resident blocks, an IPC call that fails on a rank).
  static std::unique_ptr<CustomAllReduce> make(distributed::ProcessGroup& group, int device);
  ~CustomAllReduce();
  CustomAllReduce(const CustomAllReduce&) = delete;
  CustomAllReduce& operator=(const CustomAllReduce&) = delete;

  // Whether an all-reduce of `in` by `op` takes this path: from the mode
  // (distributed::custom_all_reduce_mode()), the op (sum, avg), the dtype (float32, float16,
  // bfloat16) and the size (up to the staging buffer; Note [Which all-reduce in Auto] in
  // custom_allreduce.cpp), never from addresses or whether a capture is under way: every rank
  // decides alike, and a compiled step's warm-up takes the path its capture takes.
  bool eligible(const Tensor& in, distributed::ReduceOp op) const;
  // Queues the all-reduce of `in` into `out` (may be `in`) on the current stream of their
  // device; under capture, registers `in` for the exchange at the end of the capture.
  void all_reduce(const Tensor& in, const Tensor& out, const distributed::Collective& c);
  // The all-reduces queued so far (the flight recorder's numbering of this path's calls).
  uint64_t calls() const;

  // Completes the pending registrations of every custom all-reduce on `device` (one exchange
  // each). The CUDA plugin's end_capture calls it once a capture succeeded, on the capturing
  // thread; every rank ends the same captures, so every rank exchanges alike.
  static void end_capture(int device);

  struct State;

 private:
  explicit CustomAllReduce(std::unique_ptr<State> s);
  std::unique_ptr<State> s_;
};

// The collective backend of cuda tensors without NCCL: all_reduce through the custom
// all-reduce where eligible(), and a DistributedError saying why for everything else.
std::unique_ptr<distributed::CollectiveBackend> make_custom_only_backend(
    distributed::ProcessGroup& group);

namespace detail {
// Defined in custom_allreduce.cu, which nvcc compiles without Kiln's headers.
size_t custom_all_reduce_signal_bytes();
size_t custom_all_reduce_rank_data_bytes();
int custom_all_reduce_max_ranks();
int custom_all_reduce_max_blocks(int device);
// dtype: 0 float32, 1 float16, 2 bfloat16; `bases`: every rank's shared buffer mapped here;
// `rank_data`: device memory holding every rank's input pointer for this call; `fence_start`:
// a one-shot call's first barrier fences (every rank alike: eager calls); `stage_from`: with
// it, where the input is when the kernel itself copies it to this rank's entry of `rank_data`
// (its staging buffer) first, else null.
void launch_custom_all_reduce(int dtype, const void* rank_data, char* const* bases, int rank,
                              int size, int64_t nbytes, bool fence_start, const void* stage_from,
                              void* out, bool avg, bool two_shot, int max_blocks,
                              uint64_t timeout_ns, int* err, int code, void* stream);
// The LL kernel over `nbytes` (a multiple of 4) from `in` to `out`: every rank's lines start at
// `ll_offset` in its buffer, `ll_words` lines for each parity and sender.
void launch_custom_all_reduce_ll(int dtype, char* const* bases, int rank, int size, int64_t nbytes,
                                 size_t ll_offset, int64_t ll_words, const void* in, void* out,
                                 bool avg, int max_blocks, uint64_t timeout_ns, int* err, int code,
                                 void* stream);
}  // namespace detail

}  // namespace kiln::cuda

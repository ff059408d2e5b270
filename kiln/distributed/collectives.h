#pragma once
// Collectives as ops (Note [Collectives are ops] in collective_kernels.cpp): each call
// dispatches like any op, so autograd differentiates it, compile traces it and device graphs
// capture it. `group` defaults to the world. Bad input raises "[op] ..." naming the group, the
// rank and the sizes, before anything is sent.
#include <chrono>
#include <memory>
#include <vector>

#include "kiln/core/tensor.h"
#include "kiln/distributed/process_group.h"

namespace kiln::distributed {

// The result of an asynchronous collective (async_op). On a device with streams the
// collective runs on its group's communication stream and wait() makes the current stream
// wait for it (the host does not); on the CPU wait() drives MPI until it completes.
class Work {
 public:
  class Impl;
  explicit Work(std::shared_ptr<Impl> impl) : impl_(std::move(impl)) {}
  Work() = default;
  // Orders later work after the collective (CPU: returns when it is done).
  void wait();
  // Whether the collective has finished (never blocks; on the CPU it lets MPI progress).
  bool is_completed();
  bool defined() const { return impl_ != nullptr; }

 private:
  std::shared_ptr<Impl> impl_;
};

// Functional forms return a new tensor; `_` forms write their first argument.
Tensor all_reduce(const Tensor& t, ReduceOp op = ReduceOp::Sum, const ProcessGroup* group = {});
void all_reduce_(const Tensor& t, ReduceOp op = ReduceOp::Sum, const ProcessGroup* group = {});
// The group's tensors concatenated along dim 0 (group rank order).
Tensor all_gather_into_tensor(const Tensor& t, const ProcessGroup* group = {});
void all_gather_into_tensor_out(const Tensor& out, const Tensor& t, const ProcessGroup* group = {});
// Reduces across the group, then rank r keeps the r-th of size() equal chunks along dim 0.
Tensor reduce_scatter_tensor(const Tensor& t, ReduceOp op = ReduceOp::Sum,
                             const ProcessGroup* group = {});
void reduce_scatter_tensor_out(const Tensor& out, const Tensor& t, ReduceOp op = ReduceOp::Sum,
                               const ProcessGroup* group = {});
// Every rank gets group rank `src`'s tensor.
Tensor broadcast(const Tensor& t, int src, const ProcessGroup* group = {});
void broadcast_(const Tensor& t, int src, const ProcessGroup* group = {});
// Rank r sends rows [sum(in_splits[:j]), +in_splits[j]) of dim 0 to rank j and receives
// out_splits[j] rows from rank j. Empty splits mean equal parts.
Tensor all_to_all_single(const Tensor& t, const std::vector<int64_t>& out_splits = {},
                         const std::vector<int64_t>& in_splits = {},
                         const ProcessGroup* group = {});
void send(const Tensor& t, int dst, const ProcessGroup* group = {});
void recv_(const Tensor& t, int src, const ProcessGroup* group = {});
// Waits for every rank of the group (on `device`'s stream for a device with streams).
void barrier(const ProcessGroup* group = {}, Device device = Device("cpu"));

// Asynchronous forms (async_op; Note [Asynchronous collectives] in collectives.cpp): each
// validates like its blocking form, starts the collective and returns at once. On a device
// with streams it is queued on the group's communication stream after the current stream's
// work; on the CPU a non-blocking MPI call is started, which Open MPI advances only inside MPI
// calls (is_completed() lets it progress). The tensors must not be read or written until
// wait(); the Work keeps them alive until then. A group's collectives on one device run on its
// one communication stream in the order issued, so (as with NCCL) a recv_async queued before
// the send_async it needs waits for ever there; on the CPU both are in flight together. Not
// differentiable; under compile each is traced as its blocking form.
Work all_reduce_async(const Tensor& t, ReduceOp op = ReduceOp::Sum, const ProcessGroup* group = {});
Work all_gather_into_tensor_async(const Tensor& out, const Tensor& t,
                                  const ProcessGroup* group = {});
Work reduce_scatter_tensor_async(const Tensor& out, const Tensor& t, ReduceOp op = ReduceOp::Sum,
                                 const ProcessGroup* group = {});
Work broadcast_async(const Tensor& t, int src, const ProcessGroup* group = {});
Work all_to_all_single_async(const Tensor& out, const Tensor& t,
                             const std::vector<int64_t>& out_splits = {},
                             const std::vector<int64_t>& in_splits = {},
                             const ProcessGroup* group = {});
Work send_async(const Tensor& t, int dst, const ProcessGroup* group = {});
Work recv_async(const Tensor& t, int src, const ProcessGroup* group = {});
Work barrier_async(const ProcessGroup* group = {}, Device device = Device("cpu"));

// RAII: collectives this thread issues while it lives have `timeout` as their deadline instead
// of their group's.
class TimeoutGuard {
 public:
  explicit TimeoutGuard(std::chrono::milliseconds timeout);
  ~TimeoutGuard();
  TimeoutGuard(const TimeoutGuard&) = delete;
  TimeoutGuard& operator=(const TimeoutGuard&) = delete;

 private:
  std::chrono::milliseconds previous_;
};
// The deadline a collective of `group` issued now by this thread gets.
std::chrono::milliseconds timeout_for(const ProcessGroup& group);

}  // namespace kiln::distributed

#pragma once
// What moves a collective's bytes for the tensors of one device type: MPI for CPU tensors
// (cpu_backend.cpp), host tasks over MPI for devices whose memory the host can address (sim,
// host_task_backend.cpp), NCCL for CUDA tensors (kiln/backend/cuda/nccl.cpp, registered when
// the CUDA plugin loads). See Note [Collectives are ops] in collective_kernels.cpp.
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string_view>

#include "kiln/core/tensor.h"
#include "kiln/distributed/process_group.h"

namespace kiln::distributed {

// One collective call as the kernels validated it. Tensors are contiguous and on the group's
// device; `in` and `out` are the same tensor for in-place forms.
struct Collective {
  std::string_view op;  // "all_reduce", "all_gather_into_tensor", ...
  const ProcessGroup* group = nullptr;
  ReduceOp reduce = ReduceOp::Sum;
  int peer = -1;  // broadcast's source, send's destination, recv's source (group ranks)
  // all_to_all_single: elements per destination / per source rank.
  std::span<const int64_t> send_counts;
  std::span<const int64_t> recv_counts;
};

// Every method runs the collective in the order of the device's work: at once on the CPU, on
// the current stream of a device with streams (and so into a graph that stream captures).
// Sizes: all_gather's `out` holds size() copies of `in` along dim 0 (reduce_scatter's `in`
// likewise of `out`); the other forms take equal sizes.
class CollectiveBackend {
 public:
  virtual ~CollectiveBackend() = default;
  virtual std::string_view name() const = 0;  // "mpi", "nccl", "sim"
  virtual void all_reduce(const Tensor& in, const Tensor& out, const Collective& c) = 0;
  virtual void all_gather(const Tensor& in, const Tensor& out, const Collective& c) = 0;
  virtual void reduce_scatter(const Tensor& in, const Tensor& out, const Collective& c) = 0;
  virtual void broadcast(const Tensor& t, const Collective& c) = 0;
  virtual void all_to_all(const Tensor& in, const Tensor& out, const Collective& c) = 0;
  virtual void send(const Tensor& t, const Collective& c) = 0;
  virtual void recv(const Tensor& t, const Collective& c) = 0;
  virtual void barrier(Device device, const Collective& c) = 0;
};

// Makes the backend of one group for one device type. Called when a group is made (every rank
// of the group at once, so a factory may run collectives on group.base_comm(), e.g. to share
// NCCL's unique id) or, for groups made before the factory was registered, at registration.
using BackendFactory = std::function<std::unique_ptr<CollectiveBackend>(ProcessGroup& group)>;

// Registers the factory for tensors of `device_type` ("cuda"). Replaces an earlier one.
// Every rank must register the same factories in the same order (loading the same plugins).
void register_collective_backend(std::string_view device_type, BackendFactory factory);

}  // namespace kiln::distributed

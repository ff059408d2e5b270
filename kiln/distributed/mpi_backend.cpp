#include <algorithm>
#include <cstdlib>
#include <utility>
#include <vector>

#include "kiln/core/tensor_impl.h"
#include "kiln/distributed/backends.h"
#include "kiln/distributed/cma_allreduce.h"
#include "kiln/distributed/collectives.h"
#include "kiln/distributed/mpi_comm.h"
#include "kiln/distributed/shm_allreduce.h"
#include "kiln/ops/ops.h"

// Note [Collectives as host tasks]
// CPU tensors are reduced by MPI on the calling thread, at once. A device whose memory host
// code may address (sim: DeviceInterface::host_task_address) gets the same MPI calls as a host
// task queued on its current stream: the task runs when the stream reaches it, in order with
// the kernels before and after it, and a capturing stream records it into its graph like a
// kernel, so each replay runs the collective again over the graph's own buffers. The
// communicator is chosen when the call is issued (Note [One communicator per stream]). The task
// holds raw addresses, as a kernel does: frees are ordered on the stream (a block is reused
// only once the stream has run what was queued before the free), so the bytes outlive it. The
// device plugin never calls MPI; kiln/distributed queues the task through the device interface.
namespace kiln::distributed {
namespace {

class MpiBackend final : public CollectiveBackend {
 public:
  MpiBackend(const ProcessGroup& group, DeviceInterface* host_tasks)
      : group_(group),
        host_tasks_(host_tasks),
        shm_(ShmAllReduce::make(group, host_tasks ? host_tasks : device_interface(kCPU))),
        cma_(host_tasks ? nullptr : CmaAllReduce::make(group)) {}
  std::string_view name() const override { return host_tasks_ ? "mpi (host tasks)" : "mpi"; }

  void all_reduce(const Tensor& in, const Tensor& out, const Collective& c) override {
    // Small messages between ranks of one host: Note [Custom all-reduce] in shm_allreduce.cpp.
    if (shm_ && host_tasks_ && shm_->eligible(in, c.reduce)) return shm_->all_reduce(in, out, c);
    // Large CPU all-reduces: Note [Large CPU all-reduces].
    if (cma_ && cma_->eligible(in, c.reduce))
      return cma_->all_reduce(in, out, c, *group_.comm(stream_key(in.device())));
    if (shm_ && !host_tasks_ && in.nbytes() >= cpu_shm_min_bytes() &&
        shm_->eligible_in_pieces(in, c.reduce))
      return all_reduce_in_pieces(in, out, c);
    run(in, info(c, in, in.numel()),
        [a = addr(in), b = addr(out), n = in.numel()](MpiComm& comm, const CallInfo& i) {
          comm.all_reduce(a, b, n, i);
        });
  }
  void all_gather(const Tensor& in, const Tensor& out, const Collective& c) override {
    run(in, info(c, in, in.numel()),
        [a = addr(in), b = addr(out), n = in.numel()](MpiComm& comm, const CallInfo& i) {
          comm.all_gather(a, b, n, i);
        });
  }
  void reduce_scatter(const Tensor& in, const Tensor& out, const Collective& c) override {
    run(in, info(c, in, in.numel()),
        [a = addr(in), b = addr(out), n = out.numel()](MpiComm& comm, const CallInfo& i) {
          comm.reduce_scatter(a, b, n, i);
        });
  }
  void broadcast(const Tensor& t, const Collective& c) override {
    run(t, info(c, t, t.numel()),
        [a = addr(t), n = t.numel(), root = c.peer](MpiComm& comm, const CallInfo& i) {
          comm.broadcast(a, n, root, i);
        });
  }
  void all_to_all(const Tensor& in, const Tensor& out, const Collective& c) override {
    std::vector<int64_t> sc(c.send_counts.begin(), c.send_counts.end());
    std::vector<int64_t> rc(c.recv_counts.begin(), c.recv_counts.end());
    run(in, info(c, in, in.numel()),
        [a = addr(in), b = addr(out), sc = std::move(sc), rc = std::move(rc)](
            MpiComm& comm, const CallInfo& i) { comm.all_to_all(a, sc, b, rc, i); });
  }
  void send(const Tensor& t, const Collective& c) override {
    run(t, info(c, t, t.numel()),
        [a = addr(t), n = t.numel(), dst = c.peer](MpiComm& comm, const CallInfo& i) {
          comm.send(a, n, dst, i);
        });
  }
  void recv(const Tensor& t, const Collective& c) override {
    run(t, info(c, t, t.numel()),
        [a = addr(t), n = t.numel(), src = c.peer](MpiComm& comm, const CallInfo& i) {
          comm.recv(a, n, src, i);
        });
  }
  void barrier(Device device, const Collective& c) override {
    CallInfo i{c.op, c.group, DType::Float32, 0, c.reduce, -1, timeout_for(*c.group)};
    MpiComm* comm = group_.comm(stream_key(device));
    if (!host_tasks_) return comm->barrier(i);
    note_host_task_collectives(device);
    host_tasks_->launch_host_task(device.index(), c.op, [comm, i] { comm->barrier(i); });
  }

 private:
  // Note [Large CPU all-reduces]
  // Open MPI's shared-memory all-reduce (vader) is fast while the message fits the caches and
  // slow past them: 64 MB of float32 between 2 ranks moved at a bus bandwidth of 1.1 GB/s on the
  // GPU machine's 16-core host, below gloo's 1.9-2.1 there. Its own knobs do not help: on this
  // project's 2-core machine (2 ranks, 64 MB) coll_tuned_allreduce_algorithm 4 (ring) and 5
  // (segmented ring) took 26.2 and 26.5 ms like the default's 27.5, recursive doubling (3) 47.4.
  // So CPU all-reduces of floating dtypes from KILN_CPU_CMA_MIN_BYTES (1 MiB) up take the
  // cross-memory all-reduce (Note [Cross-memory all-reduce] in cma_allreduce.cpp), which reads
  // and writes each byte the fewest times. Measured here, one thread a rank, all-reduces in
  // place, MPI against it (us, median of 12 interleaved repeats; the machine is shared, so
  // runs vary by 10-20% together):
  //   2 ranks: 256 KB 55 / 54, 1 MB 191 / 193, 4 MB 715 / 762 (another run 338 / 371), 16 MB
  //            3009 / 3124, 64 MB 26512 / 11867 (2.2x);
  //   4 ranks (oversubscribed): 256 KB 182 / 161, 1 MB 586 / 556, 4 MB 2179 / 2188, 64 MB
  //            77069 / 33607 (2.3x).
  // Up to 16 MB the messages stay in this machine's 32 MB L3 and MPI's extra copies cost little,
  // so the two are even; past it the cross-memory all-reduce takes less than half MPI's time.
  // 1 MiB is where it stops losing here at 2 ranks, and on a host whose caches hold less (the
  // GPU machine's MPI moved 4 MB at 4.1 GB/s bus bandwidth against 11 here) it should win from
  // lower. Its reduction block (KILN_CPU_CMA_CHUNK_BYTES, 256 KiB) is not critical: 64 KiB to 1
  // MiB gave 64 MB in 12.2-13.7 ms. Where it is not permitted (Note [Cross-memory all-reduce]:
  // ptrace permission, seccomp, ranks on several hosts) the shared-memory all-reduce serves
  // from KILN_CPU_SHM_MIN_BYTES (32 MiB) up, in slot-sized pieces, one after another (each piece
  // averages by itself for avg): it copies each piece into its staging slot, reduces a share
  // per rank and gathers the shares (MPI against it here: 16 MB 2.7 / 3.1 ms, 32 MB 13.4 / 6.7,
  // 64 MB 26.7 / 12.5; on the GPU machine's host 2.06-2.48 GB/s at 64 MB, bench/gpu_runs.md I5).
  static size_t cpu_shm_min_bytes() {
    static const size_t n = [] {
      const char* v = std::getenv("KILN_CPU_SHM_MIN_BYTES");
      return v && *v ? static_cast<size_t>(std::strtoull(v, nullptr, 10)) : size_t{32} << 20;
    }();
    return n;
  }
  void all_reduce_in_pieces(const Tensor& in, const Tensor& out, const Collective& c) {
    const int64_t n = in.numel();
    const int64_t step =
        std::max<int64_t>(1, static_cast<int64_t>(shm_->capacity() / in.itemsize()));
    Tensor fi = in.view({n}), fo = out.view({n});
    for (int64_t start = 0; start < n; start += step) {
      int64_t end = std::min(n, start + step);
      shm_->all_reduce(slice(fi, 0, start, end), slice(fo, 0, start, end), c);
    }
  }
  static CallInfo info(const Collective& c, const Tensor& t, int64_t numel) {
    return CallInfo{c.op, c.group, t.dtype(), numel, c.reduce, c.peer, timeout_for(*c.group)};
  }
  void* addr(const Tensor& t) const {
    void* p = t.impl()->data();
    return host_tasks_ ? host_tasks_->host_task_address(t.device().index(), p) : p;
  }
  // Runs `fn` now (CPU) or as a host task on the device's current stream, holding `keep`.
  template <class F>
  void run(const Tensor& t, CallInfo i, F fn) {
    Device d = t.device();
    MpiComm* comm = group_.comm(stream_key(d));
    if (!host_tasks_) return fn(*comm, i);
    note_host_task_collectives(d);
    host_tasks_->launch_host_task(d.index(), i.op, [comm, i, fn = std::move(fn)] { fn(*comm, i); });
  }

  const ProcessGroup& group_;
  DeviceInterface* host_tasks_;        // null for CPU tensors
  std::unique_ptr<ShmAllReduce> shm_;  // null where the ranks share no host
  std::unique_ptr<CmaAllReduce> cma_;  // CPU tensors only; null where not permitted
};

}  // namespace

std::unique_ptr<CollectiveBackend> make_builtin_backend(const ProcessGroup& group, Device device) {
  if (device.type() == kCPU) return std::make_unique<MpiBackend>(group, nullptr);
  DeviceInterface* iface = device_interface(device.type());
  int probe = 0;  // any host address: a device with host-addressable memory hands it back
  if (iface && iface->host_task_address(device.index(), &probe))
    return std::make_unique<MpiBackend>(group, iface);
  return nullptr;
}

}  // namespace kiln::distributed

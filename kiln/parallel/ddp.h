#pragma once
// DistributedDataParallel (DESIGN.md "Distributed"; docs/distributed.md "DDP"): every rank of a
// process group holds the same module, runs it on its own share of the batch, and after each
// backward every parameter's .grad holds the group's average gradient. See Note [DDP's buckets]
// and Note [When a bucket is reduced] in ddp.cpp.
//
//   nn::Sequential model = ...;                  // the same on every rank
//   parallel::DistributedDataParallel ddp(model);  // rank 0's parameters everywhere
//   Tensor loss = cross_entropy(model(x_share), y_share);
//   loss.backward();                              // .grad is now the average over the ranks
//   opt.step();
//   { auto guard = ddp.no_sync(); loss2.backward(); }  // accumulate without communicating
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "kiln/core/device.h"
#include "kiln/core/dtype.h"
#include "kiln/nn/module.h"

namespace kiln::distributed {
class ProcessGroup;
}

namespace kiln::parallel {

struct DDPOptions {
  const distributed::ProcessGroup* group = nullptr;  // null: the world
  int64_t bucket_cap_bytes = 25 << 20;               // PyTorch's bucket_cap_mb = 25
  int64_t first_bucket_cap_bytes = 1 << 20;          // the first bucket starts reducing sooner
  bool broadcast_buffers = true;  // also broadcast the module's buffers at construction
};

// One bucket: the parameters (names, in bucket order) whose gradients are views of it.
struct DDPBucket {
  DType dtype;
  Device device;
  int64_t numel = 0;          // of its gradients
  int64_t reduced_numel = 0;  // what is all-reduced: the gradients, padded (Note [Bucket padding])
  std::vector<std::string> params;
};

// What the last synchronised backward did (eager calls only: a compiled step's replays run no
// hooks). The all-reduces run while `overlap_ms` of backward goes on; `wait_ms` is the part of
// them that was not hidden behind it.
struct DDPSyncStats {
  int64_t syncs = 0;      // synchronised backward passes so far
  int64_t bytes = 0;      // reduced by the last one
  double overlap_ms = 0;  // from its first all-reduce's start to the end of backward
  double wait_ms = 0;     // waiting for the all-reduces at the end of backward
  // Time backward spent inside collective calls before its end (starting and testing them): on
  // the CPU a call that cannot run in the background does all its work there.
  double comm_ms = 0;
};

class DistributedDataParallel {
  struct State;

 public:
  // Wraps `module`, which must outlive this object: checks that every rank's module has the
  // same parameters (names, shapes, dtypes), broadcasts the parameters (and buffers) from
  // group rank 0, lays the parameters' gradients out in buckets and sets each .grad to a view
  // of its bucket (keeping any gradient it had). Collective: every rank of the group calls it.
  explicit DistributedDataParallel(nn::Module& module, DDPOptions options = {});
  ~DistributedDataParallel();
  DistributedDataParallel(DistributedDataParallel&&) noexcept;
  DistributedDataParallel& operator=(DistributedDataParallel&&) noexcept;

  nn::Module& module() const;
  const distributed::ProcessGroup& group() const;

  // RAII: while one lives, backward passes accumulate into .grad without communicating; the
  // next synchronised backward averages the accumulated sums. A compiled step is guarded by
  // it: flipping it makes the next call trace (or replay an entry traced in that mode).
  class NoSync {
   public:
    ~NoSync();
    NoSync(const NoSync&) = delete;
    NoSync& operator=(const NoSync&) = delete;

   private:
    friend class DistributedDataParallel;
    explicit NoSync(std::shared_ptr<State> state);
    std::shared_ptr<State> state_;
    bool previous_;
  };
  [[nodiscard]] NoSync no_sync();
  // Whether backward passes synchronise now (false inside no_sync()); read while a compiled
  // function is traced, it becomes a guard.
  bool sync_enabled() const;

  // Zeroes every gradient, one fill per bucket, and makes each .grad its bucket view again
  // (after zero_grad(set_to_none) or a set_grad).
  void zero_grad();

  const std::vector<DDPBucket>& buckets() const;
  const DDPSyncStats& stats() const;

 private:
  std::shared_ptr<State> state_;
};

}  // namespace kiln::parallel

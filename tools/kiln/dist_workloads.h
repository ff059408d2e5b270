#pragma once
// BENCHMARKS.md's distributed workloads (allreduce, ddp), Kiln side, with the keys of
// ../shared/anchors/torch_dist_anchor.py. Run them on N ranks with
// `scripts/mpirun.sh N build/release/kiln bench allreduce`; every rank times, rank 0 reports.
// Without a launcher they run on a world of one. See Note [Timing collectives].
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "kiln/core/tensor.h"
#include "tools/kiln/workloads.h"

namespace kiln::workloads {

// The all-reduce message sizes in bytes (float32): 4 KB, 256 KB, 4 MB, 64 MB.
inline constexpr int64_t kAllreduceBytes[] = {4 << 10, 256 << 10, 4 << 20, 64 << 20};
// Timed calls per repeat at `bytes`: `iters_4k` at 4 KB, fewer for larger messages (at least 3).
int64_t allreduce_iters(int64_t bytes, int64_t iters_4k);
// The anchor's key stem for a size: "allreduce_4k", ..., "allreduce_65536k".
std::string allreduce_key(int64_t bytes);
// nccl-tests' bus bandwidth in GB/s of an all-reduce of `bytes` taking `seconds` on `ranks`
// ranks: algbw * 2(n-1)/n (algbw itself on one rank, as the anchor reports it).
double busbw_GBs(int64_t bytes, double seconds, int ranks);

// Times each of `fns` (collectives every rank calls in the same order) `iters` times per repeat,
// the functions interleaved repeat by repeat, each repeat starting from `barrier`. Returns this
// rank's median seconds per call of each function. See Note [Timing collectives].
std::vector<double> time_interleaved(int64_t iters, int repeats,
                                     const std::vector<std::function<void()>>& fns,
                                     const std::function<void()>& barrier);

// The device this rank times on when `--device` names `requested`: the CPU, or device
// (local rank modulo the devices present) of that type, as the NCCL backend picks it (one
// device a rank where there are enough; `cuda` and `cuda:0` alike).
Device rank_device(Device requested);

// Runs `body` (which every rank runs alike); a rank whose check fails ends the job, instead of
// leaving its peers waiting in their next collective until the deadline.
std::vector<Metric> on_every_rank(const std::function<std::vector<Metric>()>& body);

// The megabytes (1e6) the tensors hold on this rank: a DTensor's local shard, undefined ones
// none. What a rank keeps, for the FSDP and GPT workloads.
double local_mb(const TensorList& tensors);

// The most memory in live tensors any rank's device held since that rank last called
// reset_peak_memory (kiln::memory_stats), in megabytes (1e6), as PyTorch's
// max_memory_allocated; nullopt on a device whose backend keeps no count (cpu). Every rank
// calls it (a collective).
std::optional<double> peak_device_mb(Device device);

// Another all-reduce to time beside Kiln's and MPI's (bench/allreduce_bench.cpp: gloo).
struct AllreduceImpl {
  std::string name;  // key prefix: "gloo" gives gloo_allreduce_4k_us
  std::string what;  // for a human table
  // Returns a call that sums the `n` floats at `p` in place across the world (every rank calls
  // it in the same order). Called once per size, untimed.
  std::function<std::function<void()>(float* p, int64_t n)> prepare;
};

// kiln::distributed::all_reduce_ on float32 CPU tensors against a bare MPI_Allreduce loop over
// the same buffer (under a launcher) and `others`, at every size of kAllreduceBytes, each
// result checked before timing. Keys: allreduce_4k_us and allreduce_4k_busbw_GBs (Kiln, the
// anchor's keys), mpi_allreduce_4k_us, ..., allreduce_4k_over_mpi_us, allreduce_4k_vs_mpi, and
// per other implementation <name>_allreduce_4k_us, ..., allreduce_4k_vs_<name> (time ratios).
std::vector<Metric> allreduce(const Options& o, const std::vector<AllreduceImpl>& others = {});

// The mlp workload's training step (AdamW, batch 64 per rank) under
// parallel::DistributedDataParallel against the same step without it, both timed on every rank
// at once (as the anchor does), eagerly and compiled. Keys: mlp_step_local_us and
// mlp_step_ddp_us (the anchor's), ddp_overhead (ddp / local - 1), the same with _compiled,
// and how much of the all-reduces backward hid (ddp_overlap_ms, ddp_wait_ms).
std::vector<Metric> ddp(const Options& o);

}  // namespace kiln::workloads

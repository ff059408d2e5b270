#pragma once
// `kiln bench fsdp`: the bench GPT's train step under fully_shard (resharding after forward and
// not) against the same step under DistributedDataParallel, each rank on its share of the batch,
// timed in one run on `scripts/mpirun.sh N build/release/kiln bench fsdp` (every rank times,
// rank 0 reports). See Note [Timing the FSDP step] in fsdp_workload.cpp.
#include <vector>

#include "tools/kiln/workloads.h"

namespace kiln::workloads {

// A train step (forward, loss, backward, AdamW) of GPTConfig::bench() on batch 2 x 128 per rank:
// DDP; FSDP with each block a unit and the model the root, resharding after forward; the same
// without resharding. Keys: gpt_step_ddp_us, gpt_step_fsdp_us, gpt_step_fsdp_keep_us,
// fsdp_vs_ddp (fsdp / ddp time); per rank, what is kept between steps (resident_ddp_mb,
// resident_fsdp_mb: parameters, gradients, AdamW moments), the peak one step adds to it
// (step_extra_*_mb) and their sum (peak_ddp_mb, peak_fsdp_mb, peak_fsdp_keep_mb).
std::vector<Metric> fsdp(const Options& o);

}  // namespace kiln::workloads

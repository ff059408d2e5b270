#pragma once
// `kiln bench dtensor`: issue 15's per-op cost of the Sharded layer, with the keys of
// ../shared/anchors/torch_dist_anchor.py. Run it as a world of one (a 1-rank mesh) and with
// `scripts/mpirun.sh 2 build/release/kiln bench dtensor` (a 2-rank mesh); every rank times,
// rank 0 reports. See Note [Timing the Sharded layer] in dtensor_workload.cpp.
#include <vector>

#include "tools/kiln/workloads.h"

namespace kiln::workloads {

// add, mm, detach, relu and sum on 64x64 float32 DTensors (Shard(0) as the anchor has it, and
// Replicate) on a mesh over the whole world, each against the same op on the local tensors,
// interleaved; on the bench's device (cpu by default) and on meta. Keys: dtensor_add_us and
// plain_add_us (the anchor's, Shard(0) on the bench's device), dtensor_add_overhead_us (median
// of the paired differences), the same with _r for Replicate, and meta_ before each for meta.
// An op that raises NotImplementedError on DTensors is reported as missing (not timed).
std::vector<Metric> dtensor(const Options& o);

}  // namespace kiln::workloads

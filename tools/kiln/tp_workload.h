#pragma once
// `kiln bench tp`: issue 15's tensor-parallel GPT step on the ranks of
// `scripts/mpirun.sh 2 build/release/kiln bench tp` against the single-process step, both timed
// in one run (every rank times, rank 0 reports). See Note [Timing the tensor-parallel step] in
// tp_workload.cpp.
#include <vector>

#include "tools/kiln/workloads.h"

namespace kiln::workloads {

// A train step (forward, loss, backward, AdamW) of GPTConfig::bench() on batch 8 x 128: the
// whole model in one process, and the model under parallel::gpt_tensor_parallel_plan on a mesh
// of the world with loss_parallel_cross_entropy, each rank the same batch; eager and compiled,
// interleaved. Keys: gpt_step_local_us, gpt_step_tp_us, tp_speedup (local / tp), the same with
// _compiled, and tp_ideal_speedup (the world size).
std::vector<Metric> tp(const Options& o);

}  // namespace kiln::workloads

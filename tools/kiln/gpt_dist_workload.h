#pragma once
// Issue 18's distributed GPT steps, Kiln side: `kiln bench gpt_ddp|gpt_tp|gpt_fsdp` and the
// same for gpt_large, one process per device under
// `scripts/mpirun.sh N build/release/kiln bench gpt_large_ddp --device cuda --amp bf16`, with the
// keys of bench/torch_gpt_dist.py (PyTorch's DDP, tensor-parallel and FSDP2 steps). See Note
// [Timing the distributed GPT steps] in gpt_dist_workload.cpp.
#include <vector>

#include "tools/kiln/workloads.h"

namespace kiln::workloads {

enum class GptParallelism { DDP, TP, FSDP };

// The train step (forward, loss, backward, AdamW) of the gpt workload's model (large: gpt_large's)
// under `mode`: DDP and FSDP on 8 sequences a rank, TP on the same 8 on every rank; eager and,
// on a device with graphs, compiled. Keys <model>_<mode>[_bf16]_eager_tokens_per_s (all ranks),
// _graph_tokens_per_s, _best_tokens_per_s, _best_tokens_per_s_per_gpu and _resident_mb (what a
// rank keeps between steps: parameters, gradients, AdamW's moments).
std::vector<Metric> gpt_parallel(const Options& o, bool large, GptParallelism mode);

}  // namespace kiln::workloads

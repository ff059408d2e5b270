#pragma once
// The collective backend of cuda tensors, over NCCL (nccl.cpp): it registers itself with
// kiln/distributed when libkiln_cuda loads, so every process group made after
// load_backend("cuda") runs its collectives on cuda tensors through NCCL. These calls are
// diagnostics; no CUDA or NCCL header is needed to use them.

namespace kiln::cuda {

// The version of the NCCL library loaded, as NCCL_VERSION_CODE spells it (22803 for 2.28.3), or
// 0 when libkiln_cuda was built without NCCL (then cuda tensors have no collective backend).
int nccl_version();

// The CUDA device whose tensors this process's NCCL communicators serve: its local rank
// (kiln::distributed::local_rank()) modulo the devices present, so cuda:0 in a world of one.
int nccl_device();

}  // namespace kiln::cuda

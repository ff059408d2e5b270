#pragma once
// The collective backend of cuda tensors, over NCCL (nccl.cpp): registered with
// kiln/distributed once load_backend("cuda") has registered the backend
// (BackendSpec::on_registered), so every process group made after it runs its collectives on
// cuda tensors through NCCL. No CUDA or NCCL header is needed to use these calls.

namespace kiln::cuda {

// The version of the NCCL library loaded, as NCCL_VERSION_CODE spells it (22803 for 2.28.3), or
// 0 when libkiln_cuda was built without NCCL (then cuda tensors have no collective backend).
int nccl_version();

// The CUDA device whose tensors this process's NCCL communicators serve: its local rank
// (kiln::distributed::local_rank()) modulo the devices present, so cuda:0 in a world of one.
int nccl_device();

// Registers the collective backend of cuda tensors: NCCL's (with the custom all-reduce for
// small all-reduces), or the custom all-reduce alone in a build without NCCL or under
// KILN_NCCL=0. The CUDA backend's on_registered hook.
void register_collective_backends();

}  // namespace kiln::cuda

#pragma once
// The backends kiln/distributed makes itself (internal): MPI for CPU tensors, and MPI through
// host tasks for a device whose memory host tasks can address (sim). See mpi_backend.cpp.
#include <memory>

#include "kiln/distributed/collective_backend.h"

namespace kiln::distributed {

// The built-in backend of `group` for `device`'s type, or null when there is none (CUDA's
// comes from the CUDA plugin).
std::unique_ptr<CollectiveBackend> make_builtin_backend(const ProcessGroup& group, Device device);

// Records that a collective was launched as a host task on `device`'s streams (the MPI backend
// of a host-addressable device such as sim, the shared-memory all-reduce): finalize waits for
// those devices before MPI_Finalize (Note [Draining before MPI_Finalize] in init.cpp). Cheap
// after the first call per device.
void note_host_task_collectives(Device device);

}  // namespace kiln::distributed

#pragma once
// The backends kiln/distributed makes itself (internal): MPI for CPU tensors, and MPI through
// host tasks for a device whose memory host tasks can address (sim). See mpi_backend.cpp.
#include <memory>

#include "kiln/distributed/collective_backend.h"

namespace kiln::distributed {

// The built-in backend of `group` for `device`'s type, or null when there is none (CUDA's
// comes from the CUDA plugin).
std::unique_ptr<CollectiveBackend> make_builtin_backend(const ProcessGroup& group, Device device);

}  // namespace kiln::distributed

#pragma once
// Starting and ending the distributed layer. Launch with `mpirun -n N prog`; without a
// launcher the process is a world of one and MPI is never initialised. See Note [Launch] in
// init.cpp.
#include <string>

namespace kiln::distributed {

// Initialises once (later calls do nothing): under a launcher (OMPI_COMM_WORLD_SIZE or
// PMIX_RANK set) MPI with MPI_THREAD_MULTIPLE, or adopts an MPI someone else initialised (a
// Python host's mpi4py, then never finalised by Kiln). world() calls it.
void init();
bool is_initialized();
// Whether Kiln was built with MPI; without it every world has one rank.
bool built_with_mpi();
// Whether this process runs under a launcher with MPI initialised (false: a world of one).
bool mpi_active();

int rank();              // in the world
int world_size();        // 1 without a launcher
int local_rank();        // among the ranks of this host (MPI_Comm_split_type)
int local_world_size();  // ranks on this host

// Finalises MPI if Kiln initialised it (also at exit), after waiting for the devices whose
// streams ran collectives as host tasks (Note [Draining before MPI_Finalize] in init.cpp).
// Collectives after it are errors.
void finalize();

// Ends the whole job at once, every rank (MPI_Abort; std::_Exit in a world of one), after
// printing `message` on stderr. For when a peer may be dead: MPI_Finalize would hang.
[[noreturn]] void abort_job(const std::string& message, int code = 1);

}  // namespace kiln::distributed

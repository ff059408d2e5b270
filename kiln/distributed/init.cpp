#include "kiln/distributed/init.h"

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <mutex>

#include "kiln/core/device.h"
#include "kiln/core/error.h"
#include "kiln/distributed/backends.h"
#include "kiln/distributed/process_group.h"
#include "kiln/distributed/watchdog.h"

#ifdef KILN_HAVE_MPI
#include <mpi.h>
#endif

// Note [Launch]
// Kiln starts no processes: `mpirun -n N prog` does, and each process finds its place from MPI.
// A process counts as launched when the launcher's environment says so (OMPI_COMM_WORLD_SIZE
// from Open MPI's mpirun, PMIX_RANK from PMIx launchers); otherwise it is a world of one, works
// unchanged and never calls MPI_Init (which would make a singleton MPI job, slow to start and
// noisy). MPI is initialised asking for MPI_THREAD_MULTIPLE: collectives run on the threads of
// device streams (sim) and on the caller's thread at once, each on its own communicator. A
// library that gets less raises at init rather than corrupting state later. An MPI that is
// already initialised (mpi4py in a Python host) is used as it is and left for its owner to
// finalise.
namespace kiln::distributed {
namespace {

struct State {
  std::once_flag once;
  bool initialized = false;
  bool mpi_active = false;
  bool we_initialized_mpi = false;
  bool finalized = false;
  int rank = 0;
  int size = 1;
  int local_rank = 0;
  int local_size = 1;
};
State& state() {
  static State s;
  return s;
}

bool launched() {
  return std::getenv("OMPI_COMM_WORLD_SIZE") != nullptr || std::getenv("PMIX_RANK") != nullptr;
}

#ifdef KILN_HAVE_MPI
void check(int rc, const char* call) {
  if (rc == MPI_SUCCESS) return;
  char msg[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, msg, &len);
  throw DistributedError(fmt::format("[distributed] {} failed: {}", call, std::string(msg, len)));
}

void init_mpi(State& s) {
  int already = 0;
  MPI_Initialized(&already);
  if (!already) {
    // Non-blocking all-reduces are DDP's buckets (1 to 25 MB): Open MPI's default algorithm for
    // them (libnbc's) took twice as long as the blocking one at 4 MB; Rabenseifner's (3)
    // matches it. A user's setting wins.
    setenv("OMPI_MCA_coll_libnbc_iallreduce_algorithm", "3", /*overwrite=*/0);
    int provided = 0;
    check(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided), "MPI_Init_thread");
    s.we_initialized_mpi = true;
    if (provided < MPI_THREAD_MULTIPLE)
      throw DistributedError(fmt::format(
          "[distributed] MPI provides thread level {} but Kiln needs MPI_THREAD_MULTIPLE ({}): "
          "collectives run on device stream threads too",
          provided, MPI_THREAD_MULTIPLE));
  } else {
    int provided = 0;
    MPI_Query_thread(&provided);
    if (provided < MPI_THREAD_MULTIPLE)
      throw DistributedError(fmt::format(
          "[distributed] MPI was initialised by someone else with thread level {}; Kiln needs "
          "MPI_THREAD_MULTIPLE ({})",
          provided, MPI_THREAD_MULTIPLE));
  }
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  check(MPI_Comm_rank(MPI_COMM_WORLD, &s.rank), "MPI_Comm_rank");
  check(MPI_Comm_size(MPI_COMM_WORLD, &s.size), "MPI_Comm_size");
  MPI_Comm local;
  check(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, s.rank, MPI_INFO_NULL, &local),
        "MPI_Comm_split_type");
  MPI_Comm_rank(local, &s.local_rank);
  MPI_Comm_size(local, &s.local_size);
  MPI_Comm_free(&local);
  s.mpi_active = true;
}
#endif

}  // namespace

void init() {
  State& s = state();
  std::call_once(s.once, [&s] {
#ifdef KILN_HAVE_MPI
    int already = 0;
    MPI_Initialized(&already);
    if (launched() || already) init_mpi(s);
#endif
    s.initialized = true;
    std::atexit([] { finalize(); });
  });
}

bool is_initialized() { return state().initialized; }

bool built_with_mpi() {
#ifdef KILN_HAVE_MPI
  return true;
#else
  return false;
#endif
}

bool mpi_active() {
  init();
  return state().mpi_active;
}

int rank() {
  init();
  return state().rank;
}
int world_size() {
  init();
  return state().size;
}
int local_rank() {
  init();
  return state().local_rank;
}
int local_world_size() {
  init();
  return state().local_size;
}

namespace {

// The devices with host-task collectives (note_host_task_collectives): a bit per device index
// under 64 per type, and `every` for a type that had one at a higher index.
std::atomic<uint64_t> g_host_task_devices[kMaxDeviceTypes];
std::atomic<bool> g_host_task_every[kMaxDeviceTypes];

#ifdef KILN_HAVE_MPI
// Note [Draining before MPI_Finalize]
// Collectives of a device whose memory the host can address (sim) run as host tasks on its
// streams, whose worker threads call MPI, and one may still be queued when main returns:
// nothing obliges a program to wait for a result it never reads. Finalizing MPI under it leaves
// that thread inside MPI while Open MPI tears down and unloads its components (a segfault at
// exit: a 1-in-25 flake of a test whose every check had passed), or calling MPI after its
// finalize, and the queued work is lost. So every device that had such a collective
// (note_host_task_collectives; only those: waiting for all devices would make a CUDA context on
// every GPU of the host at exit) is waited for before MPI_Finalize, under the same deadline (a
// collective some rank never joins ends the job instead of hanging it), once: by finalize()
// when the program calls it, else by an exit handler that the first such collective registers.
// That handler is registered after the device's plugin was loaded, so it runs before the
// plugin's static objects (its DeviceInterface among them) are destroyed; finalize's own exit
// handler, registered at init, runs after them. A collective that failed there is printed,
// since nobody is left to raise it to; other failures at exit (a device runtime already torn
// down by its own exit handler) are not this job's news and are dropped, and the other devices
// are still waited for. A CPU collective started async and never waited for is the program's
// to complete (MPI's rule for requests): the Work that holds it is the program's, not Kiln's.
std::atomic<bool> g_drained{false};

void drain_host_task_devices() {
  if (g_drained.exchange(true)) return;
  Deadline deadline(Clock::now() + default_timeout(), [] {
    abort_job(fmt::format(
        "kiln: DistributedError: [distributed] waiting at exit for the devices' queued work timed "
        "out after {} ms on rank {}: a queued collective that some rank never joined "
        "(KILN_DIST_TIMEOUT)",
        default_timeout().count(), state().rank));
  });
  for (int t = 0; t < kMaxDeviceTypes; ++t) {
    const uint64_t bits = g_host_task_devices[t].load(std::memory_order_relaxed);
    const bool every = g_host_task_every[t].load(std::memory_order_relaxed);
    DeviceInterface* iface = device_interface(static_cast<DeviceType>(t));
    if ((!bits && !every) || !iface || !iface->caps().async) continue;
    for (int i = 0; i < iface->device_count(); ++i) {
      if (!every && (i >= 64 || !(bits >> i & 1))) continue;
      try {
        iface->synchronize(i);
      } catch (const DistributedError& e) {
        std::fprintf(stderr, "kiln: at exit, a queued collective failed on rank %d: %s\n",
                     state().rank, e.what());
        std::fflush(stderr);
      } catch (const std::exception&) {
      }
    }
  }
}
#endif

}  // namespace

void note_host_task_collectives(Device device) {
#ifdef KILN_HAVE_MPI
  static std::once_flag registered;  // the exit handler of the Note above
  std::call_once(registered, [] { std::atexit([] { drain_host_task_devices(); }); });
#endif
  const DeviceType t = device.type();
  const int i = device.index();
  if (i < 0 || i >= 64) {
    g_host_task_every[t].store(true, std::memory_order_relaxed);
    return;
  }
  const uint64_t bit = uint64_t{1} << i;
  if (!(g_host_task_devices[t].load(std::memory_order_relaxed) & bit))
    g_host_task_devices[t].fetch_or(bit, std::memory_order_relaxed);
}

void finalize() {
  State& s = state();
  if (!s.initialized || s.finalized) return;
  s.finalized = true;
#ifdef KILN_HAVE_MPI
  if (s.mpi_active) {
    int done = 0;
    MPI_Finalized(&done);
    if (!done) drain_host_task_devices();
  }
  if (s.we_initialized_mpi) {
    int done = 0;
    MPI_Finalized(&done);
    if (done) return;
    // MPI_Finalize waits for every peer: a dead one would make it wait for ever.
    Deadline deadline(Clock::now() + default_timeout(), [] {
      abort_job(fmt::format(
          "kiln: DistributedError: [distributed] MPI_Finalize timed out after {} ms on rank {}: "
          "some rank did not finish (KILN_DIST_TIMEOUT)",
          default_timeout().count(), state().rank));
    });
    MPI_Finalize();
  }
#endif
}

void abort_job(const std::string& message, int code) {
  std::fprintf(stderr, "%s\n", message.c_str());
  std::fflush(stderr);
#ifdef KILN_HAVE_MPI
  if (state().mpi_active) MPI_Abort(MPI_COMM_WORLD, code);
#endif
  std::_Exit(code);
}

}  // namespace kiln::distributed

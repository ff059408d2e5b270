// Fault scenarios for kiln/distributed (issue 14, "Faults"): one per run, named on the command
// line. tests/distributed/fault_test.sh runs each on 2 ranks under mpirun and checks what every
// rank printed, how it exited and how long the job took. See Note [Fault tests]. One scenario is
// not a fault: exit_in_flight, ranks that return from main with a collective still queued.
//
// Note [Fault tests]
// A fault ends the job, so it cannot be a gtest inside one process: each scenario is its own
// mpirun, and the pass condition lives in fault_test.sh, beside the scenarios it checks. Every
// scenario starts with one all-reduce that all ranks agree on (collective 1 of the thread's
// communicator), so that each rank has made its communicator for this thread (Note [One
// communicator per stream] in process_group.cpp) before the fault, except throw_first, whose
// fault is exactly a rank that never gets there. A rank that must not reach the next collective
// sleeps for twice the deadline instead of exiting: then the only deadline that can fire is the
// waiting rank's, and which rank prints the timeout is not a race. Messages a scenario prints
// itself start with "kiln-fault-test: rank R", so the script can tell the ranks apart.
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "kiln/backend/backend.h"
#include "kiln/core/device.h"
#include "kiln/core/error.h"
#include "kiln/distributed/collectives.h"
#include "kiln/distributed/init.h"
#include "kiln/ops/ops.h"
#include "tests/backend/sim_util.h"

namespace {

using namespace kiln;
namespace dist = kiln::distributed;
using std::chrono::milliseconds;

int me() { return dist::rank(); }

void say(const std::string& what) {
  std::fprintf(stderr, "kiln-fault-test: rank %d %s\n", me(), what.c_str());
  std::fflush(stderr);
}

// Collective 1, the same on every rank (Note [Fault tests]).
void agree(Device on = Device(kCPU)) {
  Tensor t = ones({4}, {}, on);
  dist::all_reduce_(t);
  KILN_CHECK(t.to(Device(kCPU)).to_vector<float>() == std::vector<float>(4, 2.0f),
             "[fault_test] the agreed all-reduce gave {}", t.to(Device(kCPU)).to_vector<float>());
}

// What a rank does instead of its next collective: work that outlasts the deadline.
void work_past_the_deadline() { std::this_thread::sleep_for(2 * dist::timeout_for(dist::world())); }

// Rank 0 all-reduces where rank 1 broadcasts (collective 2).
void different_ops() {
  agree();
  Tensor t = ones({4});
  if (me() == 0)
    dist::all_reduce_(t);
  else
    dist::broadcast_(t, 0);
}

// Rank 0 all-reduces 4 elements, rank 1 8 (collective 2), then both wait at a barrier.
void different_sizes() {
  agree();
  dist::all_reduce_(ones({me() == 0 ? 4 : 8}));
  dist::barrier();
}

// The same on sim tensors: the check runs in the collective's host task, and synchronize gives
// each caller that DistributedError (not the device's generic error).
void different_sizes_sim() {
  agree();
  Device sim = test::sim();
  dist::all_reduce_(ones({me() == 0 ? 4 : 8}, {}, sim));
  synchronize(sim);
}

// Rank 1 skips the second all-reduce.
void skip() {
  agree();
  if (me() == 0)
    dist::all_reduce_(ones({4}));
  else
    work_past_the_deadline();
  dist::barrier();
}

// Rank 1 skips the second all-reduce, which rank 0 started without waiting (DDP's buckets on
// the CPU) and polls, as gradient hooks do: the deadline holds for a call in flight too.
void skip_async() {
  agree();
  if (me() == 0) {
    dist::Work w = dist::all_reduce_async(ones({4}));
    while (!w.is_completed()) std::this_thread::yield();
  } else {
    work_past_the_deadline();
  }
  dist::barrier();
}

// Asynchronous all-reduces of 4 elements on rank 0 and 8 on rank 1 (collective 2).
void different_sizes_async() {
  agree();
  dist::all_reduce_async(ones({me() == 0 ? 4 : 8})).wait();
}

// Rank 1 raises between the step's collectives; main catches it and returns 1, as the kiln
// program does.
void throw_mid_step() {
  agree();
  if (me() == 1) throw ValueError("[fault_test] rank 1 failed mid-step");
  dist::all_reduce_(ones({4}));
}

// Rank 1 raises before its first collective: rank 0's first one also makes its communicator.
void throw_first() {
  if (me() == 1) throw ValueError("[fault_test] rank 1 failed before its first collective");
  dist::all_reduce_(ones({4}));
}

// Rank 1 kills itself mid-step (run with mpirun --enable-recovery, or the launcher ends the
// job at once and the survivor has nothing to report).
void killed() {
  agree();
  if (me() == 1) {
    say("kills itself");
    std::raise(SIGKILL);
  }
  dist::all_reduce_(ones({4}));
}

// The per-call deadline: KILN_DIST_TIMEOUT=60 and the group's 30 s, but rank 0's second
// all-reduce runs under a 5 s TimeoutGuard, which is what fires.
void guard() {
  dist::world().set_timeout(milliseconds(30'000));
  agree();
  if (me() == 0) {
    dist::TimeoutGuard g(milliseconds(5'000));
    dist::all_reduce_(ones({4}));
  } else {
    work_past_the_deadline();
  }
}

// A group's timeout is the deadline of its set-up too: rank 0's second thread makes its own
// communicator of the world (MPI_Comm_dup, at its first collective there), which rank 1 never
// joins. KILN_DIST_TIMEOUT is 60 s here; the world's 5 s must fire.
void setup_timeout() {
  dist::world().set_timeout(milliseconds(5'000));
  agree();
  if (me() == 0) {
    std::thread([] { dist::all_reduce_(ones({4})); }).join();
  } else {
    work_past_the_deadline();
  }
}

// guard on sim tensors: the broadcast is a host task that runs on the sim stream's thread
// (Note [Collectives as host tasks] in mpi_backend.cpp), and still has the deadline of the
// guard in force where it was issued, though the guard may have ended before the stream runs
// it. Rank 0 receives from rank 1, which never sends.
void guard_sim() {
  Device sim = test::sim();
  dist::world().set_timeout(milliseconds(30'000));
  Tensor a = full({4}, me() + 1.0, {}, sim);
  dist::broadcast_(a, 1);  // collective 1 of the sim stream's communicator, on every rank
  KILN_CHECK(a.to(Device(kCPU)).to_vector<float>() == std::vector<float>(4, 2.0f),
             "[fault_test] the agreed broadcast on sim gave {}",
             a.to(Device(kCPU)).to_vector<float>());
  if (me() == 0) {
    {
      dist::TimeoutGuard g(milliseconds(5'000));
      dist::broadcast_(a, 1);
    }
    synchronize(sim);
  } else {
    work_past_the_deadline();
  }
}

// Note [Fault scenarios on cuda tensors]
// The *_cuda scenarios put the fault on cuda tensors, a GPU a rank (issue 18: real NCCL and the
// custom all-reduce, which CI's machines cannot run; scripts/gpu_dist.sh runs them). A collective
// on cuda returns once queued, so each scenario ends with synchronize: that is where the
// watchdog's abort (Note [NCCL deadlines] in kiln/backend/cuda/nccl.cpp) or the custom
// all-reduce kernel's own deadline (its device error word) reaches the caller. fault_test.sh
// sets KILN_CUSTOM_AR=0 for the *_nccl_cuda ones, so that the small all-reduces go through
// NCCL, and KILN_CUSTOM_AR=1 for the others, which take the custom all-reduce where the GPUs can
// reach each other (in Auto an eager call this small would take NCCL). Where this
// machine has no GPU for each rank, every rank says "skipped" and fault_test.sh skips.
struct NoGpu {
  std::string why;
};

Device gpu() {
  try {
    DeviceType cuda = load_backend("cuda");
    int n = device_interface(cuda)->device_count();
    if (dist::local_rank() >= n)
      throw NoGpu{fmt::format("{} GPU(s) for local rank {}", n, dist::local_rank())};
    return Device(cuda, dist::local_rank());
  } catch (const Error& e) {
    throw NoGpu{e.what()};
  }
}

// Rank 0 all-reduces on its GPU and waits for the result; rank 1 skips the collective.
void skip_cuda() {
  Device on = gpu();
  agree(on);
  if (me() == 0) {
    dist::all_reduce_(ones({4}, {}, on));
    synchronize(on);
  } else {
    work_past_the_deadline();
  }
  dist::barrier();
}

// Rank 0 all-reduces 4 elements, rank 1 8, on their GPUs (collective 2).
void different_sizes_cuda() {
  Device on = gpu();
  agree(on);
  dist::all_reduce_(ones({me() == 0 ? 4 : 8}, {}, on));
  synchronize(on);
}

// Every rank returns from main with an all-reduce still queued on a sim stream, rank 0's
// launches slowed to 300 ms each: rank 1's worker is inside the all-reduce, waiting for rank
// 0's, while both mains have returned. The exit must wait for the streams before MPI_Finalize
// (Note [Draining before MPI_Finalize] in kiln/distributed/init.cpp); otherwise rank 1's worker
// is inside MPI while Open MPI finalizes and unloads its components, and the rank ends on a
// signal, or the finalize waits for ever (its deadline then ends the job).
void exit_in_flight() {
  if (me() == 0) setenv("KILN_SIM_LAUNCH_NS", "300000000", 1);  // read when the plugin loads
  Device sim = test::sim();
  agree();
  Tensor a = full({4}, me() + 1.0, {}, sim);
  dist::all_reduce_(a);
  // Queued behind the all-reduce: the line fault_test.sh looks for, printed only if the stream
  // was run to its end before the process went (and from the all-reduced values).
  // Sim memory is host memory, which a host task may read (data() is for cpu tensors only).
  test::sim_interface().launch_host_task(0, "report", [a] {
    const float* v = static_cast<const float*>(a.impl()->storage()->data()) + a.storage_offset();
    say(fmt::format("ran its queued all-reduce: {}", v[0]));
  });
}

// Under KILN_DIST_DEBUG=detail, calls that agree pass the check, whatever their kind, and give
// the right values: all-to-all with different split sizes per rank, send/recv (not checked).
void detail_agree() {
  agree();
  const int r = me();
  Tensor t = full({4}, r + 1.0);
  dist::all_reduce_(t, dist::ReduceOp::Max);
  KILN_CHECK(t.to_vector<float>() == std::vector<float>(4, 2.0f), "[fault_test] max gave {}",
             t.to_vector<float>());
  Tensor b = full({3}, r + 1.0);
  dist::broadcast_(b, 1);
  KILN_CHECK(b.to_vector<float>() == std::vector<float>(3, 2.0f), "[fault_test] broadcast gave {}",
             b.to_vector<float>());
  Tensor g = dist::all_gather_into_tensor(full({2}, r + 1.0));
  KILN_CHECK(g.to_vector<float>() == std::vector<float>({1, 1, 2, 2}),
             "[fault_test] all_gather gave {}", g.to_vector<float>());
  // Rank 0 sends 1 row to itself and 2 to rank 1; rank 1 sends 3 to rank 0 and 1 to itself.
  std::vector<int64_t> in = r == 0 ? std::vector<int64_t>{1, 2} : std::vector<int64_t>{3, 1};
  std::vector<int64_t> out = r == 0 ? std::vector<int64_t>{1, 3} : std::vector<int64_t>{2, 1};
  Tensor a = dist::all_to_all_single(full({in[0] + in[1]}, r + 1.0), out, in);
  std::vector<float> want = r == 0 ? std::vector<float>{1, 2, 2, 2} : std::vector<float>{1, 1, 2};
  KILN_CHECK(a.to_vector<float>() == want, "[fault_test] all_to_all gave {}", a.to_vector<float>());
  Tensor m = r == 0 ? full({2}, 7.0) : zeros({2});
  if (r == 0)
    dist::send(m, 1);
  else
    dist::recv_(m, 0);
  KILN_CHECK(m.to_vector<float>() == std::vector<float>(2, 7.0f), "[fault_test] recv gave {}",
             m.to_vector<float>());
  dist::barrier();
}

const std::map<std::string, std::function<void()>>& scenarios() {
  static const std::map<std::string, std::function<void()>> s = {
      {"ops", different_ops},
      {"ops_detail", different_ops},
      {"sizes", different_sizes},
      {"sizes_detail", different_sizes},
      {"sizes_sim_detail", different_sizes_sim},
      {"skip", skip},
      {"skip_async", skip_async},
      {"sizes_async_detail", different_sizes_async},
      {"throw", throw_mid_step},
      {"throw_first", throw_first},
      {"throw_uncaught", throw_mid_step},
      {"kill", killed},
      {"guard", guard},
      {"guard_sim", guard_sim},
      {"setup_timeout", setup_timeout},
      {"detail_agree", detail_agree},
      {"exit_in_flight", exit_in_flight},
      {"skip_cuda", skip_cuda},
      {"skip_nccl_cuda", skip_cuda},
      {"sizes_nccl_cuda", different_sizes_cuda},
      {"sizes_cuda_detail", different_sizes_cuda},
      {"sizes_nccl_cuda_detail", different_sizes_cuda},
  };
  return s;
}

}  // namespace

int main(int argc, char** argv) {
  auto it = argc == 2 ? scenarios().find(argv[1]) : scenarios().end();
  if (it == scenarios().end()) {
    std::fprintf(stderr, "usage: %s SCENARIO (one of:", argv[0]);
    for (const auto& [name, fn] : scenarios()) std::fprintf(stderr, " %s", name.c_str());
    std::fprintf(stderr, ")\n");
    return 2;
  }
  // throw_uncaught: the exception leaves main (std::terminate), for the launcher to end the job.
  if (it->first == "throw_uncaught") {
    it->second();
    say("finished");
    return 0;
  }
  try {
    it->second();
  } catch (const NoGpu& e) {
    say("skipped: " + e.why);
    return 0;
  } catch (const DistributedError& e) {
    say(std::string("raised DistributedError: ") + e.what());
    return 1;
  } catch (const Error& e) {
    say(std::string("raised: ") + e.what());
    return 1;
  }
  say("finished");
  return 0;
}

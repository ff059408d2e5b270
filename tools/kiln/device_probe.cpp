#include "tools/kiln/device_probe.h"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <limits>

#include <fmt/format.h>

#include "kiln/compile/compile.h"
#include "kiln/distributed/init.h"
#include "kiln/ops/ops.h"

// Note [The device probe]
// Two compiled functions made before anything else the bench does, their graphs holding no
// collective and their memory never moving: `small` is kSmallSteps dependent elementwise kernels
// on 1024 floats (each under a microsecond: what it measures is the device's cost a
// kernel), `big` kBigSteps on 16M floats (bandwidth). report() times kRepeats batches of
// kReplays replays of each (fewer where a replay is slow), a synchronize ending each batch, and
// prints the fastest batch's time a replay. A probe that slows between two phases of the bench says
// the process runs every kernel slower from then on, whatever the graph, its buffers or its
// collectives; a step that slows while the probe does not says the step itself changed.
//
// What it found on two H200s (bench/gpu_runs.md, V1-V13): `gpt_ddp`'s order effect (its
// compiled step 12% slower after eager DDP steps) is this. The probe's `small` graph goes from
// 252-288 us to 306-342 (+0.18 us a kernel; `big` +1%) at the first large exchange on a stream
// other than the legacy default one: eager DDP's second step, or the 1st-3rd 12 MiB all-reduce
// of --probe-allreduces (NCCL, or the custom path's large kernels; its LL calls never), and it
// stays for the life of the process. NCCL's calls on the legacy stream never start it (12
// calls of 12 MiB, with or without a synchronize each), and a compiled step's exchanges (replays of
// its graph) do not either. With NCCL_CUMEM_ENABLE=0 the first NCCL call of any size starts it, on
// any stream. No NCCL setting tried stops it (NCCL_MEM_SYNC_DOMAIN=0, NCCL_SET_STACK_SIZE=1,
// NCCL_LOCAL_REGISTER=0, NCCL_PROTO=Simple, NCCL_ALGO=Tree, NCCL_LAUNCH_MODE=GROUP, 2
// channels), nor CUDA_MODULE_LOADING=EAGER or CUDA_DEVICE_MAX_CONNECTIONS=32; NCCL's debug log
// shows nothing new at the call that starts it. PyTorch's processes slow the same, by the same
// 0.18 us a kernel, from their first all-reduce (bench/torch_device_probe.py), so it lies below
// both frameworks (NCCL, the driver or the machine), not in Kiln's step. A 1-GPU run never
// exchanges, so it never pays it: DDP's scaling over one GPU carries it.
namespace kiln::workloads {

namespace {

constexpr int kSmallSteps = 150;  // two kernels each
constexpr int kBigSteps = 10;
constexpr int kReplays = 50;
constexpr int kRepeats = 3;
constexpr double kBatchSeconds = 0.1;

CompiledFunction chain(const Tensor& x, int steps, const std::string& name) {
  return compile(
      [x, steps] {
        Tensor y = x;
        for (int i = 0; i < steps; ++i) y = y * 0.999 + 0.001;
        return y;
      },
      {.name = name});
}

}  // namespace

struct DeviceProbe::Impl {
  Device device;
  Tensor small_x, big_x;
  CompiledFunction small, big;
  Impl(Device d)
      : device(d),
        small_x(zeros({1024}, {}, d)),
        big_x(zeros({int64_t{1} << 24}, {}, d)),
        small(chain(small_x, kSmallSteps, "probe_small")),
        big(chain(big_x, kBigSteps, "probe_big")) {
    for (int i = 0; i < 3; ++i) {  // warm-up, then capture, then a replay
      small({});
      big({});
    }
    synchronize(device);
  }
  // The fastest of kRepeats batches, each kReplays replays or as many as fit in kBatchSeconds
  // (at least one: sim runs the big graph on the host, a fraction of a second a replay).
  double replay_us(CompiledFunction& f) {
    using us = std::chrono::duration<double, std::micro>;
    auto t0 = std::chrono::steady_clock::now();
    f({});
    synchronize(device);
    const double one = us(std::chrono::steady_clock::now() - t0).count();
    const int replays =
        static_cast<int>(std::clamp(kBatchSeconds * 1e6 / one, 1.0, 1.0 * kReplays));
    double best = std::numeric_limits<double>::infinity();
    for (int r = 0; r < kRepeats; ++r) {
      t0 = std::chrono::steady_clock::now();
      for (int i = 0; i < replays; ++i) f({});
      synchronize(device);
      best = std::min(best, us(std::chrono::steady_clock::now() - t0).count() / replays);
    }
    return best;
  }
};

DeviceProbe::DeviceProbe(Device device) : impl_(std::make_unique<Impl>(device)) {}
DeviceProbe::~DeviceProbe() = default;

void DeviceProbe::report(const std::string& phase) {
  const double small = impl_->replay_us(impl_->small);
  const double big = impl_->replay_us(impl_->big);
  fmt::print(stderr, "probe rank {} {:<28} small {:8.1f} us ({} kernels), big {:8.1f} us\n",
             distributed::rank(), phase, small, 2 * kSmallSteps, big);
  std::fflush(stderr);
}

}  // namespace kiln::workloads

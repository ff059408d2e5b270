#include "tools/kiln/dist_workloads.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <memory>

#include <fmt/format.h>

#include "kiln/compile/compile.h"
#include "kiln/core/device.h"
#include "kiln/core/error.h"
#include "kiln/distributed/collectives.h"
#include "kiln/distributed/init.h"
#include "kiln/dtensor/dtensor.h"
#include "kiln/nn/layers.h"
#include "kiln/ops/ops.h"
#include "kiln/optim/optimizer.h"
#include "kiln/parallel/ddp.h"
#include "kiln/profiler/profiler.h"

#ifdef KILN_HAVE_MPI
#include <mpi.h>
#endif

// Note [Timing collectives]
// A collective's time on one rank includes waiting for the slowest peer, so every repeat starts
// from a barrier and the ranks time the same calls together. Each rank reports its own median
// over the repeats (torch_dist_anchor.py's timeit, whose rank 0 prints). Two implementations
// compared in one run (Kiln against a bare MPI loop) are interleaved repeat by repeat, A B, B A,
// ..., so that a neighbour's burst of load on this shared machine falls on both, and neither is
// always the one that runs second (with caches and the peer's timing as the other left them).
// On a machine with fewer cores than ranks (4 ranks on 2 cores) the ranks time-slice: latencies
// then measure the scheduler as much as MPI, and only the ratio of the two in the same run means
// something.
namespace kiln::workloads {

int64_t allreduce_iters(int64_t bytes, int64_t iters_4k) {
  // 4 KB: iters_4k; 256 KB: half; 4 MB: a tenth; 64 MB: a fortieth.
  int64_t divisor = bytes <= (4 << 10)     ? 1
                    : bytes <= (256 << 10) ? 2
                    : bytes <= (4 << 20)   ? 10
                                           : 40;
  return std::max<int64_t>(3, iters_4k / divisor);
}

std::string allreduce_key(int64_t bytes) { return fmt::format("allreduce_{}k", bytes >> 10); }

double busbw_GBs(int64_t bytes, double seconds, int ranks) {
  double algbw = static_cast<double>(bytes) / seconds / 1e9;
  return ranks > 1 ? algbw * 2.0 * (ranks - 1) / ranks : algbw;
}

std::vector<double> time_interleaved(int64_t iters, int repeats,
                                     const std::vector<std::function<void()>>& fns,
                                     const std::function<void()>& barrier) {
  const int64_t warm = std::min<int64_t>(iters, 5);
  for (const auto& fn : fns)
    for (int64_t i = 0; i < warm; ++i) fn();
  std::vector<std::vector<double>> runs(fns.size());
  for (int r = 0; r < repeats; ++r) {
    for (size_t k = 0; k < fns.size(); ++k) {
      // Each repeat starts with the next function: none is always the one after another.
      const size_t f = (k + static_cast<size_t>(r)) % fns.size();
      barrier();
      auto t0 = std::chrono::steady_clock::now();
      for (int64_t i = 0; i < iters; ++i) fns[f]();
      std::chrono::duration<double> dt = std::chrono::steady_clock::now() - t0;
      runs[f].push_back(dt.count() / static_cast<double>(iters));
    }
  }
  std::vector<double> medians;
  for (auto& v : runs) {
    std::sort(v.begin(), v.end());
    medians.push_back(v[v.size() / 2]);
  }
  return medians;
}

double local_mb(const TensorList& tensors) {
  double bytes = 0;
  for (const Tensor& t : tensors) {
    if (!t.defined()) continue;
    const Tensor local = dtensor::is_dtensor(t) ? dtensor::to_local(t) : t;
    bytes += static_cast<double>(local.numel()) * static_cast<double>(itemsize(local.dtype()));
  }
  return bytes / 1e6;
}

Device rank_device(Device requested) {
  if (requested.is_cpu() || requested.is_meta()) return requested;
  const DeviceInterface* d = device_interface(requested.type());
  const int count = d ? std::max(1, d->device_count()) : 1;
  return Device(requested.type(), distributed::local_rank() % count);
}

std::optional<double> peak_device_mb(Device device) {
  if (!counts_memory(device)) return std::nullopt;
  Tensor peak = full({1}, static_cast<double>(memory_stats(device).peak_allocated) / 1e6, kFloat64);
  distributed::all_reduce_(peak, distributed::ReduceOp::Max);
  return peak.item<double>();
}

std::vector<Metric> on_every_rank(const std::function<std::vector<Metric>()>& body) {
  try {
    return body();
  } catch (const std::exception& e) {
    if (distributed::world_size() > 1)
      distributed::abort_job(
          fmt::format("kiln: error on rank {}: {}", distributed::rank(), e.what()));
    throw;
  }
}

namespace {

constexpr int kRepeats = 12;  // a multiple of 2 and 3: each function leads equally often

// Element i of rank r's input: (r + 1) * (i % 7 + 1), exact in float32; the sum over n ranks is
// (i % 7 + 1) * n(n+1)/2.
void fill_input(float* p, int64_t n, int rank) {
  for (int64_t i = 0; i < n; ++i) p[i] = static_cast<float>((rank + 1) * (i % 7 + 1));
}
void check_sum(const float* p, int64_t n, int ranks, const char* who, int64_t bytes) {
  const int64_t tri = static_cast<int64_t>(ranks) * (ranks + 1) / 2;
  for (int64_t i = 0; i < n; ++i) {
    const float want = static_cast<float>((i % 7 + 1) * tri);
    KILN_CHECK(p[i] == want,
               "[bench allreduce] check failed: {} at {} bytes on {} ranks gave {} at element {}, "
               "want {}",
               who, bytes, ranks, p[i], i, want);
  }
}

std::vector<Metric> allreduce_on_every_rank(int64_t iters_4k,
                                            const std::vector<AllreduceImpl>& others) {
  const int rank = distributed::rank(), ranks = distributed::world_size();
  // The bare MPI loop runs only under a launcher (a world of one never initialises MPI), on a
  // communicator of its own, as Kiln's collectives have theirs.
  [[maybe_unused]] const bool mpi = distributed::mpi_active();
#ifdef KILN_HAVE_MPI
  MPI_Comm comm = MPI_COMM_NULL;
  if (mpi) MPI_Comm_dup(MPI_COMM_WORLD, &comm);
  auto barrier = [&] {
    if (mpi) MPI_Barrier(comm);
  };
#else
  auto barrier = [] {};
#endif
  std::vector<Metric> m;
  m.push_back({"world", static_cast<double>(ranks), "count", "ranks"});
  m.push_back({"threads", static_cast<double>(get_num_threads()), "count",
               "OpenMP threads a rank (the cross-memory all-reduce's, from 1 MiB)"});
  for (int64_t bytes : kAllreduceBytes) {
    const int64_t n = bytes / 4;
    Tensor t = empty({n});
    float* p = t.data<float>();
    fill_input(p, n, rank);
    distributed::all_reduce_(t);
    check_sum(p, n, ranks, "kiln all_reduce_", bytes);
    std::vector<std::function<void()>> fns = {[&] { distributed::all_reduce_(t); }};
    std::vector<std::string> names = {"kiln"}, whats = {"kiln all_reduce_"};
#ifdef KILN_HAVE_MPI
    const int count = static_cast<int>(n);
    auto bare = [&] { MPI_Allreduce(MPI_IN_PLACE, p, count, MPI_FLOAT, MPI_SUM, comm); };
    if (mpi) {
      fill_input(p, n, rank);
      bare();
      check_sum(p, n, ranks, "MPI_Allreduce", bytes);
      fns.push_back(bare);
      names.push_back("mpi");
      whats.push_back("bare MPI_Allreduce, same buffer");
    }
#endif
    for (const AllreduceImpl& other : others) {
      std::function<void()> fn = other.prepare(p, n);
      fill_input(p, n, rank);
      fn();
      check_sum(p, n, ranks, other.name.c_str(), bytes);
      fns.push_back(std::move(fn));
      names.push_back(other.name);
      whats.push_back(other.what);
    }
    // Zeros while timing: repeated sums of them neither overflow nor become denormal.
    std::fill(p, p + n, 0.0f);
    std::vector<double> s =
        time_interleaved(allreduce_iters(bytes, iters_4k), kRepeats, fns, barrier);
    const std::string key = allreduce_key(bytes);
    const std::string size =
        bytes < (1 << 20) ? fmt::format("{} KB", bytes >> 10) : fmt::format("{} MB", bytes >> 20);
    m.push_back({key + "_us", s[0] * 1e6, "us", whats[0] + " of " + size});
    m.push_back({key + "_busbw_GBs", busbw_GBs(bytes, s[0], ranks), "GB/s", "its bus bandwidth"});
    for (size_t i = 1; i < s.size(); ++i) {
      const std::string& name = names[i];
      m.push_back({name + "_" + key + "_us", s[i] * 1e6, "us", whats[i]});
      m.push_back({name + "_" + key + "_busbw_GBs", busbw_GBs(bytes, s[i], ranks), "GB/s",
                   "its bus bandwidth"});
      if (name == "mpi")
        m.push_back({key + "_over_mpi_us", (s[0] - s[i]) * 1e6, "us",
                     "kiln - MPI (target: within 5% or 2 us)"});
      m.push_back({key + "_vs_" + name, s[0] / s[i], "x", "kiln time / " + name + " time"});
    }
  }
#ifdef KILN_HAVE_MPI
  if (mpi) MPI_Comm_free(&comm);
#endif
  return m;
}

}  // namespace

std::vector<Metric> allreduce(const Options& o, const std::vector<AllreduceImpl>& others) {
  KILN_CHECK_DEVICE(o.device.is_cpu(), "[bench allreduce] times cpu tensors only, not {}",
                    o.device);
  KILN_CHECK(o.iters >= 0, "[bench] --iters must be positive, got {}", o.iters);
  distributed::init();
  return on_every_rank(
      [&] { return allreduce_on_every_rank(o.iters > 0 ? o.iters : 200, others); });
}

namespace {

// The mlp workload's model: 4 x (Linear 512, GELU) + Linear 512 -> 10, from `seed`, on `device`.
std::shared_ptr<nn::Sequential> mlp_model(uint64_t seed, Device device) {
  Generator gen(seed);
  nn::Init init{.gen = &gen};
  auto model = std::make_shared<nn::Sequential>();
  for (int i = 0; i < 4; ++i) {
    model->push_back(std::make_shared<nn::Linear>(512, 512, true, init));
    model->push_back(std::make_shared<nn::GELU>());
  }
  model->push_back(std::make_shared<nn::Linear>(512, 10, true, init));
  model->to(device);
  return model;
}

// Runs `step` a few times: the loss must stay finite and fall.
void check_falls(const char* what, const std::function<Tensor()>& step) {
  double first = step().item<double>(), last = first;
  for (int i = 1; i < 5; ++i) last = step().item<double>();
  KILN_CHECK(std::isfinite(first) && std::isfinite(last) && last < first,
             "[bench ddp] check failed: the {} loss went from {} to {} in 5 steps", what, first,
             last);
}

// The two steps the ddp workload compares, on fresh models: the mlp step in one process and
// under DDP (every rank's batch its own; the models start equal, and DDP broadcasts rank 0's
// parameters anyway).
struct DdpSteps {
  Device device;  // the batch's
  std::shared_ptr<nn::Sequential> local_model = mlp_model(0, device),
                                  ddp_model = mlp_model(0, device);
  parallel::DistributedDataParallel wrapped{*ddp_model};
  optim::AdamW local_opt{local_model->parameters(), optim::AdamWOptions{}};
  optim::AdamW ddp_opt{ddp_model->parameters(), optim::AdamWOptions{}};
  Tensor x, y;
  parallel::DDPSyncStats sums;  // of every eager DDP step's stats (syncs counts them)

  DdpSteps(const Tensor& x, const Tensor& y) : device(x.device()), x(x), y(y) {}
  Tensor local() {
    local_opt.zero_grad();
    Tensor loss = cross_entropy((*local_model)(x), y);
    loss.backward();
    local_opt.step();
    return loss;
  }
  Tensor ddp() {
    wrapped.zero_grad();  // one fill per bucket; each .grad stays a view of it
    Tensor loss = cross_entropy((*ddp_model)(x), y);
    loss.backward();
    ddp_opt.step();
    const parallel::DDPSyncStats& st = wrapped.stats();
    sums.syncs += 1;
    sums.overlap_ms += st.overlap_ms;
    sums.wait_ms += st.wait_ms;
    sums.comm_ms += st.comm_ms;
    return loss;
  }
};

// The mean time a replay of `step` spends in its all_reduce_ steps, from a profile of `calls`
// calls (after the timing: profiling adds its own cost).
double allreduce_ms_per_call(CompiledFunction& step, int calls,
                             const std::function<void()>& barrier) {
  profiler::Session session;
  for (int i = 0; i < calls; ++i) {
    barrier();
    step({});
  }
  double ns = 0;
  for (const profiler::Event& e : session.events())
    if (e.category == "replay" && e.name == "all_reduce_") ns += static_cast<double>(e.dur_ns);
  return ns / 1e6 / calls;
}

// On a device with streams every timed call ends with its synchronize (as the anchor's).
std::vector<Metric> ddp_on_every_rank(int64_t iters, Device device) {
  const int rank = distributed::rank(), ranks = distributed::world_size();
  Generator data(1000 + static_cast<uint64_t>(rank));
  Tensor x = randn({64, 512}, &data).to(device), y = randint(0, 10, {64}, &data).to(device);
  auto barrier = [] { distributed::barrier(); };
  const bool streams = has_streams(device);
  auto synced = [&](std::function<void()> fn) -> std::function<void()> {
    if (!streams) return fn;
    return [fn = std::move(fn), device] {
      fn();
      synchronize(device);
    };
  };

  DdpSteps eager(x, y);
  check_falls("local", [&] { return eager.local(); });
  check_falls("ddp", [&] { return eager.ddp(); });
  // The buckets' all-reduces alone, on tensors of their sizes (zeros: sums stay finite): the
  // floor of the overhead where backward cannot hide them (one core per rank).
  std::vector<Tensor> alone;
  for (const parallel::DDPBucket& b : eager.wrapped.buckets())
    alone.push_back(zeros({b.reduced_numel}, b.dtype, device));
  auto reduce_alone = [&] {
    for (const Tensor& t : alone) distributed::all_reduce_(t, distributed::ReduceOp::Avg);
  };
  eager.sums = {};
  std::vector<double> s = time_interleaved(
      iters, kRepeats,
      {synced([&] { eager.local(); }), synced([&] { eager.ddp(); }), synced(reduce_alone)},
      barrier);
  const double n = static_cast<double>(std::max<int64_t>(1, eager.sums.syncs));
  std::vector<Metric> m = {
      {"world", static_cast<double>(ranks), "count", "ranks"},
      {"mlp_step_local_us", s[0] * 1e6, "us", "mlp train step, one process (all ranks at once)"},
      {"mlp_step_ddp_us", s[1] * 1e6, "us", "the same step under DDP"},
      {"ddp_overhead", s[1] / s[0] - 1, "x", "ddp / local - 1 (target <= 0.15)"},
      {"ddp_buckets", static_cast<double>(eager.wrapped.buckets().size()), "count",
       "gradient buckets"},
      {"ddp_allreduce_alone_us", s[2] * 1e6, "us", "their all-reduces alone, outside a step"},
      {"ddp_allreduce_alone_share", s[2] / s[0], "x", "that / the local step"},
      {"ddp_overlap_ms", eager.sums.overlap_ms / n, "ms",
       "a step's all-reduces in flight during backward (mean)"},
      {"ddp_wait_ms", eager.sums.wait_ms / n, "ms", "waiting for them after backward (mean)"},
      {"ddp_comm_ms", eager.sums.comm_ms / n, "ms",
       "in collective calls during backward (mean): what backward could not hide"},
  };

  DdpSteps fresh(x, y);
  CompiledFunction local_c = compile([&] { return fresh.local().detach(); }, {.name = "local"});
  CompiledFunction ddp_c = compile([&] { return fresh.ddp().detach(); }, {.name = "ddp_step"});
  check_falls("compiled local", [&] { return local_c({})[0]; });
  check_falls("compiled ddp", [&] { return ddp_c({})[0]; });
  std::vector<double> c = time_interleaved(
      iters, kRepeats, {synced([&] { local_c({}); }), synced([&] { ddp_c({}); })}, barrier);
  m.push_back({"mlp_step_local_compiled_us", c[0] * 1e6, "us", "the local step, compiled"});
  m.push_back({"mlp_step_ddp_compiled_us", c[1] * 1e6, "us", "the DDP step, compiled"});
  m.push_back({"ddp_compiled_overhead", c[1] / c[0] - 1, "x", "compiled ddp / local - 1"});
  if (!streams)  // elsewhere a replay is one device graph: its steps are not profiled apart
    m.push_back({"ddp_compiled_allreduce_ms", allreduce_ms_per_call(ddp_c, 10, barrier), "ms",
                 "a compiled step's replayed all_reduce_ steps (mean of 10 profiled calls)"});
  return m;
}

}  // namespace

std::vector<Metric> ddp(const Options& o) {
  KILN_CHECK(o.iters >= 0, "[bench] --iters must be positive, got {}", o.iters);
  distributed::init();
  return on_every_rank(
      [&] { return ddp_on_every_rank(o.iters > 0 ? o.iters : 10, rank_device(o.device)); });
}

}  // namespace kiln::workloads

#include "tools/kiln/dtensor_workload.h"

#include <algorithm>
#include <chrono>
#include <functional>
#include <string>

#include <fmt/format.h>

#include "kiln/core/device.h"
#include "kiln/core/error.h"
#include "kiln/distributed/collectives.h"
#include "kiln/distributed/init.h"
#include "kiln/dtensor/dtensor.h"
#include "kiln/dtensor/redistribute.h"
#include "kiln/ops/ops.h"
#include "tools/kiln/dist_workloads.h"

// Note [Timing the Sharded layer]
// What issue 15 bounds is the Sharded layer's cost on top of the local op, so each DTensor op is
// timed beside the same op on its local tensors, in pairs of repeats whose order alternates
// (DTensor first, then plain first, ...), and the overhead is the median of the paired
// differences: a neighbour's burst of load on this shared machine falls on both halves of a
// pair, and drift between pairs cancels. On the meta device the local op does no arithmetic, so
// the difference there is the layer's cost alone, without the cache effects of a real kernel.
// No op here communicates (the anchor's calls: add of two Shard(0), Shard(0) @ Replicate, sum to
// Partial), so the ranks only start each repeat together, from a barrier, and otherwise time
// independently; rank 0 reports its own medians. Each result is checked before timing: the
// DTensor's local result must equal the plain op's bitwise. On a device with streams (cuda, sim)
// each rank uses the device of its local rank, and every timed loop ends with a synchronize of
// it, as torch_dist_anchor.py's `timeit` does (so a per-call time there is the host's or the
// device's, whichever is longer).
namespace kiln::workloads {

namespace {

namespace dt = kiln::dtensor;

constexpr int kRepeats = 16;  // pairs; each order leads in half of them
constexpr int64_t kDefaultIters = 2000;

struct Timed {
  double a, b, diff;  // medians in seconds per call: a, b, and a - b paired
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

// See Note [Timing the Sharded layer].
Timed time_pair(int64_t iters, Device device, const std::function<void()>& a,
                const std::function<void()>& b) {
  const bool many = distributed::world_size() > 1;
  const bool streams = has_streams(device);
  auto seconds = [&](const std::function<void()>& fn) {
    if (many) distributed::barrier();
    auto t0 = std::chrono::steady_clock::now();
    for (int64_t i = 0; i < iters; ++i) fn();
    if (streams) synchronize(device);
    std::chrono::duration<double> dt = std::chrono::steady_clock::now() - t0;
    return dt.count() / static_cast<double>(iters);
  };
  for (int64_t i = 0; i < std::min<int64_t>(iters, 200); ++i) a(), b();
  std::vector<double> as, bs, diffs;
  for (int r = 0; r < kRepeats; ++r) {
    double ta, tb;
    if (r % 2 == 0) {
      ta = seconds(a), tb = seconds(b);
    } else {
      tb = seconds(b), ta = seconds(a);
    }
    as.push_back(ta), bs.push_back(tb), diffs.push_back(ta - tb);
  }
  return {median(as), median(bs), median(diffs)};
}

struct OpCase {
  std::string name;
  std::function<Tensor(const Tensor& x, const Tensor& y)> fn;  // y: the second operand
};

std::vector<OpCase> op_cases() {
  return {
      {"add", [](const Tensor& x, const Tensor&) { return add(x, x); }},
      {"mm", [](const Tensor& x, const Tensor& y) { return mm(x, y); }},
      {"detach", [](const Tensor& x, const Tensor&) { return x.detach(); }},
      {"relu", [](const Tensor& x, const Tensor&) { return relu(x); }},
      {"sum", [](const Tensor& x, const Tensor&) { return sum(x); }},
  };
}

// The ops on DTensors `x` (and `y`, Replicate, for mm) against the same ops on their local
// tensors. `prefix` starts every key ("" or "meta_"); `suffix` ends the op name ("" or "_r").
void time_ops(const Tensor& x, const Tensor& y, const std::string& prefix,
              const std::string& suffix, const std::string& what, int64_t iters,
              std::vector<Metric>& m) {
  const Tensor &lx = dt::to_local(x), &ly = dt::to_local(y);
  const bool real = !lx.device().is_meta();
  for (const OpCase& c : op_cases()) {
    const std::string key = c.name + suffix;
    try {
      Tensor got = c.fn(x, y);
      KILN_CHECK(dt::is_dtensor(got),
                 "[bench dtensor] check failed: {} of a DTensor gave a plain "
                 "tensor",
                 key);
      Tensor want = c.fn(lx, ly);
      KILN_CHECK(dt::to_local(got).sizes() == want.sizes() &&
                     (!real || equal(dt::to_local(got).to(Device(kCPU)), want.to(Device(kCPU)))),
                 "[bench dtensor] check failed: {}{}'s local result differs from the plain op's",
                 prefix, key);
    } catch (const NotImplementedError& e) {
      const std::string why = e.what();  // "[op] has no sharding rule; inputs: ..."
      m.push_back({prefix + "dtensor_" + key + "_missing", 1, "count",
                   "not timed: " + why.substr(0, why.find(';'))});
      continue;
    }
    Timed t = time_pair(
        iters, lx.device(), [&] { c.fn(x, y); }, [&] { c.fn(lx, ly); });
    m.push_back({prefix + "dtensor_" + key + "_us", t.a * 1e6, "us",
                 fmt::format("{} on {}", c.name, what)});
    m.push_back(
        {prefix + "plain_" + key + "_us", t.b * 1e6, "us", "the same on its local tensors"});
    m.push_back({prefix + "dtensor_" + key + "_overhead_us", t.diff * 1e6, "us",
                 "DTensor - plain, paired medians (target <= 1 us)"});
  }
}

std::vector<Metric> dtensor_on_every_rank(const Options& o) {
  const int64_t iters = o.iters > 0 ? o.iters : kDefaultIters;
  const int64_t world = distributed::world_size();
  std::vector<Metric> m;
  m.push_back({"world", static_cast<double>(world), "count", "ranks in the mesh"});
  for (Device device : {rank_device(o.device), Device(kMeta)}) {
    const dt::DeviceMesh& mesh = dt::init_device_mesh(device, {world});
    const std::string prefix = device.is_meta() ? "meta_" : "";
    // The anchor's tensors: A is Shard(0) of a (64 * world) x 64 tensor, R a Replicate 64 x 64.
    Generator shard_gen(static_cast<uint64_t>(distributed::rank()) + 1), same_gen(0);
    Tensor a = randn({64, 64}, &shard_gen).to(device), r = randn({64, 64}, &same_gen).to(device);
    Tensor A = dt::from_local(a, mesh, {dt::Shard(0)});
    Tensor R = dt::from_local(r, mesh, {dt::Replicate()});
    const std::string where =
        fmt::format("64x64 float32 per rank, {}-rank {} mesh", world, device.str());
    time_ops(A, R, prefix, "", "Shard(0), " + where, iters, m);
    time_ops(R, R, prefix, "_r", "Replicate, " + where, iters, m);
    if (device.is_meta()) continue;
    // The anchor's redistribute: Shard(0) -> Replicate (an all-gather), against the bare
    // all-gather of the local shard (collective: every rank runs the same loops).
    const int64_t n = std::max<int64_t>(iters / 20, 10);
    Timed t = time_pair(
        n, device, [&] { (void)dt::redistribute(A, {dt::Replicate()}); },
        [&] { (void)distributed::all_gather_into_tensor(a, &mesh.group(0)); });
    m.push_back({"dtensor_redistribute_s0_to_r_us", t.a * 1e6, "us",
                 "redistribute Shard(0) -> Replicate, " + where});
    m.push_back({"plain_all_gather_us", t.b * 1e6, "us", "all_gather_into_tensor of the shard"});
  }
  return m;
}

}  // namespace

std::vector<Metric> dtensor(const Options& o) {
  KILN_CHECK(o.iters >= 0, "[bench] --iters must be positive, got {}", o.iters);
  distributed::init();
  return on_every_rank([&] { return dtensor_on_every_rank(o); });
}

}  // namespace kiln::workloads

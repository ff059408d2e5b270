// Issue 18's collective sweep, Kiln side: all_reduce, all_gather and reduce_scatter of float32
// device tensors from 8 B to 1 GiB (every fourfold size), one process per device, with
// nccl-tests' bus bandwidth; and the all-reduce at 8 B to 8 MiB with the custom all-reduce
// forced on and forced off (NCCL), eager and captured (a compiled call of 10 chained
// all-reduces, replayed as one graph). PyTorch's side is bench/torch_collectives.py.
//   scripts/mpirun.sh N build/release/bench/kiln_collectives_bench [--device cuda|sim]
//       [--max-bytes B] [--json FILE] [--smoke] [--custom-only] [--extra-bytes B,B,...]
// Each rank uses <device>:<its local rank>. Every result is checked before it is timed (the
// ranks' values are known, so the sums and gathers are exact), every timed call ends with a
// device synchronize, and each repeat starts from a barrier (Note [Timing collectives] in
// tools/kiln/dist_workloads.cpp), and checked again after; rank 0 prints. The timed all-reduces
// average (their values stay bounded). Sizes are the message each rank sends
// (all_reduce and reduce_scatter) or receives (all_gather), as nccl-tests counts them; busbw is
// algbw * 2(n-1)/n for all_reduce and algbw * (n-1)/n for the other two (algbw alone on one
// rank). Sizes: 8 B, then 16 B times powers of 4 (1 GiB is one). --smoke: sizes up to 64 KiB,
// 2 calls, results checked, no timing claimed. --custom-only skips the bandwidth sweep;
// --extra-bytes adds sizes to the custom-against-library comparison (DDP's bucket sizes, say).
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "bench/main_guard.h"
#include "kiln/backend/backend.h"
#include "kiln/compile/compile.h"
#include "kiln/core/error.h"
#include "kiln/distributed/collectives.h"
#include "kiln/distributed/init.h"
#include "kiln/distributed/shm_allreduce.h"
#include "kiln/ops/ops.h"
#include "tools/kiln/dist_workloads.h"

using namespace kiln;
namespace dist = kiln::distributed;

namespace {

constexpr int kChained = 10;  // all-reduces in one captured call

struct Args {
  std::string device = "cuda";
  int64_t max_bytes = int64_t{1} << 30;
  const char* json = nullptr;
  bool smoke = false;
  bool custom_only = false;    // only the custom all-reduce against the library
  std::vector<int64_t> extra;  // sizes (bytes) compared besides the sweep's
};

// Calls a repeat at `bytes`: enough to outlast a launch's noise, few for the large messages.
int64_t iters_at(int64_t bytes, bool smoke) {
  if (smoke) return 2;
  if (bytes <= (int64_t{1} << 20)) return 50;
  if (bytes <= (int64_t{64} << 20)) return 10;
  return 3;
}

// 8 B, then 16 B times every power of 4, up to `max`, and `max` itself: 8 B to 1 GiB, or to
// the custom all-reduce's 8 MiB.
std::vector<int64_t> sizes_up_to(int64_t max) {
  std::vector<int64_t> v;
  if (max >= 8) v.push_back(8);
  for (int64_t b = 16; b <= max; b *= 4) v.push_back(b);
  if (!v.empty() && v.back() < max) v.push_back(max);
  return v;
}

std::string size_key(int64_t bytes) {
  if (bytes >= (int64_t{1} << 30)) return fmt::format("{}g", bytes >> 30);
  if (bytes >= (int64_t{1} << 20)) return fmt::format("{}m", bytes >> 20);
  if (bytes >= (int64_t{1} << 10)) return fmt::format("{}k", bytes >> 10);
  return fmt::format("{}b", bytes);
}

// i % 7 for i in [first, first + n), as float32: the indices are int64, since float32 holds
// integers exactly only up to 2^24 (a 64 MiB tensor) and the sweep goes to 1 GiB. Made on the
// device the collectives run on, where the checks run too: on the host, one thread a rank, the
// checks of the 1 GiB messages took minutes.
Tensor mod7(int64_t first, int64_t n, Device d) {
  return remainder(arange(first, first + n, 1, kInt64, d), 7).to(kFloat32);
}

// Rank r's values: r + 1 + i % 7 (exact in float32 sums at any size here).
Tensor rank_values(int64_t n, int rank, Device d) {
  return add(mod7(0, n, d), static_cast<double>(rank + 1));
}

std::vector<std::string> split_commas(const std::string& s) {
  std::vector<std::string> out;
  size_t start = 0;
  for (size_t comma; (comma = s.find(',', start)) != std::string::npos; start = comma + 1)
    out.push_back(s.substr(start, comma - start));
  out.push_back(s.substr(start));
  return out;
}

void check(bool ok, const std::string& what) {
  KILN_CHECK(ok, "[collectives_bench] check failed: {}", what);
}

int run(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg == "--device" && i + 1 < argc) {
      a.device = argv[++i];
    } else if (arg == "--max-bytes" && i + 1 < argc) {
      a.max_bytes = std::atoll(argv[++i]);
    } else if (arg == "--json" && i + 1 < argc) {
      a.json = argv[++i];
    } else if (arg == "--smoke") {
      a.smoke = true;
    } else if (arg == "--custom-only") {
      a.custom_only = true;
    } else if (arg == "--extra-bytes" && i + 1 < argc) {
      for (const std::string& b : split_commas(argv[++i])) {
        const int64_t v = std::atoll(b.c_str());
        if (v <= 0 || v % 4 != 0) {
          fmt::print(stderr,
                     "kiln_collectives_bench: --extra-bytes takes positive multiples of "
                     "4 (float32), got '{}'\n",
                     b);
          return 2;
        }
        a.extra.push_back(v);
      }
    } else {
      fmt::print(stderr,
                 "kiln_collectives_bench: unknown argument '{}' (--device D, --max-bytes B, "
                 "--json FILE, --smoke, --custom-only, --extra-bytes B,B,...)\n",
                 arg);
      return 2;
    }
  }
  try {
    load_backend(a.device == "cuda" ? "cuda" : a.device);
  } catch (const Error& e) {
    fmt::print("kiln_collectives_bench: skipped: {}\n", e.what());
    return 0;
  }
  dist::init();
  const int rank = dist::rank(), ranks = dist::world_size();
  const Device dev(a.device + ":" + std::to_string(dist::local_rank()));
  if (a.smoke) a.max_bytes = std::min<int64_t>(a.max_bytes, 64 << 10);
  auto barrier = [] { dist::barrier(); };
  // nccl-tests' factors from algbw to busbw (1 on a single rank).
  const double ring = ranks > 1 ? static_cast<double>(ranks - 1) / ranks : 1.0;
  const double ring2 = ranks > 1 ? 2 * ring : 1.0;
  nlohmann::ordered_json j;
  j["world"] = ranks;
  j["device"] = dev.str();
  // Each result is printed (rank 0) as soon as it is measured, so that a run stopped by a time
  // limit still shows what it measured.
  auto record = [&](const std::string& key, double v) {
    j[key] = v;
    if (rank == 0) {
      fmt::print("  {:<44} {:12.3f}\n", key, v);
      std::fflush(stdout);
    }
  };
  // Times fn (iters calls a repeat, each ending with a device synchronize): seconds per call.
  auto timed = [&](int64_t iters, const std::function<void()>& fn) {
    return workloads::time_interleaved(iters, a.smoke ? 1 : 5, {[&] {
                                         fn();
                                         synchronize(dev);
                                       }},
                                       barrier)[0];
  };
  const double sum_ranks = ranks * (ranks + 1) / 2.0;  // Σ (r + 1)
  // The mean over ranks of r + 1 + i % 7: what Avg gives, and keeps giving when repeated.
  auto mean_values = [&](int64_t n) { return add(mod7(0, n, dev), (ranks + 1) / 2.0); };
  // Repeated averages over a rank count that is not a power of 2 may drift by rounding.
  auto near = [](const Tensor& got, const Tensor& want) { return allclose(got, want, 1e-4, 1e-4); };
  for (int64_t bytes : a.custom_only ? std::vector<int64_t>{} : sizes_up_to(a.max_bytes)) {
    const int64_t n = bytes / 4, iters = iters_at(bytes, a.smoke);
    const std::string k = size_key(bytes);
    // all_reduce: element i sums to Σ (r + 1 + i % 7).
    Tensor x = rank_values(n, rank, dev);
    Tensor want = add(mul(mod7(0, n, dev), static_cast<double>(ranks)), sum_ranks);
    dist::all_reduce_(x);
    check(equal(x, want), "all_reduce of " + k);
    // Timed as Avg of the same values, which stay bounded however often it runs.
    Tensor y = rank_values(n, rank, dev);
    double s = timed(iters, [&] { dist::all_reduce_(y, dist::ReduceOp::Avg); });
    check(near(y, mean_values(n)), "timed all_reduce of " + k);
    record("all_reduce_" + k + "_us", s * 1e6);
    record("all_reduce_" + k + "_busbw_GBs", bytes / s / 1e9 * ring2);
    // all_gather: each rank sends bytes / ranks (whole elements), receives bytes.
    const int64_t part = std::max<int64_t>(1, n / ranks);
    Tensor piece = rank_values(part, rank, dev);
    Tensor gathered = dist::all_gather_into_tensor(piece);
    TensorList chunks;
    for (int r = 0; r < ranks; ++r) chunks.push_back(rank_values(part, r, dev));
    const Tensor all = cat(chunks, 0);
    chunks.clear();
    check(equal(gathered, all), "all_gather of " + k);
    s = timed(iters, [&] { dist::all_gather_into_tensor_out(gathered, piece); });
    check(equal(gathered, all), "timed all_gather of " + k);
    record("all_gather_" + k + "_us", s * 1e6);
    record("all_gather_" + k + "_busbw_GBs", part * ranks * 4.0 / s / 1e9 * ring);
    // reduce_scatter: each rank sends part * ranks elements, keeps the sum of its part.
    Tensor whole = rank_values(part * ranks, rank, dev);
    Tensor mine = dist::reduce_scatter_tensor(whole);
    // Element j of this rank's part sums r + 1 + (rank * part + j) % 7 over the ranks.
    Tensor mine_want =
        add(mul(mod7(rank * part, part, dev), static_cast<double>(ranks)), sum_ranks);
    check(equal(mine, mine_want), "reduce_scatter of " + k);
    s = timed(iters, [&] { dist::reduce_scatter_tensor_out(mine, whole); });
    record("reduce_scatter_" + k + "_us", s * 1e6);
    record("reduce_scatter_" + k + "_busbw_GBs", part * ranks * 4.0 / s / 1e9 * ring);
  }
  // The custom all-reduce against the library path (NCCL on cuda), eager and captured.
  // --extra-bytes sizes are keyed by their bytes (above the custom path's capacity both modes
  // take the library).
  const int64_t custom_max = std::min<int64_t>(a.max_bytes, 8 << 20);
  std::vector<std::pair<int64_t, std::string>> compared;
  for (int64_t bytes : sizes_up_to(custom_max)) compared.emplace_back(bytes, size_key(bytes));
  for (int64_t bytes : a.extra) compared.emplace_back(bytes, std::to_string(bytes));
  const std::pair<dist::CustomAllReduceMode, const char*> paths[] = {
      {dist::CustomAllReduceMode::On, "custom"}, {dist::CustomAllReduceMode::Off, "library"}};
  for (const auto& [bytes, k] : compared) {
    const int64_t n = bytes / 4, iters = iters_at(bytes, a.smoke);
    // Eager, the two paths interleaved repeat by repeat (Note [Timing collectives]): their
    // ratio is the target, and timed one after the other a burst of the host's load fell on one
    // only (bench/gpu_runs.md U3: 1.26 at 1 KiB between 1.78 and 2.19).
    Tensor xs[2] = {rank_values(n, rank, dev), rank_values(n, rank, dev)};
    std::vector<std::function<void()>> eager;
    for (int p = 0; p < 2; ++p)
      eager.push_back([&, p] {
        dist::set_custom_all_reduce_mode(paths[p].first);
        dist::all_reduce_(xs[p], dist::ReduceOp::Avg);
        synchronize(dev);
      });
    const std::vector<double> eager_s =
        workloads::time_interleaved(iters, a.smoke ? 1 : 7, eager, barrier);
    for (int p = 0; p < 2; ++p) {
      record(fmt::format("all_reduce_{}_{}_us", paths[p].second, k), eager_s[p] * 1e6);
      check(near(xs[p], mean_values(n)), fmt::format("{} all_reduce of {}", paths[p].second, k));
    }
    for (auto [mode, name] : paths) {
      dist::set_custom_all_reduce_mode(mode);
      CompiledFunction chain = compile(
          [](const Tensor& in) {
            Tensor y = in;
            for (int c = 0; c < kChained; ++c) y = dist::all_reduce(y, dist::ReduceOp::Avg);
            return y;
          },
          {.name = fmt::format("all_reduce_chain_{}", name), .static_inputs = {0}});
      Tensor in = rank_values(n, rank, dev);
      for (int call = 0; call < 3; ++call)  // trace, warm-up, capture
        check(near(chain({in})[0], mean_values(n)),
              fmt::format("captured {} all_reduce of {}", name, k));
      record(fmt::format("all_reduce_{}_{}_captured_us", name, k),
             timed(iters, [&] { chain({in}); }) * 1e6 / kChained);
    }
    dist::set_custom_all_reduce_mode(dist::CustomAllReduceMode::Auto);
  }
  if (rank == 0 && a.json) std::ofstream(a.json) << j.dump(1) << "\n";
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return kiln::bench::guarded_main("kiln_collectives_bench", run, argc, argv);
}

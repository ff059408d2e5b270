// `kiln bench`: BENCHMARKS.md's workloads (tools/kiln/workloads.h) as a table or as JSON with
// torch_anchor.py's keys.
#include <cstdio>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "kiln/core/error.h"
#include "kiln/distributed/init.h"
#include "kiln/ops/ops.h"
#include "tools/kiln/commands.h"
#include "tools/kiln/workloads.h"

#ifndef KILN_VERSION_STRING
#error "KILN_VERSION_STRING must be defined by the build"
#endif

namespace kiln::tool {

int run_bench(const BenchOptions& o) {
  Common common = apply_common(o.common);
  int threads = common.threads;
  const workloads::Workload* w = workloads::find(o.workload);
  KILN_CHECK(w, "[bench] unknown workload '{}'", o.workload);
  KILN_CHECK(o.iters >= 0, "[bench] --iters must be positive, got {}", o.iters);
  KILN_CHECK(!o.small || w->name == "gpt", "[bench] --small applies only to the gpt workload");
  KILN_CHECK(o.amp.empty() || w->name.rfind("gpt", 0) == 0,
             "[bench] --amp applies only to the gpt workloads (gpt, gpt_large, gpt_*_ddp|tp|fsdp)");
  const bool ddp = w->name.ends_with("_ddp");
  KILN_CHECK(ddp || (o.bucket_mb == 0 && !o.no_sync),
             "[bench] --bucket-mb and --no-sync apply only to gpt_ddp and gpt_large_ddp");
  const bool parallel_gpt = w->name.rfind("gpt", 0) == 0 &&
                            (ddp || w->name.ends_with("_tp") || w->name.ends_with("_fsdp"));
  KILN_CHECK(
      !o.pipelined || parallel_gpt,
      "[bench] --pipelined applies only to the distributed gpt workloads (gpt_*_ddp|tp|fsdp)");
  KILN_CHECK(!o.explain || parallel_gpt,
             "[bench] --explain applies only to the distributed gpt workloads (gpt_*_ddp|tp|fsdp)");
  KILN_CHECK(!o.explain || workloads::has_graphs(common.device),
             "[bench] --explain prints the compiled step, which runs only on a device with "
             "graphs (cuda, sim), not {}",
             common.device);
  KILN_CHECK(!o.compiled_only || (parallel_gpt && workloads::has_graphs(common.device)),
             "[bench] --compiled-only applies only to the distributed gpt workloads "
             "(gpt_*_ddp|tp|fsdp) on a device with graphs (cuda, sim), not {} on {}",
             w->name, common.device);
  KILN_CHECK(!o.probe || (parallel_gpt && workloads::has_graphs(common.device)),
             "[bench] --probe applies only to the distributed gpt workloads (gpt_*_ddp|tp|fsdp) "
             "on a device with graphs (cuda, sim), not {} on {}",
             w->name, common.device);
  KILN_CHECK(o.probe_allreduces >= 0 && (o.probe || o.probe_allreduces == 0),
             "[bench] --probe-allreduces needs --probe and must not be negative, got {}",
             o.probe_allreduces);
  KILN_CHECK(o.bucket_mb >= 0, "[bench] --bucket-mb must not be negative, got {}", o.bucket_mb);
  int64_t iters = o.iters > 0 ? o.iters : w->default_iters;
  if (!common.device.is_cpu()) set_allow_tf32(true);  // as torch_anchor.py sets it
  if (o.math_attention) set_fused_attention(false);
  std::vector<workloads::Metric> metrics = w->run({.iters = iters,
                                                   .small = o.small,
                                                   .device = common.device,
                                                   .amp = o.amp,
                                                   .bucket_mb = o.bucket_mb,
                                                   .no_sync = o.no_sync,
                                                   .pipelined = o.pipelined,
                                                   .explain = o.explain,
                                                   .compiled_only = o.compiled_only,
                                                   .probe = o.probe,
                                                   .probe_allreduces = o.probe_allreduces});
  // Under mpirun (the distributed workloads) every rank times and rank 0 reports.
  if (distributed::is_initialized() && distributed::rank() != 0) return 0;

  if (o.json) {
    nlohmann::ordered_json j;
    j["workload"] = w->name;
    for (const auto& m : metrics) {
      if (m.unit == "count")
        j[m.key] = static_cast<int64_t>(m.value);
      else
        j[m.key] = m.value;
    }
    j["iters"] = iters;
    j["threads"] = threads;
    j["device"] = common.device.str();
    j["kiln"] = KILN_VERSION_STRING;
    fmt::print("{}\n", j.dump(1));
    return 0;
  }
  fmt::print("kiln bench {} ({}; {} iters, threads {}, {})\n", w->name, w->description, iters,
             threads, common.device);
  for (const auto& m : metrics) {
    std::string value = m.unit == "count" ? fmt::format("{:.0f}", m.value)
                                          : fmt::format("{:.3f} {}", m.value, m.unit);
    // Host costs below a microsecond read better in nanoseconds.
    if (m.unit == "us" && m.value < 1) value += fmt::format(" ({:.0f} ns)", m.value * 1e3);
    fmt::print("  {:<24} {:>22}   {}\n", m.key, value, m.what);
  }
  return 0;
}

}  // namespace kiln::tool

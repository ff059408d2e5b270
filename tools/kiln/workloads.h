#pragma once
// The Kiln side of BENCHMARKS.md's shared workloads (the definitions of
// ../shared/anchors/torch_anchor.py, with the same sizes and result keys). Each workload checks
// its result before timing and throws kiln::Error when the check fails.
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "kiln/core/device.h"

namespace kiln::nn {
struct GPTConfig;  // kiln/nn/transformer.h
}

namespace kiln::workloads {

// One reported number: `key` as in torch_anchor.py's JSON where the workload exists there.
struct Metric {
  std::string key;
  double value;
  std::string unit;  // "us", "us/op", "count", ...
  std::string what;  // a few words for a human table
};

struct Options {
  int64_t iters = 0;   // timed iterations per repeat; 0: the workload's default
  bool small = false;  // gpt only: width 128 instead of 256, reported under other keys
  // Where the work runs. On a device with graphs (cuda) chain, adamw, mlp and gpt are also
  // timed compiled, replaying captured device graphs (keys ending in _graph_us).
  Device device = Device(kCPU);
  // gpt and gpt_large: "bf16" runs the forward and the loss under bfloat16 autocast (float32
  // master weights), reported under keys with _bf16 after the workload's name.
  std::string amp;
  // gpt_ddp, gpt_large_ddp: DDP's bucket cap in MiB (0: the default), and backward under
  // no_sync() (no all-reduces). Either reports under keys of its own.
  double bucket_mb = 0;
  bool no_sync = false;
  // The distributed GPT steps: timed back to back, synchronized once a repeat (keys gain
  // _pipelined), not each step.
  bool pipelined = false;
  // The distributed GPT steps: rank 0 prints the compiled step's explain() to stderr.
  bool explain = false;
  // The distributed GPT steps: no eager model first (its steps, and their collectives, do not
  // run before the compiled one's; no eager keys).
  bool compiled_only = false;
  // The distributed GPT steps: a fixed compiled function timed between the phases (Note [The
  // device probe] in device_probe.cpp), one line a rank and phase on stderr.
  bool probe = false;
  // With probe: before the models, this many eager all-reduces of 4 KiB, then of 12 MiB, the
  // probe after the first of each and after the last.
  int64_t probe_allreduces = 0;
};

struct Workload {
  std::string name;
  std::string description;
  int64_t default_iters;
  std::function<std::vector<Metric>(const Options&)> run;
};

// dispatch, chain, adamw, mlp, gpt (all but dispatch also on an accelerator), gpt_large, conv
// and cnn (cnn_workload.h), and
// the distributed allreduce and ddp (dist_workloads.h), dtensor (dtensor_workload.h) and tp
// (tp_workload.h).
const std::vector<Workload>& all();
// nullptr when there is no workload of that name.
const Workload* find(const std::string& name);

// Whether `d`'s backend captures device graphs (compiled steps replay them there).
bool has_graphs(Device d);
// Whether work on `d` is queued on streams (sim, CUDA): a timed call ends with a synchronize.
bool has_streams(Device d);
// gpt_large's model: width 768, 12 layers, 12 heads, context 1024, vocab 512 (issue 6's size).
nn::GPTConfig gpt_large_config();

// Median over `repeats` runs of the seconds per call of `iters` calls to fn, after `warm`
// untimed calls; on an asynchronous device each run ends when the device has finished.
double time_per_call(int64_t iters, int repeats, int64_t warm, const std::function<void()>& fn,
                     Device device);

}  // namespace kiln::workloads

#pragma once
// Timing shared by the benchmarks: the median, over `repeats` runs of `iters` calls, of the
// mean seconds per call of `fn`, after `warmup` untimed calls; and the same for several
// functions timed in alternation (interleaved_seconds_per_call).
#include <algorithm>
#include <chrono>
#include <functional>
#include <vector>

namespace kiln::bench {

inline double median_seconds_per_call(const std::function<void()>& fn, int iters, int repeats,
                                      int warmup) {
  for (int i = 0; i < warmup; ++i) fn();
  std::vector<double> runs;
  for (int r = 0; r < repeats; ++r) {
    auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < iters; ++i) fn();
    auto t1 = std::chrono::steady_clock::now();
    runs.push_back(std::chrono::duration<double>(t1 - t0).count() / iters);
  }
  std::sort(runs.begin(), runs.end());
  return runs[runs.size() / 2];
}

// Note [Interleaved timing]
// On a shared machine (CI's and this project's 2-core VMs) the speed a process gets drifts over
// seconds. Timing A's runs, then B's, lets that drift into A / B. Here each round runs `iters`
// calls of every function in turn, and a function's ratio to the first is the median over
// rounds of the two runs' ratio, so a slow spell slows both sides of a ratio; the range of the
// rounds' ratios says how far to trust it. (On the 2-core VM, a step that runs 2 OpenMP threads
// still swings 2x from round to round, on both sides: a thread that the host preempts holds up
// its team. One thread per side gives rounds within a few percent of each other.)
struct Interleaved {
  std::vector<double> seconds_per_call;      // per function: the median over rounds
  std::vector<double> ratio_to_first;        // per function: the median over rounds of t_i / t_0
  std::vector<double> ratio_min, ratio_max;  // per function: the range of t_i / t_0 over rounds
};

inline Interleaved interleaved_seconds_per_call(const std::vector<std::function<void()>>& fns,
                                                int iters, int rounds, int warmup) {
  for (const auto& fn : fns)
    for (int i = 0; i < warmup; ++i) fn();
  const size_t n = fns.size();
  std::vector<std::vector<double>> secs(n), ratios(n);
  for (int r = 0; r < rounds; ++r) {
    std::vector<double> t(n);
    for (size_t f = 0; f < n; ++f) {
      auto t0 = std::chrono::steady_clock::now();
      for (int i = 0; i < iters; ++i) fns[f]();
      t[f] = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / iters;
      secs[f].push_back(t[f]);
    }
    for (size_t f = 0; f < n; ++f) ratios[f].push_back(t[f] / t[0]);
  }
  auto median = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  };
  Interleaved out;
  for (size_t f = 0; f < n; ++f) {
    out.seconds_per_call.push_back(median(secs[f]));
    out.ratio_to_first.push_back(median(ratios[f]));
    out.ratio_min.push_back(*std::min_element(ratios[f].begin(), ratios[f].end()));
    out.ratio_max.push_back(*std::max_element(ratios[f].begin(), ratios[f].end()));
  }
  return out;
}

}  // namespace kiln::bench

#pragma once
// Timing shared by the benchmarks: the median, over `repeats` runs of `iters` calls, of the
// mean seconds per call of `fn`, after `warmup` untimed calls.
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

}  // namespace kiln::bench

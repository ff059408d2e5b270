#pragma once
// The command line of the benchmarks over one [N, C, H, W] input against ATen (kiln_norm_bench,
// kiln_pool_bench): `[--smoke] [N C H W [THREADS]]`.
#include <ATen/Parallel.h>

#include <array>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "kiln/kiln.h"

namespace kiln::bench {

struct NchwArgs {
  bool smoke = false;  // a small input, checked against ATen, nothing timed
  std::array<int64_t, 4> shape{};
};

// The input's shape is N C H W where all four are given, else `full` (`small` under --smoke).
// THREADS sets both Kiln's and ATen's thread counts; without it ATen takes Kiln's.
inline NchwArgs parse_nchw_args(int argc, char** argv, std::array<int64_t, 4> full,
                                std::array<int64_t, 4> small) {
  NchwArgs a;
  std::vector<const char*> pos;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--smoke"))
      a.smoke = true;
    else
      pos.push_back(argv[i]);
  }
  a.shape = a.smoke ? small : full;
  if (pos.size() >= 4)
    for (size_t i = 0; i < 4; ++i) a.shape[i] = std::atoll(pos[i]);
  if (pos.size() >= 5) {
    const int t = std::atoi(pos[4]);
    kiln::set_num_threads(t);
    at::set_num_threads(t);
  } else {
    at::set_num_threads(kiln::get_num_threads());
  }
  return a;
}

}  // namespace kiln::bench

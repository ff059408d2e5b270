// Where an eager CUDA op's time goes: the launch floor (an empty kernel), allocation, and Kiln's
// ops on 4096 floats, each timed on the host with the device synchronised at the end of each
// repeat. Exits 0 with a note when no CUDA device is present (CI). `--json FILE` writes them.
#include <cstring>
#include <fstream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "bench/timing.h"
#include "kiln/backend/backend.h"
#include "kiln/backend/cuda/cuda.h"
#include "kiln/core/stream.h"
#include "kiln/ops/ops.h"

using namespace kiln;

int main(int argc, char** argv) {
  const char* json_path = argc == 3 && std::strcmp(argv[1], "--json") == 0 ? argv[2] : nullptr;
  try {
    load_backend("cuda");
  } catch (const Error& e) {
    fmt::print("kiln_cuda_bench: skipped: {}\n", e.what());
    return 0;
  }
  Device gpu("cuda:0");
  Tensor x = randn({4096}).to(gpu), y = randn({4096}).to(gpu), out = empty({4096}, kFloat32, gpu);
  auto timed = [&](auto&& fn) {
    double s = bench::median_seconds_per_call(
        [&] {
          for (int i = 0; i < 100; ++i) fn();
          synchronize(gpu);
        },
        20, 5, 3);
    return s / 100 * 1e6;
  };
  nlohmann::ordered_json j;
  j["empty_launch_us"] = cuda::empty_launch_us(0);
  j["empty_graph_node_us"] = cuda::empty_graph_node_us(0);
  j["alloc_free_4096_us"] = timed([&] { empty({4096}, kFloat32, gpu); });
  j["mul_scalar_us"] = timed([&] { mul(x, 1.0001); });
  j["mul_out_us"] = timed([&] { mul_out(out, x, y); });
  j["add_us"] = timed([&] { add(x, y); });
  j["relu_us"] = timed([&] { relu(x); });
  j["sum_us"] = timed([&] { sum(x); });
  {  // the same on a stream of Kiln's own (non-blocking) instead of CUDA's legacy stream
    Stream side = Stream::create(gpu);
    StreamGuard g(side);
    j["empty_launch_side_stream_us"] = cuda::empty_launch_us(0);
    j["mul_scalar_side_stream_us"] = timed([&] { mul(x, 1.0001); });
  }
  for (auto& [k, v] : j.items()) fmt::print("  {:<22} {:8.3f} us\n", k, v.get<double>());
  if (json_path) std::ofstream(json_path) << j.dump(1) << "\n";
  return 0;
}

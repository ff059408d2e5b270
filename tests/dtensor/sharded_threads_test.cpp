// The Sharded layer's hit path under concurrent threads (kiln/dtensor/sharded_layer.cpp, Note
// [The decision cache]): each thread keeps its own scratch space, lookups take no lock, and
// decisions that threads make at the same time for the same key are published once. Only ops
// that never communicate run here (from_local, pointwise on Shard(0), mm of Shard(0) by
// Replicate, sum to Partial), so every rank may run its threads in any order.
#include <gtest/gtest.h>

#include <atomic>
#include <string>
#include <thread>
#include <vector>

#include "kiln/dtensor/sharding_rule.h"
#include "tests/dtensor/dtensor_test_util.h"

namespace kiln::test {
namespace {

// Each thread's local results must equal the same ops on its plain local tensors, bitwise.
TEST(ShardedThreads, ConcurrentCallsGetTheirOwnResults) {
  const dt::DeviceMesh& mesh = mesh_1d(Device(kCPU));
  constexpr int kThreads = 4, kIters = 300;
  std::atomic<int> failures{0};
  std::vector<std::string> first_error(kThreads);
  const auto before = dt::decision_cache_stats();
  auto body = [&](int t) {
    try {
      for (int i = 0; i < kIters; ++i) {
        // Shapes repeat across threads (hits and concurrent misses of the same key) and differ
        // between iterations (several keys per op at once); no other test uses these shapes,
        // since some count their decisions. Values differ per thread.
        const int64_t rows = 17 + i % 4, cols = 23 + i % 3;
        Tensor a = global_tensor({rows, cols}, kFloat32, Device(kCPU), 100 * t + i);
        Tensor r = global_tensor({cols, 3}, kFloat32, Device(kCPU), 7 * t);
        Tensor A = dt::from_local(a, mesh, {dt::Shard(0)});
        Tensor R = dt::from_local(r, mesh, {dt::Replicate()});
        const std::vector<std::pair<Tensor, Tensor>> pairs = {
            {add(A, A), add(a, a)},
            {relu(sub(A, 10.0)), relu(sub(a, 10.0))},
            {mm(A, R), mm(a, r)},
            {sum(A), sum(a)},
            {sum(A, {1}), sum(a, {1})}};
        for (const auto& [got, want] : pairs)
          if (!dt::is_dtensor(got) || !equal(dt::to_local(got), want)) {
            if (failures.fetch_add(1) == 0)
              first_error[t] = fmt::format("thread {} iteration {}: {} differs", t, i,
                                           dt::is_dtensor(got) ? dt::spec_of(got)->str() : "plain");
          }
      }
    } catch (const std::exception& e) {
      failures.fetch_add(1);
      first_error[t] = e.what();
    }
  };
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) threads.emplace_back(body, t);
  for (auto& th : threads) th.join();
  EXPECT_EQ(failures.load(), 0) << fmt::format("{}", fmt::join(first_error, " | "));
  // 6 ops (add, sub, relu, mm, two sums) x 4 row counts x 3 column counts at most, whichever
  // thread decided first; threads that raced on a key may each have decided it, but only one
  // entry is kept.
  const auto after = dt::decision_cache_stats();
  EXPECT_LE(after.entries - before.entries, 6u * 4 * 3);
  EXPECT_EQ(after.uncached, before.uncached);
}

}  // namespace
}  // namespace kiln::test

// The asynchronous forms of kiln/distributed/collectives.h (Note [Asynchronous collectives] in
// collectives.cpp) on CPU tensors (non-blocking MPI calls) and sim tensors (the group's
// communication stream): each gives bitwise what its blocking form gives, several may be in
// flight at once and be waited for in any order, bad input raises at the call before anything
// is sent, and differentiable tensors take the blocking path. Runs as a world of one and on 2,
// 3 and 4 ranks.
#include <gtest/gtest.h>

#include "kiln/core/stream.h"
#include "tests/distributed/dist_test_util.h"

namespace kiln::test {
namespace {

using dist::ReduceOp;

class CollectiveAsync : public ::testing::TestWithParam<std::string> {
 protected:
  Device dev() const { return device_named(GetParam()); }
};
INSTANTIATE_TEST_SUITE_P(Devices, CollectiveAsync, ::testing::ValuesIn(device_names()),
                         [](const auto& info) { return info.param; });

ValueFn reduce_fn(DType t) {
  return [t](int r, int64_t k) { return reduce_value(t, r, k); };
}

// Each async form against its blocking form on the same inputs: all started before any is
// waited for, then waited for in reverse order. bfloat16 takes the float32 staging that a
// non-blocking reduction must keep alive until it completes.
TEST_P(CollectiveAsync, EveryFormEqualsItsBlockingForm) {
  const Device d = dev();
  const int me = dist::rank();
  for (DType t : {kFloat32, kBFloat16, kInt64}) {
    for (const GroupCase& g : test_groups()) {
      if (!g.member()) continue;
      const int n = g.size();
      const ReduceOp red = is_floating(t) ? ReduceOp::Avg : ReduceOp::Sum;
      Tensor r_in = make_tensor({6 * n}, t, d, me, reduce_fn(t));
      Tensor a_in = tagged({2 * n, 3}, t, d, me);
      Tensor reduced = r_in.clone(), gathered = empty({2 * n * n, 3}, t, d),
             scattered = empty({6}, t, d), bcast = a_in.clone(), swapped = empty({2 * n, 3}, t, d);
      std::vector<dist::Work> works;
      works.push_back(dist::all_reduce_async(reduced, red, g.group));
      works.push_back(dist::all_gather_into_tensor_async(gathered, a_in, g.group));
      works.push_back(dist::reduce_scatter_tensor_async(scattered, r_in, red, g.group));
      works.push_back(dist::broadcast_async(bcast, n - 1, g.group));
      works.push_back(dist::all_to_all_single_async(swapped, a_in, {}, {}, g.group));
      works.push_back(dist::barrier_async(g.group, d));
      for (auto it = works.rbegin(); it != works.rend(); ++it) it->wait();
      const std::string at = where(g, d, t);
      EXPECT_TRUE(bitwise_equal(reduced, dist::all_reduce(r_in, red, g.group))) << at;
      EXPECT_TRUE(bitwise_equal(gathered, dist::all_gather_into_tensor(a_in, g.group))) << at;
      EXPECT_TRUE(bitwise_equal(scattered, dist::reduce_scatter_tensor(r_in, red, g.group))) << at;
      EXPECT_TRUE(bitwise_equal(bcast, dist::broadcast(a_in, n - 1, g.group))) << at;
      EXPECT_TRUE(bitwise_equal(swapped, dist::all_to_all_single(a_in, {}, {}, g.group))) << at;
      for (dist::Work& w : works) EXPECT_TRUE(w.is_completed()) << at;
    }
  }
}

// A ring where every rank starts its receive before its send: with blocking calls in that
// order every rank would wait for ever. CPU only: a device stream runs a group's collectives
// one after another on its communication stream, so there, as with NCCL, the receive queued
// first waits for a send queued behind it.
TEST_P(CollectiveAsync, SendAndReceiveInFlightTogether) {
  const Device d = dev();
  const int n = dist::world_size(), me = dist::rank();
  if (n == 1) GTEST_SKIP() << "send and recv need a peer (every rank skips alike)";
  if (!d.is_cpu()) GTEST_SKIP() << "a stream runs them in order (every rank skips alike)";
  Tensor mine = tagged({5}, kFloat32, d, me);
  Tensor got = zeros({5}, kFloat32, d);
  dist::Work r = dist::recv_async(got, (me + n - 1) % n);
  dist::Work s = dist::send_async(mine, (me + 1) % n);
  r.wait();
  s.wait();
  EXPECT_TRUE(bitwise_equal(got, tagged({5}, kFloat32, d, (me + n - 1) % n)));
}

// is_completed() never blocks and lets MPI progress: polling alone finishes the collective.
TEST_P(CollectiveAsync, PollingCompletes) {
  const Device d = dev();
  Tensor x = ones({64}, kFloat32, d);
  dist::Work w = dist::all_reduce_async(x);
  while (!w.is_completed()) {
  }
  if (!d.is_cpu()) w.wait();  // a stream's event may be done before the current stream waits
  EXPECT_TRUE(bitwise_equal(x, full({64}, dist::world_size(), kFloat32, d)));
}

TEST_P(CollectiveAsync, BadInputRaisesAtTheCallAndSendsNothing) {
  const Device d = dev();
  const int n = dist::world_size();
  const double mark = calls_mark();
  Tensor x = ones({4}, kFloat32, d);
  EXPECT_THROW_PREFIX(dist::all_gather_into_tensor_async(empty({4 * n + 1}, kFloat32, d), x),
                      ValueError, "[all_gather_into_tensor] out has sizes");
  EXPECT_THROW_PREFIX(
      dist::reduce_scatter_tensor_async(empty({4}, kInt64, d), ones({4 * n}, kFloat32, d)),
      TypeError, "[reduce_scatter_tensor] out is int64 but self is float32");
  EXPECT_THROW_PREFIX(dist::all_reduce_async(ones({4}, kInt64, d), ReduceOp::Avg), TypeError,
                      "[all_reduce_] avg needs a floating dtype");
  EXPECT_THROW_PREFIX(dist::broadcast_async(x, n), ValueError, "[broadcast_] src");
  if (!d.is_cpu()) Stream::current(d).synchronize();
  EXPECT_EQ(calls_since(mark, "all_gather_into_tensor"), 0);
  EXPECT_EQ(calls_since(mark, "reduce_scatter_tensor"), 0);
  EXPECT_EQ(calls_since(mark, "broadcast_"), 0);
}

// A tensor that requires grad takes the blocking, differentiable op: done at return.
TEST_P(CollectiveAsync, DifferentiableTensorsTakeTheBlockingOp) {
  const Device d = dev();
  Tensor x = ones({3}, kFloat32, d).requires_grad_(true);
  Tensor y = x * 2.0;
  dist::Work w = dist::all_reduce_async(y);
  EXPECT_TRUE(w.is_completed());
  EXPECT_TRUE(bitwise_equal(y.detach(), full({3}, 2.0 * dist::world_size(), kFloat32, d)));
}

}  // namespace
}  // namespace kiln::test

// The collectives' backward formulas (kiln/distributed/collective_grads.cpp), with the
// semantics of torch.distributed.nn.functional: all_reduce(sum)'s gradient is all-reduced,
// all_gather's is a reduce_scatter and the reverse, all_to_all's is the reverse all_to_all,
// broadcast's sums every rank's gradient into the source; max, min and product reductions,
// send and recv_ raise NotImplementedError. Each rank weights its output with weights of its
// own (loss = sum(y * w_rank)), so the expected gradients, computed here by hand from every
// rank's weights, tell the ranks apart. float64 throughout, on CPU and sim tensors.
#include <gtest/gtest.h>

#include "kiln/autograd/gradcheck.h"
#include "kiln/core/stream.h"
#include "tests/distributed/dist_test_util.h"

namespace kiln::test {
namespace {

using dist::ReduceOp;

class CollectiveGrad : public ::testing::TestWithParam<std::string> {
 protected:
  Device dev() const { return device_named(GetParam()); }
};
INSTANTIATE_TEST_SUITE_P(Devices, CollectiveGrad, ::testing::ValuesIn(device_names()),
                         [](const auto& info) { return info.param; });

const Device kHost(kCPU);

// Inputs and weights of world rank r, element k: distinct per rank, exact in float64 sums.
double x_value(int r, int64_t k) { return 0.5 * static_cast<double>((r * 5 + k * 3) % 11) - 2; }
double w_value(int r, int64_t k) { return static_cast<double>(r * 16 + k % 16) * 0.25 + 1; }

Tensor leaf(IntArrayRef sizes, Device d) {
  Tensor x = make_tensor(sizes, kFloat64, d, dist::rank(), x_value);
  x.requires_grad_();
  return x;
}
Tensor weights(IntArrayRef sizes, Device d, int r) {
  return make_tensor(sizes, kFloat64, d, r, w_value);
}
// sum(y * w) with this rank's weights.
Tensor weighted(const Tensor& y) {
  return sum(mul(y, weights(kiln_test::vec(y.sizes()), y.device(), dist::rank())));
}

TEST_P(CollectiveGrad, AllReduceSumAndAvgAllReduceTheGradient) {
  const Device d = dev();
  for (const GroupCase& g : test_groups()) {
    if (!g.member()) continue;
    for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Avg}) {
      std::string at = where(g, d, kFloat64, dist::reduce_op_name(op));
      // y = reduce of every rank's x; dL/dx = the same reduction of every rank's weights.
      Tensor want = expected_reduce({2, 3}, kFloat64, op, g.members, w_value);
      Tensor x = leaf({2, 3}, d);
      Tensor y = dist::all_reduce(x, op, g.group);
      EXPECT_TRUE(
          bitwise_equal(y.detach(), expected_reduce({2, 3}, kFloat64, op, g.members, x_value)))
          << at;
      weighted(y).backward();
      EXPECT_TRUE(bitwise_equal(x.grad(), want)) << at;
      // In place, on a non-leaf.
      Tensor x2 = leaf({2, 3}, d);
      Tensor t = mul(x2, 1.0);
      dist::all_reduce_(t, op, g.group);
      weighted(t).backward();
      EXPECT_TRUE(bitwise_equal(x2.grad(), want)) << at << " (in place)";
    }
  }
}

TEST_P(CollectiveGrad, AllGatherBackwardIsAReduceScatter) {
  const Device d = dev();
  for (const GroupCase& g : test_groups()) {
    if (!g.member()) continue;
    const int n = g.size(), a = g.rank();
    std::string at = where(g, d, kFloat64);
    // y = every rank's x stacked; dL/dx = block a of the sum of every rank's weights.
    Tensor x = leaf({2, 3}, d);
    Tensor y = dist::all_gather_into_tensor(x, g.group);
    EXPECT_EQ(kiln_test::vec(y.sizes()), (std::vector<int64_t>{2 * n, 3}));
    double mark = calls_mark();
    weighted(y).backward();
    EXPECT_TRUE(bitwise_equal(
        x.grad(), expected_reduce({2, 3}, kFloat64, ReduceOp::Sum, g.members, w_value, 6 * a)))
        << at;
    if (!d.is_cpu()) Stream::current(d).synchronize();
    if (dist::world_size() > 1) {
      EXPECT_EQ(calls_since(mark, "reduce_scatter_tensor"), 1) << at;
    }
  }
}

TEST_P(CollectiveGrad, ReduceScatterBackwardIsAnAllGather) {
  const Device d = dev();
  for (const GroupCase& g : test_groups()) {
    if (!g.member()) continue;
    const int n = g.size();
    for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Avg}) {
      std::string at = where(g, d, kFloat64, dist::reduce_op_name(op));
      // y = block a of the reduction; dL/dx = every rank's weights stacked (/ n for avg).
      std::vector<Tensor> ws;
      for (int r : g.members) ws.push_back(weights({2, 3}, kHost, r));
      Tensor want = cat(ws, 0);
      if (op == ReduceOp::Avg) want = div(want, static_cast<double>(n));
      Tensor x = leaf({2 * n, 3}, d);
      double mark = calls_mark();
      weighted(dist::reduce_scatter_tensor(x, op, g.group)).backward();
      EXPECT_TRUE(bitwise_equal(x.grad(), want)) << at;
      if (!d.is_cpu()) Stream::current(d).synchronize();
      if (dist::world_size() > 1) {
        EXPECT_EQ(calls_since(mark, "all_gather_into_tensor"), 1) << at;
      }
    }
  }
}

// Group rank a sends split(a, j) rows to group rank j (as in collectives_test.cpp).
int64_t split(int a, int j) { return (a + 2 * j + 1) % 3; }

TEST_P(CollectiveGrad, AllToAllBackwardIsTheReverseAllToAll) {
  const Device d = dev();
  for (const GroupCase& g : test_groups()) {
    if (!g.member()) continue;
    const int n = g.size(), a = g.rank();
    std::string at = where(g, d, kFloat64);
    std::vector<int64_t> in_splits, out_splits;
    int64_t in_rows = 0;
    for (int j = 0; j < n; ++j) {
      in_splits.push_back(split(a, j));
      out_splits.push_back(split(j, a));
      in_rows += split(a, j);
    }
    // The rows x sent to rank j come back weighted by j's weights for the rows j received from
    // this rank: j's output rows [sum_{i<a} split(i, j), + split(a, j)).
    std::vector<Tensor> parts;
    for (int j = 0; j < n; ++j) {
      int64_t rows_j = 0, offset = 0;
      for (int i = 0; i < n; ++i) rows_j += split(i, j);
      for (int i = 0; i < a; ++i) offset += split(i, j);
      parts.push_back(narrow(weights({rows_j, 2}, kHost, g.members[j]), 0, offset, split(a, j)));
    }
    Tensor x = leaf({in_rows, 2}, d);
    weighted(dist::all_to_all_single(x, out_splits, in_splits, g.group)).backward();
    EXPECT_TRUE(bitwise_equal(x.grad(), cat(parts, 0))) << at;
    // Equal splits.
    Tensor xe = leaf({2 * n, 2}, d);
    weighted(dist::all_to_all_single(xe, {}, {}, g.group)).backward();
    std::vector<Tensor> eq;
    for (int r : g.members) eq.push_back(narrow(weights({2 * n, 2}, kHost, r), 0, 2 * a, 2));
    EXPECT_TRUE(bitwise_equal(xe.grad(), cat(eq, 0))) << at << " (equal splits)";
  }
}

TEST_P(CollectiveGrad, BroadcastBackwardSumsIntoTheSource) {
  const Device d = dev();
  for (const GroupCase& g : test_groups()) {
    if (!g.member()) continue;
    for (int src = 0; src < g.size(); ++src) {
      std::string at = where(g, d, kFloat64, fmt::format("src {}", src));
      // y = x of the source on every rank; dL/dx is the sum of every rank's weights on the
      // source and zero elsewhere.
      Tensor sum_w = expected_reduce({2, 3}, kFloat64, ReduceOp::Sum, g.members, w_value);
      Tensor want = g.rank() == src ? sum_w : zeros_like(sum_w);
      Tensor x = leaf({2, 3}, d);
      weighted(dist::broadcast(x, src, g.group)).backward();
      EXPECT_TRUE(bitwise_equal(x.grad(), want)) << at;
      Tensor x2 = leaf({2, 3}, d);
      Tensor t = mul(x2, 1.0);
      dist::broadcast_(t, src, g.group);
      weighted(t).backward();
      EXPECT_TRUE(bitwise_equal(x2.grad(), want)) << at << " (in place)";
    }
  }
}

// Raised on every rank, before any collective of the backward: nobody waits.
TEST_P(CollectiveGrad, MaxMinProductSendAndRecvHaveNoGradient) {
  const Device d = dev();
  const int n = dist::world_size(), me = dist::rank();
  for (ReduceOp op : {ReduceOp::Max, ReduceOp::Min, ReduceOp::Product}) {
    std::string want =
        fmt::format("the gradient of a {} reduction is not implemented", dist::reduce_op_name(op));
    Tensor x = leaf({4}, d);
    Tensor y = dist::all_reduce(x, op);  // the forward runs
    EXPECT_THROW_CONTAINS(sum(y).backward(), NotImplementedError, "[all_reduce] " + want);
    Tensor rs = dist::reduce_scatter_tensor(leaf({2 * n}, d), op);
    EXPECT_THROW_CONTAINS(sum(rs).backward(), NotImplementedError,
                          "[reduce_scatter_tensor] " + want);
  }
  Tensor x = leaf({4}, d);
  if (n > 1) {
    EXPECT_THROW_PREFIX(dist::send(x, (me + 1) % n), NotImplementedError,
                        "[send] does not support automatic differentiation");
    Tensor t = mul(x, 1.0);
    EXPECT_THROW_PREFIX(dist::recv_(t, (me + n - 1) % n), NotImplementedError,
                        "[recv_] does not support automatic differentiation");
  }
  Tensor out = empty({4 * n}, kFloat64, d);
  EXPECT_THROW_CONTAINS(dist::all_gather_into_tensor_out(out, x), NotImplementedError,
                        "does not support automatic differentiation");
  // The ranks still pair up.
  Tensor y = dist::all_reduce(ones({2}, kInt64, d));
  EXPECT_EQ(y.to_vector<int64_t>(), std::vector<int64_t>(2, n));
}

// Finite differences: every rank perturbs the same element at once (gradcheck runs the same
// calls on every rank), so what is checked is the derivative along that common direction. For
// all_reduce it equals each rank's own Jacobian (n for sum, 1 for avg); for the other
// collectives it does not, so they are checked this way only in a world of one.
TEST_P(CollectiveGrad, GradcheckInFloat64) {
  const Device d = dev();
  if (!d.is_cpu()) GTEST_SKIP() << "gradcheck perturbs its inputs in host memory";
  for (const GroupCase& g : test_groups()) {
    if (!g.member()) continue;
    for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Avg}) {
      std::string why;
      EXPECT_TRUE(autograd::gradcheck(
          [&](const TensorList& in) -> TensorList {
            return {dist::all_reduce(in[0], op, g.group)};
          },
          {leaf({3}, d)}, {}, &why))
          << where(g, d, kFloat64, dist::reduce_op_name(op)) << ": " << why;
    }
  }
  if (dist::world_size() > 1) return;
  using F = std::function<TensorList(const TensorList&)>;
  std::vector<std::pair<std::string, F>> fns = {
      {"all_gather",
       [](const TensorList& in) -> TensorList { return {dist::all_gather_into_tensor(in[0])}; }},
      {"reduce_scatter",
       [](const TensorList& in) -> TensorList { return {dist::reduce_scatter_tensor(in[0])}; }},
      {"broadcast", [](const TensorList& in) -> TensorList { return {dist::broadcast(in[0], 0)}; }},
      {"all_to_all",
       [](const TensorList& in) -> TensorList {
         return {dist::all_to_all_single(in[0], {2}, {2})};
       }},
  };
  for (auto& [label, fn] : fns) {
    std::string why;
    EXPECT_TRUE(autograd::gradcheck(fn, {leaf({2, 2}, d)}, {}, &why)) << label << ": " << why;
  }
}

}  // namespace
}  // namespace kiln::test

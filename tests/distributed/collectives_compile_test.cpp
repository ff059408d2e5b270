// kiln::compile of steps that contain collectives (Note [Collectives are ops] in
// kiln/distributed/collective_kernels.cpp), on CPU tensors and on sim tensors with device
// graphs: compiled equals eager bitwise over calls with changing inputs, on sim the collectives
// are captured into the graph and each replay runs them again (once per call, counted by the
// flight recorder), a collective whose result is unused (on some ranks or on all) is still run,
// and two equal collectives are never merged.
#include <gtest/gtest.h>

#include <sstream>
#include <string>
#include <vector>

#include "kiln/compile/compile.h"
#include "kiln/core/stream.h"
#include "tests/distributed/dist_test_util.h"

namespace kiln::test {
namespace {

using dist::ReduceOp;
using kiln_test::contains;

class CollectiveCompile : public ::testing::TestWithParam<std::string> {
 protected:
  Device dev() const { return device_named(GetParam()); }
  void sync() const {
    if (!dev().is_cpu()) Stream::current(dev()).synchronize();
  }
  // On sim, calls 0 (trace) and 1 (warm-up) run the steps and call 2 captures: from then on
  // every call replays one graph.
  void expect_captured(const CompiledFunction& f) const {
    CacheEntryInfo e = f.entries().at(0);
    EXPECT_EQ(f.entries().size(), 1u) << f.explain();
    if (dev().is_cpu()) {
      EXPECT_FALSE(e.device_graphs);
      return;
    }
    EXPECT_TRUE(e.device_graphs) << f.explain();
    EXPECT_EQ(e.captures, 1) << f.explain();
    EXPECT_TRUE(contains(f.explain(), "device graphs: 1 per replay")) << f.explain();
  }
};
INSTANTIATE_TEST_SUITE_P(Devices, CollectiveCompile, ::testing::ValuesIn(device_names()),
                         [](const auto& info) { return info.param; });

// Call i's input on world rank r: changes with the call and the rank.
Tensor input(int call, IntArrayRef sizes, Device d) {
  return make_tensor(sizes, kFloat32, d, dist::rank(), [call](int r, int64_t k) {
    return 0.25 * static_cast<double>((r * 7 + k * 3 + call * 5) % 23) - 2.0;
  });
}

// The steps of `steps_str()` that run kernel `kernel` (lines "i: kernel <- node ...").
int steps_running(const std::string& steps, std::string_view kernel) {
  int n = 0;
  std::istringstream lines(steps);
  for (std::string line; std::getline(lines, line);) {
    size_t colon = line.find(": ");
    if (colon != std::string::npos &&
        line.compare(colon + 2, kernel.size() + 1, std::string(kernel) + " ") == 0)
      ++n;
  }
  return n;
}

TEST_P(CollectiveCompile, EveryCollectiveMatchesEagerBitwise) {
  const Device d = dev();
  const int n = dist::world_size();
  auto fn = [](const Tensor& x) -> TensorList {
    Tensor h = mul(x, 2.0);
    Tensor s = dist::all_reduce(h, ReduceOp::Sum);
    Tensor m = dist::all_reduce(x, ReduceOp::Max);
    Tensor g = dist::all_gather_into_tensor(relu(x));
    Tensor rs = dist::reduce_scatter_tensor(x, ReduceOp::Avg);
    Tensor b = dist::broadcast(add(x, 1.0), dist::world_size() - 1);
    Tensor a = dist::all_to_all_single(x);
    return {add(s, 1.0), m, sum(g, {0}), rs, b, a};
  };
  CompiledFunction f = compile(fn, {.name = "collectives"});
  double mark = calls_mark();
  for (int call = 0; call < 6; ++call) {
    Tensor x = input(call, {2 * n, 3}, d);
    TensorList want = fn(x), got = f({x});
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < want.size(); ++i)
      EXPECT_TRUE(bitwise_equal(got[i], want[i])) << "call " << call << ", output " << i;
  }
  expect_captured(f);
  sync();
  if (n > 1) {  // eager and compiled ran each collective once per call: 12 calls
    EXPECT_EQ(calls_since(mark, "all_reduce"), 24) << calls_str(mark);
    EXPECT_EQ(calls_since(mark, "all_gather_into_tensor"), 12) << calls_str(mark);
    EXPECT_EQ(calls_since(mark, "reduce_scatter_tensor"), 12) << calls_str(mark);
    EXPECT_EQ(calls_since(mark, "broadcast"), 12) << calls_str(mark);
    EXPECT_EQ(calls_since(mark, "all_to_all_single"), 12) << calls_str(mark);
  }
}

// The in-place forms write the caller's tensors through a compiled step as they do eagerly.
TEST_P(CollectiveCompile, InPlaceFormsWriteTheCallersInputs) {
  const Device d = dev();
  auto fn = [](const Tensor& x, const Tensor& y) -> TensorList {
    dist::all_reduce_(x, ReduceOp::Avg);
    dist::broadcast_(y, 0);
    return {mul(x, y)};
  };
  CompiledFunction f = compile(fn, {.name = "in_place"});
  for (int call = 0; call < 6; ++call) {
    Tensor xe = input(call, {4, 2}, d), ye = input(call + 50, {4, 2}, d);
    Tensor xc = xe.clone(), yc = ye.clone();
    Tensor want = fn(xe, ye)[0];
    Tensor got = f({xc, yc})[0];
    EXPECT_TRUE(bitwise_equal(got, want)) << "call " << call;
    EXPECT_TRUE(bitwise_equal(xc, xe)) << "call " << call;
    EXPECT_TRUE(bitwise_equal(yc, ye)) << "call " << call;
  }
  expect_captured(f);
}

// Each rank's compiled step uses its own half of a split group; the halves run apart.
TEST_P(CollectiveCompile, SubGroupCollectives) {
  const Device d = dev();
  const GroupCase& half = test_groups().at(2);
  ASSERT_TRUE(half.member());  // every rank is in one half
  auto fn = [&](const Tensor& x) -> TensorList {
    Tensor s = dist::all_reduce(x, ReduceOp::Sum, half.group);
    return {dist::all_gather_into_tensor(s, half.group)};
  };
  CompiledFunction f = compile(fn, {.name = "halves"});
  for (int call = 0; call < 5; ++call) {
    Tensor x = input(call, {3}, d);
    EXPECT_TRUE(bitwise_equal(f({x})[0], fn(x)[0])) << "call " << call;
  }
  expect_captured(f);
}

// A rank that does not use a collective's result must still run it: its peers wait for it.
// Dropping it as dead code would hang rank 0 (ended by the deadline).
TEST_P(CollectiveCompile, UnusedResultsAreStillCommunicated) {
  const Device d = dev();
  const int n = dist::world_size(), me = dist::rank();
  auto some = [me](const Tensor& x) -> TensorList {
    Tensor s = dist::all_reduce(x);
    return {me == 0 ? add(s, 1.0) : mul(x, 2.0)};
  };
  auto none = [](const Tensor& x) -> TensorList {
    Tensor scratch = x.clone();
    dist::all_reduce_(scratch);             // an in-place write nobody reads
    (void)dist::all_gather_into_tensor(x);  // a result nobody reads
    return {mul(x, 2.0)};
  };
  CompiledFunction fs = compile(some, {.name = "some"}), fn = compile(none, {.name = "none"});
  double mark = calls_mark();
  for (int call = 0; call < 5; ++call) {
    Tensor x = input(call, {4}, d);
    EXPECT_TRUE(bitwise_equal(fs({x})[0], some(x)[0])) << "call " << call;
    EXPECT_TRUE(bitwise_equal(fn({x})[0], none(x)[0])) << "call " << call;
  }
  sync();
  if (n > 1) {  // 5 compiled and 5 eager calls of each step (all_reduce_ may be recorded under
                // the functional name, as sim's custom all-reduce does)
    EXPECT_EQ(calls_since(mark, "all_reduce") + calls_since(mark, "all_reduce_"), 20)
        << calls_str(mark);
    EXPECT_EQ(calls_since(mark, "all_gather_into_tensor"), 10) << calls_str(mark);
  }
  EXPECT_EQ(steps_running(fs.steps_str(), "all_reduce"), 1) << fs.steps_str();
  EXPECT_EQ(steps_running(fn.steps_str(), "all_reduce_"), 1) << fn.steps_str();
  EXPECT_EQ(steps_running(fn.steps_str(), "all_gather_into_tensor_out"), 1) << fn.steps_str();
  expect_captured(fs);
  expect_captured(fn);
}

// Two equal collectives are two collectives: merging them on one rank (CSE) would leave its
// peers waiting for the second.
TEST_P(CollectiveCompile, EqualCollectivesAreNotMerged) {
  const Device d = dev();
  const int n = dist::world_size();
  auto fn = [](const Tensor& x) -> TensorList {
    Tensor a = dist::all_reduce(x), b = dist::all_reduce(x);
    Tensor c = dist::all_gather_into_tensor(x), e = dist::all_gather_into_tensor(x);
    return {add(a, b), sub(c, e)};
  };
  CompiledFunction f = compile(fn, {.name = "twice"});
  double mark = calls_mark();
  for (int call = 0; call < 5; ++call) {
    Tensor x = input(call, {3, 2}, d);
    TensorList want = fn(x), got = f({x});
    EXPECT_TRUE(bitwise_equal(got[0], want[0])) << "call " << call;
    EXPECT_TRUE(bitwise_equal(got[1], want[1])) << "call " << call;
  }
  sync();
  EXPECT_EQ(f.entries().at(0).cse_merged, 0) << f.explain();
  EXPECT_EQ(steps_running(f.steps_str(), "all_reduce"), 2) << f.steps_str();
  EXPECT_EQ(steps_running(f.steps_str(), "all_gather_into_tensor_out"), 2) << f.steps_str();
  if (n > 1) {
    EXPECT_EQ(calls_since(mark, "all_reduce"), 20) << calls_str(mark);
    EXPECT_EQ(calls_since(mark, "all_gather_into_tensor"), 20) << calls_str(mark);
  }
  expect_captured(f);
}

// Kernels before and after a collective stay in order around it in the captured graph: the
// collective reads what the kernel before it wrote and the kernel after reads its result, at
// every replay, while the inputs change.
TEST_P(CollectiveCompile, KernelsAroundACollectiveStayInOrder) {
  const Device d = dev();
  auto fn = [](const Tensor& x) -> TensorList {
    Tensor h = x;
    for (int i = 0; i < 3; ++i) h = mul(add(dist::all_reduce(h, ReduceOp::Avg), 1.0), 0.5);
    return {h};
  };
  CompiledFunction f = compile(fn, {.name = "chain"});
  for (int call = 0; call < 8; ++call) {
    Tensor x = input(call, {64}, d);
    EXPECT_TRUE(bitwise_equal(f({x})[0], fn(x)[0])) << "call " << call;
  }
  expect_captured(f);
}

// The steps of `steps_str()` that wait for the communication stream: the number of the step
// printed after each "(waits for ...)" line.
std::vector<int> steps_waiting(const std::string& steps) {
  std::vector<int> at;
  std::istringstream lines(steps);
  bool wait = false;
  for (std::string line; std::getline(lines, line);) {
    if (line.find("waits for the communication stream") != std::string::npos) {
      wait = true;
    } else if (wait) {
      at.push_back(std::stoi(line));
      wait = false;
    }
  }
  return at;
}

// Note [Collectives on a stream of their own] in kiln/compile/comm_stream.cpp: on sim a
// collective on a free tensor (what DDP's buckets are) runs on the executable's communication
// stream while the independent kernels after it run, and only the step reading it waits.
// Collectives on intermediates run in line, as do those that allocate their result. Results
// stay bitwise those of eager code at every call: trace, warm-up, capture and replays.
TEST_P(CollectiveCompile, ACollectiveOnAFreeTensorOverlapsTheStepsAfterIt) {
  const Device d = dev();
  Tensor state_e = input(0, {4096}, d), state_c = state_e.clone();
  auto fn = [](const Tensor& state, const Tensor& x) -> TensorList {
    dist::all_reduce_(state, ReduceOp::Avg);  // step 0: a free tensor, on the stream
    Tensor h = mul(x, 2.0);                   // steps 1-5: independent of it
    for (int i = 0; i < 4; ++i) h = add(h, 0.5);
    Tensor r = add(h, state);                               // step 6 reads it: waits
    dist::all_reduce_(r, ReduceOp::Sum);                    // an intermediate: in line
    return {add(dist::all_reduce(r, ReduceOp::Sum), 1.0)};  // allocates: in line
  };
  CompiledFunction f = compile([&](const Tensor& x) { return fn(state_c, x); }, {.name = "comm"});
  for (int call = 0; call < 6; ++call) {
    Tensor x = input(call, {4096}, d);
    Tensor want = fn(state_e, x)[0];
    Tensor got = f({x})[0];
    EXPECT_TRUE(bitwise_equal(got, want)) << "call " << call;
    EXPECT_TRUE(bitwise_equal(state_c, state_e)) << "call " << call;
  }
  expect_captured(f);
  const CacheEntryInfo e = f.entries().at(0);
  const std::string steps = f.steps_str(0);
  if (d.is_cpu()) {  // no streams
    EXPECT_EQ(e.comm_stream_steps, 0) << steps;
    EXPECT_EQ(steps.find("communication stream"), std::string::npos) << steps;
    return;
  }
  EXPECT_EQ(e.comm_stream_steps, 1) << steps;
  EXPECT_TRUE(contains(f.explain(), "collectives: 1 on a stream of their own")) << f.explain();
  EXPECT_EQ(steps_waiting(steps), std::vector<int>{6}) << steps;
}

// A collective that runs in line after one on the stream waits for the stream first: every
// rank's collectives stay in one order.
TEST_P(CollectiveCompile, AnInlineCollectiveWaitsForTheStreamFirst) {
  const Device d = dev();
  Tensor state_e = input(0, {256}, d), state_c = state_e.clone();
  auto fn = [](const Tensor& state, const Tensor& x) -> TensorList {
    dist::all_reduce_(state, ReduceOp::Sum);  // step 0: on the stream
    Tensor h = mul(x, 3.0);                   // step 1
    dist::all_reduce_(h, ReduceOp::Sum);      // step 2: in line, after step 0's all-reduce
    return {add(h, 1.0)};
  };
  CompiledFunction f = compile([&](const Tensor& x) { return fn(state_c, x); }, {.name = "order"});
  for (int call = 0; call < 5; ++call) {
    Tensor x = input(call, {256}, d);
    Tensor want = fn(state_e, x)[0];
    EXPECT_TRUE(bitwise_equal(f({x})[0], want)) << "call " << call;
    EXPECT_TRUE(bitwise_equal(state_c, state_e)) << "call " << call;
  }
  expect_captured(f);
  if (d.is_cpu()) return;
  const std::string steps = f.steps_str(0);
  EXPECT_EQ(f.entries().at(0).comm_stream_steps, 1) << steps;
  EXPECT_EQ(steps_waiting(steps), std::vector<int>{2}) << steps;
}

}  // namespace
}  // namespace kiln::test

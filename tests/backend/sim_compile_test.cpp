// Compile's device-graph path (Note [Device graphs] in kiln/compile/device_graphs.cpp) on sim:
// warm-up then capture, static input copy-in, free tensors and static inputs by address (an
// address change updates the graph), capture errors naming the op, piecewise segments, and
// results equal to eager.
#include <gtest/gtest.h>

#include "kiln/compile/compile.h"
#include "kiln/core/stream.h"
#include "kiln/nn/layers.h"
#include "kiln/ops/ops.h"
#include "kiln/optim/optimizer.h"
#include "tests/backend/sim_util.h"
#include "tests/core/test_util.h"

namespace kiln::test {
namespace {

using kiln_test::contains;

std::vector<float> values(const Tensor& t) { return t.to_vector<float>(); }
Tensor srand_(std::initializer_list<int64_t> sizes, uint64_t seed) {
  Generator g(seed);
  return randn(sizes, &g).to(sim());
}

TEST(SimCompile, WarmUpThenCaptureThenReplayEqualsEager) {
  Tensor w = srand_({8, 4}, 1);
  auto fn = [&](const Tensor& x) { return mul(relu(add(matmul(x, w), 1.0)), 2.0); };
  CompiledFunction f = compile(fn, {.name = "mlp"});
  std::vector<int> captures;
  for (int i = 0; i < 5; ++i) {
    Tensor x = srand_({3, 8}, 10 + i);
    Tensor got = f({x})[0];
    EXPECT_EQ(got.device(), sim());
    EXPECT_EQ(values(got), values(fn(x))) << "call " << i;
    captures.push_back(f.entries().at(0).captures);
  }
  // Call 0 traces, call 1 replays the steps (the warm-up), call 2 captures.
  EXPECT_EQ(captures, (std::vector<int>{0, 0, 1, 1, 1}));
  CacheEntryInfo e = f.entries().at(0);
  EXPECT_TRUE(e.device_graphs);
  EXPECT_EQ(e.graph_updates, 0);
  EXPECT_TRUE(contains(f.explain(), "device graphs: 1 per replay")) << f.explain();
}

TEST(SimCompile, OutputsAreTheCallersNotTheGraphs) {
  CompiledFunction f = compile([](const Tensor& x) { return add(x, 1.0); });
  std::vector<Tensor> outs;
  for (int i = 0; i < 5; ++i)
    outs.push_back(f({full({2}, static_cast<double>(i), kFloat32, sim())})[0]);
  for (int i = 0; i < 5; ++i)
    EXPECT_EQ(values(outs[i]), std::vector<float>(2, static_cast<float>(i + 1))) << i;
}

TEST(SimCompile, StaticInputAddressChangeUpdatesTheGraph) {
  CompiledFunction f =
      compile([](const Tensor& x, const Tensor& w) { return mul(x, w); }, {.static_inputs = {1}});
  Tensor w = srand_({4}, 2), w2 = srand_({4}, 3);
  for (int i = 0; i < 4; ++i) {
    Tensor x = srand_({4}, 20 + i);
    EXPECT_EQ(values(f({x, w})[0]), values(mul(x, w)));
  }
  EXPECT_EQ(f.entries().at(0).captures, 1);
  Tensor x = srand_({4}, 30);
  EXPECT_EQ(values(f({x, w2})[0]), values(mul(x, w2)));  // another address
  EXPECT_EQ(values(f({x, w2})[0]), values(mul(x, w2)));
  CacheEntryInfo e = f.entries().at(0);
  EXPECT_EQ(f.entries().size(), 1u);
  EXPECT_EQ(e.captures, 2);
  EXPECT_EQ(e.graph_updates, 1);  // updated in place, not re-instantiated
  EXPECT_TRUE(f.miss_reasons().empty());
}

TEST(SimCompile, FreeTensorsAreStaticByAddress) {
  Tensor w = srand_({4}, 4);
  CompiledFunction f = compile([&](const Tensor& x) { return add(x, w); });
  Tensor x = srand_({4}, 5);
  for (int i = 0; i < 4; ++i) {
    w.copy_(full({4}, static_cast<double>(i), kFloat32, sim()));  // same address, new values
    EXPECT_EQ(values(f({x})[0]), values(add(x, w))) << i;
  }
  EXPECT_EQ(f.entries().at(0).captures, 1);
}

TEST(SimCompile, InputsWrittenInPlaceReachTheCaller) {
  auto fn = [](const Tensor& x) {
    Tensor y = x;
    add_(y, 1.0);
    return mul(x, 2.0);
  };
  CompiledFunction f = compile(fn);
  Tensor a = zeros({3}, kFloat32, sim()), b = zeros({3}, kFloat32, sim());
  for (int i = 0; i < 4; ++i) {
    Tensor want = fn(a);
    Tensor got = f({b})[0];
    EXPECT_EQ(values(got), values(want)) << i;
    EXPECT_EQ(values(b), values(a)) << i;
  }
  EXPECT_EQ(f.entries().at(0).captures, 1);
}

TEST(SimCompile, RandomOpsDrawFreshNumbersEachReplay) {
  auto fn = [](const Tensor& x) { return add(x, randn({4}, nullptr, kFloat32, sim())); };
  CompiledFunction f = compile(fn);
  Tensor x = zeros({4}, kFloat32, sim());
  manual_seed(5);
  std::vector<std::vector<float>> want;
  for (int i = 0; i < 5; ++i) want.push_back(values(fn(x)));
  manual_seed(5);
  for (int i = 0; i < 5; ++i) EXPECT_EQ(values(f({x})[0]), want[i]) << "call " << i;
  EXPECT_NE(want[3], want[4]);
  EXPECT_EQ(f.entries().at(0).captures, 1);
}

TEST(SimCompile, CaptureErrorNamesTheOpAndPiecewiseRunsItBetweenGraphs) {
  auto fn = [](const Tensor& x) {
    Tensor h = mul(x, 2.0).to(Device(kCPU));  // a copy through the host
    return add(h.to(sim()), 1.0);
  };
  CompiledFunction f = compile(fn, {.name = "hostcopy"});
  Tensor x = srand_({3}, 6);
  EXPECT_EQ(values(f({x})[0]), values(fn(x)));  // traced
  EXPECT_EQ(values(f({x})[0]), values(fn(x)));  // warm-up
  std::string msg = kiln_test::message_of<CompileError>([&] { (void)f({x}); });
  EXPECT_TRUE(contains(msg, "[compile] 'hostcopy': step")) << msg;
  EXPECT_TRUE(contains(msg, "op 'to_copy'")) << msg;
  EXPECT_TRUE(contains(msg, "a copy between host and device is not permitted")) << msg;
  EXPECT_TRUE(contains(msg, "piecewise")) << msg;

  CompiledFunction p = compile(fn, {.name = "hostcopy", .piecewise = true});
  for (int i = 0; i < 4; ++i) {
    Tensor xi = srand_({3}, 40 + i);
    EXPECT_EQ(values(p({xi})[0]), values(fn(xi))) << i;
  }
  CacheEntryInfo e = p.entries().at(0);
  EXPECT_TRUE(e.device_graphs);
  EXPECT_EQ(e.captures, 1);
  EXPECT_TRUE(contains(p.explain(), "device graphs: 2 per replay")) << p.explain();
}

TEST(SimCompile, PiecewiseRunsCpuStepsBetweenGraphsInOrder) {
  // Everything but the last op runs between graphs, starting with the very first step.
  auto fn = [](const Tensor& x) {
    Tensor h = x.to(Device(kCPU));  // a copy through the host
    Tensor h3 = mul(h, 3.0);        // a kernel on the cpu
    return add(h3.to(sim()), x);    // back, then one op on the device
  };
  CompiledFunction p = compile(fn, {.name = "cpu_steps", .piecewise = true});
  for (int i = 0; i < 5; ++i) {
    Tensor x = srand_({4}, 60 + i);
    EXPECT_EQ(values(p({x})[0]), values(fn(x))) << i;
  }
  EXPECT_TRUE(p.entries().at(0).device_graphs);
  EXPECT_EQ(p.entries().at(0).captures, 1);
  // Without piecewise the kernel on the cpu is refused by name: a graph cannot hold it.
  CompiledFunction f = compile(fn, {.name = "cpu_steps"});
  Tensor x = srand_({4}, 70);
  (void)f({x});
  (void)f({x});
  std::string msg = kiln_test::message_of<CompileError>([&] { (void)f({x}); });
  EXPECT_TRUE(contains(msg, "runs on the cpu, outside the graph on sim:0")) << msg;
  EXPECT_TRUE(contains(msg, "op 'mul'")) << msg;
}

TEST(SimCompile, PiecewiseAroundAHostRead) {
  auto fn = [](const Tensor& x) {
    Tensor s = sum(x);
    (void)s.item();  // a graph break
    return mul(x, s);
  };
  CompiledFunction f = compile(fn, {.piecewise = true});
  for (int i = 0; i < 4; ++i) {
    Tensor x = srand_({5}, 50 + i);
    EXPECT_EQ(values(f({x})[0]), values(fn(x))) << i;
  }
  EXPECT_TRUE(f.entries().at(0).device_graphs);
  EXPECT_TRUE(contains(f.explain(), "device graphs: 2 per replay")) << f.explain();
}

TEST(SimCompile, DynamicSizesCaptureOneGraphPerSize) {
  Tensor w = srand_({6, 3}, 8);
  auto fn = [&](const Tensor& x) { return sum(relu(matmul(x, w)), {0}); };
  CompiledFunction f = compile(fn, {.dynamic = {{0, 0}}});
  for (int64_t n : {2, 3, 4, 5, 4, 5, 5, 2, 2}) {
    Generator g(static_cast<uint64_t>(n));
    Tensor x = randn({n, 6}, &g).to(sim());
    EXPECT_EQ(values(f({x})[0]), values(fn(x))) << "batch " << n;
  }
  CacheEntryInfo e = f.entries().at(0);
  EXPECT_EQ(f.entries().size(), 1u);
  EXPECT_TRUE(e.device_graphs);
  EXPECT_GE(e.captures, 3);  // sizes 4, 5 and 2 were called often enough to be captured
}

TEST(SimCompile, OutputsThatViewAnInputViewTheCallersTensor) {
  CompiledFunction f = compile([](const Tensor& x) -> TensorList {
    return {mul(x, 2.0), transpose(x, 0, 1)};
  });
  for (int i = 0; i < 4; ++i) {
    Tensor x = srand_({2, 3}, 80 + i);
    TensorList out = f({x});
    EXPECT_EQ(out[1].impl()->storage(), x.impl()->storage()) << i;
    EXPECT_EQ(values(out[1].contiguous()), values(transpose(x, 0, 1).contiguous())) << i;
    EXPECT_EQ(values(out[0]), values(mul(x, 2.0))) << i;
  }
  EXPECT_TRUE(f.entries().at(0).device_graphs);
}

TEST(SimCompile, ACpuValueMadeInTheStepIsNotFrozenIntoAGraph) {
  auto fn = [](const Tensor& x) {
    Tensor s = sum(x).to(Device(kCPU));  // a 0-d cpu value, new at every call
    return mul(x, s);
  };
  CompiledFunction f = compile(fn);
  for (int i = 0; i < 4; ++i) {
    Tensor x = srand_({5}, 90 + i);
    EXPECT_EQ(values(f({x})[0]), values(fn(x))) << i;
  }
  EXPECT_FALSE(f.entries().at(0).device_graphs);
  EXPECT_TRUE(contains(f.explain(), "reads a cpu value made in the step")) << f.explain();
}

TEST(SimCompile, CallsOnTwoStreamsTakeTurns) {
  auto fn = [](const Tensor& x) { return mul(add(x, 1.0), 3.0); };
  CompiledFunction f = compile(fn);
  Device d = sim();
  Stream a = Stream::create(d), b = Stream::create(d);
  std::vector<Tensor> xs, ys;
  for (int i = 0; i < 12; ++i) xs.push_back(srand_({4096}, 100 + i));
  for (int i = 0; i < 12; ++i) {  // no synchronising in between: the calls overlap
    StreamGuard guard(i % 2 ? a : b);
    ys.push_back(f({xs[i]})[0]);
  }
  for (int i = 0; i < 12; ++i) EXPECT_EQ(values(ys[i]), values(fn(xs[i]))) << "call " << i;
  EXPECT_EQ(f.entries().at(0).captures, 1);
}

// Without graphs the replayed steps share their intermediate buffers between calls too.
TEST(SimCompile, CallsOnTwoStreamsTakeTurnsWithoutGraphs) {
  auto fn = [](const Tensor& x) { return mul(add(mul(x, 2.0), 1.0), 3.0); };
  CompiledFunction f = compile(fn, {.capture = false});
  Device d = sim();
  Stream a = Stream::create(d), b = Stream::create(d);
  std::vector<Tensor> xs, ys;
  for (int i = 0; i < 24; ++i) xs.push_back(srand_({1 << 16}, 300 + i));
  for (int i = 0; i < 24; ++i) {  // no synchronising in between: the calls overlap
    StreamGuard guard(i % 2 ? a : b);
    ys.push_back(f({xs[i]})[0]);
  }
  for (int i = 0; i < 24; ++i) EXPECT_EQ(values(ys[i]), values(fn(xs[i]))) << "call " << i;
  EXPECT_FALSE(f.entries().at(0).device_graphs);
}

TEST(SimCompile, CaptureOffReplaysTheSteps) {
  CompiledFunction f = compile([](const Tensor& x) { return add(x, 1.0); }, {.capture = false});
  Tensor x = srand_({3}, 7);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(values(f({x})[0]), values(add(x, 1.0)));
  EXPECT_FALSE(f.entries().at(0).device_graphs);
  EXPECT_TRUE(contains(f.explain(), "none, because CompileOptions::capture is off"));
}

TEST(SimCompileTrain, MlpStepsMatchEagerBitwise) {
  auto make = [] {
    Generator g(1);
    nn::Init init{.gen = &g};
    auto m = std::make_shared<nn::Sequential>();
    m->push_back(std::make_shared<nn::Linear>(16, 32, true, init));
    m->push_back(std::make_shared<nn::GELU>());
    m->push_back(std::make_shared<nn::Linear>(32, 10, true, init));
    m->to(sim());
    return m;
  };
  auto eager = make(), compiled = make();
  optim::AdamW eager_opt(eager->parameters(), {.lr = 1e-2});
  optim::AdamW opt(compiled->parameters(), {.lr = 1e-2});
  auto step = [](nn::Sequential& m, optim::Optimizer& o, const Tensor& x, const Tensor& y) {
    o.zero_grad();
    Tensor loss = cross_entropy(m.forward(x), y);
    loss.backward();
    o.step();
    return loss.detach();
  };
  CompiledFunction f =
      compile([&](const Tensor& x, const Tensor& y) { return step(*compiled, opt, x, y); },
              {.name = "step"});
  Generator data(7);
  for (int s = 1; s <= 8; ++s) {
    Tensor x = randn({8, 16}, &data).to(sim()), y = randint(0, 10, {8}, &data).to(sim());
    Tensor want = step(*eager, eager_opt, x, y);
    Tensor got = f({x, y})[0];
    EXPECT_EQ(got.item<float>(), want.item<float>()) << "loss at step " << s;
    if (s == 5) {
      eager_opt.set_lr(3e-3);
      opt.set_lr(3e-3);
    }
  }
  auto pa = eager->parameters(), pb = compiled->parameters();
  for (size_t i = 0; i < pa.size(); ++i) EXPECT_EQ(values(pa[i]), values(pb[i])) << i;
  CacheEntryInfo e = f.entries().at(0);
  EXPECT_TRUE(e.device_graphs);
  EXPECT_EQ(e.captures, 1);
  EXPECT_EQ(f.entries().size(), 1u);
}

// A kernel that fails during a replay, on the warm-up and on a captured graph: the caller gets
// an exception (sim reports a kernel's error at the next synchronisation, as CUDA does), and
// the next call with good inputs replays the same entry.
TEST(SimCompile, AKernelErrorDuringAReplayIsAnExceptionAndTheNextCallReplays) {
  auto fn = [](const Tensor& x, const Tensor& y) { return nll_loss(log_softmax(x, -1), y); };
  CompiledFunction f = compile(fn, {.name = "loss"});
  Tensor x = srand_({3, 5}, 4);
  Tensor good = from_vector<int64_t>({1, 4, 0}).to(sim()),
         bad = from_vector<int64_t>({1, 9, 0}).to(sim());
  const float want = fn(x, good).item<float>();
  auto call_bad = [&](const char* when) {
    try {
      Tensor r = f({x, bad})[0];
      synchronize(sim());
      ADD_FAILURE() << "expected an error " << when;
    } catch (const Error& e) {
      EXPECT_TRUE(contains(e.what(), "target 9 is out of bounds for 5 classes")) << e.what();
    }
  };
  EXPECT_EQ(f({x, good})[0].item<float>(), want);  // traced
  call_bad("in the warm-up replay");
  for (int i = 0; i < 3; ++i) EXPECT_EQ(f({x, good})[0].item<float>(), want) << "call " << i;
  call_bad("in a graph replay");
  for (int i = 0; i < 2; ++i) EXPECT_EQ(f({x, good})[0].item<float>(), want) << "after " << i;
  ASSERT_EQ(f.entries().size(), 1u);
  EXPECT_EQ(f.entries()[0].hits, 7);
}

}  // namespace
}  // namespace kiln::test

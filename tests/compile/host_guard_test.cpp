// kiln/compile/host_guard.h: host values as guards. The values and their text; nothing
// recorded without a trace; one guard per value; changes inside the traced call; owners that
// die; and, through kiln::compile, a scalar cell, a thread-local read, and Dropout's training
// flag in a compiled training step against the same steps run eagerly.
#include "kiln/compile/host_guard.h"

#include <cmath>
#include <cstdlib>
#include <limits>

#include <gtest/gtest.h>

#include "kiln/autograd/grad_mode.h"
#include "kiln/compile/compile.h"
#include "kiln/nn/layers.h"
#include "kiln/ops/ops.h"
#include "kiln/optim/optimizer.h"

namespace kiln {
namespace {

using compiler::HostCell;
using compiler::HostGuardRecorder;
using compiler::HostReader;
using compiler::HostValue;

enum class Mode : uint8_t { Fast, Exact };

// A scalar kept in a cell, as a Python wrapper would keep a call's scalar argument.
std::shared_ptr<HostCell> scalar_cell(HostValue v) {
  return HostCell::make(v, nullptr, [](const void*) { return std::string("scalar 'scale'"); });
}

// Thread-local state read through a HostReader, as autocast's dtype would be.
thread_local DType tls_dtype = kFloat32;
constexpr HostReader kTestDType{"test dtype", [] { return HostValue(tls_dtype); }};

void expect_equal(const Tensor& a, const Tensor& b, const std::string& what) {
  ASSERT_EQ(a.sizes(), b.sizes()) << what;
  EXPECT_EQ(a.to(kFloat64).to_vector<double>(), b.to(kFloat64).to_vector<double>()) << what;
}

TEST(CompileHostValue, KindsCompareAndPrint) {
  EXPECT_EQ(HostValue(true).str(), "true");
  EXPECT_EQ(HostValue(false).str(), "false");
  EXPECT_EQ(HostValue(int64_t{-3}).str(), "-3");
  EXPECT_EQ(HostValue(7).as_int(), 7);
  EXPECT_EQ(HostValue(0.5).str(), "0.5");
  EXPECT_EQ(HostValue(kBFloat16).str(), "bfloat16");
  EXPECT_EQ(HostValue(kBFloat16).as_dtype(), kBFloat16);
  EXPECT_EQ(HostValue::enumerator(Mode::Exact, "Exact").str(), "Exact");
  EXPECT_EQ(HostValue::enumerator(Mode::Exact, nullptr).str(), "1");
  EXPECT_EQ(HostValue(true), HostValue(true));
  EXPECT_FALSE(HostValue(true) == HostValue(false));
  EXPECT_FALSE(HostValue(1) == HostValue(true));  // kinds differ
  EXPECT_FALSE(HostValue(1) == HostValue(1.0));
  EXPECT_FALSE(HostValue(1) == HostValue::enumerator(Mode::Exact, "Exact"));
  EXPECT_EQ(HostValue::enumerator(Mode::Exact, "Exact"), HostValue::enumerator(Mode::Exact, "x"));
  EXPECT_FALSE(HostValue(0.0) == HostValue(-0.0));  // bitwise: 1 / x differs
  const double nan = std::numeric_limits<double>::quiet_NaN();
  EXPECT_EQ(HostValue(nan), HostValue(nan));
  EXPECT_FALSE(HostValue(kFloat16) == HostValue(kBFloat16));
}

TEST(CompileHostValue, RecordedOnlyWhileATraceIsRecordedOncePerValue) {
  auto cell = scalar_cell(4);
  HostGuardRecorder rec;
  EXPECT_EQ(detail::tls_host_guards, nullptr);
  cell->get();
  compiler::guard_host_value(kTestDType);
  cell->set(5);
  compiler::host_value_changing(kTestDType);
  EXPECT_TRUE(rec.guards().empty());
  {
    HostGuardRecorder::Scope scope(rec);
    EXPECT_EQ(detail::tls_host_guards, &rec);
    cell->get();
    cell->get();
    compiler::guard_host_value(kTestDType);
    compiler::guard_host_value(kTestDType);
  }
  EXPECT_EQ(detail::tls_host_guards, nullptr);
  ASSERT_EQ(rec.guards().size(), 2u);
  EXPECT_EQ(rec.guards()[0].str(), "scalar 'scale' == 5");
  EXPECT_EQ(rec.guards()[1].str(), "test dtype == float32");
  EXPECT_TRUE(rec.guards()[0].passes());
  EXPECT_EQ(rec.guards()[0].why(), "");
  cell->set(6);  // no trace: nothing recorded, the guard now fails
  tls_dtype = kFloat64;
  EXPECT_EQ(rec.guards().size(), 2u);
  EXPECT_FALSE(rec.guards()[0].passes());
  EXPECT_EQ(rec.guards()[0].why(), "scalar 'scale': expected 5, got 6");
  EXPECT_EQ(rec.guards()[1].why(), "test dtype: expected float32, got float64");
  tls_dtype = kFloat32;
  EXPECT_TRUE(rec.guards()[1].passes());
}

TEST(CompileHostValue, ChangesInsideATraceExpectTheValueTheCallStartedWith) {
  auto restored = scalar_cell(1.5);
  auto changed = HostCell::make(true, nullptr, [](const void*) { return std::string("flag"); });
  HostGuardRecorder rec;
  {
    HostGuardRecorder::Scope scope(rec);
    restored->set(2.5);  // written before any read
    restored->get();
    restored->set(1.5);
    changed->get();
    changed->set(false);
    compiler::host_value_changing(kTestDType);  // noted before the change is made
    tls_dtype = kFloat16;
  }
  ASSERT_EQ(rec.guards().size(), 3u);
  EXPECT_EQ(rec.guards()[0].str(), "scalar 'scale' == 1.5");
  EXPECT_EQ(rec.guards()[1].str(), "flag == true");
  EXPECT_EQ(rec.guards()[2].str(), "test dtype == float32");
  const std::vector<std::string> u = rec.unrestored();
  tls_dtype = kFloat32;
  ASSERT_EQ(u.size(), 2u);
  EXPECT_EQ(u[0], "flag changed from true to false");
  EXPECT_EQ(u[1], "test dtype changed from float32 to float16");
}

TEST(CompileHostValue, AReleasedCellFailsItsGuard) {
  auto cell = scalar_cell(true);
  HostGuardRecorder rec;
  {
    HostGuardRecorder::Scope scope(rec);
    cell->get();
  }
  cell->release();
  ASSERT_EQ(rec.guards().size(), 1u);
  EXPECT_FALSE(rec.guards()[0].passes());
  EXPECT_EQ(rec.guards()[0].why(), "scalar 'scale': its owner was destroyed after the trace");
  EXPECT_TRUE(rec.unrestored().empty());
}

TEST(CompileHostGuards, AScalarCellSteersTheTrace) {
  auto scale = scalar_cell(2.0);
  CompiledFunction f =
      compile([&](const Tensor& x) { return mul(x, scale->get().as_double()); }, {.name = "s"});
  Tensor x = arange(4, kFloat32);
  expect_equal(f({x})[0], mul(x, 2.0), "first call");
  expect_equal(f({x})[0], mul(x, 2.0), "hit");
  scale->set(3.0);
  expect_equal(f({x})[0], mul(x, 3.0), "after the change");
  ASSERT_EQ(f.miss_reasons().size(), 1u);
  EXPECT_EQ(f.miss_reasons()[0], "scalar 'scale': expected 2, got 3");
  scale->set(2.0);
  expect_equal(f({x})[0], mul(x, 2.0), "back to 2");
  EXPECT_EQ(f.miss_reasons().size(), 1u);  // entry 0 fits again
  ASSERT_EQ(f.entries().size(), 2u);
  EXPECT_EQ(f.entries()[0].hits, 2);
  EXPECT_NE(f.explain().find("    scalar 'scale' == 2\n"), std::string::npos) << f.explain();
  EXPECT_NE(f.explain().find("because: scalar 'scale': expected 2, got 3"), std::string::npos);
}

TEST(CompileHostGuards, AThreadLocalReadSteersTheTrace) {
  CompiledFunction f = compile([](const Tensor& x) {
    compiler::guard_host_value(kTestDType);
    return x.to(tls_dtype);
  });
  Tensor x = arange(3, kFloat32);
  EXPECT_EQ(f({x})[0].dtype(), kFloat32);
  tls_dtype = kFloat64;
  EXPECT_EQ(f({x})[0].dtype(), kFloat64);
  tls_dtype = kFloat32;
  ASSERT_EQ(f.miss_reasons().size(), 1u);
  EXPECT_EQ(f.miss_reasons()[0], "test dtype: expected float32, got float64");
}

TEST(CompileHostGuards, LogsListHostGuards) {
  setenv("KILN_LOGS", "recompiles,guards", 1);
  testing::internal::CaptureStderr();
  auto scale = scalar_cell(1);
  CompiledFunction f =
      compile([&](const Tensor& x) { return mul(x, static_cast<double>(scale->get().as_int())); },
              {.name = "logged"});
  f({ones({2})});
  scale->set(2);
  f({ones({2})});
  std::string err = testing::internal::GetCapturedStderr();
  unsetenv("KILN_LOGS");
  EXPECT_NE(err.find("scalar 'scale' == 1\n"), std::string::npos) << err;
  EXPECT_NE(err.find("[compile] 'logged' cache miss: scalar 'scale': expected 1, got 2"),
            std::string::npos)
      << err;
}

TEST(CompileHostGuards, AChangeTheCallDoesNotUndoIsAnError) {
  auto drop = std::make_shared<nn::Dropout>(0.5);
  Tensor x = ones({4});
  // Changed and restored inside the call: fine, guarded by the value the call started with.
  CompiledFunction restores = compile([&](const Tensor& t) {
    drop->eval();
    Tensor y = drop->forward(t);
    drop->train();
    return y;
  });
  expect_equal(restores({x})[0], x, "eval inside the call");
  expect_equal(restores({x})[0], x, "replay");
  EXPECT_TRUE(drop->is_training());
  EXPECT_EQ(restores.entries().at(0).hits, 1);
  EXPECT_NE(restores.explain().find("module Dropout training flag == true"), std::string::npos)
      << restores.explain();
  // Changed and left so: a replay would not change it.
  CompiledFunction leaves = compile([&](const Tensor& t) {
    drop->eval();
    return drop->forward(t);
  });
  try {
    leaves({x});
    FAIL() << "no error";
  } catch (const CompileError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("[compile] 'compiled': the function changed host values that steer its "
                     "trace and did not restore them: module Dropout training flag changed "
                     "from true to false"),
              std::string::npos)
        << m;
  }
}

TEST(CompileHostGuards, ModulePathsAndDestroyedModules) {
  auto inner = std::make_shared<nn::Sequential>();
  inner->push_back(std::make_shared<nn::GELU>());
  auto drop = std::make_shared<nn::Dropout>(0.5);
  inner->push_back(drop);
  EXPECT_EQ(drop->path(), "1");
  nn::Sequential outer({std::make_shared<nn::SiLU>(), inner});  // registered after its children
  EXPECT_EQ(drop->path(), "1.1");
  EXPECT_EQ(inner->path(), "1");
  EXPECT_EQ(outer.path(), "");
  EXPECT_EQ(drop->type_name(), "Dropout");
  EXPECT_EQ(outer.type_name(), "Sequential");

  Generator gen(5);
  auto held = std::make_shared<nn::Dropout>(0.5, &gen);
  CompiledFunction f = compile([&](const Tensor& x) {
    Tensor a = outer.forward(x);  // read first: its guard comes first
    return add(a, held->forward(x));
  });
  Tensor x = ones({8});
  f({x});
  outer.eval();
  f({x});
  held = std::make_shared<nn::Dropout>(0.5, &gen);  // the traced one is destroyed
  f({x});
  const std::vector<std::string> r = f.miss_reasons();
  ASSERT_EQ(r.size(), 2u);
  EXPECT_EQ(r[0], "module '1.1' (Dropout) training flag: expected true, got false");
  EXPECT_EQ(r[1],
            "entry 0: module '1.1' (Dropout) training flag: expected true, got false; entry 1: "
            "module Dropout training flag: its owner was destroyed after the trace");
}

TEST(CompileHostGuards, AModuleMadeInsideTheFunctionIsNotGuarded) {
  CompiledFunction f = compile([](const Tensor& x) {
    nn::Dropout d(0.5);
    d.eval();
    return d.forward(x);
  });
  Tensor x = ones({4});
  for (int i = 0; i < 3; ++i) expect_equal(f({x})[0], x, fmt::format("call {}", i));
  EXPECT_TRUE(f.miss_reasons().empty()) << f.explain();
  EXPECT_EQ(f.entries().at(0).hits, 2);
  EXPECT_EQ(f.explain().find("training flag"), std::string::npos) << f.explain();
}

// Linear, Dropout, Linear: 8 -> 16 -> 4.
std::shared_ptr<nn::Sequential> make_net(uint64_t seed, Generator* drop_gen) {
  Generator gen(seed);
  nn::Init init{.gen = &gen};
  auto m = std::make_shared<nn::Sequential>();
  m->push_back(std::make_shared<nn::Linear>(8, 16, true, init));
  m->push_back(std::make_shared<nn::Dropout>(0.5, drop_gen));
  m->push_back(std::make_shared<nn::Linear>(16, 4, true, init));
  return m;
}

// The bug this guard fixes: a step traced in training kept dropping values after eval().
TEST(CompileHostGuards, DropoutTrainEvalTrainMatchesEager) {
  Generator eager_drop(11), compiled_drop(11);
  auto eager = make_net(1, &eager_drop), net = make_net(1, &compiled_drop);
  optim::SGD eager_opt(eager->parameters(), {.lr = 0.1, .momentum = 0.9});
  optim::SGD opt(net->parameters(), {.lr = 0.1, .momentum = 0.9});
  auto step = [](nn::Sequential& m, optim::Optimizer& o, const Tensor& x,
                 const Tensor& y) -> TensorList {
    o.zero_grad();
    Tensor out = m.forward(x);
    Tensor loss = cross_entropy(out, y);
    loss.backward();
    o.step();
    return {loss.detach(), out.detach()};
  };
  CompiledFunction f = compile(
      [&](const Tensor& x, const Tensor& y) { return step(*net, opt, x, y); }, {.name = "step"});
  Generator data(3);
  int call = 0;
  auto run = [&](const std::string& phase) {
    ++call;
    Tensor x = randn({6, 8}, &data), y = randint(0, 4, {6}, &data);
    Tensor undropped;  // what the compiled model computes without dropout, before the step
    {
      autograd::NoGradGuard no_grad;
      undropped = (*net)[2].forward((*net)[0].forward(x));
    }
    TensorList want = step(*eager, eager_opt, x, y);
    TensorList got = f({x, y});
    const std::string what = fmt::format("{} call {}", phase, call);
    expect_equal(got[0], want[0], what + " loss");
    expect_equal(got[1], want[1], what + " output");
    auto pe = eager->parameters(), pc = net->parameters();
    for (size_t i = 0; i < pe.size(); ++i) expect_equal(pc[i], pe[i], what + " parameters");
    if (phase == "eval")
      expect_equal(got[1], undropped, what + ": no dropout in eval");
    else
      EXPECT_NE(got[1].to_vector<float>(), undropped.to_vector<float>()) << what;
  };

  for (int i = 0; i < 3; ++i) run("train");  // warm-up, trace, replay
  EXPECT_TRUE(f.miss_reasons().empty());
  ASSERT_EQ(f.entries().size(), 1u);
  EXPECT_EQ(f.entries()[0].hits, 1);

  eager->eval();
  net->eval();
  for (int i = 0; i < 3; ++i) run("eval");  // one miss, then replays of the eval trace
  ASSERT_EQ(f.miss_reasons().size(), 1u);
  EXPECT_EQ(f.miss_reasons()[0], "module '1' (Dropout) training flag: expected true, got false");
  ASSERT_EQ(f.entries().size(), 2u);
  EXPECT_EQ(f.entries()[1].hits, 2);

  eager->train();
  net->train();
  for (int i = 0; i < 3; ++i) run("train");  // the training entry fits again: replays
  EXPECT_EQ(f.miss_reasons().size(), 1u);
  ASSERT_EQ(f.entries().size(), 2u);
  EXPECT_EQ(f.entries()[0].hits, 4);

  eager->eval();
  net->eval();
  run("eval");
  EXPECT_EQ(f.entries()[1].hits, 3);
  EXPECT_EQ(f.miss_reasons().size(), 1u);
  EXPECT_EQ(f.eager_calls(), 1);
}

}  // namespace
}  // namespace kiln

// kiln::compile: results against eager, the guard hit/miss matrix, recompile limits, dynamic
// dims, free tensors, graph breaks, passes, outputs, logs and explain().
#include "kiln/compile/compile.h"

#include <atomic>
#include <cstdlib>
#include <thread>

#include <gtest/gtest.h>

#include "kiln/autograd/engine.h"
#include "kiln/autograd/grad_mode.h"
#include "kiln/compile/trace.h"
#include "kiln/ops/distance.h"
#include "kiln/ops/ops.h"
#include "kiln/profiler/profiler.h"

namespace kiln {
namespace {

Tensor rnd(IntArrayRef sizes, uint64_t seed, DType dtype = kFloat32) {
  Generator g(seed);
  return randn(sizes, &g, dtype);
}

void expect_equal(const Tensor& a, const Tensor& b, const std::string& what = "") {
  ASSERT_EQ(a.sizes(), b.sizes()) << what;
  ASSERT_EQ(a.dtype(), b.dtype()) << what;
  EXPECT_EQ(a.to(kFloat64).to_vector<double>(), b.to(kFloat64).to_vector<double>()) << what;
}

// A small function with views, reductions, a matmul and broadcasting.
TensorList small_fn(std::span<const Tensor> in) {
  Tensor h = relu(add(mm(in[0], in[1]), 0.5));
  Tensor s = softmax(h.view({h.numel()}).view(h.sizes()), 1);
  return {sum(mul(s, h), {1}), transpose(h, 0, 1)};
}

TEST(Compile, MatchesEagerAndCompilesOnce) {
  Tensor a = rnd({4, 3}, 1), b = rnd({3, 5}, 2);
  TensorList want = small_fn(std::vector<Tensor>{a, b});
  CompiledFunction f = compile(&small_fn, {.name = "small"});
  for (int i = 0; i < 1000; ++i) {
    TensorList got = f({a, b});
    ASSERT_EQ(got.size(), 2u);
    if (i % 100 == 0) {
      expect_equal(got[0], want[0], "output 0");
      expect_equal(got[1], want[1], "output 1");
    }
  }
  ASSERT_EQ(f.entries().size(), 1u);
  EXPECT_EQ(f.entries()[0].hits, 999);
  EXPECT_TRUE(f.miss_reasons().empty());
}

TEST(Compile, NewInputValuesEachCall) {
  CompiledFunction f = compile([](const Tensor& x, const Tensor& y) { return mul(add(x, y), x); });
  for (int i = 0; i < 5; ++i) {
    Tensor x = rnd({6}, 10 + i), y = rnd({6}, 20 + i);
    expect_equal(f({x, y})[0], mul(add(x, y), x));
  }
  EXPECT_EQ(f.entries().size(), 1u);
}

TEST(Compile, NonContiguousAndOffsetInputs) {
  CompiledFunction f = compile([](const Tensor& x) { return mul(x, 2.0); });
  Tensor base = rnd({8, 8}, 3);
  Tensor t1 = slice(transpose(base, 0, 1), 0, 1, 5);  // offset 1, strides [1, 8]
  expect_equal(f({t1})[0], mul(t1, 2.0));
  Tensor base2 = rnd({8, 8}, 4);
  Tensor t2 = slice(transpose(base2, 0, 1), 0, 2, 6);  // same geometry, another offset
  expect_equal(f({t2})[0], mul(t2, 2.0));
  EXPECT_EQ(f.entries().size(), 1u);
}

// ---------------------------------------------------------------- guards
struct GuardCase {
  const char* name;
  std::function<Tensor()> make;  // the second call's input (the first is [4, 3] float32)
  const char* reason;            // expected miss reason; nullptr for a hit
  std::function<void()> around = nullptr;
};

// The padding and upsampling ops replay with their int-list, Scalar and float? arguments (Note
// [Padding and upsampling]): every call equals eager.
TEST(Compile, PaddingAndUpsamplingMatchEager) {
  auto fn = [](const Tensor& x) {
    Tensor y = upsample_bilinear2d(reflection_pad2d(x, {1, 2, 2, 1}), {9, 11}, true);
    Tensor z =
        upsample_nearest2d(constant_pad_nd(y, {1, -1, 2, 0}, 0.5), {6, 7}, 0.6, std::nullopt);
    return replication_pad1d(sum(z, {1}), {2, 3});
  };
  CompiledFunction f = compile(fn);
  for (int i = 0; i < 3; ++i) {
    Tensor x = rnd({2, 3, 4, 5}, 30 + i);
    expect_equal(f({x})[0], fn(x));
  }
  EXPECT_EQ(f.entries().size(), 1u);
}

TEST(CompileGuards, HitMissMatrix) {
  std::vector<GuardCase> cases = {
      {"same",
       [] {
         return rnd({4, 3}, 2);
       },
       nullptr},
      {"dtype",
       [] {
         return rnd({4, 3}, 2, kFloat64);
       },
       "input 0 ('x') dtype mismatch: expected float32, got float64"},
      {"size",
       [] {
         return rnd({8, 3}, 2);
       },
       "input 0 ('x') size mismatch at dim 0: expected 4, got 8"},
      {"rank", [] { return rnd({12}, 2); },
       "input 0 ('x') rank mismatch: expected 2 dims [4, 3], got 1 dims [12]"},
      {"strides",
       [] {
         return transpose(rnd({3, 4}, 2), 0, 1);
       },
       "input 0 ('x') stride mismatch: expected [3, 1], got [1, 4]"},
      {"requires_grad",
       [] {
         return rnd({4, 3}, 2).requires_grad_();
       },
       "input 0 ('x') requires_grad mismatch: expected false, got true"},
      {"device spelled cpu",
       [] {
         return rnd({4, 3}, 2).to(Device("cpu"));
       },
       nullptr},
      {"device spelled cpu:0",
       [] {
         return zeros({4, 3}, kFloat32, Device("cpu:0"));
       },
       nullptr},
      {"device spelled kCPU, 0",
       [] {
         return zeros({4, 3}, kFloat32, Device(kCPU, 0));
       },
       nullptr},
  };
  for (const GuardCase& c : cases) {
    SCOPED_TRACE(c.name);
    CompiledFunction f = compile([](const Tensor& x) { return mul(x, x).detach(); },
                                 {.name = c.name, .input_names = {"x"}});
    f({rnd({4, 3}, 1)});
    Tensor second = c.make();
    f({second});
    if (c.reason) {
      ASSERT_EQ(f.miss_reasons().size(), 1u);
      EXPECT_EQ(f.miss_reasons()[0], c.reason);
      EXPECT_EQ(f.entries().size(), 2u);
    } else {
      EXPECT_TRUE(f.miss_reasons().empty());
      EXPECT_EQ(f.entries().size(), 1u);
    }
  }
}

TEST(CompileGuards, ModesAreGuarded) {
  Tensor x = rnd({3}, 1);
  CompiledFunction f = compile([](const Tensor& t) { return exp(t); });
  f({x});
  {
    autograd::NoGradGuard no_grad;
    f({x});
  }
  {
    DType saved = default_dtype();
    set_default_dtype(kFloat64);
    f({x});
    set_default_dtype(saved);
  }
  f({x});
  std::vector<std::string> r = f.miss_reasons();
  ASSERT_EQ(r.size(), 2u);
  EXPECT_EQ(r[0], "grad mode: expected enabled, got disabled");
  EXPECT_EQ(r[1],
            "entry 0: default dtype: expected float32, got float64; entry 1: grad mode: "
            "expected disabled, got enabled");
  EXPECT_EQ(f.entries().size(), 3u);
  EXPECT_EQ(f.entries()[0].hits, 1);  // the last call
}

TEST(CompileGuards, InputAliasing) {
  CompiledFunction f = compile([](const Tensor& a, const Tensor& b) { return add(a, b); },
                               {.input_names = {"a", "b"}});
  Tensor x = rnd({4}, 1), y = rnd({4}, 2);
  f({x, y});
  f({x, x});
  ASSERT_EQ(f.miss_reasons().size(), 1u);
  EXPECT_EQ(f.miss_reasons()[0],
            "input 1 ('b') shares storage with input 0 ('a'); when traced they were separate");
  expect_equal(f({x, x})[0], add(x, x));
}

TEST(CompileGuards, StaticInputsRebindWhenTheirStorageChanges) {
  Tensor w = rnd({3}, 1);
  CompiledFunction f = compile([](const Tensor& x, const Tensor& w) { return mul(x, w); },
                               {.static_inputs = {1}, .input_names = {"x", "w"}});
  for (int i = 0; i < 3; ++i) {
    Tensor x = rnd({3}, 10 + i);
    {
      autograd::NoGradGuard ng;
      add_(w, 1.0);  // the same storage, new values: still a hit
    }
    expect_equal(f({x, w})[0], mul(x, w));
  }
  EXPECT_EQ(f.entries().size(), 1u);
  // Another storage: not a miss; the executable binds it (on a device with graphs, the graph
  // is updated: tests/backend/sim_compile_test.cpp).
  Tensor w2 = mul(w, 3.0);
  Tensor x = rnd({3}, 20);
  expect_equal(f({x, w2})[0], mul(x, w2));
  expect_equal(f({x, w})[0], mul(x, w));
  EXPECT_TRUE(f.miss_reasons().empty());
  EXPECT_EQ(f.entries().size(), 1u);
  CompiledFunction g = compile([](const Tensor& x) { return x; }, {.static_inputs = {3}});
  EXPECT_THROW(g({x}), ValueError);
}

TEST(CompileGuards, FreeTensorIdentity) {
  auto w = std::make_shared<Tensor>(rnd({3}, 1));
  CompiledFunction f = compile([w](const Tensor& x) { return mul(x, *w); });
  Tensor x = rnd({3}, 2);
  f({x});
  f({x});
  *w = rnd({3}, 3);  // the function now reaches a different tensor
  expect_equal(f({x})[0], mul(x, *w));
  ASSERT_EQ(f.miss_reasons().size(), 1u);
  EXPECT_NE(f.miss_reasons()[0].find("is no longer referenced outside the compiled function"),
            std::string::npos)
      << f.miss_reasons()[0];
}

TEST(CompileLimits, ErrorAtTheLimit) {
  CompiledFunction f =
      compile([](const Tensor& x) { return neg(x); }, {.name = "neg", .recompile_limit = 2});
  f({rnd({1}, 1)});
  f({rnd({2}, 1)});
  try {
    f({rnd({3}, 1)});
    FAIL() << "expected a CompileError";
  } catch (const CompileError& e) {
    EXPECT_NE(std::string(e.what()).find("[compile] 'neg' reached its recompile limit (2 cache "
                                         "entries) and none fits: entry 0: input 0 size mismatch "
                                         "at dim 0: expected 1, got 3"),
              std::string::npos)
        << e.what();
  }
  EXPECT_EQ(f.entries().size(), 2u);
}

TEST(CompileLimits, EagerAtTheLimitWarnsOnce) {
  CompiledFunction f =
      compile([](const Tensor& x) { return neg(x); },
              {.name = "neg", .recompile_limit = 1, .at_limit = RecompileLimitAction::Eager});
  f({rnd({1}, 1)});
  testing::internal::CaptureStderr();
  Tensor a = rnd({2}, 1), b = rnd({3}, 1);
  expect_equal(f({a})[0], neg(a));
  expect_equal(f({b})[0], neg(b));
  std::string err = testing::internal::GetCapturedStderr();
  EXPECT_NE(err.find("kiln: warning: [compile] 'neg' reached its recompile limit"),
            std::string::npos)
      << err;
  EXPECT_EQ(err.find("warning", err.find("warning") + 1), std::string::npos) << "warned twice";
  EXPECT_EQ(f.eager_calls(), 2);
  EXPECT_EQ(f.entries().size(), 1u);
}

TEST(CompileLimits, BadOptions) {
  EXPECT_THROW(compile([](const Tensor& x) { return x; }, {.recompile_limit = 0}), ValueError);
  CompiledFunction f = compile([](const Tensor& x, const Tensor& y) { return add(x, y); });
  EXPECT_THROW(f({rnd({2}, 1)}), ValueError);  // takes two tensors
  CompiledFunction g =
      compile([](const Tensor& x) { return neg(x); }, {.dynamic = {{.input = 0, .dim = 3}}});
  EXPECT_THROW(g({rnd({2}, 1)}), ValueError);
  CompiledFunction h = compile([](const Tensor& x) { return neg(x); }, {.input_names = {"x"}});
  try {
    h({Tensor()});
    FAIL();
  } catch (const ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("input 0 ('x') is an undefined tensor"), std::string::npos)
        << e.what();
  }
  h({rnd({2}, 1)});
  EXPECT_THROW(h({Tensor()}), ValueError);  // a miss, then the same error
  EXPECT_EQ(h.entries().size(), 1u);
}

// ---------------------------------------------------------------- dynamic dims
TEST(CompileDynamic, BatchSizesShareOneEntry) {
  Tensor w = rnd({5, 3}, 7);
  auto fn = [&](const Tensor& x) { return mean(linear(x, w), {0}); };
  CompiledFunction f = compile(fn, {.dynamic = {{.input = 0, .dim = 0}}});
  for (int64_t b : {4, 8, 16, 8, 4, 2, 16}) {
    Tensor x = rnd({b, 3}, static_cast<uint64_t>(b));
    expect_equal(f({x})[0], fn(x), fmt::format("batch {}", b));
  }
  ASSERT_EQ(f.entries().size(), 1u);
  EXPECT_EQ(f.entries()[0].size_specializations, 4);
  EXPECT_EQ(f.entries()[0].sizes_derived, 2) << "16 and 2 derived from the traces of 4 and 8";
  EXPECT_TRUE(f.miss_reasons().empty());
  EXPECT_EQ(f.entries()[0].hits, 5);
}

TEST(CompileDynamic, TrainingStepWithDynamicBatch) {
  // A training step whose graph depends on the batch size in view shapes, in a mean's
  // divisor (an integer constant) and in cross-entropy's sizes: two sizes are traced, the
  // others derived, every step equal to the eager one bitwise.
  auto make = [](uint64_t seed) {
    Generator g(seed);
    return std::pair{randn({5, 6}, &g).requires_grad_(), randn({5}, &g).requires_grad_()};
  };
  auto [w1, b1] = make(3);
  auto [w2, b2] = make(3);
  auto step = [](Tensor& w, Tensor& b, const Tensor& x, const Tensor& y) {
    Tensor h = gelu(linear(x, w, b));
    Tensor logits = h.view({x.size(0), 5});
    Tensor loss = add(cross_entropy(logits, y), mean(mul(h, h)));
    loss.backward();
    autograd::NoGradGuard ng;
    for (Tensor* p : {&w, &b}) {
      add_(*p, mul(p->grad(), -0.1));
      Tensor g = p->grad();
      g.zero_();
    }
    return loss.detach();
  };
  CompiledFunction f = compile([&](const Tensor& x, const Tensor& y) { return step(w2, b2, x, y); },
                               {.dynamic = {{0, 0}, {1, 0}}});
  Generator data(5);
  for (int64_t n : {4, 4, 8, 16, 3, 8, 12}) {
    Tensor x = randn({n, 6}, &data), y = randint(0, 5, {n}, &data);
    Tensor want = step(w1, b1, x, y);
    expect_equal(f({x, y})[0], want, fmt::format("batch {}", n));
    expect_equal(w2, w1, fmt::format("weights after batch {}", n));
  }
  ASSERT_EQ(f.entries().size(), 1u);
  EXPECT_GE(f.entries()[0].sizes_derived, 2) << f.explain();
  EXPECT_TRUE(f.miss_reasons().empty());
}

TEST(CompileDynamic, FloatsThatDependOnTheSizeAreTraced) {
  auto fn = [](const Tensor& x) { return mul(sum(x, {0}), 1.0 / static_cast<double>(x.size(0))); };
  CompiledFunction f = compile(fn, {.dynamic = {{0, 0}}});
  for (int64_t n : {2, 4, 8, 16}) {
    Tensor x = rnd({n, 3}, static_cast<uint64_t>(n));
    expect_equal(f({x})[0], fn(x), fmt::format("batch {}", n));
  }
  ASSERT_EQ(f.entries().size(), 1u);
  EXPECT_EQ(f.entries()[0].sizes_derived, 0);
  EXPECT_EQ(f.entries()[0].size_specializations, 4);
  EXPECT_NE(f.explain().find("new sizes are traced: the graphs traced at sizes 2 and 4 differ"),
            std::string::npos)
      << f.explain();
}

TEST(CompileDynamic, FreeTensorIdentityWithManySizes) {
  auto w = std::make_shared<Tensor>(rnd({3}, 1));
  CompiledFunction f =
      compile([w](const Tensor& x) { return mul(x, *w); }, {.dynamic = {{.input = 0, .dim = 0}}});
  for (int64_t n : {2, 4, 8, 16}) f({rnd({n, 3}, 2)});  // two traced, two derived
  EXPECT_EQ(f.entries().at(0).sizes_derived, 2);
  *w = rnd({3}, 3);  // the function now reaches a different tensor
  Tensor x = rnd({8, 3}, 4);
  expect_equal(f({x})[0], mul(x, *w));
  ASSERT_EQ(f.miss_reasons().size(), 1u);
  EXPECT_NE(f.miss_reasons()[0].find("is no longer referenced outside"), std::string::npos)
      << f.miss_reasons()[0];
}

TEST(CompileDynamic, MarkDynamic) {
  CompiledFunction f = compile([](const Tensor& x) { return sum(x, {1}); });
  Tensor a = rnd({2, 3}, 1);
  mark_dynamic(a, 1);
  f({a});
  Tensor b = rnd({2, 9}, 2);
  expect_equal(f({b})[0], sum(b, {1}));
  EXPECT_EQ(f.entries().size(), 1u);
  EXPECT_THROW(mark_dynamic(a, 2), IndexError);
}

// ---------------------------------------------------------------- mutation
TEST(CompileMutation, FreeTensorsAreUpdatedInOrder) {
  Tensor acc = zeros({3});
  Tensor count = zeros({});
  auto fn = [&](const Tensor& x) {
    autograd::NoGradGuard ng;
    add_(acc, x);
    mul_(acc, 0.5);
    add_(count, 1.0);
    return add(acc, count);
  };
  Tensor acc_ref = zeros({3}), count_ref = zeros({});
  CompiledFunction f = compile(fn);
  for (int i = 0; i < 6; ++i) {
    Tensor x = rnd({3}, 30 + i);
    Tensor got = f({x})[0];
    add_(acc_ref, x);
    mul_(acc_ref, 0.5);
    add_(count_ref, 1.0);
    expect_equal(got, add(acc_ref, count_ref), fmt::format("call {}", i));
  }
  expect_equal(acc, acc_ref);
  EXPECT_EQ(count.item<double>(), 6.0);
  EXPECT_EQ(f.entries().size(), 1u);
}

TEST(CompileMutation, InPlaceOnInputsReachesTheCaller) {
  CompiledFunction f = compile([](const Tensor& x) {
    Tensor t = x;
    mul_(t, 2.0);
    return add(x, 1.0);
  });
  for (int i = 0; i < 3; ++i) {
    Tensor x = rnd({4}, 40 + i), orig = x.clone();
    uint64_t v0 = x.version();
    Tensor y = f({x})[0];
    expect_equal(x, mul(orig, 2.0));
    expect_equal(y, add(mul(orig, 2.0), 1.0));
    EXPECT_GT(x.version(), v0);
  }
}

TEST(CompileMutation, StateMadeEveryCallIsAnError) {
  std::vector<Tensor> kept;
  CompiledFunction f = compile(
      [&](const Tensor& x) {
        kept.push_back(mul(x, 2.0));
        return add(x, 1.0);
      },
      {.name = "leaky"});
  Tensor x = rnd({2}, 1);
  expect_equal(f({x})[0], add(x, 1.0));  // warm-up
  EXPECT_EQ(f.eager_calls(), 1);
  try {
    f({x});
    FAIL() << "expected a CompileError";
  } catch (const CompileError& e) {
    EXPECT_NE(std::string(e.what()).find("outlive the call without being returned"),
              std::string::npos)
        << e.what();
    EXPECT_NE(std::string(e.what()).find("'mul' made %"), std::string::npos) << e.what();
  }
}

TEST(CompileMutation, ConstantsMadeWithoutOps) {
  // scalar_tensor makes a tensor without an op: it is baked in as a constant.
  CompiledFunction f = compile([](const Tensor& x) { return mul(x, scalar_tensor(3.0)); });
  for (int i = 0; i < 3; ++i) {
    Tensor x = rnd({3}, 50 + i);
    expect_equal(f({x})[0], mul(x, 3.0));
  }
  EXPECT_EQ(f.entries().size(), 1u);
}

TEST(CompileMutation, NestedCompiledFunctionsAreTracedThrough) {
  CompiledFunction inner = compile([](const Tensor& x) { return mul(x, 2.0); });
  Tensor x0 = rnd({3}, 1);
  inner({x0});
  inner({x0});  // inner now replays when called on its own
  CompiledFunction outer = compile([&](const Tensor& x) { return add(inner({x})[0], 1.0); });
  for (int i = 0; i < 3; ++i) {
    Tensor x = rnd({3}, 70 + i);
    expect_equal(outer({x})[0], add(mul(x, 2.0), 1.0), fmt::format("call {}", i));
  }
  EXPECT_EQ(outer.entries().at(0).steps, 2) << outer.steps_str();
}

TEST(CompileMutation, AnExceptionWhileTracingLeavesNoEntry) {
  bool fail = true;
  CompiledFunction f = compile([&](const Tensor& x) {
    Tensor y = mul(x, 3.0);
    if (fail) mm(ones({2, 3}), ones({2, 3}));  // a size mismatch raises
    return y;
  });
  Tensor x = rnd({3}, 1);
  EXPECT_THROW(f({x}), ValueError);
  EXPECT_TRUE(f.entries().empty());
  EXPECT_FALSE(profiler::enabled());
  fail = false;
  expect_equal(f({x})[0], mul(x, 3.0));
  expect_equal(f({x})[0], mul(x, 3.0));
  EXPECT_EQ(f.entries().size(), 1u);
  EXPECT_FALSE(local_dispatch_state().included.has(DispatchKey::Trace));
  EXPECT_EQ(compiler::current_tracer(), nullptr);
}

TEST(CompileMutation, RandomOpsDrawFreshNumbersOnEveryReplay) {
  // dropout and randn have no out= variant: their kernels run at replay and advance the
  // generator, so a compiled run draws the same sequence as an eager one from the same seed.
  auto fn = [](const Tensor& x, Generator* g) {
    return add(dropout(x, 0.5, true, g), randn({4}, g));
  };
  Generator ge(42), gc(42);
  CompiledFunction f = compile([&](const Tensor& x) { return fn(x, &gc); });
  Tensor x = ones({4});
  std::vector<std::vector<float>> seen;
  for (int i = 0; i < 4; ++i) {
    Tensor got = f({x})[0];
    expect_equal(got, fn(x, &ge), fmt::format("call {}", i));
    seen.push_back(got.to_vector<float>());
  }
  EXPECT_NE(seen[2], seen[3]);
  EXPECT_EQ(f.entries().at(0).hits, 3);
  EXPECT_NE(f.explain().find("2 allocate their result"), std::string::npos) << f.explain();
}

TEST(CompileMutation, CallsFromSeveralThreadsAreSerialised) {
  CompiledFunction f = compile([](const Tensor& x) { return mul(add(x, 1.0), 2.0); });
  f({rnd({64}, 1)});
  std::vector<std::thread> threads;
  std::atomic<int> wrong{0};
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&, t] {
      for (int i = 0; i < 200; ++i) {
        Tensor x = rnd({64}, 1000 * t + i);
        Tensor y = f({x})[0];
        if (y.to_vector<float>() != mul(add(x, 1.0), 2.0).to_vector<float>()) ++wrong;
      }
    });
  for (auto& th : threads) th.join();
  EXPECT_EQ(wrong.load(), 0);
  EXPECT_EQ(f.entries().size(), 1u);
}

// ---------------------------------------------------------------- outputs
TEST(CompileOutputs, CallerOwnsOutputs) {
  CompiledFunction f = compile([](const Tensor& x) { return mul(x, 3.0); });
  Tensor a = rnd({4}, 1), b = rnd({4}, 2);
  Tensor ya = f({a})[0];
  Tensor ya2 = f({a})[0];  // the first replay
  Tensor yb = f({b})[0];   // must not overwrite ya2, which is still held
  expect_equal(ya2, mul(a, 3.0));
  expect_equal(yb, mul(b, 3.0));
  EXPECT_NE(ya2.data_ptr(), yb.data_ptr());
}

TEST(CompileOutputs, ReturningInputsAndFreeTensors) {
  Tensor w = rnd({2}, 9);
  CompiledFunction f = compile([&](const Tensor& x) { return TensorList{x, w, x.view({2, 1})}; });
  Tensor x = rnd({2}, 1);
  f({x});
  TensorList out = f({x});
  EXPECT_TRUE(out[0].is_same(x));
  EXPECT_TRUE(out[1].is_same(w));
  EXPECT_EQ(out[2].data_ptr(), x.data_ptr());
  EXPECT_EQ(out[2].sizes(), Shape({2, 1}).span());
}

TEST(CompileOutputs, HistoryIsAnError) {
  Tensor w = rnd({3}, 1).requires_grad_();
  CompiledFunction f = compile([&](const Tensor& x) { return mul(x, w); });
  EXPECT_THROW(f({rnd({3}, 2)}), CompileError);
  autograd::NoGradGuard ng;
  CompiledFunction g = compile([&](const Tensor& x) { return mul(x, w); });
  g({rnd({3}, 2)});
  EXPECT_EQ(g.entries().size(), 1u);
}

// ---------------------------------------------------------------- graph breaks
TEST(CompileBreaks, HostReadIsAnErrorNamingTheOp) {
  CompiledFunction f = compile(
      [](const Tensor& x) {
        Tensor s = sum(x);
        double v = s.item<double>();
        return mul(x, v > 0 ? 1.0 : -1.0);
      },
      {.name = "branchy"});
  try {
    f({rnd({4}, 1)});
    FAIL() << "expected a CompileError";
  } catch (const CompileError& e) {
    std::string m = e.what();
    EXPECT_NE(m.find("[compile] 'branchy': graph break"), std::string::npos) << m;
    EXPECT_NE(m.find("item() of %"), std::string::npos) << m;
    EXPECT_NE(m.find("after n0 'sum'"), std::string::npos) << m;
    EXPECT_NE(m.find("piecewise"), std::string::npos) << m;
  }
}

TEST(CompileBreaks, PiecewiseRunsTheReadBetweenSegments) {
  std::vector<double> seen;
  CompiledFunction f = compile(
      [&](const Tensor& x) {
        Tensor s = sum(x);
        seen.push_back(s.item<double>());  // logging: host code runs while tracing only
        return exp(s);
      },
      {.name = "logged", .piecewise = true});
  for (int i = 0; i < 4; ++i) {
    Tensor x = rnd({4}, 60 + i);
    expect_equal(f({x})[0], exp(sum(x)));
  }
  ASSERT_EQ(f.entries().size(), 1u);
  EXPECT_EQ(f.entries()[0].segments, 2);
  EXPECT_EQ(seen.size(), 1u);
  EXPECT_NE(f.steps_str().find("host read: segment break"), std::string::npos) << f.steps_str();
}

// ---------------------------------------------------------------- errors during a replay
// A kernel that raises while a compiled function replays (here nll_loss on a target out of
// range, which only the kernel can see) raises the kernel's own error to the caller, and the
// compiled function stays usable: the next call with good inputs replays the same entry.
TEST(CompileReplayErrors, AKernelErrorReachesTheCallerAndTheNextCallReplays) {
  auto fn = [](const Tensor& x, const Tensor& y) { return nll_loss(log_softmax(x, -1), y); };
  CompiledFunction f = compile(fn, {.name = "loss"});
  Tensor x = rnd({3, 5}, 11);
  Tensor good = from_vector<int64_t>({1, 4, 0}), bad = from_vector<int64_t>({1, 9, 0});
  expect_equal(f({x, good})[0], fn(x, good), "traced call");
  expect_equal(f({x, good})[0], fn(x, good), "replay");
  try {
    f({x, bad});
    FAIL() << "expected an IndexError";
  } catch (const IndexError& e) {
    std::string m = e.what();
    EXPECT_NE(m.find("[nll_loss] target 9 is out of bounds for 5 classes"), std::string::npos) << m;
  }
  EXPECT_EQ(f.entries().size(), 1u);
  for (int i = 0; i < 2; ++i)
    expect_equal(f({x, good})[0], fn(x, good), fmt::format("after {}", i));
  EXPECT_EQ(f.entries().size(), 1u);
  EXPECT_EQ(f.entries()[0].hits, 4);
}

// ---------------------------------------------------------------- passes and memory
TEST(CompilePasses, DeadCodeCseAndNoops) {
  CompiledFunction f = compile([](const Tensor& a, const Tensor& b) {
    Tensor unused = exp(a);               // dead
    Tensor p = mul(a, b), q = mul(a, b);  // one is merged
    Tensor r = add(p, q);
    r.copy_(r);  // a no-op
    return r;
  });
  Tensor a = rnd({8}, 1), b = rnd({8}, 2);
  expect_equal(f({a, b})[0], add(mul(a, b), mul(a, b)));
  expect_equal(f({a, b})[0], add(mul(a, b), mul(a, b)));
  CacheEntryInfo e = f.entries()[0];
  EXPECT_EQ(e.dead_removed, 1);
  EXPECT_EQ(e.cse_merged, 1);
  EXPECT_EQ(e.noops_removed, 1);
  EXPECT_EQ(e.steps, 2);
}

TEST(CompilePasses, NoMergeAcrossAWrite) {
  Tensor w = rnd({4}, 3), w_ref = w.clone();
  auto fn = [](const Tensor& a, Tensor& w) {
    autograd::NoGradGuard ng;
    Tensor p = mul(a, w);
    add_(w, 1.0);
    Tensor q = mul(a, w);  // same op and values, but w changed in between
    return sub(q, p);
  };
  CompiledFunction f = compile([&](const Tensor& a) { return fn(a, w); });
  Tensor a = rnd({4}, 4);
  for (int i = 0; i < 3; ++i) {  // the trace, then replays
    Tensor got = f({a})[0];
    expect_equal(got, fn(a, w_ref), fmt::format("call {}", i));
  }
  EXPECT_EQ(f.entries()[0].cse_merged, 0);
}

// Two equal calls whose results are written later must stay two buffers: merging them would
// make the write to one show through the other.
TEST(CompilePasses, NoMergeOfAResultWrittenLater) {
  auto fn = [](const Tensor& a, const Tensor& b) {
    autograd::NoGradGuard ng;
    Tensor p = mul(a, b), q = mul(a, b);
    add_(q, 1.0);
    Tensor r = mul(a, b), s = mul(a, b);
    add_(r, 2.0);  // the first of the pair written after the second was made
    return add(sub(q, p), sub(r, s));
  };
  CompiledFunction f = compile(fn);
  Tensor a = rnd({4}, 5), b = rnd({4}, 6);
  for (int i = 0; i < 3; ++i) expect_equal(f({a, b})[0], fn(a, b), fmt::format("call {}", i));
  EXPECT_EQ(f.entries()[0].cse_merged, 0);
}

// A node whose outputs nobody reads is still needed when another value over its buffer is read
// (the result a ReLU saved for its backward, when only the gradient is returned).
TEST(CompilePasses, DeadCodeKeepsANodeWhoseBufferIsRead) {
  Tensor w = rnd({4}, 9).requires_grad_(true);
  auto fn = [&](const Tensor& x) { return autograd::grad({sum(relu(mul(x, w)))}, {w})[0]; };
  CompiledFunction f = compile(fn);
  Tensor x = rnd({4}, 10);
  Tensor want = fn(x);
  for (int i = 0; i < 3; ++i) expect_equal(f({x})[0], want, fmt::format("call {}", i));
}

// A value over a merged node's buffer without being its output (autograd's saved result of
// the second of two equal calls) is moved to the kept node's buffer.
TEST(CompilePasses, MergedBufferKeepsItsOtherValues) {
  Tensor w = rnd({4}, 7).requires_grad_(true);
  auto fn = [&](const Tensor& x) {
    Tensor y = add(relu(mul(x, w)), relu(mul(x, w)));
    return autograd::grad({sum(y)}, {w})[0];
  };
  CompiledFunction f = compile(fn);
  Tensor x = rnd({4}, 8);
  Tensor want = fn(x);
  for (int i = 0; i < 3; ++i) expect_equal(f({x})[0], want, fmt::format("call {}", i));
  EXPECT_GT(f.entries()[0].cse_merged, 0);
}

// empty and empty_strided leave their memory uninitialised: each becomes a planned buffer with
// no step (their OpDef says so), where any other factory runs a kernel per replay.
TEST(CompilePasses, UninitialisedFactoriesNeedNoStep) {
  auto body = [](Tensor e, const Tensor& x) {
    e.copy_(x);
    return mul(e, 2.0);
  };
  CompiledFunction plain = compile([&](const Tensor& x) {
    return body(empty({2, 3}, kFloat32), x);
  });
  CompiledFunction strided = compile([&](const Tensor& x) {
    return body(empty_strided({2, 3}, {1, 2}), x);
  });
  Tensor x = rnd({2, 3}, 12);
  for (int i = 0; i < 2; ++i) {
    expect_equal(plain({x})[0], mul(x, 2.0));
    expect_equal(strided({x})[0], mul(x, 2.0));
  }
  EXPECT_EQ(plain.entries()[0].steps, 2) << plain.steps_str();
  EXPECT_EQ(strided.entries()[0].steps, 2) << strided.steps_str();
  EXPECT_EQ(strided.steps_str().find("empty_strided"), std::string::npos) << strided.steps_str();
}

TEST(CompileMemory, ArenaReusesDeadBuffers) {
  CompiledFunction f = compile([](const Tensor& x) {
    Tensor h = x;
    for (int i = 0; i < 16; ++i) h = relu(add(mul(h, 1.01), 0.01));
    return sum(h);
  });
  Tensor x = rnd({1024}, 1);
  f({x});
  CacheEntryInfo e = f.entries()[0];
  EXPECT_GT(e.arena_bytes, 0u);
  EXPECT_LE(e.arena_bytes, 3u * 1024 * 4 + 3 * 64);  // a few live buffers, not 48
  EXPECT_NE(f.explain().find("without reuse 192.0 KiB"), std::string::npos) << f.explain();
}

// ---------------------------------------------------------------- text, logs, explain
TEST(CompileText, GraphAndDot) {
  CompiledFunction f = compile([](const Tensor& x) { return add(mul(x, x), 1.0); });
  f({rnd({2}, 1)});
  std::string g = f.graph_str();
  EXPECT_NE(g.find("input 0: %0: float32[2] cpu"), std::string::npos) << g;
  EXPECT_NE(g.find("= mul(%0, %0)"), std::string::npos) << g;
  EXPECT_NE(g.find("return ("), std::string::npos) << g;
  std::string d = f.graph_dot();
  EXPECT_EQ(d.rfind("digraph kiln {", 0), 0u) << d;
  EXPECT_NE(d.find("label=\"n0: mul\""), std::string::npos) << d;
  EXPECT_NE(f.steps_str().find("mul_out"), std::string::npos) << f.steps_str();
  EXPECT_THROW(f.graph_str(3), ValueError);
}

TEST(CompileText, LogsAndExplain) {
  setenv("KILN_LOGS", "recompiles,guards,graph", 1);
  testing::internal::CaptureStderr();
  CompiledFunction f =
      compile([](const Tensor& x) { return neg(x); }, {.name = "logged", .input_names = {"x"}});
  f({rnd({4}, 1)});
  f({rnd({8}, 1)});
  std::string err = testing::internal::GetCapturedStderr();
  unsetenv("KILN_LOGS");
  EXPECT_NE(err.find("[compile] 'logged' entry 0 graph"), std::string::npos) << err;
  EXPECT_NE(err.find("[compile] 'logged' entry 0 guards:"), std::string::npos) << err;
  EXPECT_NE(err.find("input 0 ('x'): float32 [4] strides [1] on cpu"), std::string::npos) << err;
  EXPECT_NE(err.find("[compile] 'logged' cache miss: input 0 ('x') size mismatch at dim 0: "
                     "expected 4, got 8"),
            std::string::npos)
      << err;
  std::string x = f.explain();
  EXPECT_NE(x.find("compiled function 'logged': 2 cache entries, 2 calls"), std::string::npos) << x;
  EXPECT_NE(x.find("because: first call"), std::string::npos) << x;
  EXPECT_NE(x.find("misses:\n  input 0 ('x') size mismatch"), std::string::npos) << x;
}

}  // namespace
}  // namespace kiln

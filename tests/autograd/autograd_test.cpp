// The autograd layer's errors (each one's type and a message substring) and the semantics of
// backward, grad(), gradient accumulation and the grad modes. The formulas themselves are in
// gradcheck_test.cpp.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "kiln/autograd/engine.h"
#include "kiln/autograd/grad_mode.h"
#include "kiln/ops/op_list.h"
#include "kiln/ops/ops.h"

namespace kiln::test {
namespace {

using autograd::AnomalyModeGuard;
using autograd::EnableGradGuard;
using autograd::InferenceModeGuard;
using autograd::NoGradGuard;

// A float64 leaf that requires grad.
Tensor leaf(const std::vector<double>& v, IntArrayRef shape = {}) {
  Tensor t = from_vector(v, IntArrayRef({static_cast<int64_t>(v.size())}));
  if (!shape.empty()) t = t.reshape(shape);
  t.requires_grad_();
  return t;
}
std::vector<double> values(const Tensor& t) { return t.to(kFloat64).to_vector<double>(); }

// Runs `f`, which must throw E with a message containing every one of `parts`.
template <class E, class F>
void expect_error(F&& f, const std::vector<std::string>& parts) {
  try {
    f();
    ADD_FAILURE() << "no exception; expected one containing \"" << parts.front() << "\"";
  } catch (const E& e) {
    for (const std::string& p : parts)
      EXPECT_NE(std::string(e.what()).find(p), std::string::npos)
          << "message \"" << e.what() << "\" lacks \"" << p << "\"";
  } catch (const std::exception& e) {
    ADD_FAILURE() << "wrong exception type: " << e.what();
  }
}

// ---------------------------------------------------------------- errors

TEST(AutogradErrors, BackwardTwiceWithoutRetainGraph) {
  Tensor x = leaf({1, 2, 3});
  Tensor y = sum(x * x);
  y.backward();
  expect_error<ValueError>([&] { y.backward(); }, {"MulBackward", "retain_graph"});
}

TEST(AutogradErrors, SavedInputModifiedInPlace) {
  Tensor x = leaf({1, 2, 3});
  Tensor a = x * 1.0;
  Tensor b = a * a;  // MulBackward saves a
  add_(a, 1.0);
  expect_error<ValueError>([&] { sum(b).backward(); }, {"MulBackward", "version"});
}

TEST(AutogradErrors, SavedInputModifiedThroughAView) {
  Tensor x = leaf({1, 2, 3, 4});
  Tensor a = x * 1.0;
  Tensor b = exp(a) * a;  // MulBackward saves a; views share its version counter
  Tensor v = slice(a, 0, 1, 3);
  mul_(v, 2.0);
  expect_error<ValueError>([&] { sum(b).backward(); }, {"MulBackward", "version"});
}

TEST(AutogradErrors, SavedOutputModifiedInPlace) {
  Tensor x = leaf({1, 2, 3});
  Tensor y = exp(x);  // ExpBackward saves its output
  Tensor z = sum(y);
  {
    NoGradGuard no_grad;
    mul_(y, 2.0);
  }
  expect_error<ValueError>([&] { z.backward(); }, {"ExpBackward", "version"});
}

TEST(AutogradErrors, SavedLeafModifiedUnderNoGrad) {
  Tensor x = leaf({1, 2, 3});
  Tensor y = sum(x * x);  // MulBackward saves x
  {
    NoGradGuard no_grad;
    add_(x, 1.0);  // e.g. an optimizer step before backward
  }
  expect_error<ValueError>([&] { y.backward(); }, {"MulBackward", "version"});
}

TEST(AutogradErrors, SavedLeafModifiedThroughDetach) {
  Tensor x = leaf({1, 2, 3});
  Tensor y = sum(x * x);
  Tensor d = x.detach();  // shares x's storage and version counter
  add_(d, 1.0);
  expect_error<ValueError>([&] { y.backward(); }, {"MulBackward", "version"});
}

TEST(AutogradErrors, SavedOutputModifiedByARecordedInPlaceOp) {
  Tensor x = leaf({1, 2, 3});
  Tensor y = exp(x);
  Tensor z = sum(y * 2.0);
  ops::op_sigmoid_(y);  // recorded, but ExpBackward's saved output is gone
  expect_error<ValueError>([&] { z.backward(); }, {"ExpBackward", "version"});
}

TEST(AutogradErrors, SetGradMismatch) {
  Tensor x = leaf({1, 2, 3});
  expect_error<ValueError>([&] { x.set_grad(zeros({2}, kFloat64)); }, {"[set_grad]"});
  expect_error<ValueError>([&] { x.set_grad(zeros({3}, kFloat32)); }, {"[set_grad]"});
  Tensor g = zeros({3}, kFloat64);
  g.requires_grad_();
  expect_error<ValueError>([&] { x.set_grad(g); }, {"[set_grad]", "must not require grad"});
}

TEST(AutogradErrors, InPlaceOnLeafRequiringGrad) {
  Tensor x = leaf({1, 2, 3});
  expect_error<ValueError>([&] { add_(x, 1.0); }, {"[add_]", "leaf"});
  expect_error<ValueError>([&] { x.fill_(0.0); }, {"[fill_]", "leaf"});
  Tensor v = slice(x, 0, 0, 2);
  expect_error<ValueError>([&] { mul_(v, 2.0); }, {"[mul_]", "view of a leaf"});
  EXPECT_EQ(values(x), (std::vector<double>{1, 2, 3}));  // nothing was written
  NoGradGuard no_grad;
  add_(x, 1.0);  // allowed without grad mode
  EXPECT_EQ(values(x), (std::vector<double>{2, 3, 4}));
}

TEST(AutogradErrors, OutVariantWithInputRequiringGrad) {
  Tensor x = leaf({1, 2, 3});
  Tensor y = from_vector(std::vector<double>{4, 5, 6});
  Tensor out = zeros({3}, kFloat64);
  expect_error<NotImplementedError>([&] { add_out(out, x, y); }, {"[add_out]", "NoGradGuard"});
  expect_error<NotImplementedError>(
      [&] {
        mm_out(out, x.view({1, 3}), y.view({3, 1}));
      },
      {"[mm_out]"});
  NoGradGuard no_grad;
  add_out(out, x, y);
  EXPECT_EQ(values(out), (std::vector<double>{5, 7, 9}));
}

TEST(AutogradErrors, ForeachWithGradMode) {
  Tensor x = leaf({1, 2});
  Tensor p = from_vector(std::vector<double>{1, 1});
  expect_error<NotImplementedError>([&] { foreach_mul_({x}, 2.0); }, {"[foreach_mul_]"});
  expect_error<NotImplementedError>([&] { foreach_add_({p}, {x}); }, {"[foreach_add_]"});
  expect_error<NotImplementedError>([&] { foreach_sqrt({x}); }, {"[foreach_sqrt]"});
  NoGradGuard no_grad;
  foreach_mul_({x}, 2.0);  // an optimizer update
  EXPECT_EQ(values(x), (std::vector<double>{2, 4}));
}

TEST(AutogradErrors, NonScalarBackwardWithoutGradient) {
  Tensor x = leaf({1, 2, 3});
  expect_error<ValueError>([&] { (x * 2.0).backward(); }, {"[backward]", "single-element"});
  expect_error<ValueError>([&] { (x * 2.0).backward(ones({2}, kFloat64)); }, {"shape"});
  expect_error<TypeError>([&] { (x * 2.0).backward(ones({3}, kInt64)); }, {"floating point"});
}

TEST(AutogradErrors, BackwardOnTensorWithoutGrad) {
  Tensor x = from_vector(std::vector<double>{1, 2});
  expect_error<ValueError>([&] { sum(x).backward(); }, {"does not require grad"});
}

TEST(AutogradErrors, RequiresGradOnIntegerTensor) {
  Tensor i = from_vector(std::vector<int64_t>{1, 2});
  expect_error<TypeError>([&] { i.requires_grad_(); }, {"[requires_grad_]", "int64"});
  Tensor b = from_vector(std::vector<double>{1, 0}).to(kBool);
  expect_error<TypeError>([&] { b.requires_grad_(); }, {"[requires_grad_]"});
}

TEST(AutogradErrors, RequiresGradOnNonLeaf) {
  Tensor x = leaf({1, 2});
  Tensor y = x * 2.0;
  expect_error<ValueError>([&] { y.requires_grad_(false); }, {"[requires_grad_]", "MulBackward"});
}

TEST(AutogradErrors, GradWithUnusedInput) {
  Tensor x = leaf({1, 2}), z = leaf({3, 4});
  Tensor y = sum(x * x);
  expect_error<ValueError>(
      [&] {
        autograd::grad({y}, {x, z}, {}, true);
      },
      {"[grad]", "input 1", "allow_unused"});
  TensorList g = autograd::grad({y}, {x, z}, {}, false, true);
  ASSERT_EQ(g.size(), 2u);
  EXPECT_EQ(values(g[0]), (std::vector<double>{2, 4}));
  EXPECT_FALSE(g[1].defined());
}

TEST(AutogradErrors, InferenceTensorSavedForBackward) {
  Tensor x = leaf({1, 2, 3});
  Tensor t;
  {
    InferenceModeGuard inference;
    t = from_vector(std::vector<double>{4, 5, 6}) * 1.0;
  }
  EXPECT_TRUE(t.impl()->is_inference());
  expect_error<ValueError>([&] { (void)mul(x, t); }, {"[mul]", "inference tensor"});
  // An op that saves nothing may use it.
  Tensor s = add(x, t);
  sum(s).backward();
  EXPECT_EQ(values(x.grad()), (std::vector<double>{1, 1, 1}));
}

TEST(AutogradErrors, AnomalyModeNamesTheNode) {
  Tensor x = leaf({-1, 4});
  Tensor y = sum(sqrt(x));  // nan at -1
  {
    AnomalyModeGuard anomaly;
    expect_error<ValueError>([&] { y.backward({}, true); }, {"anomaly", "SqrtBackward", "nan"});
  }
  Tensor z = leaf({0, 4});
  {
    AnomalyModeGuard anomaly;
    expect_error<ValueError>([&] { sum(sqrt(z)).backward(); }, {"SqrtBackward", "inf"});
  }
  EXPECT_FALSE(autograd::is_anomaly_enabled());
  y.backward();  // without anomaly mode the NaN is simply propagated
  EXPECT_TRUE(std::isnan(values(x.grad())[0]));
  EXPECT_EQ(values(x.grad())[1], 0.25);
}

TEST(AutogradErrors, ViewOfUntrackedTensorReceivingGrad) {
  Tensor x = leaf({1, 2});
  Tensor base = zeros({4}, kFloat64);
  expect_error<NotImplementedError>([&] { slice(base, 0, 0, 2).copy_(x); }, {"[copy_]"});
  // Writing into the whole tensor makes it part of the graph.
  Tensor whole = zeros({2}, kFloat64);
  whole.copy_(x);
  EXPECT_TRUE(whole.requires_grad());
  sum(whole * 3.0).backward();
  EXPECT_EQ(values(x.grad()), (std::vector<double>{3, 3}));
}

// ---------------------------------------------------------------- semantics

TEST(AutogradSemantics, LeavesAndGradFn) {
  Tensor x = leaf({1, 2});
  EXPECT_TRUE(x.requires_grad());
  EXPECT_TRUE(x.is_leaf());
  EXPECT_EQ(x.grad_fn_name(), "");
  Tensor y = x * 2.0;
  EXPECT_TRUE(y.requires_grad());
  EXPECT_FALSE(y.is_leaf());
  EXPECT_EQ(y.grad_fn_name(), "MulBackward");
  EXPECT_EQ(log_softmax(y, 0).grad_fn_name(), "LogSoftmaxBackward");
  EXPECT_FALSE(y.detach().requires_grad());
  EXPECT_FALSE(argmax(y).requires_grad());  // integer outputs never carry gradients
  EXPECT_FALSE(gt(y, 1.0).requires_grad());
  EXPECT_FALSE(std::get<1>(max(y, 0)).requires_grad());
  Tensor plain = from_vector(std::vector<double>{1, 2});
  EXPECT_FALSE((plain * 2.0).requires_grad());
  x.requires_grad_(false);
  EXPECT_FALSE(x.requires_grad());
}

TEST(AutogradSemantics, NoGradAndEnableGradGuards) {
  Tensor x = leaf({1, 2});
  EXPECT_TRUE(autograd::is_grad_enabled());
  {
    NoGradGuard no_grad;
    EXPECT_FALSE(autograd::is_grad_enabled());
    Tensor y = x * 2.0;
    EXPECT_FALSE(y.requires_grad());
    EXPECT_TRUE(y.is_leaf());
    {
      EnableGradGuard enable;
      EXPECT_TRUE(autograd::is_grad_enabled());
      Tensor z = x * 2.0;
      EXPECT_TRUE(z.requires_grad());
      EXPECT_EQ(z.grad_fn_name(), "MulBackward");
    }
    EXPECT_FALSE(autograd::is_grad_enabled());
  }
  EXPECT_TRUE(autograd::is_grad_enabled());
}

TEST(AutogradSemantics, InferenceMode) {
  Tensor x = leaf({1, 2});
  {
    InferenceModeGuard inference;
    EXPECT_TRUE(autograd::is_inference_mode_enabled());
    EXPECT_FALSE(autograd::is_grad_enabled());
    Tensor y = x * 2.0;
    EXPECT_FALSE(y.requires_grad());
    EXPECT_TRUE(y.impl()->is_inference());
  }
  EXPECT_FALSE(autograd::is_inference_mode_enabled());
  EXPECT_TRUE(autograd::is_grad_enabled());
  EXPECT_FALSE((x * 2.0).impl()->is_inference());
}

TEST(AutogradSemantics, GradientsAccumulateOverBackwardCalls) {
  Tensor x = leaf({1, 2, 3});
  sum(x * x).backward();
  EXPECT_EQ(values(x.grad()), (std::vector<double>{2, 4, 6}));
  sum(x * x).backward();
  EXPECT_EQ(values(x.grad()), (std::vector<double>{4, 8, 12}));
  x.set_grad(Tensor());
  EXPECT_FALSE(x.grad().defined());
  sum(x * 3.0).backward();
  EXPECT_EQ(values(x.grad()), (std::vector<double>{3, 3, 3}));
}

TEST(AutogradSemantics, RetainGraphAllowsASecondBackward) {
  Tensor x = leaf({1, 2});
  Tensor y = sum(exp(x) * x);
  y.backward({}, true);
  std::vector<double> first = values(x.grad());
  y.backward();
  std::vector<double> second = values(x.grad());
  ASSERT_EQ(second.size(), 2u);
  for (size_t i = 0; i < 2; ++i) EXPECT_DOUBLE_EQ(second[i], 2 * first[i]);
}

TEST(AutogradSemantics, GradIsAccumulatedInPlace) {
  Tensor x = leaf({1, 2, 3});
  Tensor w = leaf({1, 1, 1});
  sum(x * w).backward();
  const void* p = x.grad().data_ptr();
  const Tensor g = x.grad();
  sum(x * w * 2.0).backward();
  EXPECT_EQ(x.grad().data_ptr(), p);
  EXPECT_EQ(values(g), (std::vector<double>{3, 3, 3}));  // the same tensor was updated
  EXPECT_FALSE(x.grad().requires_grad());
}

TEST(AutogradSemantics, GradLeavesDotGradAlone) {
  Tensor x = leaf({1, 2}), w = leaf({3, 4});
  Tensor y = sum(x * w);
  TensorList g = autograd::grad({y}, {x});
  EXPECT_EQ(values(g[0]), (std::vector<double>{3, 4}));
  EXPECT_FALSE(x.grad().defined());
  EXPECT_FALSE(w.grad().defined());
}

TEST(AutogradSemantics, GradWithRespectToNonLeaf) {
  Tensor x = leaf({1, 2});
  Tensor h = x * 3.0;
  Tensor y = sum(h * h);
  TensorList g = autograd::grad({y}, {h, x});
  EXPECT_EQ(values(g[0]), (std::vector<double>{6, 12}));
  EXPECT_EQ(values(g[1]), (std::vector<double>{18, 36}));
}

TEST(AutogradSemantics, BackwardFromSeveralOutputs) {
  Tensor x = leaf({1, 2});
  Tensor a = sum(x * x), b = sum(x * 3.0);
  autograd::backward({a, b});
  EXPECT_EQ(values(x.grad()), (std::vector<double>{5, 7}));
}

TEST(AutogradSemantics, GradOutputsSeedTheBackward) {
  Tensor x = leaf({1, 2, 3});
  Tensor y = x * x;
  y.backward(from_vector(std::vector<double>{1, 0, -1}));
  EXPECT_EQ(values(x.grad()), (std::vector<double>{2, 0, -6}));
}

TEST(AutogradSemantics, Float32LeafGetsFloat32Grad) {
  Tensor x = from_vector(std::vector<float>{1, 2});
  x.requires_grad_();
  sum(x.to(kFloat64) * 2.0).backward();
  ASSERT_TRUE(x.grad().defined());
  EXPECT_EQ(x.grad().dtype(), kFloat32);
  EXPECT_EQ(x.grad().to_vector<float>(), (std::vector<float>{2, 2}));
}

// ---------------------------------------------------------------- hooks and retain_grad
TEST(AutogradHooks, RetainGradKeepsANonLeafGradient) {
  Tensor x = leaf({1, 2, 3});
  Tensor y = x * 2.0;
  y.retain_grad();
  sum(y * y).backward();
  EXPECT_EQ(values(y.grad()), (std::vector<double>{4, 8, 12}));  // d(y^2)/dy = 2y
  EXPECT_EQ(values(x.grad()), (std::vector<double>{8, 16, 24}));
}

TEST(AutogradHooks, RetainedGradientsAccumulate) {
  Tensor x = leaf({1, 2});
  Tensor y = x * 3.0;
  y.retain_grad();
  Tensor z = sum(y);
  z.backward({}, /*retain_graph=*/true);
  z.backward();
  EXPECT_EQ(values(y.grad()), (std::vector<double>{2, 2}));
  EXPECT_EQ(values(x.grad()), (std::vector<double>{6, 6}));
}

TEST(AutogradHooks, HookReplacesANonLeafGradient) {
  Tensor x = leaf({1, 2});
  Tensor y = x * 2.0;
  autograd::register_hook(y, [](const Tensor& g) { return g * 10.0; });
  sum(y).backward();
  EXPECT_EQ(values(x.grad()), (std::vector<double>{20, 20}));
}

TEST(AutogradHooks, LeafHookRunsOnceOnTheTotal) {
  Tensor x = leaf({1, 2});
  int calls = 0;
  std::vector<double> seen;
  autograd::register_hook(x, [&](const Tensor& g) {
    ++calls;
    seen = values(g);
    return Tensor();  // keep the gradient
  });
  sum(x * 2.0 + x * 3.0).backward();  // two paths into the same leaf
  EXPECT_EQ(calls, 1);
  EXPECT_EQ(seen, (std::vector<double>{5, 5}));
  EXPECT_EQ(values(x.grad()), (std::vector<double>{5, 5}));
}

TEST(AutogradHooks, HooksFollowATensorThroughInPlaceOps) {
  Tensor x = leaf({1, 2});
  Tensor y = x * 1.0;
  int calls = 0;
  autograd::register_hook(y, [&](const Tensor& g) {
    ++calls;
    return g;
  });
  mul_(y, 3.0);
  sum(y).backward();
  EXPECT_EQ(calls, 1);
  EXPECT_EQ(values(x.grad()), (std::vector<double>{3, 3}));
}

TEST(AutogradHooks, GradAppliesHooks) {
  Tensor x = leaf({1, 2});
  autograd::register_hook(x, [](const Tensor& g) { return g * 2.0; });
  TensorList g = autograd::grad({sum(x * x)}, {x});
  EXPECT_EQ(values(g[0]), (std::vector<double>{4, 8}));
  EXPECT_FALSE(x.grad().defined());
}

// See Note [Leaves finish early] in engine.cpp: w2, used last in the forward, is accumulated
// (and its post hook run) before the backward reaches the node that sends w1 its gradient.
TEST(AutogradHooks, PostAccumulateHookRunsWhenTheLeafIsComplete) {
  Tensor w1 = leaf({2, 3}), w2 = leaf({5, 7});
  int calls = 0;
  bool w1_done_before = true;
  std::vector<double> w2_grad;
  autograd::register_post_accumulate_grad_hook(w2, [&](const Tensor& t) {
    ++calls;
    w2_grad = values(t.grad());
    w1_done_before = w1.grad().defined();
  });
  Tensor h = w1 * 2.0;
  sum(h * w2 + w2).backward();  // two paths into w2: the hook sees their total, once
  EXPECT_EQ(calls, 1);
  EXPECT_EQ(w2_grad, (std::vector<double>{5, 7}));  // 2 w1 + 1
  EXPECT_FALSE(w1_done_before);
  EXPECT_EQ(values(w1.grad()), (std::vector<double>{10, 14}));
  sum(w2).backward();  // the hook sees .grad after accumulation
  EXPECT_EQ(calls, 2);
  EXPECT_EQ(w2_grad, (std::vector<double>{6, 8}));
}

TEST(AutogradHooks, GradRunsNoPostAccumulateHook) {
  Tensor x = leaf({1, 2});
  int calls = 0;
  autograd::register_post_accumulate_grad_hook(x, [&](const Tensor&) { ++calls; });
  autograd::grad({sum(x * x)}, {x});
  EXPECT_EQ(calls, 0);
}

TEST(AutogradHooks, QueuedCallbacksRunAfterEveryLeaf) {
  Tensor a = leaf({1}), b = leaf({2});
  std::vector<std::string> order;
  autograd::register_post_accumulate_grad_hook(b, [&](const Tensor&) {
    order.push_back("b");
    autograd::queue_callback([&] {
      order.push_back(fmt::format("end a={} b={}", values(a.grad())[0], values(b.grad())[0]));
      autograd::queue_callback([&] { order.push_back("queued by a callback"); });
    });
  });
  sum(a * 3.0 + b * a).backward();
  EXPECT_EQ(order, (std::vector<std::string>{"b", "end a=5 b=1", "queued by a callback"}));
}

TEST(AutogradHooks, ACallbackThatThrowsEndsTheBackward) {
  Tensor x = leaf({1});
  autograd::register_post_accumulate_grad_hook(x, [](const Tensor&) {
    autograd::queue_callback([] { KILN_THROW(Value, "[test] from a callback"); });
  });
  expect_error<ValueError>([&] { sum(x).backward(); }, {"[test] from a callback"});
  EXPECT_EQ(values(x.grad()), (std::vector<double>{1}));
}

TEST(AutogradHooks, Errors) {
  Tensor x = leaf({1, 2});
  autograd::register_hook(x, [](const Tensor&) { return zeros({3}, kFloat64); });
  expect_error<ValueError>([&] { sum(x).backward(); }, {"[register_hook]", "[3]", "[2]"});
  Tensor plain = zeros({2});
  expect_error<ValueError>(
      [&] { autograd::register_hook(plain, [](const Tensor& g) { return g; }); },
      {"[register_hook]", "does not require grad"});
  expect_error<ValueError>([&] { plain.retain_grad(); }, {"[retain_grad]"});
  expect_error<ValueError>(
      [&] { autograd::register_post_accumulate_grad_hook(plain, [](const Tensor&) {}); },
      {"[register_post_accumulate_grad_hook]", "does not require grad"});
  expect_error<ValueError>(
      [&] { autograd::register_post_accumulate_grad_hook(x * 2.0, [](const Tensor&) {}); },
      {"[register_post_accumulate_grad_hook]", "not a leaf", "MulBackward"});
  expect_error<ValueError>([&] { autograd::queue_callback([] {}); },
                           {"[queue_callback]", "no backward pass is running"});
}

}  // namespace
}  // namespace kiln::test

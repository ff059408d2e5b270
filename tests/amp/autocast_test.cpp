// kiln/amp/autocast.h: which ops autocast casts and how (against the same ops on inputs cast by
// hand, bitwise), gradients of float32 weights through the casts, backward with autocast off,
// nesting, other device types, compiled functions guarded by the autocast state, the policy
// table's names, and the errors. No oracle: the ops themselves are checked by kiln_op_test.
#include <gtest/gtest.h>

#include "kiln/amp/autocast.h"
#include "kiln/amp/autocast_policies.h"
#include "kiln/compile/compile.h"
#include "kiln/core/error.h"
#include "kiln/dispatch/op.h"
#include "kiln/nn/layers.h"
#include "kiln/ops/op_list.h"
#include "kiln/ops/ops.h"

namespace kiln::test {
namespace {

const Device kCpu{kCPU};

bool same(const Tensor& a, const Tensor& b) {
  return a.sizes() == b.sizes() && a.dtype() == b.dtype() && all(eq(a, b)).item<bool>();
}

TEST(Autocast, ProductsRunInTheAutocastDtype) {
  Tensor a = randn({4, 8}), b = randn({8, 3}), c = randn({3});
  for (DType d : {kBFloat16, kFloat16}) {
    amp::AutocastGuard autocast(kCpu, d);
    Tensor y = mm(a, b);
    EXPECT_EQ(y.dtype(), d);
    EXPECT_TRUE(same(y, [&] {
      amp::AutocastGuard off(kCpu, d, false);
      return mm(a.to(d), b.to(d));
    }()));
    EXPECT_EQ(linear(a, t(b), c).dtype(), d);  // addmm
    EXPECT_EQ(matmul(a.reshape({2, 2, 8}), b).dtype(), d);
  }
  // float64 was asked for: it stays.
  amp::AutocastGuard autocast(kCpu, kBFloat16);
  EXPECT_EQ(mm(a.to(kFloat64), b.to(kFloat64)).dtype(), kFloat64);
}

TEST(Autocast, ReductionsSoftmaxNormsAndLossesRunInFloat32) {
  Tensor x = randn({4, 6}).to(kBFloat16);
  Tensor target = from_vector<int64_t>({1, 0, 5, 2});
  amp::AutocastGuard autocast(kCpu, kBFloat16);
  Tensor s = softmax(x, 1);
  EXPECT_EQ(s.dtype(), kFloat32);
  Tensor want;
  {
    amp::AutocastGuard off(kCpu, kBFloat16, false);
    want = softmax(x.to(kFloat32), 1);
  }
  EXPECT_TRUE(same(s, want));
  EXPECT_EQ(sum(x).dtype(), kFloat32);
  EXPECT_EQ(cross_entropy(x, target).dtype(), kFloat32);
  EXPECT_EQ(layer_norm(x, {6}).dtype(), kFloat32);
}

// The 3-D pools are on PyTorch's CPU float32 list (max_pool3d, avg_pool3d,
// adaptive_avg_pool3d); the 2-D pools are on no list and keep the input's dtype.
TEST(Autocast, ThreeDPoolsRunInFloat32) {
  Tensor x = randn({1, 2, 4, 4, 4}).to(kBFloat16);
  amp::AutocastGuard autocast(kCpu, kBFloat16);
  Tensor want;
  {
    amp::AutocastGuard off(kCpu, kBFloat16, false);
    want = avg_pool3d(x.to(kFloat32), {2});
  }
  EXPECT_TRUE(same(avg_pool3d(x, {2}), want));
  EXPECT_EQ(max_pool3d(x, {2}).dtype(), kFloat32);
  EXPECT_EQ(std::get<1>(max_pool3d_with_indices(x, {2})).dtype(), kInt64);
  EXPECT_EQ(adaptive_avg_pool3d(x, {2, 2, 2}).dtype(), kFloat32);
  Tensor x2 = randn({1, 2, 4, 4}).to(kBFloat16);
  EXPECT_EQ(max_pool2d(x2, {2}).dtype(), kBFloat16);
  EXPECT_EQ(avg_pool2d(x2, {2}).dtype(), kBFloat16);
}

TEST(Autocast, PromoteCastsToTheWidestAndPassthroughLeavesInputs) {
  Tensor f = randn({2, 3}), h = randn({2, 3}).to(kBFloat16);
  amp::AutocastGuard autocast(kCpu, kBFloat16);
  EXPECT_EQ(cat({h, f}, 0).dtype(), kFloat32);  // Promote
  EXPECT_EQ(relu(h).dtype(), kBFloat16);        // Passthrough
  EXPECT_EQ(add(h, f).dtype(), kFloat32);       // Passthrough: type promotion
  // A number wrapped as a 0-d float64 tensor is weak: it neither widens nor gets cast.
  EXPECT_EQ(where(gt(h, 0.0), h, -1.0).dtype(), kBFloat16);
  Tensor w = randn({3});
  add_(w, 1.0);  // in place: the written tensor keeps its dtype
  EXPECT_EQ(w.dtype(), kFloat32);
}

TEST(Autocast, OnlyTheGuardedDeviceTypeIsCast) {
  Tensor a = randn({4, 8}), b = randn({8, 3});
  amp::AutocastGuard autocast(Device(kMeta), kBFloat16);
  EXPECT_EQ(mm(a, b).dtype(), kFloat32);
  EXPECT_EQ(mm(a.to(Device(kMeta)), b.to(Device(kMeta))).dtype(), kBFloat16);
}

TEST(Autocast, GuardsNestAndRestore) {
  EXPECT_FALSE(amp::autocast_enabled());
  EXPECT_FALSE(local_dispatch_state().included.has(DispatchKey::Autocast));
  {
    amp::AutocastGuard outer(kCpu, kFloat16);
    EXPECT_TRUE(amp::autocast_enabled());
    {
      amp::AutocastGuard inner(kCpu, kBFloat16, false);
      EXPECT_FALSE(amp::autocast_enabled());
      EXPECT_EQ(mm(randn({2, 2}), randn({2, 2})).dtype(), kFloat32);
    }
    EXPECT_TRUE(amp::autocast_enabled());
    EXPECT_EQ(amp::autocast_dtype(), kFloat16);
  }
  EXPECT_FALSE(amp::autocast_enabled());
}

TEST(Autocast, Float32WeightsGetFloat32GradientsThroughTheCasts) {
  Generator gen(1);
  nn::Linear lin(8, 4, true, {.gen = &gen});
  Tensor x = randn({5, 8});
  Tensor loss;
  {
    amp::AutocastGuard autocast(kCpu, kBFloat16);
    Tensor y = lin(x);
    EXPECT_EQ(y.dtype(), kBFloat16);
    loss = sum(mul(y, y));  // sum: float32
    EXPECT_EQ(loss.dtype(), kFloat32);
  }
  loss.backward();
  EXPECT_EQ(lin.weight.grad().dtype(), kFloat32);
  EXPECT_EQ(lin.bias.grad().dtype(), kFloat32);
  // The same computation with the casts written out.
  Tensor w = lin.weight.detach().requires_grad_(true), b = lin.bias.detach().requires_grad_(true);
  Tensor y = addmm(b.to(kBFloat16), x.to(kBFloat16), t(w.to(kBFloat16)));
  sum(mul(y, y).to(kFloat32)).backward();
  EXPECT_TRUE(same(lin.weight.grad(), w.grad()));
  EXPECT_TRUE(same(lin.bias.grad(), b.grad()));
}

// Note [Casts in memory order]: a permutation of a contiguous tensor keeps its strides (so a
// transposed weight casts flat); gaps, broadcasts and overlaps cast to contiguous. The values are
// those of a plain cast either way.
TEST(Autocast, CastsKeepADenseInputsMemoryOrder) {
  Tensor w = randn({6, 4}), cube = randn({2, 3, 5});
  struct Case {
    const char* what;
    Tensor in;
    bool keeps;
  };
  const Case cases[] = {
      {"transposed", t(w), true},
      {"permuted", permute(cube, {2, 0, 1}), true},
      {"contiguous", w, true},
      {"sliced (gaps)", slice(w, 1, 0, 4, 2), false},
      {"expanded (broadcast)", expand(randn({1, 4}), {3, 4}), false},
  };
  for (const Case& c : cases) {
    Tensor r = amp::cast_in_memory_order(c.in, kBFloat16);
    EXPECT_EQ(r.dtype(), kBFloat16) << c.what;
    EXPECT_TRUE(same(r, c.in.to(kBFloat16))) << c.what;
    if (c.keeps)
      EXPECT_EQ(r.strides(), c.in.strides()) << c.what;
    else
      EXPECT_TRUE(r.is_contiguous()) << c.what;
  }
  // Under autocast the product sees the transposed cast, and gives what the explicit casts give.
  Tensor x = randn({3, 4});
  amp::AutocastGuard autocast(kCpu, kBFloat16);
  Tensor y = mm(x, t(w));
  amp::AutocastGuard off(kCpu, kBFloat16, false);
  EXPECT_TRUE(same(y, mm(x.to(kBFloat16), t(w).to(kBFloat16))));
}

TEST(Autocast, BackwardRunsWithAutocastOff) {
  Tensor a = randn({3, 4}).to(kFloat64).requires_grad_(true);
  amp::AutocastGuard autocast(kCpu, kBFloat16);
  // float64 stays float64 forward; a backward inside the guard must not cast its products.
  Tensor y = sum(mm(a, t(a)));
  y.backward();
  EXPECT_EQ(a.grad().dtype(), kFloat64);
}

TEST(Autocast, CompiledFunctionsAreGuardedByTheAutocastState) {
  Tensor a = randn({4, 8}), b = randn({8, 3});
  CompiledFunction f =
      compile([](const Tensor& x, const Tensor& y) { return mm(x, y); }, {.name = "autocast_mm"});
  Tensor plain = f({a, b})[0];
  EXPECT_EQ(plain.dtype(), kFloat32);
  Tensor low;
  {
    amp::AutocastGuard autocast(kCpu, kBFloat16);
    low = f({a, b})[0];
    EXPECT_EQ(low.dtype(), kBFloat16);
    EXPECT_EQ(f({a, b})[0].dtype(), kBFloat16);
  }
  EXPECT_EQ(f({a, b})[0].dtype(), kFloat32);
  EXPECT_EQ(f.entries().size(), 2u);  // one per autocast state, each replayed
}

TEST(Autocast, EveryPolicyEntryNamesAnOp) {
  for (const amp::PolicyEntry& e : amp::autocast_policy_table()) {
    const OpDef* op = ops::find_op(e.op);
    ASSERT_NE(op, nullptr) << e.op;
    EXPECT_EQ(op->kind(), OpKind::Functional) << e.op;
    EXPECT_EQ(op->autocast_policy(), e.policy) << e.op;
  }
}

TEST(Autocast, Errors) {
  try {
    amp::AutocastGuard bad(kCpu, kFloat32);
    ADD_FAILURE() << "no error";
  } catch (const ValueError& e) {
    EXPECT_NE(std::string(e.what()).find(
                  "[autocast] the autocast dtype must be float16 or bfloat16, got float32"),
              std::string::npos)
        << e.what();
  }
  EXPECT_FALSE(amp::autocast_enabled());
}

}  // namespace
}  // namespace kiln::test

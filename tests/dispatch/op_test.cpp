// Tests for kiln/dispatch/op.h: thread-local key guards, boxed fallbacks, boxed calls and
// missing-kernel errors.
#include "kiln/dispatch/op.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "core/test_util.h"
#include "kiln/ops/op_list.h"
#include "kiln/ops/ops.h"

namespace kiln {
namespace {

using K = DispatchKey;
using kiln_test::vec;

// Ops defined by this test, with kernels only where each test puts them.
TypedOp<Tensor(const Tensor&)> test_identity_op{
    "test_identity", "test_identity(Tensor self) -> Tensor", OpKind::Functional};
TypedOp<Tensor(int64_t)> test_no_tensor_op{"test_no_tensor", "test_no_tensor(int n) -> Tensor",
                                           OpKind::Functional};
Tensor identity_kernel(const Tensor& t) { return t; }

Tensor meta_tensor(IntArrayRef sizes, DType dtype = kFloat32) {
  return empty(sizes, dtype, Device("meta"));
}

// A shape-only tensor that dispatches as if it lived on a plugin device (PrivateUse2).
Tensor plugin_tensor(IntArrayRef sizes) {
  Tensor t = meta_tensor(sizes);
  t.impl()->remove_key(K::Meta);
  t.impl()->add_key(K::PrivateUse2);
  return t;
}

// ---------------------------------------------------------------- guards

class DispatchGuardTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(local_dispatch_state().included.empty());
    ASSERT_TRUE(local_dispatch_state().excluded.empty());
  }
  const LocalDispatchState& state() { return local_dispatch_state(); }
};

TEST_F(DispatchGuardTest, ExcludeNestsAndRestores) {
  {
    ExcludeKeyGuard a(K::Profile);
    EXPECT_EQ(state().excluded, DispatchKeySet(K::Profile));
    {
      ExcludeKeyGuard b(K::Trace);
      EXPECT_EQ(state().excluded, DispatchKeySet(K::Profile).add(K::Trace));
      {
        ExcludeKeyGuard c(K::Profile);  // already excluded: leaving must keep it excluded
        EXPECT_EQ(state().excluded, DispatchKeySet(K::Profile).add(K::Trace));
      }
      EXPECT_EQ(state().excluded, DispatchKeySet(K::Profile).add(K::Trace));
    }
    EXPECT_EQ(state().excluded, DispatchKeySet(K::Profile));
    EXPECT_TRUE(state().included.empty());
  }
  EXPECT_TRUE(state().excluded.empty());
}

TEST_F(DispatchGuardTest, IncludeNestsAndRestores) {
  {
    IncludeKeyGuard a(K::Trace);
    EXPECT_EQ(state().included, DispatchKeySet(K::Trace));
    {
      IncludeKeyGuard b(K::Profile);
      IncludeKeyGuard c(K::Trace);
      EXPECT_EQ(state().included, DispatchKeySet(K::Trace).add(K::Profile));
    }
    EXPECT_EQ(state().included, DispatchKeySet(K::Trace));
    EXPECT_TRUE(state().excluded.empty());
  }
  EXPECT_TRUE(state().included.empty());
}

TEST_F(DispatchGuardTest, MixedGuardsRestoreIndependently) {
  {
    IncludeKeyGuard i(K::Profile);
    {
      ExcludeKeyGuard e(K::Profile);
      EXPECT_TRUE(state().included.has(K::Profile));
      EXPECT_TRUE(state().excluded.has(K::Profile));
    }
    EXPECT_TRUE(state().included.has(K::Profile));
    EXPECT_FALSE(state().excluded.has(K::Profile));
  }
  EXPECT_TRUE(state().included.empty());
}

TEST_F(DispatchGuardTest, RestoredWhenAnExceptionPassesThrough) {
  try {
    IncludeKeyGuard i(K::Trace);
    ExcludeKeyGuard e(K::Profile);
    IncludeKeyGuard i2(K::Sharded);
    throw ValueError("[test] boom");
  } catch (const ValueError&) {
  }
  EXPECT_TRUE(state().included.empty());
  EXPECT_TRUE(state().excluded.empty());
}

TEST_F(DispatchGuardTest, StateIsPerThread) {
  IncludeKeyGuard i(K::Trace);
  ExcludeKeyGuard e(K::Profile);
  DispatchKeySet inc, exc;
  std::thread([&] {
    inc = local_dispatch_state().included;
    exc = local_dispatch_state().excluded;
  }).join();
  EXPECT_TRUE(inc.empty());
  EXPECT_TRUE(exc.empty());
  EXPECT_TRUE(state().included.has(K::Trace));
}

// ---------------------------------------------------------------- boxed fallbacks

struct ProfileLog {
  int calls = 0;
  std::vector<std::string> ops;
  std::vector<DispatchKey> keys;
};
ProfileLog g_log;

// Counts the call, then redispatches below Profile (the way a Profile layer would).
void profile_fallback(const OpDef& op, DispatchKey key, Stack& stack) {
  ++g_log.calls;
  g_log.ops.emplace_back(op.name());
  g_log.keys.push_back(key);
  ExcludeKeyGuard guard(K::Profile);
  op.call_boxed(stack);
}

class ProfileFallbackTest : public ::testing::Test {
 protected:
  void SetUp() override {
    g_log = {};
    saved_ = fallback_for(K::Profile);  // kiln/profiler's, replaced for the test
    register_fallback(K::Profile, &profile_fallback);
    ASSERT_EQ(fallback_for(K::Profile), &profile_fallback);
  }
  void TearDown() override {
    register_fallback(K::Profile, saved_);
    EXPECT_TRUE(local_dispatch_state().included.empty());
    EXPECT_TRUE(local_dispatch_state().excluded.empty());
  }
  BoxedKernel saved_ = nullptr;
};

TEST_F(ProfileFallbackTest, InactiveUnlessTheKeyIsIncluded) {
  Tensor a = ones({2, 3});
  Tensor r = add(a, a);
  EXPECT_EQ(g_log.calls, 0);
  EXPECT_EQ(r.to_vector<float>(), std::vector<float>(6, 2.0f));
}

TEST_F(ProfileFallbackTest, HandlesOpsOfEverySignature) {
  Tensor a = arange(24.0).view({2, 3, 4});
  Tensor b = full({3, 4}, 0.5);
  Tensor c = arange(8.0).view({2, 1, 4});
  // The unboxed results, with Profile inactive.
  Tensor add_ref = add(a, b, 2);
  Tensor add_scalar_ref = add(a, 1.5);
  Tensor sum_ref = sum(a, {0, 2}, true);
  auto [max_v_ref, max_i_ref] = max(a, 1);
  Tensor cat_ref = cat({a, c}, 1);
  ASSERT_EQ(g_log.calls, 0);

  Tensor add_r, add_scalar_r, sum_r, max_v, max_i, cat_r;
  {
    IncludeKeyGuard profile(K::Profile);
    add_r = add(a, b, 2);                // Tensor, Tensor, Scalar
    add_scalar_r = add(a, 1.5);          // a wrapped number
    sum_r = sum(a, {0, 2}, true);        // IntArrayRef, bool, optional dtype
    std::tie(max_v, max_i) = max(a, 1);  // a tuple of results
    cat_r = cat({a, c}, 1);              // a TensorList
  }
  EXPECT_EQ(g_log.calls, 5);
  EXPECT_EQ(g_log.ops, (std::vector<std::string>{"add", "add", "sum", "max_dim", "cat"}));
  for (DispatchKey k : g_log.keys) EXPECT_EQ(k, K::Profile) << key_name(k);

  EXPECT_TRUE(equal(add_r, add_ref));
  EXPECT_TRUE(equal(add_scalar_r, add_scalar_ref));
  EXPECT_EQ(vec(sum_r.sizes()), (std::vector<int64_t>{1, 3, 1}));
  EXPECT_TRUE(equal(sum_r, sum_ref));
  EXPECT_TRUE(equal(max_v, max_v_ref));
  EXPECT_TRUE(equal(max_i, max_i_ref));
  EXPECT_EQ(vec(cat_r.sizes()), (std::vector<int64_t>{2, 4, 4}));
  EXPECT_TRUE(equal(cat_r, cat_ref));
}

TEST_F(ProfileFallbackTest, HandlesInPlaceViewAndFactoryOps) {
  IncludeKeyGuard profile(K::Profile);
  Tensor t = zeros({4});  // a factory: dispatches on its Device argument
  uint64_t v0 = t.version();
  add_(t, ones({4}), 3);  // in place, void result
  EXPECT_EQ(t.to_vector<float>(), std::vector<float>(4, 3.0f));
  EXPECT_EQ(t.version(), v0 + 1);
  Tensor tr = transpose(t.view({2, 2}), 0, 1);  // views share storage
  EXPECT_EQ(tr.impl()->storage(), t.impl()->storage());
  Generator g(3), h(3);
  Tensor r = rand({5}, &g);  // a Generator* argument
  ExcludeKeyGuard off(K::Profile);
  EXPECT_TRUE(equal(r, rand({5}, &h)));
  EXPECT_EQ(g.offset(), h.offset());
  EXPECT_EQ(g_log.ops,
            (std::vector<std::string>{"full", "full", "add_", "view", "transpose", "rand"}));
}

TEST_F(ProfileFallbackTest, ExcludedKeyWinsOverIncluded) {
  IncludeKeyGuard profile(K::Profile);
  {
    ExcludeKeyGuard off(K::Profile);
    add(ones({2}), ones({2}));
  }
  EXPECT_EQ(g_log.calls, 0);
  add(ones({2}), ones({2}));
  EXPECT_EQ(g_log.calls, 3);  // ones, ones, add
}

TEST_F(ProfileFallbackTest, WorksOnMetaTensors) {
  Tensor a = meta_tensor({2, 3, 4}), b = meta_tensor({3, 1});
  IncludeKeyGuard profile(K::Profile);
  Tensor r = add(a, expand(b, {3, 4}));
  EXPECT_TRUE(r.device().is_meta());
  EXPECT_EQ(vec(r.sizes()), (std::vector<int64_t>{2, 3, 4}));
  auto [v, i] = max(a, -1);
  EXPECT_EQ(vec(i.sizes()), (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(i.dtype(), kInt64);
  EXPECT_EQ(g_log.ops, (std::vector<std::string>{"expand", "add", "max_dim"}));
}

TEST_F(ProfileFallbackTest, ErrorsPassThroughAndRestoreTheGuards) {
  Tensor a = meta_tensor({2}), b = meta_tensor({3});
  {
    IncludeKeyGuard profile(K::Profile);
    EXPECT_THROW_PREFIX(add(a, b), ValueError, "[add]");
    EXPECT_FALSE(local_dispatch_state().excluded.has(K::Profile));
    EXPECT_TRUE(local_dispatch_state().included.has(K::Profile));
  }
  EXPECT_EQ(g_log.calls, 1);
}

TEST_F(ProfileFallbackTest, FallbackReceivesItsOwnKeyWhenAHigherLayerFallsThrough) {
  // Trace has no kernel and no fallback here, so dispatch falls through it to Profile. The
  // fallback must be told it runs at Profile: a layer that redispatches with
  // ExcludeKeyGuard(key) would otherwise recurse forever.
  Tensor a = meta_tensor({2});
  IncludeKeyGuard trace(K::Trace);
  IncludeKeyGuard profile(K::Profile);
  add(a, a);  // unboxed entry
  Stack stack{a, a, Scalar(1)};
  ops::op_add.def.call_boxed(stack);  // boxed entry
  ASSERT_EQ(g_log.calls, 2);
  EXPECT_EQ(g_log.keys[0], K::Profile) << "unboxed call passed " << key_name(g_log.keys[0]);
  EXPECT_EQ(g_log.keys[1], K::Profile) << "boxed call passed " << key_name(g_log.keys[1]);
}

TEST_F(ProfileFallbackTest, CallBoxedAtUsesTheFallback) {
  Tensor a = meta_tensor({2, 2});
  Stack stack{a, a};
  ops::op_mul.def.call_boxed_at(K::Profile, stack);
  ASSERT_EQ(stack.size(), 1u);
  EXPECT_EQ(g_log.ops, (std::vector<std::string>{"mul"}));
  EXPECT_TRUE(std::get<Tensor>(stack[0]).device().is_meta());
}

TEST_F(ProfileFallbackTest, UnregisteringStopsIt) {
  Tensor a = meta_tensor({2});
  IncludeKeyGuard profile(K::Profile);
  add(a, a);
  EXPECT_EQ(g_log.calls, 1);
  register_fallback(K::Profile, nullptr);
  EXPECT_EQ(fallback_for(K::Profile), nullptr);
  Tensor r = add(a, a);  // Profile has no handler now: dispatch falls through to Meta
  EXPECT_TRUE(r.device().is_meta());
  EXPECT_EQ(g_log.calls, 1);
}

// ---------------------------------------------------------------- boxed calls

TEST(BoxedCallTest, FromAHandBuiltStack) {
  Tensor a = arange(6.0).view({2, 3}), b = full({3}, 2.0);
  Stack stack{a, b, Scalar(3)};
  ops::op_add.def.call_boxed(stack);
  ASSERT_EQ(stack.size(), 1u);
  EXPECT_TRUE(equal(std::get<Tensor>(stack[0]), add(a, b, 3)));

  Stack s2{a, Shape{1}, true, std::monostate{}};  // sum(a, [1], keepdim=True, dtype=None)
  ops::op_sum.def.call_boxed(s2);
  ASSERT_EQ(s2.size(), 1u);
  EXPECT_TRUE(equal(std::get<Tensor>(s2[0]), sum(a, {1}, true)));

  Stack s3{a, int64_t{0}, false};
  ops::op_max_dim.def.call_boxed(s3);
  ASSERT_EQ(s3.size(), 2u);  // values, indices
  EXPECT_TRUE(equal(std::get<Tensor>(s3[0]), std::get<0>(max(a, 0))));
  EXPECT_TRUE(equal(std::get<Tensor>(s3[1]), std::get<1>(max(a, 0))));

  Stack s4{TensorList{a, a}, int64_t{0}};
  ops::op_cat.def.call_boxed(s4);
  ASSERT_EQ(s4.size(), 1u);
  EXPECT_EQ(vec(std::get<Tensor>(s4[0]).sizes()), (std::vector<int64_t>{4, 3}));
}

TEST(BoxedCallTest, VoidOpsLeaveAnEmptyStack) {
  Tensor t = zeros({3});
  Stack stack{t, Scalar(7)};
  ops::op_fill_.def.call_boxed(stack);
  EXPECT_TRUE(stack.empty());
  EXPECT_EQ(t.to_vector<float>(), std::vector<float>(3, 7.0f));
}

TEST(BoxedCallTest, FactoriesDispatchOnTheirDevice) {
  Stack stack{Shape{2, 3}, kFloat16, Device("meta")};
  ops::op_empty.def.call_boxed(stack);
  ASSERT_EQ(stack.size(), 1u);
  Tensor t = std::get<Tensor>(stack[0]);
  EXPECT_TRUE(t.device().is_meta());
  EXPECT_EQ(t.dtype(), kFloat16);
  EXPECT_EQ(vec(t.sizes()), (std::vector<int64_t>{2, 3}));
}

TEST(BoxedCallTest, CallBoxedAtRunsThatKeysKernel) {
  Tensor a = meta_tensor({2, 2});
  Stack stack{a, a, Scalar(1)};
  ops::op_add.def.call_boxed_at(K::Meta, stack);
  ASSERT_EQ(stack.size(), 1u);
  EXPECT_TRUE(std::get<Tensor>(stack[0]).device().is_meta());
}

TEST(BoxedCallTest, WrongArgumentCountIsAnError) {
  Tensor a = meta_tensor({2});
  Stack stack{a};
  EXPECT_THROW(ops::op_add.def.call_boxed(stack), Error);
}

TEST(BoxedCallTest, CustomOp) {
  test_identity_op.set_kernel(K::Meta, &identity_kernel);
  Tensor a = meta_tensor({3});
  Stack stack{a};
  test_identity_op.def.call_boxed(stack);
  ASSERT_EQ(stack.size(), 1u);
  EXPECT_TRUE(std::get<Tensor>(stack[0]).is_same(a));
  EXPECT_TRUE(test_identity_op(a).is_same(a));
}

// ---------------------------------------------------------------- op definitions

TEST(OpDefTest, NamesKindsAndSchemas) {
  EXPECT_EQ(ops::op_add.def.name(), "add");
  EXPECT_EQ(ops::op_add.def.kind(), OpKind::Functional);
  EXPECT_TRUE(ops::op_add.def.schema().starts_with("add(Tensor self, Tensor other"));
  EXPECT_EQ(ops::op_add_.def.name(), "add_");
  EXPECT_EQ(ops::op_add_.def.kind(), OpKind::InPlace);
  EXPECT_EQ(ops::op_add_out.def.name(), "add_out");
  EXPECT_EQ(ops::op_add_out.def.kind(), OpKind::Out);
  EXPECT_EQ(ops::op_view.def.kind(), OpKind::View);
  EXPECT_EQ(ops::op_empty.def.kind(), OpKind::Factory);
  EXPECT_EQ(ops::op_max_dim.def.name(), "max_dim");
  EXPECT_EQ(ops::find_op("add"), &ops::op_add.def);
  EXPECT_EQ(ops::find_op("cat"), &ops::op_cat.def);
  EXPECT_EQ(ops::find_op("no_such_op"), nullptr);
}

TEST(OpDefTest, OpNamesAreUnique) {
  std::vector<std::string_view> names;
  for (const OpDef* op : ops::all_ops()) names.push_back(op->name());
  std::sort(names.begin(), names.end());
  EXPECT_EQ(std::adjacent_find(names.begin(), names.end()), names.end());
}

// ---------------------------------------------------------------- missing kernels

TEST(MissingKernelTest, BackendKeyWithoutKernelNamesTheOp) {
  Tensor p = plugin_tensor({2, 2});
  EXPECT_THROW_PREFIX(add(p, p), NotImplementedError,
                      "[add] no kernel for dispatch key PrivateUse2");
  EXPECT_THROW_PREFIX(relu(p), NotImplementedError, "[relu]");
  Stack stack{p, p, Scalar(1)};
  EXPECT_THROW_PREFIX(ops::op_add.def.call_boxed(stack), NotImplementedError, "[add]");
  // View ops serve every backend with one kernel.
  EXPECT_EQ(vec(transpose(p, 0, 1).sizes()), (std::vector<int64_t>{2, 2}));
}

TEST(MissingKernelTest, CustomOpWithOnlyACpuKernel) {
  test_identity_op.set_kernel(K::CPU, &identity_kernel);
  Tensor c = zeros({2});
  EXPECT_TRUE(test_identity_op(c).is_same(c));
  EXPECT_THROW_PREFIX(test_identity_op.call_at(K::CUDA, c), NotImplementedError,
                      "[test_identity] no kernel for dispatch key CUDA");
  Stack stack{c};
  EXPECT_THROW_PREFIX(test_identity_op.def.call_boxed_at(K::PrivateUse1, stack),
                      NotImplementedError,
                      "[test_identity] no kernel for dispatch key PrivateUse1");
  EXPECT_THROW_PREFIX(ops::op_add.call_at(K::CUDA, c, c, 1), NotImplementedError,
                      "[add] no kernel for dispatch key CUDA");
}

TEST(MissingKernelTest, LayerKeysWithoutKernelsFallThrough) {
  test_identity_op.set_kernel(K::CPU, &identity_kernel);
  Tensor c = zeros({2});
  IncludeKeyGuard trace(K::Trace);
  IncludeKeyGuard sharded(K::Sharded);
  EXPECT_TRUE(test_identity_op(c).is_same(c));
}

TEST(MissingKernelTest, NoTensorArgumentToDispatchOn) {
  EXPECT_THROW_PREFIX(test_no_tensor_op(3), ValueError, "[test_no_tensor]");
}

}  // namespace
}  // namespace kiln

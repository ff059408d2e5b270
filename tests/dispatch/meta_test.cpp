// The meta device: shape-only tensors. Ops dispatched at DispatchKey::Meta run their meta
// function only: right sizes, dtypes and errors, no data, no allocation.
#include <gtest/gtest.h>

#include <vector>

#include "core/test_util.h"
#include "kiln/core/error.h"
#include "kiln/ops/ops.h"

namespace kiln {
namespace {

using kiln_test::vec;
using V = std::vector<int64_t>;

const Device kMetaDevice("meta");

Tensor m(IntArrayRef sizes, DType dtype = kFloat32) { return empty(sizes, dtype, kMetaDevice); }

void expect_meta(const Tensor& t, const V& sizes, DType dtype) {
  EXPECT_TRUE(t.device().is_meta()) << t.device().str();
  EXPECT_TRUE(t.key_set().has(DispatchKey::Meta));
  EXPECT_EQ(vec(t.sizes()), sizes);
  EXPECT_EQ(t.dtype(), dtype) << name(t.dtype());
  EXPECT_EQ(t.impl()->data(), nullptr);
  EXPECT_EQ(t.impl()->storage()->data(), nullptr);
}

TEST(MetaTest, EmptyHasNoData) {
  Tensor t = empty({2, 3}, kFloat32, Device("meta"));
  expect_meta(t, {2, 3}, kFloat32);
  EXPECT_EQ(vec(t.strides()), (V{3, 1}));
  EXPECT_TRUE(t.is_contiguous());
  EXPECT_EQ(t.numel(), 6);
  EXPECT_EQ(t.nbytes(), 24u);
  EXPECT_EQ(t.impl()->storage()->nbytes(), 24u);  // the size it would have
  EXPECT_THROW_PREFIX(t.data_ptr(), DeviceError, "[data_ptr]");
  EXPECT_THROW_PREFIX(t.item(), ValueError, "[item]");
  EXPECT_THROW_PREFIX(empty({}, kFloat32, kMetaDevice).item(), DeviceError, "[item]");
  EXPECT_THROW_PREFIX(t.to_vector<float>(), DeviceError, "[to_vector]");
}

TEST(MetaTest, HugeTensorsAllocateNothing) {
  // 4 TiB each: these only work because nothing is allocated.
  const int64_t n = int64_t{1} << 20;
  expect_meta(empty({n, n}, kFloat32, kMetaDevice), {n, n}, kFloat32);
  expect_meta(zeros({n, n}, kFloat32, kMetaDevice), {n, n}, kFloat32);
  expect_meta(ones({n, n}, kFloat64, kMetaDevice), {n, n}, kFloat64);
  expect_meta(full({n, n}, 2, std::nullopt, kMetaDevice), {n, n}, kInt64);
  expect_meta(rand({n, n}, nullptr, kBFloat16, kMetaDevice), {n, n}, kBFloat16);
  expect_meta(randn({n, n}, nullptr, kFloat16, kMetaDevice), {n, n}, kFloat16);
  expect_meta(randint(0, 5, {n, n}, nullptr, std::nullopt, kMetaDevice), {n, n}, kInt64);
  Tensor big = empty({n, n}, kFloat32, kMetaDevice);
  expect_meta(add(big, big), {n, n}, kFloat32);
  expect_meta(mm(big, big), {n, n}, kFloat32);
  expect_meta(exp(big), {n, n}, kFloat32);
  expect_meta(sum(big, {0}), {n}, kFloat32);
}

TEST(MetaTest, FactoriesFollowTheDefaultDevice) {
  struct Restore {
    Device saved = default_device();
    ~Restore() { set_default_device(saved); }
  } restore;
  set_default_device(kMetaDevice);
  expect_meta(zeros({3}), {3}, kFloat32);
  expect_meta(arange(5), {5}, kInt64);
}

TEST(MetaTest, PointwiseShapesAndPromotion) {
  expect_meta(add(m({2, 1, 4}), m({3, 1})), {2, 3, 4}, kFloat32);
  expect_meta(add(m({2, 3}, kInt32), m({3}, kFloat16)), {2, 3}, kFloat16);
  expect_meta(mul(m({4}, kInt64), m({4}, kInt32)), {4}, kInt64);
  expect_meta(div(m({4}, kInt64), m({4}, kInt64)), {4}, kFloat32);  // true division
  expect_meta(add(m({4}, kInt32), 2.5), {4}, kFloat32);             // a float scalar makes it float
  expect_meta(add(m({4}, kInt32), 2), {4}, kInt32);                 // an int scalar keeps int32
  expect_meta(mul(m({4}, kFloat16), 3.0), {4}, kFloat16);
  expect_meta(lt(m({2, 3}), m({3})), {2, 3}, kBool);
  expect_meta(sqrt(m({5}, kInt64)), {5}, kFloat32);
  expect_meta(relu(m({5}, kInt64)), {5}, kInt64);
  expect_meta(where(m({2, 1}, kBool), m({3}), 0.0), {2, 3}, kFloat32);
  expect_meta(clamp(m({3}, kInt32), 0.5), {3}, kFloat32);
  expect_meta(m({2, 3}).to(kFloat64), {2, 3}, kFloat64);
}

TEST(MetaTest, ReductionsAndStructuredOps) {
  Tensor x = m({2, 3, 4});
  expect_meta(sum(x), {}, kFloat32);
  expect_meta(sum(x, {1}), {2, 4}, kFloat32);
  expect_meta(sum(x, {0, -1}, true), {1, 3, 1}, kFloat32);
  expect_meta(sum(m({3}, kInt32)), {}, kInt64);  // integer sums accumulate in int64
  expect_meta(mean(x, {2}), {2, 3}, kFloat32);
  expect_meta(amax(x, {1}, true), {2, 1, 4}, kFloat32);
  expect_meta(argmax(x, 1), {2, 4}, kInt64);
  auto [values, indices] = max(x, 1);
  expect_meta(values, {2, 4}, kFloat32);
  expect_meta(indices, {2, 4}, kInt64);
  expect_meta(softmax(x, -1), {2, 3, 4}, kFloat32);
  expect_meta(mm(m({2, 3}), m({3, 5})), {2, 5}, kFloat32);
  expect_meta(bmm(m({7, 2, 3}), m({7, 3, 5})), {7, 2, 5}, kFloat32);
  expect_meta(matmul(m({7, 2, 3}), m({3, 4})), {7, 2, 4}, kFloat32);
  expect_meta(matmul(m({5, 1, 2, 3}), m({6, 3, 4})), {5, 6, 2, 4}, kFloat32);
  expect_meta(linear(m({8, 3}), m({5, 3}), m({5})), {8, 5}, kFloat32);
  expect_meta(cat({m({2, 3}), m({4, 3})}, 0), {6, 3}, kFloat32);
  expect_meta(stack({m({2, 3}), m({2, 3})}, 1), {2, 2, 3}, kFloat32);
  expect_meta(layer_norm(m({4, 8}), {8}), {4, 8}, kFloat32);
  expect_meta(embedding(m({10, 4}), m({2, 3}, kInt64)), {2, 3, 4}, kFloat32);
  expect_meta(one_hot(m({5}, kInt64), 7), {5, 7}, kInt64);
}

TEST(MetaTest, ViewsAndShapes) {
  Tensor x = m({2, 3, 4});
  Tensor v = x.view({6, 4});
  expect_meta(v, {6, 4}, kFloat32);
  EXPECT_EQ(v.impl()->storage(), x.impl()->storage());
  Tensor t = transpose(x, 0, 2);
  expect_meta(t, {4, 3, 2}, kFloat32);
  EXPECT_EQ(vec(t.strides()), (V{1, 4, 12}));
  EXPECT_FALSE(t.is_contiguous());
  Tensor c = t.contiguous();
  expect_meta(c, {4, 3, 2}, kFloat32);
  EXPECT_TRUE(c.is_contiguous());
  expect_meta(reshape(t, {-1}), {24}, kFloat32);
  expect_meta(permute(x, {2, 0, 1}), {4, 2, 3}, kFloat32);
  expect_meta(slice(x, 1, 1, 3), {2, 2, 4}, kFloat32);
  expect_meta(select(x, 0, 1), {3, 4}, kFloat32);
  expect_meta(unsqueeze(x, 0), {1, 2, 3, 4}, kFloat32);
  expect_meta(expand(m({3, 1}), {2, 3, 5}), {2, 3, 5}, kFloat32);
  expect_meta(flatten(x, 1), {2, 12}, kFloat32);
  auto parts = split(x, 2, 2);
  ASSERT_EQ(parts.size(), 2u);
  expect_meta(parts[1], {2, 3, 2}, kFloat32);
}

TEST(MetaTest, InPlaceAndOutOpsCheckShapes) {
  Tensor x = m({2, 3});
  add_(x, m({3}));
  EXPECT_THROW_PREFIX(add_(x, m({4, 2, 3})), ValueError, "[add_]");
  Tensor out = m({2, 3});
  add_out(out, x, x);
  Tensor bad = m({3, 2});
  EXPECT_THROW_PREFIX(add_out(bad, x, x), ValueError, "[add_out]");
  x.fill_(1.0);
  x.copy_(m({3}));
}

TEST(MetaTest, ErrorsAreTheSameAsOnCpu) {
  EXPECT_THROW_PREFIX(add(m({2, 3}), m({4})), ValueError, "[add]");
  EXPECT_THROW_PREFIX(mm(m({2, 3}), m({4, 5})), ValueError, "[mm]");
  EXPECT_THROW_PREFIX(sum(m({2, 3}), {2}), IndexError, "[sum]");
  EXPECT_THROW_PREFIX(m({2, 3}).view({4, 2}), ValueError, "[view]");
  EXPECT_THROW_PREFIX(cat({m({2, 3}), m({2, 4})}, 0), ValueError, "[cat]");
  EXPECT_THROW_PREFIX(sub(m({2}, kBool), m({2}, kBool)), TypeError, "[sub]");
}

TEST(MetaTest, MixingDevices) {
  // A 0-d cpu tensor goes along with any device, like a number.
  expect_meta(add(m({2}), full({}, 1.0)), {2}, kFloat32);
  EXPECT_THROW_PREFIX(add(m({2}), ones({2})), DeviceError, "[add]");
}

TEST(MetaTest, CopiesBetweenCpuAndMeta) {
  Tensor cpu = ones({2, 3});
  Tensor on_meta = cpu.to(kMetaDevice);
  expect_meta(on_meta, {2, 3}, kFloat32);
  Tensor same = on_meta.to(kMetaDevice);
  EXPECT_TRUE(same.is_same(on_meta));
  expect_meta(on_meta.clone(), {2, 3}, kFloat32);
}

TEST(MetaTest, CopyingOutOfAMetaTensorThrows) {
  // A meta tensor has no data to copy (PyTorch: "Cannot copy out of meta tensor; no data!").
  // Returning an uninitialised cpu tensor, or leaving the destination untouched, would
  // silently produce garbage.
  Tensor on_meta = m({2, 3});
  EXPECT_THROW(on_meta.to(Device("cpu")), Error);
  Tensor dst = zeros({2, 3});
  uint64_t v0 = dst.version();
  EXPECT_THROW(dst.copy_(on_meta), Error);
  EXPECT_EQ(dst.version(), v0);
}

}  // namespace
}  // namespace kiln

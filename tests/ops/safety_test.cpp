// Regression tests for unsafe inputs found in review: aliasing out= arguments, overflowing
// sizes and strides, scalars that do not fit, undefined tensors. Each must either compute the
// right answer or raise a kiln::Error naming the op, never crash or write out of bounds.
#include <gtest/gtest.h>

#include <cstdint>
#include <limits>

#include "kiln/kiln.h"
#include "kiln/ops/op_list.h"

namespace kiln {
namespace {

constexpr int64_t kBig = int64_t{1} << 60;

TEST(SafetyTest, MmOutAliasingAnInputComputesThroughATemporary) {
  manual_seed(1);
  Tensor a = randn({4, 4}), b = randn({4, 4});
  Tensor ref = mm(a, b);
  mm_out(a, a, b);
  EXPECT_TRUE(allclose(a, ref, 1e-5, 1e-6));
}

TEST(SafetyTest, IndexSelectOutAliasingSelf) {
  Tensor x = arange(6, kFloat32).view({2, 3});
  Tensor ref = index_select(x, 0, from_vector<int64_t>({1, 0}));
  ops::op_index_select_out(x, x, 0, from_vector<int64_t>({1, 0}));
  EXPECT_TRUE(equal(x, ref));
}

TEST(SafetyTest, CatOutOverlappingAnInputIsRejected) {
  Tensor x = arange(8, kFloat32);
  Tensor before = x.clone();
  EXPECT_THROW(ops::op_cat_out(slice(x, 0, 2, 6), {slice(x, 0, 0, 2), slice(x, 0, 4, 6)}, 0),
               ValueError);
  EXPECT_TRUE(equal(x, before));
}

TEST(SafetyTest, ScatterAddInPlaceStillWorks) {
  Tensor self = zeros({3});
  scatter_add_(self, 0, from_vector<int64_t>({0, 0, 2}), ones({3}));
  EXPECT_EQ(self.to_vector<float>(), (std::vector<float>{2, 0, 1}));
}

TEST(SafetyTest, ViewWithOverflowingSizesIsRejected) {
  EXPECT_THROW(view(zeros({16}), {16, kBig + 1}), ValueError);
  EXPECT_THROW(reshape(zeros({16}), {16, kBig + 1}), ValueError);
  EXPECT_THROW(view(zeros({16}), {-1, kBig, kBig}), ValueError);
}

TEST(SafetyTest, AsStridedOverflowIsRejected) {
  EXPECT_THROW(as_strided(zeros({4}), {2, 2}, {int64_t{1} << 62, int64_t{1} << 62}), IndexError);
}

TEST(SafetyTest, GatherWithZeroDimIndex) {
  Tensor r = gather(arange(10), 0, scalar_tensor(int64_t{5}, kInt64));
  EXPECT_EQ(r.item<int64_t>(), 5);
}

TEST(SafetyTest, ForeachFloatScalarOnIntegerTensorsIsRejected) {
  Tensor t = full({3}, 5);
  EXPECT_THROW(foreach_mul_({t}, 0.5), TypeError);
  EXPECT_EQ(t.to_vector<int64_t>(), (std::vector<int64_t>{5, 5, 5}));
  EXPECT_THROW(foreach_add_({t}, {ones({3}, kInt64)}, 0.5), TypeError);
}

TEST(SafetyTest, OutOfRangeNumbersAreRejected) {
  EXPECT_THROW(arange(0, std::numeric_limits<int64_t>::max(), 1), ValueError);
  EXPECT_THROW(arange(0.0, 1e19, 1.0), ValueError);
  EXPECT_THROW(full({2}, 1e30, kInt32), TypeError);
  EXPECT_THROW(full({2}, 300, kUInt8), TypeError);
  EXPECT_THROW(full({2}, 1e6, kFloat16), TypeError);
  Tensor t = zeros({2}, kInt32);
  EXPECT_THROW(t.fill_(int64_t{1} << 40), TypeError);
  EXPECT_EQ(full({2}, 255, kUInt8).to_vector<int64_t>(), (std::vector<int64_t>{255, 255}));
}

TEST(SafetyTest, ExpandRejectsNegativeSizes) { EXPECT_THROW(expand(ones({1}), {-2}), ValueError); }

TEST(SafetyTest, UndefinedTensorsRaise) {
  EXPECT_THROW(stack({Tensor()}), ValueError);
  EXPECT_THROW(masked_fill(Tensor(), ones({1}, kBool), 0), ValueError);
  EXPECT_THROW(allclose(Tensor(), ones({1})), ValueError);
  EXPECT_THROW(expand_as(ones({1}), Tensor()), ValueError);
}

TEST(SafetyTest, NarrowAndSliceBoundsDoNotOverflow) {
  Tensor x = arange(10);
  EXPECT_THROW(narrow(x, 0, 1, std::numeric_limits<int64_t>::max()), IndexError);
  EXPECT_EQ(slice(x, 0, 0, 10, std::numeric_limits<int64_t>::max()).numel(), 1);
}

TEST(SafetyTest, TooManyStridedDimsIsAUserError) {
  Shape sizes(17, 2);
  Tensor x = zeros(sizes);
  try {
    add(transpose(x, 0, 1), 1);
    FAIL() << "expected an error";
  } catch (const ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("[elementwise]"), std::string::npos) << e.what();
  }
}

TEST(SafetyTest, IndexSelectOnZeroDimSelfTakesOneIndex) {
  EXPECT_THROW(index_select(scalar_tensor(3.0), 0, from_vector<int64_t>({0, 0})), IndexError);
}

}  // namespace
}  // namespace kiln

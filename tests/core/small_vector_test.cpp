// Tests for kiln/core/small_vector.h.
#include "kiln/core/small_vector.h"

#include <gtest/gtest.h>

#include <array>
#include <utility>
#include <vector>

#include "core/test_util.h"

namespace kiln {
namespace {

using kiln_test::vec;
using Vec = SmallVector<int64_t, 6>;

// Whether v's elements live inside the object itself (no heap allocation).
template <class V>
bool is_inline(const V& v) {
  auto* p = reinterpret_cast<const char*>(v.data());
  return p >= reinterpret_cast<const char*>(&v) && p < reinterpret_cast<const char*>(&v + 1);
}

Vec iota(int64_t n) {
  Vec v;
  for (int64_t i = 0; i < n; ++i) v.push_back(i);
  return v;
}

TEST(SmallVectorTest, StaysInlineUpToN) {
  Vec v;
  EXPECT_TRUE(v.empty());
  EXPECT_EQ(v.size(), 0u);
  EXPECT_TRUE(is_inline(v));
  for (int64_t i = 0; i < 6; ++i) {
    v.push_back(i * 10);
    EXPECT_TRUE(is_inline(v)) << "size " << v.size();
  }
  EXPECT_EQ(vec(v.span()), (std::vector<int64_t>{0, 10, 20, 30, 40, 50}));
  EXPECT_EQ(v.back(), 50);
}

TEST(SmallVectorTest, GrowsToHeapPastN) {
  Vec v = iota(6);
  v.push_back(6);
  EXPECT_FALSE(is_inline(v));
  EXPECT_EQ(v.size(), 7u);
  for (int64_t i = 7; i < 100; ++i) v.push_back(i);
  ASSERT_EQ(v.size(), 100u);
  for (int64_t i = 0; i < 100; ++i) EXPECT_EQ(v[i], i);
}

TEST(SmallVectorTest, Constructors) {
  EXPECT_EQ(vec(Vec{}.span()), std::vector<int64_t>{});
  EXPECT_EQ(vec(Vec{1, 2, 3}.span()), (std::vector<int64_t>{1, 2, 3}));
  EXPECT_EQ(vec(Vec(3).span()), (std::vector<int64_t>{0, 0, 0}));
  EXPECT_EQ(vec(Vec(2, 7).span()), (std::vector<int64_t>{7, 7}));
  Vec big(9, 5);
  EXPECT_FALSE(is_inline(big));
  EXPECT_EQ(vec(big.span()), std::vector<int64_t>(9, 5));
  std::vector<int64_t> src{4, 5, 6, 7, 8, 9, 10, 11};
  Vec from_ref(IntArrayRef{src});
  EXPECT_EQ(vec(from_ref.span()), src);
}

TEST(SmallVectorTest, ResizeAndClear) {
  Vec v{1, 2};
  v.resize(4, 9);
  EXPECT_EQ(vec(v.span()), (std::vector<int64_t>{1, 2, 9, 9}));
  v.resize(10);
  EXPECT_EQ(v.size(), 10u);
  EXPECT_EQ(v[3], 9);
  EXPECT_EQ(v[9], 0);
  v.resize(1);
  EXPECT_EQ(vec(v.span()), (std::vector<int64_t>{1}));
  v.clear();
  EXPECT_TRUE(v.empty());
  v.push_back(3);
  EXPECT_EQ(vec(v.span()), (std::vector<int64_t>{3}));
}

TEST(SmallVectorTest, CopyInlineAndHeap) {
  for (int64_t n : {0, 3, 6, 7, 20}) {
    Vec a = iota(n);
    Vec b(a);
    EXPECT_EQ(a, b) << n;
    EXPECT_EQ(is_inline(b), n <= 6) << n;
    if (n > 0) {
      b[0] = 42;  // independent storage
      EXPECT_EQ(a[0], 0) << n;
      EXPECT_NE(a, b) << n;
    }
  }
}

TEST(SmallVectorTest, CopyAssignBetweenInlineAndHeap) {
  // Every combination of source and destination sizes around the inline capacity.
  for (int64_t dst_n : {0, 2, 6, 7, 10, 30}) {
    for (int64_t src_n : {0, 1, 6, 7, 12, 40}) {
      Vec dst = iota(dst_n);
      for (auto& x : dst) x += 1000;
      Vec src = iota(src_n);
      dst = src;
      EXPECT_EQ(dst, src) << "dst " << dst_n << " src " << src_n;
      EXPECT_EQ(vec(dst.span()), vec(src.span())) << "dst " << dst_n << " src " << src_n;
    }
  }
  Vec self = iota(9);
  Vec& alias = self;
  self = alias;
  EXPECT_EQ(self, iota(9));
}

TEST(SmallVectorTest, MoveStealsHeapAndCopiesInline) {
  Vec heap = iota(10);
  const int64_t* p = heap.data();
  Vec moved(std::move(heap));
  EXPECT_EQ(moved.data(), p) << "moving a heap vector should steal its buffer";
  EXPECT_EQ(moved, iota(10));
  EXPECT_TRUE(heap.empty());  // NOLINT(bugprone-use-after-move): documented state

  Vec small = iota(4);
  Vec moved_small(std::move(small));
  EXPECT_TRUE(is_inline(moved_small));
  EXPECT_EQ(moved_small, iota(4));
  EXPECT_TRUE(small.empty());  // NOLINT(bugprone-use-after-move)

  // A moved-from vector is usable.
  heap.push_back(1);
  EXPECT_EQ(vec(heap.span()), (std::vector<int64_t>{1}));
}

TEST(SmallVectorTest, MoveAssign) {
  for (int64_t dst_n : {0, 3, 8}) {
    for (int64_t src_n : {0, 5, 9}) {
      Vec dst = iota(dst_n);
      Vec src = iota(src_n);
      dst = std::move(src);
      EXPECT_EQ(dst, iota(src_n)) << "dst " << dst_n << " src " << src_n;
      EXPECT_TRUE(src.empty());  // NOLINT(bugprone-use-after-move)
      dst.push_back(99);         // still growable after taking over an inline or heap buffer
      for (int i = 0; i < 10; ++i) dst.push_back(i);
      EXPECT_EQ(dst.size(), static_cast<size_t>(src_n + 11));
    }
  }
}

TEST(SmallVectorTest, Insert) {
  Vec v{1, 2, 3};
  v.insert(0, 0);
  EXPECT_EQ(vec(v.span()), (std::vector<int64_t>{0, 1, 2, 3}));
  v.insert(2, 9);
  EXPECT_EQ(vec(v.span()), (std::vector<int64_t>{0, 1, 9, 2, 3}));
  v.insert(5, 7);  // at the end
  EXPECT_EQ(vec(v.span()), (std::vector<int64_t>{0, 1, 9, 2, 3, 7}));
  EXPECT_TRUE(is_inline(v));
  v.insert(1, 8);  // 7th element: moves to the heap
  EXPECT_FALSE(is_inline(v));
  EXPECT_EQ(vec(v.span()), (std::vector<int64_t>{0, 8, 1, 9, 2, 3, 7}));
  Vec e;
  e.insert(0, 5);
  EXPECT_EQ(vec(e.span()), (std::vector<int64_t>{5}));
}

TEST(SmallVectorTest, Erase) {
  Vec v{0, 1, 2, 3, 4, 5, 6, 7};
  v.erase(0);
  EXPECT_EQ(vec(v.span()), (std::vector<int64_t>{1, 2, 3, 4, 5, 6, 7}));
  v.erase(3);
  EXPECT_EQ(vec(v.span()), (std::vector<int64_t>{1, 2, 3, 5, 6, 7}));
  v.erase(5);  // the last
  EXPECT_EQ(vec(v.span()), (std::vector<int64_t>{1, 2, 3, 5, 6}));
  while (!v.empty()) v.erase(0);
  EXPECT_EQ(v.size(), 0u);
}

TEST(SmallVectorTest, Equality) {
  EXPECT_EQ(Vec{}, Vec{});
  EXPECT_EQ((Vec{1, 2}), (Vec{1, 2}));
  EXPECT_NE((Vec{1, 2}), (Vec{1, 2, 3}));
  EXPECT_NE((Vec{1, 2}), (Vec{2, 1}));
  EXPECT_NE((Vec{}), (Vec{0}));
  // Inline and heap vectors with the same elements are equal.
  Vec heap = iota(10);
  heap.resize(3);
  EXPECT_FALSE(is_inline(heap));
  EXPECT_EQ(heap, iota(3));
}

TEST(SmallVectorTest, OtherInlineCapacities) {
  SmallVector<bool, 8> mask(5, false);
  mask[3] = true;
  EXPECT_TRUE(is_inline(mask));
  EXPECT_TRUE(mask[3]);
  EXPECT_FALSE(mask[4]);
  SmallVector<int32_t, 1> one;
  for (int32_t i = 0; i < 5; ++i) one.push_back(i);
  EXPECT_EQ(one.size(), 5u);
  EXPECT_EQ(one[4], 4);
}

TEST(ArrayRefTest, FromBracedList) {
  auto sum = [](IntArrayRef r) {
    int64_t s = 0;
    for (int64_t x : r) s += x;
    return std::make_pair(r.size(), s);
  };
  EXPECT_EQ(sum({2, 3, 4}), std::make_pair(size_t{3}, int64_t{9}));
  EXPECT_EQ(sum({}), std::make_pair(size_t{0}, int64_t{0}));
}

TEST(ArrayRefTest, FromContainers) {
  std::vector<int64_t> v{5, 6, 7};
  IntArrayRef a(v);
  EXPECT_EQ(a.data(), v.data());
  EXPECT_EQ(a.size(), 3u);
  EXPECT_EQ(a[1], 6);
  EXPECT_EQ(a.back(), 7);

  Vec sv{1, 2, 3, 4};
  IntArrayRef b(sv);
  EXPECT_EQ(b.data(), sv.data());
  EXPECT_EQ(vec(b), (std::vector<int64_t>{1, 2, 3, 4}));

  std::array<int64_t, 2> arr{8, 9};
  IntArrayRef c(arr);
  EXPECT_EQ(vec(c), (std::vector<int64_t>{8, 9}));

  int64_t raw[] = {1, 2, 3};
  IntArrayRef d(raw, 2);
  EXPECT_EQ(vec(d), (std::vector<int64_t>{1, 2}));

  EXPECT_TRUE(IntArrayRef().empty());
  EXPECT_EQ(IntArrayRef().data(), nullptr);
}

TEST(ArrayRefTest, Subspan) {
  std::vector<int64_t> v{0, 1, 2, 3, 4};
  IntArrayRef a(v);
  EXPECT_EQ(vec(a.subspan(2)), (std::vector<int64_t>{2, 3, 4}));
  EXPECT_EQ(vec(a.subspan(1, 2)), (std::vector<int64_t>{1, 2}));
  EXPECT_TRUE(a.subspan(5).empty());
}

TEST(ArrayRefTest, SmallVectorRoundTrip) {
  Vec a{3, 1, 4, 1, 5, 9, 2, 6};
  Vec b = a.span();  // implicit from ArrayRef
  EXPECT_EQ(a, b);
  EXPECT_NE(a.data(), b.data());
}

}  // namespace
}  // namespace kiln

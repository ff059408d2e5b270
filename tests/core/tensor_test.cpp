// Tests for kiln/core/tensor.h and kiln/core/tensor_impl.h: geometry, contiguity, version
// counters, data access errors, wrap_dim, item() and PyTorch-style printing.
#include "kiln/core/tensor.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <thread>
#include <vector>

#include "core/test_util.h"
#include "kiln/core/error.h"
#include "kiln/core/tensor_impl.h"
#include "kiln/ops/ops.h"

namespace kiln {
namespace {

using kiln_test::vec;
using V = std::vector<int64_t>;

// A float32 tensor with the given geometry over a 4 KiB cpu storage.
Tensor strided(IntArrayRef sizes, IntArrayRef strides, int64_t offset = 0) {
  auto storage = make_ref<StorageImpl>(4096, Device(kCPU), cpu_allocator());
  return Tensor(make_ref<TensorImpl>(storage, kFloat32, sizes, strides, offset));
}

struct DefaultDTypeGuard {
  DType saved = default_dtype();
  ~DefaultDTypeGuard() { set_default_dtype(saved); }
};

// ---------------------------------------------------------------- impl blocks

// At thread exit a thread_local tensor constructed before the thread's first cached impl block
// (as the CPU kernels' scalar scratch is) is destroyed after the cache is emptied; its impl must
// be freed, not cached again. LeakSanitizer, in the asan preset's run, reports it otherwise.
TEST(TensorTest, ThreadLocalTensorOutlivingTheImplCacheIsFreed) {
  std::thread([] {
    thread_local Tensor held;  // constructed first, so destroyed last
    held = empty({2}, kFloat32);
    { Tensor first = empty({3}, kFloat32); }  // caching its block sets up the cache's cleanup
  }).join();
}

// ---------------------------------------------------------------- geometry

TEST(TensorTest, SizesAndStrides) {
  Tensor t = empty({2, 3, 4});
  EXPECT_TRUE(t.defined());
  EXPECT_EQ(t.dim(), 3);
  EXPECT_EQ(t.numel(), 24);
  EXPECT_EQ(vec(t.sizes()), (V{2, 3, 4}));
  EXPECT_EQ(vec(t.strides()), (V{12, 4, 1}));
  EXPECT_EQ(t.size(0), 2);
  EXPECT_EQ(t.size(-1), 4);
  EXPECT_EQ(t.stride(-3), 12);
  EXPECT_EQ(t.storage_offset(), 0);
  EXPECT_EQ(t.dtype(), kFloat32);
  EXPECT_EQ(t.device(), Device("cpu"));
  EXPECT_EQ(t.itemsize(), 4u);
  EXPECT_EQ(t.nbytes(), 96u);
  EXPECT_TRUE(t.is_contiguous());
  EXPECT_TRUE(t.key_set().has(DispatchKey::CPU));
  EXPECT_FALSE(t.requires_grad());

  Tensor s = empty({});
  EXPECT_EQ(s.dim(), 0);
  EXPECT_EQ(s.numel(), 1);
  EXPECT_TRUE(s.is_contiguous());

  Tensor z = empty({3, 0, 2});
  EXPECT_EQ(z.numel(), 0);
  EXPECT_EQ(z.nbytes(), 0u);
  EXPECT_TRUE(z.is_contiguous());
}

TEST(TensorTest, ContiguousStrides) {
  EXPECT_EQ(vec(contiguous_strides({2, 3, 4})), (V{12, 4, 1}));
  EXPECT_EQ(vec(contiguous_strides({2, 1, 3})), (V{3, 3, 1}));
  EXPECT_EQ(vec(contiguous_strides({2, 0, 3})), (V{3, 3, 1}));  // as PyTorch: max(size, 1)
  EXPECT_EQ(vec(contiguous_strides({5})), (V{1}));
  EXPECT_TRUE(contiguous_strides({}).empty());
}

TEST(TensorTest, Contiguity) {
  EXPECT_TRUE(strided({2, 3}, {3, 1}).is_contiguous());
  EXPECT_FALSE(strided({2, 3}, {1, 2}).is_contiguous());  // column-major
  EXPECT_FALSE(strided({2, 3}, {4, 1}).is_contiguous());  // padded rows
  EXPECT_FALSE(strided({3}, {2}).is_contiguous());
  EXPECT_FALSE(strided({2, 3}, {0, 1}).is_contiguous());  // expanded
  // Dims of size 1 may have any stride, as in PyTorch.
  EXPECT_TRUE(strided({2, 1, 3}, {3, 100, 1}).is_contiguous());
  EXPECT_TRUE(strided({1, 1}, {7, 9}).is_contiguous());
  EXPECT_TRUE(strided({1, 4}, {0, 1}).is_contiguous());
  EXPECT_TRUE(strided({2, 1}, {1, 5}).is_contiguous());
  EXPECT_TRUE(strided({3, 1, 1}, {1, 0, 17}).is_contiguous());
  // Empty tensors are contiguous whatever their strides.
  EXPECT_TRUE(strided({0, 3}, {1, 7}).is_contiguous());
  EXPECT_TRUE(strided({}, {}).is_contiguous());
}

TEST(TensorTest, SetGeometryRefreshesNumelAndContiguity) {
  Tensor t = strided({2, 3}, {3, 1});
  t.impl()->set_geometry({3, 2}, {1, 3}, 5);
  EXPECT_EQ(vec(t.sizes()), (V{3, 2}));
  EXPECT_EQ(t.storage_offset(), 5);
  EXPECT_EQ(t.numel(), 6);
  EXPECT_FALSE(t.is_contiguous());
  t.impl()->set_geometry({4, 5}, {5, 1}, 0);
  EXPECT_EQ(t.numel(), 20);
  EXPECT_TRUE(t.is_contiguous());
}

TEST(TensorTest, ViewsShareStorageAndKnowTheirGeometry) {
  Tensor t = arange(24).view({2, 3, 4});
  Tensor tr = transpose(t, 0, 2);
  EXPECT_EQ(vec(tr.sizes()), (V{4, 3, 2}));
  EXPECT_EQ(vec(tr.strides()), (V{1, 4, 12}));
  EXPECT_FALSE(tr.is_contiguous());
  EXPECT_EQ(tr.impl()->storage(), t.impl()->storage());
  Tensor c = tr.contiguous();
  EXPECT_TRUE(c.is_contiguous());
  EXPECT_EQ(vec(c.strides()), (V{6, 2, 1}));
  EXPECT_NE(c.impl()->storage(), t.impl()->storage());

  Tensor u = unsqueeze(arange(6).view({2, 3}), 1);  // a size-1 dim in the middle
  EXPECT_EQ(vec(u.sizes()), (V{2, 1, 3}));
  EXPECT_TRUE(u.is_contiguous());

  Tensor sl = slice(t, 2, 1, 3);
  EXPECT_EQ(sl.storage_offset(), 1);
  EXPECT_FALSE(sl.is_contiguous());
  EXPECT_EQ(sl.data_ptr(), static_cast<char*>(t.data_ptr()) + 1 * t.itemsize());
  EXPECT_EQ(sl.to_vector<int64_t>(), (V{1, 2, 5, 6, 9, 10, 13, 14, 17, 18, 21, 22}));
}

TEST(TensorTest, CheckedNumel) {
  EXPECT_EQ(checked_numel({2, 3, 4}, "op"), 24);
  EXPECT_EQ(checked_numel({}, "op"), 1);
  EXPECT_EQ(checked_numel({5, 0}, "op"), 0);
  EXPECT_THROW_PREFIX(checked_numel({2, -1}, "myop"), ValueError, "[myop] negative dimension");
  EXPECT_THROW_CONTAINS(checked_numel({int64_t{1} << 40, int64_t{1} << 40}, "myop"), ValueError,
                        "too many elements");
  EXPECT_THROW_PREFIX(empty({-2, 3}), ValueError, "[empty]");
}

// ---------------------------------------------------------------- version counter

TEST(TensorTest, VersionCounterSharedByViewsAndBumpedInPlace) {
  Tensor t = zeros({4});
  uint64_t v0 = t.version();
  Tensor v = t.view({2, 2});
  Tensor row = select(v, 0, 1);
  EXPECT_EQ(v.version(), v0);

  add_(t, ones({4}));
  EXPECT_EQ(t.version(), v0 + 1);
  EXPECT_EQ(v.version(), v0 + 1);
  EXPECT_EQ(row.version(), v0 + 1);

  add_(row, 1.0);  // through a view
  EXPECT_EQ(t.version(), v0 + 2);
  EXPECT_EQ(t.to_vector<float>(), (std::vector<float>{1, 1, 2, 2}));

  Tensor sum = add(t, t);  // functional ops do not bump
  EXPECT_EQ(t.version(), v0 + 2);
  uint64_t s0 = sum.version();

  t.fill_(3);
  EXPECT_EQ(t.version(), v0 + 3);
  t.copy_(ones({4}));
  EXPECT_EQ(t.version(), v0 + 4);
  t.zero_();
  EXPECT_EQ(v.version(), v0 + 5);
  mul_(v, 2.0);
  EXPECT_EQ(row.version(), v0 + 6);
  EXPECT_EQ(sum.version(), s0);  // a separate storage has its own counter

  Tensor cl = t.clone();
  uint64_t c0 = cl.version();
  add_(cl, 1.0);
  EXPECT_EQ(cl.version(), c0 + 1);
  EXPECT_EQ(t.version(), v0 + 6);
}

TEST(TensorTest, FailedInPlaceOpDoesNotBumpOrWrite) {
  Tensor t = ones({4});
  uint64_t v0 = t.version();
  EXPECT_THROW(add_(t, ones({3})), Error);
  EXPECT_EQ(t.version(), v0);
  EXPECT_EQ(t.to_vector<float>(), (std::vector<float>{1, 1, 1, 1}));
}

// ---------------------------------------------------------------- data access

TEST(TensorTest, TypedDataPointer) {
  Tensor t = zeros({3});
  EXPECT_EQ(t.data<float>(), t.data_ptr());
  EXPECT_EQ(t.data<const float>(), t.data_ptr());
  t.data<float>()[1] = 5;
  EXPECT_EQ(t.to_vector<float>(), (std::vector<float>{0, 5, 0}));
  Tensor i = zeros({2}, kInt64);
  EXPECT_NE(i.data<int64_t>(), nullptr);
}

TEST(TensorTest, TypedDataPointerTypeMismatch) {
  Tensor t = zeros({3});
  EXPECT_THROW_PREFIX(t.data<double>(), TypeError, "[data]");
  EXPECT_THROW_CONTAINS(t.data<double>(), TypeError, "float64");
  EXPECT_THROW_CONTAINS(t.data<double>(), TypeError, "float32");
  EXPECT_THROW_PREFIX(t.data<int32_t>(), TypeError, "[data]");
  EXPECT_THROW_PREFIX(zeros({2}, kInt32).data<int64_t>(), TypeError, "[data]");
  EXPECT_THROW_PREFIX(zeros({2}, kBFloat16).data<Half>(), TypeError, "[data]");
}

TEST(TensorTest, DataPointerOfMetaTensorThrows) {
  Tensor m = empty({2, 3}, kFloat32, Device("meta"));
  EXPECT_THROW_PREFIX(m.data_ptr(), DeviceError, "[data_ptr]");
  EXPECT_THROW_PREFIX(m.data<float>(), DeviceError, "[data_ptr]");
  EXPECT_EQ(m.impl()->data(), nullptr);
}

TEST(TensorTest, DataPointerOfUndefinedTensorThrows) {
  EXPECT_THROW_PREFIX(Tensor().data_ptr(), ValueError, "[data_ptr]");
}

// Run in a child process so that a crash fails this test only. DESIGN.md: bad input never
// crashes.
TEST(TensorDeathTest, TypedDataPointerOfUndefinedTensorThrows) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        try {
          (void)Tensor().data<float>();
        } catch (const Error&) {
          std::_Exit(0);
        }
        std::_Exit(1);
      },
      testing::ExitedWithCode(0), "");
}

// ---------------------------------------------------------------- wrap_dim

TEST(TensorTest, WrapDim) {
  EXPECT_EQ(wrap_dim(0, 3, "op"), 0);
  EXPECT_EQ(wrap_dim(2, 3, "op"), 2);
  EXPECT_EQ(wrap_dim(-1, 3, "op"), 2);
  EXPECT_EQ(wrap_dim(-3, 3, "op"), 0);
  // A 0-d tensor accepts 0 and -1.
  EXPECT_EQ(wrap_dim(0, 0, "op"), 0);
  EXPECT_EQ(wrap_dim(-1, 0, "op"), 0);
}

TEST(TensorTest, WrapDimErrors) {
  EXPECT_THROW_PREFIX(wrap_dim(3, 3, "myop"), IndexError,
                      "[myop] dimension out of range (expected to be in range of [-3, 2], but "
                      "got 3)");
  EXPECT_THROW_PREFIX(wrap_dim(-4, 3, "myop"), IndexError,
                      "[myop] dimension out of range (expected to be in range of [-3, 2], but "
                      "got -4)");
  EXPECT_THROW_PREFIX(wrap_dim(1, 0, "myop"), IndexError, "[myop]");
  EXPECT_THROW_PREFIX(wrap_dim(-2, 0, "myop"), IndexError, "[myop]");
  Tensor t = empty({2, 3});
  EXPECT_THROW_PREFIX(t.size(2), IndexError, "[size]");
  EXPECT_THROW_PREFIX(t.stride(-3), IndexError, "[stride]");
}

// ---------------------------------------------------------------- item()

TEST(TensorTest, Item) {
  Scalar f = full({}, 2.5).item();
  EXPECT_TRUE(f.is_floating());
  EXPECT_EQ(f.to_double(), 2.5);
  Scalar i = full({1, 1, 1}, int64_t{-7}).item();
  EXPECT_TRUE(i.is_integral());
  EXPECT_EQ(i.to_int(), -7);
  Scalar b = full({1}, true).item();
  EXPECT_TRUE(b.is_bool());
  EXPECT_TRUE(b.to_bool());
  EXPECT_EQ(full({}, 3, kInt32).item<int32_t>(), 3);
  EXPECT_EQ(full({1}, 0.5, kFloat16).item<float>(), 0.5f);
  Tensor v = arange(10);
  EXPECT_EQ(select(v, 0, 7).item<int64_t>(), 7);  // a view with an offset
}

TEST(TensorTest, ItemErrors) {
  EXPECT_THROW_PREFIX(zeros({2}).item(), ValueError, "[item]");
  EXPECT_THROW_CONTAINS(zeros({2, 3}).item(), ValueError, "6 elements");
  EXPECT_THROW_PREFIX(zeros({0}).item(), ValueError, "[item]");
  EXPECT_THROW_PREFIX(Tensor().item(), ValueError, "[item]");
  EXPECT_THROW_PREFIX(empty({}, kFloat32, Device("meta")).item(), DeviceError, "[item]");
}

// ---------------------------------------------------------------- printing
// Expected texts are PyTorch's (torch/_tensor_str.py), except that Kiln writes dtype=float64
// where PyTorch writes dtype=torch.float64.

TEST(TensorPrintTest, FloatIntegers) {
  EXPECT_EQ(from_vector<float>({1, 2, 3}).str(), "tensor([1., 2., 3.])");
  EXPECT_EQ(from_vector<float>({-1, 2}).str(), "tensor([-1.,  2.])");
  EXPECT_EQ(from_vector<float>({0, 0}).str(), "tensor([0., 0.])");
}

TEST(TensorPrintTest, FixedPoint2D) {
  EXPECT_EQ(from_vector<float>({0.1f, 0.2f, 0.3f, 0.4f}, {2, 2}).str(),
            "tensor([[0.1000, 0.2000],\n        [0.3000, 0.4000]])");
}

TEST(TensorPrintTest, Integers) {
  EXPECT_EQ(from_vector<int64_t>({1, 2, 3}).str(), "tensor([1, 2, 3])");
  EXPECT_EQ(from_vector<int64_t>({-10, 2, 300}).str(), "tensor([-10,   2, 300])");
  EXPECT_EQ(from_vector<int32_t>({1, 2}).str(), "tensor([1, 2], dtype=int32)");
  EXPECT_EQ(from_vector<uint8_t>({7}).str(), "tensor([7], dtype=uint8)");
}

TEST(TensorPrintTest, BoolsArePaddedToEqualWidth) {
  EXPECT_EQ(from_vector<bool>({true, false}).str(), "tensor([ True, False])");
  EXPECT_EQ(from_vector<bool>({true, true}).str(), "tensor([True, True])");
}

TEST(TensorPrintTest, ZeroDim) {
  EXPECT_EQ(full({}, 3.0).str(), "tensor(3.)");
  EXPECT_EQ(full({}, 0.5).str(), "tensor(0.5000)");
  EXPECT_EQ(full({}, int64_t{4}).str(), "tensor(4)");
  EXPECT_EQ(full({}, true).str(), "tensor(True)");
  EXPECT_EQ(full({}, 2, kInt32).str(), "tensor(2, dtype=int32)");
}

TEST(TensorPrintTest, Empty) {
  EXPECT_EQ(zeros({0, 3}).str(), "tensor([], size=(0, 3))");
  EXPECT_EQ(zeros({0}).str(), "tensor([])");
  EXPECT_EQ(zeros({0}, kFloat64).str(), "tensor([], dtype=float64)");
}

TEST(TensorPrintTest, EmptyWithALeadingNonzeroDim) {
  // PyTorch prints every empty tensor's contents as "[]".
  EXPECT_EQ(zeros({2, 0}).str(), "tensor([], size=(2, 0))");
}

TEST(TensorPrintTest, EmptyShowsEveryNonDefaultDType) {
  // For an empty tensor PyTorch shows the dtype whenever it is not the default float dtype,
  // int64 and bool included: there are no elements to tell the dtype from.
  EXPECT_EQ(zeros({0}, kInt64).str(), "tensor([], dtype=int64)");
  EXPECT_EQ(zeros({0}, kBool).str(), "tensor([], dtype=bool)");
}

TEST(TensorPrintTest, NonDefaultDType) {
  EXPECT_EQ(from_vector<double>({1, 2}).str(), "tensor([1., 2.], dtype=float64)");
  EXPECT_EQ(from_vector<Half>({Half(1.0f), Half(2.0f)}).str(), "tensor([1., 2.], dtype=float16)");
  DefaultDTypeGuard guard;
  set_default_dtype(kFloat64);
  EXPECT_EQ(from_vector<double>({1, 2}).str(), "tensor([1., 2.])");
  EXPECT_EQ(from_vector<float>({1, 2}).str(), "tensor([1., 2.], dtype=float32)");
}

TEST(TensorPrintTest, Scientific) {
  EXPECT_EQ(from_vector<float>({1e-5f, 1e3f}).str(), "tensor([1.0000e-05, 1.0000e+03])");
  EXPECT_EQ(from_vector<float>({0.5f, 2e9f}).str(), "tensor([5.0000e-01, 2.0000e+09])");
}

TEST(TensorPrintTest, ScientificForIntegerValuedFloatsWithALargeRange) {
  // PyTorch's int mode switches to scientific when max / min > 1000, like the fixed mode.
  EXPECT_EQ(from_vector<float>({1, 10000}).str(), "tensor([1.0000e+00, 1.0000e+04])");
}

TEST(TensorPrintTest, NonFiniteValues) {
  EXPECT_EQ(from_vector<float>({0.5f, NAN, INFINITY}).str(), "tensor([0.5000,    nan,    inf])");
  EXPECT_EQ(from_vector<float>({NAN, INFINITY}).str(), "tensor([nan, inf])");
}

TEST(TensorPrintTest, NonFiniteValuesDoNotWidenIntegerMode) {
  // PyTorch sizes the columns from the finite values only.
  EXPECT_EQ(from_vector<float>({1, NAN, INFINITY}).str(), "tensor([1., nan, inf])");
}

TEST(TensorPrintTest, ThreeDims) {
  EXPECT_EQ(arange(8).view({2, 2, 2}).str(),
            "tensor([[[0, 1],\n"
            "         [2, 3]],\n"
            "\n"
            "        [[4, 5],\n"
            "         [6, 7]]])");
}

TEST(TensorPrintTest, NonContiguousPrintsLogicalOrder) {
  EXPECT_EQ(transpose(arange(4).view({2, 2}), 0, 1).str(), "tensor([[0, 2],\n        [1, 3]])");
}

TEST(TensorPrintTest, SummarizedRows) {
  EXPECT_EQ(arange(3000).view({1000, 3}).str(),
            "tensor([[   0,    1,    2],\n"
            "        [   3,    4,    5],\n"
            "        [   6,    7,    8],\n"
            "        ...,\n"
            "        [2991, 2992, 2993],\n"
            "        [2994, 2995, 2996],\n"
            "        [2997, 2998, 2999]])");
}

TEST(TensorPrintTest, SummarizedVector) {
  // The ellipsis is an element " ..." joined with ", ".
  EXPECT_EQ(arange(2000).str(), "tensor([   0,    1,    2,  ..., 1997, 1998, 1999])");
}

TEST(TensorPrintTest, LongVectorsWrapAtEightyColumns) {
  EXPECT_EQ(arange(30.0).str(),
            "tensor([ 0.,  1.,  2.,  3.,  4.,  5.,  6.,  7.,  8.,  9., 10., 11., 12., 13.,\n"
            "        14., 15., 16., 17., 18., 19., 20., 21., 22., 23., 24., 25., 26., 27.,\n"
            "        28., 29.])");
}

TEST(TensorPrintTest, MetaTensor) {
  EXPECT_EQ(empty({2, 3}, kFloat32, Device("meta")).str(),
            "tensor(..., device='meta', size=(2, 3))");
  EXPECT_EQ(empty({4}, kFloat64, Device("meta")).str(),
            "tensor(..., device='meta', size=(4,), dtype=float64)");
}

TEST(TensorPrintTest, UndefinedAndFmt) {
  EXPECT_EQ(Tensor().str(), "tensor(undefined)");
  EXPECT_EQ(fmt::format("{}", from_vector<int64_t>({5})), "tensor([5])");
}

}  // namespace
}  // namespace kiln

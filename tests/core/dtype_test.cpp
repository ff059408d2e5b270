// Tests for kiln/core/dtype.h, with libtorch as the oracle for promotion and casting.
#include "kiln/core/dtype.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <string>

#include "core/test_util.h"
#include "kiln/core/error.h"
#include "ops/torch_bridge.h"

namespace kiln {
namespace {

constexpr DType kAll[] = {kBool, kUInt8, kInt32, kInt64, kFloat16, kBFloat16, kFloat32, kFloat64};
static_assert(std::size(kAll) == kNumDTypes);

using test::to_aten;  // the one dtype mapping, shared with the op tests

// Restores the default dtype when a test ends, even if it fails.
struct DefaultDTypeGuard {
  DType saved = default_dtype();
  ~DefaultDTypeGuard() { set_default_dtype(saved); }
};

TEST(DTypeTest, ItemsizeMatchesTorch) {
  EXPECT_EQ(itemsize(kBool), 1u);
  EXPECT_EQ(itemsize(kUInt8), 1u);
  EXPECT_EQ(itemsize(kInt32), 4u);
  EXPECT_EQ(itemsize(kInt64), 8u);
  EXPECT_EQ(itemsize(kFloat16), 2u);
  EXPECT_EQ(itemsize(kBFloat16), 2u);
  EXPECT_EQ(itemsize(kFloat32), 4u);
  EXPECT_EQ(itemsize(kFloat64), 8u);
  for (DType t : kAll) EXPECT_EQ(itemsize(t), c10::elementSize(to_aten(t))) << name(t);
}

TEST(DTypeTest, ItemsizeMatchesCppTypes) {
  static_assert(itemsize(dtype_of<bool>::value) == sizeof(bool));
  static_assert(itemsize(dtype_of<uint8_t>::value) == sizeof(uint8_t));
  static_assert(itemsize(dtype_of<int32_t>::value) == sizeof(int32_t));
  static_assert(itemsize(dtype_of<int64_t>::value) == sizeof(int64_t));
  static_assert(itemsize(dtype_of<Half>::value) == sizeof(Half));
  static_assert(itemsize(dtype_of<BFloat16>::value) == sizeof(BFloat16));
  static_assert(itemsize(dtype_of<float>::value) == sizeof(float));
  static_assert(itemsize(dtype_of<double>::value) == sizeof(double));
  static_assert(std::is_same_v<acc_t<Half>, float>);
  static_assert(std::is_same_v<acc_t<BFloat16>, float>);
  static_assert(std::is_same_v<acc_t<int32_t>, int32_t>);
}

TEST(DTypeTest, Categories) {
  for (DType t : kAll) {
    bool floating = t == kFloat16 || t == kBFloat16 || t == kFloat32 || t == kFloat64;
    EXPECT_EQ(is_floating(t), floating) << name(t);
    EXPECT_EQ(is_floating(t), at::isFloatingType(to_aten(t))) << name(t);
    EXPECT_EQ(is_integral(t, /*include_bool=*/true), at::isIntegralType(to_aten(t), true))
        << name(t);
    EXPECT_EQ(is_integral(t, /*include_bool=*/false), at::isIntegralType(to_aten(t), false))
        << name(t);
  }
}

TEST(DTypeTest, Names) {
  EXPECT_EQ(name(kBool), "bool");
  EXPECT_EQ(name(kUInt8), "uint8");
  EXPECT_EQ(name(kInt32), "int32");
  EXPECT_EQ(name(kInt64), "int64");
  EXPECT_EQ(name(kFloat16), "float16");
  EXPECT_EQ(name(kBFloat16), "bfloat16");
  EXPECT_EQ(name(kFloat32), "float32");
  EXPECT_EQ(name(kFloat64), "float64");
  EXPECT_EQ(fmt::format("{}", kBFloat16), "bfloat16");
  EXPECT_EQ(fmt::format("[{:>9}]", kInt32), "[    int32]");  // format specs pass through
}

TEST(DTypeTest, NameParseRoundTrip) {
  for (DType t : kAll) EXPECT_EQ(parse_dtype(name(t)), t) << name(t);
}

TEST(DTypeTest, ParseAliases) {
  EXPECT_EQ(parse_dtype("float"), kFloat32);
  EXPECT_EQ(parse_dtype("f32"), kFloat32);
  EXPECT_EQ(parse_dtype("double"), kFloat64);
  EXPECT_EQ(parse_dtype("f64"), kFloat64);
  EXPECT_EQ(parse_dtype("half"), kFloat16);
  EXPECT_EQ(parse_dtype("f16"), kFloat16);
  EXPECT_EQ(parse_dtype("bf16"), kBFloat16);
  EXPECT_EQ(parse_dtype("long"), kInt64);
  EXPECT_EQ(parse_dtype("int"), kInt32);
}

TEST(DTypeTest, ParseRejectsBadStrings) {
  for (const char* bad : {"", "Float32", "FLOAT", "float128", "int8", "uint16", " float32",
                          "float32 ", "torch.float32", "f", "complex64", "float32\n"}) {
    EXPECT_THROW_PREFIX(parse_dtype(bad), ValueError, "[dtype]") << "input: '" << bad << "'";
  }
  // The message names the offending string.
  EXPECT_THROW_CONTAINS(parse_dtype("int8"), ValueError, "'int8'");
}

TEST(DTypeTest, PromoteTypesMatchesTorchOnAllPairs) {
  for (DType a : kAll) {
    for (DType b : kAll) {
      DType got = promote_types(a, b);
      at::ScalarType want = at::promote_types(to_aten(a), to_aten(b));
      EXPECT_EQ(to_aten(got), want) << "promote_types(" << name(a) << ", " << name(b)
                                    << ") = " << name(got) << ", torch says " << want;
    }
  }
}

TEST(DTypeTest, PromoteTypesIsSymmetric) {
  for (DType a : kAll)
    for (DType b : kAll) EXPECT_EQ(promote_types(a, b), promote_types(b, a));
}

TEST(DTypeTest, CanCastMatchesTorchOnAllPairs) {
  for (DType from : kAll) {
    for (DType to : kAll) {
      EXPECT_EQ(can_cast(from, to), at::canCast(to_aten(from), to_aten(to)))
          << "can_cast(" << name(from) << ", " << name(to) << ")";
    }
  }
}

TEST(DTypeTest, DefaultDTypeSetAndGet) {
  DefaultDTypeGuard guard;
  EXPECT_EQ(default_dtype(), kFloat32);
  set_default_dtype(kFloat64);
  EXPECT_EQ(default_dtype(), kFloat64);
  set_default_dtype(kFloat32);
  EXPECT_EQ(default_dtype(), kFloat32);
}

TEST(DTypeTest, DefaultDTypeRejectsNonFloat32Or64) {
  DefaultDTypeGuard guard;
  set_default_dtype(kFloat64);
  for (DType t : {kBool, kUInt8, kInt32, kInt64, kFloat16, kBFloat16}) {
    EXPECT_THROW_PREFIX(set_default_dtype(t), TypeError, "[set_default_dtype]") << name(t);
    EXPECT_EQ(default_dtype(), kFloat64) << "a rejected dtype must leave the default unchanged";
  }
}

TEST(DTypeTest, DispatchTypesBindsTheCppType) {
  for (DType t : kAll) {
    DType seen = KILN_DISPATCH_TYPES(t, "test", [&] { return dtype_of<scalar_t>::value; });
    EXPECT_EQ(seen, t);
  }
  EXPECT_THROW_PREFIX(KILN_DISPATCH_FLOAT_TYPES(kInt32, "myop", [&] { return sizeof(scalar_t); }),
                      TypeError, "[myop] expected a floating-point dtype, got int32");
}

}  // namespace
}  // namespace kiln

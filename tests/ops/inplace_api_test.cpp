// The public in-place API (kiln/ops/ops.h) is complete: every pointwise op of
// kiln/ops/op_list.h but `where` has `name_(self, ...)`, which writes the functional result into
// self and returns self. (The op table checks the in-place ops themselves against ATen; this
// checks the functions a user calls.)
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <map>
#include <set>
#include <string>

#include "kiln/ops/op_list.h"
#include "kiln/ops/ops.h"

namespace kiln {
namespace {

// `where_` writes into its bool condition, which no user means: it has no public form.
// where_ writes into its bool condition; isnan and isinf have no in-place form in PyTorch.
const std::set<std::string> kNoPublicInPlace = {"where", "isnan", "isinf"};
// Ops on bool and integer tensors only: the in-place test runs them on int64 copies.
const std::set<std::string> kIntegerOnly = {"bitwise_and", "bitwise_or", "bitwise_xor",
                                            "bitwise_not"};

struct Row {
  std::function<Tensor(const Tensor&, const Tensor&)> functional;
  std::function<Tensor&(Tensor&, const Tensor&)> inplace;
};

// Functional and public in-place forms of each pointwise op, with `other` as the second
// operand where there is one.
std::map<std::string, Row> make_rows() {
  using T = const Tensor&;
  std::map<std::string, Row> r;
#define KILN_UNARY_ROW(name) \
  r[#name] = {[](T a, T) { return name(a); }, [](Tensor& s, T) -> Tensor& { return name##_(s); }};
#define KILN_BINARY_ROW(name)                      \
  r[#name] = {[](T a, T b) { return name(a, b); }, \
              [](Tensor& s, T b) -> Tensor& { return name##_(s, b); }};
  KILN_FORALL_PUBLIC_UNARY(KILN_UNARY_ROW)
  KILN_BINARY_ROW(add)
  KILN_BINARY_ROW(sub)
  KILN_BINARY_ROW(mul)
  KILN_BINARY_ROW(div)
  KILN_BINARY_ROW(pow)
  KILN_BINARY_ROW(maximum)
  KILN_BINARY_ROW(minimum)
  KILN_BINARY_ROW(eq)
  KILN_BINARY_ROW(ne)
  KILN_BINARY_ROW(lt)
  KILN_BINARY_ROW(le)
  KILN_BINARY_ROW(gt)
  KILN_BINARY_ROW(ge)
  KILN_BINARY_ROW(logical_and)
  KILN_BINARY_ROW(logical_or)
  KILN_BINARY_ROW(logical_xor)
  KILN_BINARY_ROW(atan2)
  KILN_BINARY_ROW(fmod)
  KILN_BINARY_ROW(remainder)
  KILN_BINARY_ROW(bitwise_and)
  KILN_BINARY_ROW(bitwise_or)
  KILN_BINARY_ROW(bitwise_xor)
#undef KILN_UNARY_ROW
#undef KILN_BINARY_ROW
  r["gelu"] = {[](T a, T) { return gelu(a, true); },
               [](Tensor& s, T) -> Tensor& { return gelu_(s, true); }};
  r["bitwise_not"] = {[](T a, T) { return bitwise_not(a); },
                      [](Tensor& s, T) -> Tensor& { return bitwise_not_(s); }};
  r["div_trunc"] = {[](T a, T b) { return div(a, b, "trunc"); },
                    [](Tensor& s, T b) -> Tensor& { return div_(s, b, "trunc"); }};
  r["div_floor"] = {[](T a, T b) { return div(a, b, "floor"); },
                    [](Tensor& s, T b) -> Tensor& { return div_(s, b, "floor"); }};
  r["hardtanh"] = {[](T a, T) { return hardtanh(a, Scalar(0.75), Scalar(2.5)); },
                   [](Tensor& s, T) -> Tensor& { return hardtanh_(s, Scalar(0.75), Scalar(2.5)); }};
  r["leaky_relu"] = {[](T a, T) { return leaky_relu(a, Scalar(0.5)); },
                     [](Tensor& s, T) -> Tensor& { return leaky_relu_(s, Scalar(0.5)); }};
  r["elu"] = {[](T a, T) { return elu(a, Scalar(1.5), Scalar(0.5), Scalar(2)); },
              [](Tensor& s, T) -> Tensor& { return elu_(s, Scalar(1.5), Scalar(0.5), Scalar(2)); }};
  r["clamp"] = {[](T a, T) { return clamp(a, Scalar(0.5), Scalar(1.5)); },
                [](Tensor& s, T) -> Tensor& { return clamp_(s, Scalar(0.5), Scalar(1.5)); }};
  return r;
}
const std::map<std::string, Row>& rows() {
  static const std::map<std::string, Row> r = make_rows();
  return r;
}

TEST(InPlaceApiTest, EveryPointwiseOpHasAPublicInPlaceForm) {
  std::set<std::string> want;
#define KILN_NAME(name, ARGS, schema) want.insert(#name);
  KILN_FORALL_POINTWISE(KILN_NAME)
#undef KILN_NAME
  for (const std::string& n : kNoPublicInPlace) want.erase(n);
  std::set<std::string> have;
  for (const auto& [name, row] : rows()) have.insert(name);
  EXPECT_EQ(have, want);
}

TEST(InPlaceApiTest, WritesTheFunctionalResultIntoSelf) {
  // Positive values keep log, sqrt, rsqrt and pow finite.
  Tensor fa = from_vector<float>({0.5f, 1.0f, 2.0f, 3.0f}, {2, 2});
  Tensor fb = from_vector<float>({1.0f, 1.0f, 0.25f, 4.0f}, {2, 2});
  for (const auto& [name, row] : rows()) {
    SCOPED_TRACE(name);
    bool integral = kIntegerOnly.count(name) > 0;
    Tensor a = integral ? fa.to(kInt64) : fa, b = integral ? fb.to(kInt64) : fb;
    Tensor want = row.functional(a, b).to(kFloat32);
    Tensor self = a.clone();
    uint64_t version = self.version();
    Tensor& got = row.inplace(self, b);
    EXPECT_TRUE(got.is_same(self));
    EXPECT_GT(self.version(), version);
    // NaN where the input is outside the op's domain (acos(2)): equal when both are NaN.
    std::vector<float> got_v = self.to_vector<float>(), want_v = want.to_vector<float>();
    ASSERT_EQ(got_v.size(), want_v.size());
    for (size_t k = 0; k < got_v.size(); ++k)
      if (!(std::isnan(got_v[k]) && std::isnan(want_v[k]))) {
        EXPECT_EQ(got_v[k], want_v[k]) << k;
      }
  }
}

TEST(InPlaceApiTest, ScalarOperandsPromoteLikeTheFunctionalForm) {
  Tensor a = from_vector<float>({1.0f, 2.0f});
  Tensor s = a.clone();
  sub_(s, Scalar(0.5));
  EXPECT_EQ(s.to_vector<float>(), sub(a, Scalar(0.5)).to_vector<float>());
  Tensor p = a.clone();
  pow_(p, Scalar(2));
  EXPECT_EQ(p.to_vector<float>(), (std::vector<float>{1.0f, 4.0f}));
  Tensor c = a.clone();
  ge_(c, Scalar(1.5));
  EXPECT_EQ(c.to_vector<float>(), (std::vector<float>{0.0f, 1.0f}));
}

TEST(InPlaceApiTest, ResultThatCannotCastToSelfIsRefusedAndSelfIsKept) {
  Tensor i = from_vector<int64_t>({1, 2});
  EXPECT_THROW(exp_(i), TypeError);  // a float result into int64
  EXPECT_EQ(i.to_vector<int64_t>(), (std::vector<int64_t>{1, 2}));
}

}  // namespace
}  // namespace kiln

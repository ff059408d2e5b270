// Every op's schema string says what its C++ signature says: the same number of arguments, each
// of the schema type that its C++ type stands for, the same results, defaults that parse for
// their type, and one name per parameter (PyTorch generates one from the other; Kiln writes
// both in kiln/ops/op_list.h, so this test keeps them from drifting apart).
#include <gtest/gtest.h>

#include <algorithm>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "kiln/dispatch/schema.h"
#include "kiln/ops/op_list.h"

namespace kiln {
namespace {

// ---------------------------------------------------------------- C++ types -> schema types

// The schema spelling of a C++ argument type; "?" marks a type with no schema spelling.
template <class T>
struct SchemaType {
  static std::vector<std::string> names() { return {"?"}; }
};
#define KILN_SCHEMA_TYPE(T, ...)                                      \
  template <>                                                         \
  struct SchemaType<T> {                                              \
    static std::vector<std::string> names() { return {__VA_ARGS__}; } \
  };
// An undefined Tensor stands for None, so `const Tensor&` is either spelling.
KILN_SCHEMA_TYPE(const Tensor&, "Tensor", "Tensor?")
// An undefined element stands for None, so a list may be Tensor?[] (index's indices).
KILN_SCHEMA_TYPE(const TensorList&, "Tensor[]", "Tensor?[]")
KILN_SCHEMA_TYPE(const Scalar&, "Scalar")
KILN_SCHEMA_TYPE(const OptScalar&, "Scalar?")
KILN_SCHEMA_TYPE(IntArrayRef, "int[]")
KILN_SCHEMA_TYPE(int64_t, "int")
KILN_SCHEMA_TYPE(const OptInt&, "int?")
KILN_SCHEMA_TYPE(bool, "bool")
KILN_SCHEMA_TYPE(double, "float")
KILN_SCHEMA_TYPE(const OptDouble&, "float?")
KILN_SCHEMA_TYPE(DType, "DType")
KILN_SCHEMA_TYPE(const OptDType&, "DType?")
KILN_SCHEMA_TYPE(Device, "Device")
KILN_SCHEMA_TYPE(Generator*, "Generator?")
#undef KILN_SCHEMA_TYPE

// The schema's result types for a C++ return type.
template <class R>
std::vector<std::string> result_types();
template <>
std::vector<std::string> result_types<void>() {
  return {};
}
template <>
std::vector<std::string> result_types<Tensor>() {
  return {"Tensor"};
}
template <>
std::vector<std::string> result_types<TensorPair>() {
  return {"Tensor", "Tensor"};
}
template <>
std::vector<std::string> result_types<TensorTriple>() {
  return {"Tensor", "Tensor", "Tensor"};
}
template <>
std::vector<std::string> result_types<TensorQuad>() {
  return {"Tensor", "Tensor", "Tensor", "Tensor"};
}
template <>
std::vector<std::string> result_types<TensorList>() {
  return {"Tensor[]"};
}

// The parser is kiln/dispatch/schema.h's.
using Param = SchemaParam;
using Parsed = Schema;
Parsed parse(std::string_view schema) { return parse_schema(schema); }
bool default_fits(const std::string& type, const std::string& value) {
  return schema_default_fits(type, value);
}

// ---------------------------------------------------------------- the check

std::set<const OpDef*>& checked() {
  static std::set<const OpDef*> s;
  return s;
}

template <class R, class... A>
void check(const TypedOp<R(A...)>& typed) {
  const OpDef& op = typed.def;
  checked().insert(&op);
  SCOPED_TRACE(std::string(op.name()) + ": " + std::string(op.schema()));
  Parsed p = parse(op.schema());

  // The schema names the op, or for a pointwise op's in-place and out= forms its functional
  // form (Note [Op variants]).
  const OpDef* functional = op.functional_variant();
  std::string_view expected_name = functional ? functional->name() : op.name();
  EXPECT_EQ(p.name, expected_name);
  EXPECT_EQ(p.out_form, op.kind() == OpKind::Out);

  // An out= form's first C++ argument is `out`, which the schema leaves implicit.
  std::vector<std::vector<std::string>> want = {SchemaType<A>::names()...};
  if (op.kind() == OpKind::Out) {
    ASSERT_FALSE(want.empty());
    EXPECT_EQ(want.front(), SchemaType<const Tensor&>::names()) << "out is not a Tensor";
    want.erase(want.begin());
  }
  ASSERT_EQ(p.params.size(), want.size()) << "argument count differs from the C++ signature";
  std::set<std::string> names;
  bool seen_default = false;
  for (size_t i = 0; i < want.size(); ++i) {
    const Param& param = p.params[i];
    SCOPED_TRACE("argument " + std::to_string(i) + " '" + param.name + "'");
    EXPECT_NE(std::find(want[i].begin(), want[i].end(), param.type), want[i].end())
        << "schema type " << param.type << ", C++ type spelled " << want[i].front();
    EXPECT_FALSE(param.name.empty()) << "unnamed argument";
    EXPECT_TRUE(names.insert(param.name).second) << "two arguments named " << param.name;
    if (!param.default_value.empty()) {
      seen_default = true;
      EXPECT_TRUE(default_fits(param.type, param.default_value))
          << "default " << param.default_value << " does not fit " << param.type;
    } else {
      EXPECT_FALSE(seen_default) << "an argument without a default after one with a default";
    }
  }

  std::vector<std::string> results;
  for (const Param& r : p.results) results.push_back(r.type);
  if (op.kind() == OpKind::InPlace || op.kind() == OpKind::Out)
    EXPECT_TRUE(results.empty()) << "in-place and out= forms return nothing";
  else
    EXPECT_EQ(results, result_types<R>());
}

TEST(OpSchemaTest, EverySchemaMatchesItsSignature) {
#define KILN_CHECK_POINTWISE(name, ARGS, schema) \
  check(ops::op_##name);                         \
  check(ops::op_##name##_);                      \
  check(ops::op_##name##_out);
#define KILN_CHECK_STRUCTURED(name, ARGS, schema) \
  check(ops::op_##name);                          \
  check(ops::op_##name##_out);
#define KILN_CHECK_OTHER(name, kind, sig, schema) check(ops::op_##name);
  KILN_FORALL_POINTWISE(KILN_CHECK_POINTWISE)
  KILN_FORALL_STRUCTURED(KILN_CHECK_STRUCTURED)
  KILN_FORALL_OTHER_OPS(KILN_CHECK_OTHER)
#undef KILN_CHECK_POINTWISE
#undef KILN_CHECK_STRUCTURED
#undef KILN_CHECK_OTHER
  for (const OpDef* op : ops::all_ops())
    EXPECT_TRUE(checked().count(op)) << op->name() << " was not checked";
}

// The parser itself, on schemas written to fail each check.
TEST(OpSchemaTest, ParserReadsTypesNamesDefaultsAndResults) {
  Parsed p = parse("out=foo(Tensor(a!)[] self, int? dim=None, float eps=1e-5) -> ()");
  EXPECT_TRUE(p.out_form);
  EXPECT_EQ(p.name, "foo");
  ASSERT_EQ(p.params.size(), 3u);
  EXPECT_EQ(p.params[0].type, "Tensor[]");
  EXPECT_EQ(p.params[0].name, "self");
  EXPECT_EQ(p.params[1].type, "int?");
  EXPECT_EQ(p.params[1].default_value, "None");
  EXPECT_EQ(p.params[2].default_value, "1e-5");
  EXPECT_TRUE(p.results.empty());

  Parsed q = parse("bar(Tensor x) -> (Tensor values, Tensor indices)");
  ASSERT_EQ(q.results.size(), 2u);
  EXPECT_EQ(q.results[1].name, "indices");
  EXPECT_EQ(parse("baz() -> Tensor").params.size(), 0u);
}

TEST(OpSchemaTest, DefaultsMustFitTheirType) {
  EXPECT_TRUE(default_fits("bool", "False"));
  EXPECT_FALSE(default_fits("bool", "false"));
  EXPECT_TRUE(default_fits("int", "-100"));
  EXPECT_FALSE(default_fits("int", "1.5"));
  EXPECT_TRUE(default_fits("float", "1e-5"));
  EXPECT_TRUE(default_fits("int[]", "[]"));
  EXPECT_TRUE(default_fits("Scalar?", "None"));
  EXPECT_FALSE(default_fits("Scalar", "None"));
  EXPECT_TRUE(default_fits("Scalar", "1"));
}

}  // namespace
}  // namespace kiln

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

// ---------------------------------------------------------------- parsing a schema

struct Param {
  std::string type;  // alias annotations removed: "Tensor(a!)[]" -> "Tensor[]"
  std::string name;
  std::string default_value;  // empty when there is none
};
struct Parsed {
  bool out_form = false;  // "out=name(...)"
  std::string name;
  std::vector<Param> params;
  std::vector<Param> results;  // names may be empty
};

std::string trim(std::string_view s) {
  while (!s.empty() && s.front() == ' ') s.remove_prefix(1);
  while (!s.empty() && s.back() == ' ') s.remove_suffix(1);
  return std::string(s);
}

// Splits at top-level commas (not inside parentheses or brackets).
std::vector<std::string> split_top(std::string_view s) {
  std::vector<std::string> parts;
  int depth = 0;
  size_t start = 0;
  for (size_t i = 0; i < s.size(); ++i) {
    char c = s[i];
    if (c == '(' || c == '[') ++depth;
    if (c == ')' || c == ']') --depth;
    if (c == ',' && depth == 0) {
      parts.push_back(trim(s.substr(start, i - start)));
      start = i + 1;
    }
  }
  std::string last = trim(s.substr(start));
  if (!last.empty() || !parts.empty()) parts.push_back(last);
  return parts;
}

// "Tensor(a!)[] self=..." -> {Tensor[], self, ...}
Param parse_param(const std::string& text) {
  Param p;
  std::string decl = text;
  if (size_t eq = text.find('='); eq != std::string::npos) {
    decl = trim(std::string_view(text).substr(0, eq));
    p.default_value = trim(std::string_view(text).substr(eq + 1));
  }
  size_t space = decl.rfind(' ');
  std::string type = space == std::string::npos ? decl : decl.substr(0, space);
  p.name = space == std::string::npos ? "" : decl.substr(space + 1);
  for (size_t open; (open = type.find('(')) != std::string::npos;)
    type.erase(open, type.find(')', open) - open + 1);
  p.type = type;
  return p;
}

Parsed parse(std::string_view schema) {
  Parsed r;
  if (schema.starts_with("out=")) {
    r.out_form = true;
    schema.remove_prefix(4);
  }
  size_t open = schema.find('(');
  size_t arrow = schema.rfind(" -> ");
  if (open == std::string_view::npos || arrow == std::string_view::npos) {
    r.name = "<no '(' or no ' -> ' in the schema>";
    return r;
  }
  size_t close = schema.rfind(')', arrow);
  r.name = std::string(schema.substr(0, open));
  for (const std::string& a : split_top(schema.substr(open + 1, close - open - 1)))
    r.params.push_back(parse_param(a));
  std::string ret = trim(schema.substr(arrow + 4));
  if (ret == "()") return r;
  if (ret.front() == '(') ret = ret.substr(1, ret.size() - 2);
  for (const std::string& a : split_top(ret)) r.results.push_back(parse_param(a));
  return r;
}

// Whether `value` is a default the schema type can hold.
bool default_fits(const std::string& type, const std::string& value) {
  if (value == "None") return type.ends_with("?");
  std::string base = type.ends_with("?") ? type.substr(0, type.size() - 1) : type;
  auto is_number = [](const std::string& v, bool integral) {
    if (v.empty()) return false;
    size_t used = 0;
    try {
      if (integral)
        (void)std::stoll(v, &used);
      else
        (void)std::stod(v, &used);
    } catch (...) {
      return false;
    }
    return used == v.size();
  };
  if (base == "bool") return value == "True" || value == "False";
  if (base == "int") return is_number(value, true);
  if (base == "float" || base == "Scalar") return is_number(value, false);
  if (base == "int[]") return value.front() == '[' && value.back() == ']';
  return false;
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

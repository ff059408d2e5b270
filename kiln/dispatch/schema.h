#pragma once
// An op's schema string, parsed: "name(Type arg=default, ...) -> (Type result, ...)".
//
// The op list (kiln/ops/op_list.h) writes each op's schema beside its C++ signature;
// tests/ops/op_schema_test.cpp keeps the two in step, and the Python module
// (python/src/op_bindings.cpp) reads its argument names, types and defaults from here.
#include <string>
#include <string_view>
#include <vector>

namespace kiln {

struct SchemaParam {
  std::string type;           // alias annotations removed: "Tensor(a!)[]" -> "Tensor[]"
  std::string name;           // empty for an unnamed result
  std::string default_value;  // as written ("None", "1e-5", "[]"); empty when there is none
  bool has_default() const { return !default_value.empty(); }
  // "int?" -> true: None is a value of the type.
  bool optional() const { return type.ends_with("?"); }
  // The type without its trailing "?": "int?" -> "int", "Tensor?[]" stays "Tensor?[]".
  std::string_view base_type() const;
};

struct Schema {
  bool out_form = false;  // "out=name(...)": the op writes into an implicit first `out`
  std::string name;
  std::vector<SchemaParam> params;
  std::vector<SchemaParam> results;
};

// Parses `schema`; a string without "(" or " -> " gives a name saying so and no params.
Schema parse_schema(std::string_view schema);

// Whether `value` is a default that the schema type `type` can hold ("None" only for "T?").
bool schema_default_fits(std::string_view type, std::string_view value);

}  // namespace kiln

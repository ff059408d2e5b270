#include "kiln/dispatch/schema.h"

#include <cstdlib>

namespace kiln {
namespace {

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
SchemaParam parse_param(std::string_view text) {
  SchemaParam p;
  std::string decl(text);
  if (size_t eq = text.find('='); eq != std::string_view::npos) {
    decl = trim(text.substr(0, eq));
    p.default_value = trim(text.substr(eq + 1));
  }
  size_t space = decl.rfind(' ');
  std::string type = space == std::string::npos ? decl : decl.substr(0, space);
  p.name = space == std::string::npos ? "" : decl.substr(space + 1);
  for (size_t open; (open = type.find('(')) != std::string::npos;)
    type.erase(open, type.find(')', open) - open + 1);
  p.type = type;
  return p;
}

bool is_number(std::string_view v, bool integral) {
  if (v.empty()) return false;
  std::string s(v);
  char* end = nullptr;
  if (integral)
    (void)std::strtoll(s.c_str(), &end, 10);
  else
    (void)std::strtod(s.c_str(), &end);
  return end == s.c_str() + s.size();
}

}  // namespace

std::string_view SchemaParam::base_type() const {
  std::string_view t = type;
  if (t.ends_with("?")) t.remove_suffix(1);
  return t;
}

Schema parse_schema(std::string_view schema) {
  Schema r;
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

bool schema_default_fits(std::string_view type, std::string_view value) {
  if (value == "None") return type.ends_with("?");
  std::string_view base = type.ends_with("?") ? type.substr(0, type.size() - 1) : type;
  if (base == "bool") return value == "True" || value == "False";
  if (base == "int") return is_number(value, true);
  if (base == "float" || base == "Scalar") return is_number(value, false);
  if (base == "int[]") return value.front() == '[' && value.back() == ']';
  return false;
}

}  // namespace kiln

#include "op_bindings.h"

#include <algorithm>
#include <memory>

#include "kiln/core/error.h"
#include "kiln/core/generator.h"
#include "kiln/dispatch/schema.h"
#include "kiln/ops/op_list.h"

namespace kiln::python {
namespace {

// Note [Calling an op from Python]
// Each exposed op gets one OpBinding, made once at import from its schema: per parameter a
// kind, its name and its default already converted to an IValue. A call fills a Stack in
// schema order (positional, then keywords, then defaults), runs OpDef::call_boxed with the GIL
// released, and turns the results into a Tensor, a tuple or a list. Python adds three things
// the C++ signatures do not have:
//   - a number where a Tensor is expected becomes a wrapped number (promotes as in PyTorch);
//   - a factory's `dtype` and `device` without a default take the default dtype and device;
//   - `out=` runs the op's out= form (Note [Op variants]), and an int[] parameter that is the
//     last required one takes the rest of the positional ints (t.view(2, 3), t.permute(1, 0)).
enum class Kind {
  Tensor,
  OptTensor,
  TensorList,
  OptTensorList,
  Scalar,
  OptScalar,
  Int,
  OptInt,
  Float,
  OptFloat,
  Bool,
  IntList,
  DType,
  OptDType,
  Device,
  OptGenerator,
};

Kind kind_of(const SchemaParam& p) {
  static const std::pair<std::string_view, Kind> table[] = {
      {"Tensor", Kind::Tensor},
      {"Tensor?", Kind::OptTensor},
      {"Tensor[]", Kind::TensorList},
      {"Tensor?[]", Kind::OptTensorList},
      {"Scalar", Kind::Scalar},
      {"Scalar?", Kind::OptScalar},
      {"int", Kind::Int},
      {"int?", Kind::OptInt},
      {"float", Kind::Float},
      {"float?", Kind::OptFloat},
      {"bool", Kind::Bool},
      {"int[]", Kind::IntList},
      {"DType", Kind::DType},
      {"DType?", Kind::OptDType},
      {"Device", Kind::Device},
      {"Generator?", Kind::OptGenerator},
  };
  for (const auto& [name, kind] : table)
    if (p.type == name) return kind;
  throw InternalError(fmt::format("[python] bug: schema type '{}' of argument '{}' has no binding",
                                  p.type, p.name));
}

struct Param {
  Kind kind = Kind::Tensor;
  std::string name;
  bool has_default = false;
  IValue default_value;
};

struct OpBinding {
  const OpDef* op = nullptr;
  const OpDef* out_op = nullptr;  // the out= form, or null
  std::string name;
  std::vector<Param> params;
  int self_index = -1;        // the parameter a method binds its Tensor to
  int packed_ints = -1;       // the int[] parameter that may take the remaining positional ints
  bool returns_self = false;  // in place: returns its first argument, as PyTorch does
};

IValue parse_default(const Param& p, const std::string& text) {
  if (text == "None") return IValue{};
  switch (p.kind) {
    case Kind::Bool:
      return text == "True";
    case Kind::Int:
    case Kind::OptInt:
      return static_cast<int64_t>(std::stoll(text));
    case Kind::Float:
    case Kind::OptFloat:
      return std::stod(text);
    case Kind::Scalar:
    case Kind::OptScalar:
      return text.find_first_of(".eE") == std::string::npos ? Scalar(std::stoll(text))
                                                            : Scalar(std::stod(text));
    case Kind::IntList: {
      Shape s;
      std::string inner = text.substr(1, text.size() - 2);
      for (size_t start = 0; start < inner.size();) {
        size_t comma = inner.find(',', start);
        s.push_back(std::stoll(inner.substr(start, comma - start)));
        start = comma == std::string::npos ? inner.size() : comma + 1;
      }
      return s;
    }
    default:
      throw InternalError(
          fmt::format("[python] bug: default '{}' of '{}' cannot be read", text, p.name));
  }
}

OpBinding make_binding(const OpDef& op) {
  Schema s = parse_schema(op.schema());
  OpBinding b;
  b.op = &op;
  b.out_op = op.out_variant();
  b.name = std::string(op.name());
  int last_required = -1;
  for (const SchemaParam& sp : s.params) {
    Param p;
    p.kind = kind_of(sp);
    p.name = sp.name;
    if (sp.has_default()) {
      p.has_default = true;
      p.default_value = parse_default(p, sp.default_value);
    } else if (op.kind() == OpKind::Factory && (p.kind == Kind::DType || p.kind == Kind::Device)) {
      p.has_default = true;  // filled at call time: the default dtype and device may change
    } else {
      last_required = static_cast<int>(b.params.size());
    }
    b.params.push_back(std::move(p));
  }
  for (size_t i = 0; i < b.params.size(); ++i) {
    const Param& p = b.params[i];
    bool tensor = p.kind == Kind::Tensor || p.kind == Kind::OptTensor;
    if (b.self_index < 0 && tensor && (p.name == "self" || p.name == "input"))
      b.self_index = int(i);
  }
  if (b.self_index < 0)
    for (size_t i = 0; i < b.params.size(); ++i)
      if (b.params[i].kind == Kind::Tensor) {
        b.self_index = static_cast<int>(i);
        break;
      }
  b.returns_self =
      op.kind() == OpKind::InPlace && !b.params.empty() && b.params.front().kind == Kind::Tensor;
  if (last_required >= 0 && b.params[size_t(last_required)].kind == Kind::IntList)
    b.packed_ints = last_required;
  return b;
}

std::string type_name(py::handle v) {
  return py::str(py::type::handle_of(v).attr("__name__")).cast<std::string>();
}

[[noreturn]] void wrong_type(const OpBinding& b, const Param& p, const char* want, py::handle v) {
  throw TypeError(
      fmt::format("[{}] argument '{}' must be {}, got {}", b.name, p.name, want, type_name(v)));
}

TensorList to_tensor_list(const OpBinding& b, const Param& p, py::handle v, bool allow_none) {
  if (!py::isinstance<py::sequence>(v) || py::isinstance<py::str>(v) || py::isinstance<Tensor>(v))
    wrong_type(b, p, "a sequence of Tensors", v);
  TensorList out;
  for (py::handle e : v.cast<py::sequence>()) {
    if (allow_none && e.is_none())
      out.emplace_back();
    else if (py::isinstance<Tensor>(e))
      out.push_back(e.cast<Tensor>());
    else
      wrong_type(b, p, allow_none ? "a sequence of Tensors or None" : "a sequence of Tensors", e);
  }
  return out;
}

IValue convert(const OpBinding& b, const Param& p, py::handle v) {
  bool none = v.is_none();
  switch (p.kind) {
    case Kind::OptTensor:
      if (none) return Tensor();
      [[fallthrough]];
    case Kind::Tensor:
      if (py::isinstance<Tensor>(v)) return v.cast<Tensor>();
      if (is_number(v)) return wrapped_number(to_scalar(v, b.name.c_str()));
      wrong_type(b, p, "a Tensor or a number", v);
    case Kind::TensorList:
      return to_tensor_list(b, p, v, false);
    case Kind::OptTensorList:
      return to_tensor_list(b, p, v, true);
    case Kind::OptScalar:
      if (none) return IValue{};
      [[fallthrough]];
    case Kind::Scalar:
      if (!is_number(v) && !py::isinstance<Tensor>(v)) wrong_type(b, p, "a number", v);
      return to_scalar(v, b.name.c_str());
    case Kind::OptInt:
      if (none) return IValue{};
      [[fallthrough]];
    case Kind::Int:
      if (py::isinstance<py::bool_>(v) || !py::hasattr(v, "__index__"))
        wrong_type(b, p, "an int", v);
      return py::int_(py::reinterpret_borrow<py::object>(v)).cast<int64_t>();
    case Kind::OptFloat:
      if (none) return IValue{};
      [[fallthrough]];
    case Kind::Float:
      if (!is_number(v) || py::isinstance<py::bool_>(v)) wrong_type(b, p, "a float", v);
      return py::float_(py::reinterpret_borrow<py::object>(v)).cast<double>();
    case Kind::Bool:
      if (!py::isinstance<py::bool_>(v)) wrong_type(b, p, "a bool", v);
      return v.cast<bool>();
    case Kind::IntList:
      return to_shape(v, b.name.c_str());
    case Kind::OptDType:
      if (none) return IValue{};
      [[fallthrough]];
    case Kind::DType:
      if (none) return default_dtype();  // a factory's dtype=None
      if (!py::isinstance<DType>(v)) wrong_type(b, p, "a kiln.dtype", v);
      return v.cast<DType>();
    case Kind::Device:
      if (none) return default_device();
      if (!py::isinstance<Device>(v) && !py::isinstance<py::str>(v))
        wrong_type(b, p, "a kiln.device or a string", v);
      return to_device(v);
    case Kind::OptGenerator:
      if (none) return static_cast<Generator*>(nullptr);
      if (!py::isinstance<Generator>(v)) wrong_type(b, p, "a kiln.Generator or None", v);
      return v.cast<Generator*>();
  }
  throw InternalError("[python] bug: unhandled parameter kind");
}

py::object results_to_python(const OpBinding& b, Stack& stack, const Stack& args) {
  if (b.returns_self) return py::cast(std::get<Tensor>(args.front()));
  if (stack.empty()) return py::none();
  auto one = [](IValue& v) -> py::object {
    if (auto* t = std::get_if<Tensor>(&v)) return py::cast(std::move(*t));
    if (auto* l = std::get_if<TensorList>(&v)) return py::cast(std::move(*l));
    throw InternalError("[python] bug: an op returned something other than tensors");
  };
  if (stack.size() == 1) return one(stack[0]);
  py::tuple out(stack.size());
  for (size_t i = 0; i < stack.size(); ++i) out[i] = one(stack[i]);
  return out;
}

// Runs `b` on Python arguments; `self` (a method's tensor) fills b.self_index.
py::object call(const OpBinding& b, py::args args, py::kwargs kwargs, py::handle self) {
  const size_t n = b.params.size();
  std::vector<py::handle> given(n);
  py::handle out;
  size_t next = 0;
  auto skip_self = [&] {
    if (self && next == size_t(b.self_index)) ++next;
  };
  if (self) given[size_t(b.self_index)] = self;
  const size_t nargs = args.size();
  std::unique_ptr<py::tuple> packed;
  for (size_t i = 0; i < nargs; ++i) {
    skip_self();
    if (next >= n)
      throw TypeError(
          fmt::format("[{}] takes {} arguments, got {}", b.name, n - (self ? 1 : 0), nargs));
    if (int(next) == b.packed_ints && py::isinstance<py::int_>(args[i]) && i + 1 < nargs) {
      // t.view(2, 3): the rest of the positional ints are the list.
      packed = std::make_unique<py::tuple>(nargs - i);
      for (size_t j = i; j < nargs; ++j) (*packed)[j - i] = args[j];
      given[next++] = *packed;
      break;
    }
    given[next++] = args[i];
  }
  for (auto [key, value] : kwargs) {
    std::string k = key.cast<std::string>();
    if (k == "out" && b.out_op) {
      out = value;
      continue;
    }
    auto it =
        std::find_if(b.params.begin(), b.params.end(), [&](const Param& p) { return p.name == k; });
    if (it == b.params.end())
      throw TypeError(fmt::format("[{}] got an unexpected keyword argument '{}'", b.name, k));
    size_t i = size_t(it - b.params.begin());
    if (given[i])
      throw TypeError(fmt::format("[{}] got multiple values for argument '{}'", b.name, k));
    given[i] = value;
  }
  Stack stack;
  stack.reserve(n + 1);
  if (out) {
    if (!py::isinstance<Tensor>(out))
      throw TypeError(fmt::format("[{}] out= must be a Tensor, got {}", b.name, type_name(out)));
    stack.emplace_back(out.cast<Tensor>());
  }
  for (size_t i = 0; i < n; ++i) {
    const Param& p = b.params[i];
    if (given[i]) {
      stack.push_back(convert(b, p, given[i]));
    } else if (!p.has_default) {
      throw TypeError(
          fmt::format("[{}] missing required argument '{}' ({})", b.name, p.name, b.op->schema()));
    } else if (p.kind == Kind::DType && std::holds_alternative<std::monostate>(p.default_value)) {
      stack.emplace_back(default_dtype());
    } else if (p.kind == Kind::Device) {
      stack.emplace_back(default_device());
    } else {
      stack.push_back(p.default_value);
    }
  }
  const OpDef* op = out ? b.out_op : b.op;
  Stack args_kept;
  if (b.returns_self || out) args_kept.push_back(stack.front());
  {
    py::gil_scoped_release nogil;
    op->call_boxed(stack);
  }
  if (out) return py::cast(std::get<Tensor>(args_kept.front()));
  return results_to_python(b, stack, args_kept);
}

std::string signature_of(const OpBinding& b, bool method) {
  Schema s = parse_schema(b.op->schema());
  std::string text;
  for (size_t i = 0; i < s.params.size(); ++i) {
    if (method && int(i) == b.self_index) continue;
    if (!text.empty()) text += ", ";
    text += s.params[i].type + " " + s.params[i].name;
    if (s.params[i].has_default()) text += "=" + s.params[i].default_value;
  }
  return text;
}

bool exposed(const OpDef& op, bool method) {
  PythonExposure e = op.python_exposure();
  if (op.kind() == OpKind::Out) return false;  // reached through out=
  return method ? e == PythonExposure::FunctionAndMethod
                : e == PythonExposure::FunctionAndMethod || e == PythonExposure::Function;
}

std::vector<std::shared_ptr<const OpBinding>>& bindings() {
  static std::vector<std::shared_ptr<const OpBinding>> all = [] {
    std::vector<std::shared_ptr<const OpBinding>> v;
    for (const OpDef* op : ops::all_ops())
      if (exposed(*op, false)) v.push_back(std::make_shared<const OpBinding>(make_binding(*op)));
    return v;
  }();
  return all;
}

}  // namespace

void bind_ops(py::module_& m, py::handle tensor_class, const std::vector<std::string>& skip) {
  for (const auto& b : bindings()) {
    if (std::ranges::find(skip, b->name) != skip.end()) continue;
    std::string doc =
        fmt::format("{}\n\nKiln op `{}` (kiln/ops/op_list.h).", b->op->schema(), b->name);
    m.def(
        b->name.c_str(),
        [b](py::args args, py::kwargs kwargs) { return call(*b, args, kwargs, py::handle()); },
        doc.c_str());
    if (exposed(*b->op, true) && b->self_index >= 0 &&
        !py::hasattr(tensor_class, b->name.c_str())) {
      py::cpp_function method([b](py::handle self, py::args args,
                                  py::kwargs kwargs) { return call(*b, args, kwargs, self); },
                              py::name(b->name.c_str()), py::is_method(tensor_class),
                              py::sibling(py::getattr(tensor_class, b->name.c_str(), py::none())),
                              doc.c_str());
      tensor_class.attr(b->name.c_str()) = method;
    }
  }
}

std::vector<std::string> op_stub_lines(bool methods) {
  std::vector<std::string> lines;
  for (const auto& b : bindings()) {
    if (methods && !exposed(*b->op, true)) continue;
    std::string sig = signature_of(*b, methods);
    lines.push_back(fmt::format("{}|{}|{}", b->name, sig, b->op->schema()));
  }
  return lines;
}

}  // namespace kiln::python

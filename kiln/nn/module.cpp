#include "kiln/nn/module.h"

#include <cxxabi.h>

#include <cstdlib>
#include <set>
#include <typeinfo>

#include "kiln/autograd/grad_mode.h"
#include "kiln/core/error.h"
#include "kiln/dtensor/dtensor.h"
#include "kiln/ops/ops.h"

namespace kiln::nn {

template <class F>
void Module::visit(const std::string& prefix, bool params, F&& f) const {
  for (const auto& [name, t] : params ? params_ : buffers_) f(prefix + name, *t);
  for (const auto& [name, child] : children_) child->visit(prefix + name + ".", params, f);
}

NamedTensors Module::named_parameters() const {
  NamedTensors out;
  visit("", true, [&](const std::string& n, const Tensor& t) { out.emplace_back(n, t); });
  return out;
}
TensorList Module::parameters() const {
  TensorList out;
  visit("", true, [&](const std::string&, const Tensor& t) { out.push_back(t); });
  return out;
}
NamedTensors Module::named_buffers() const {
  NamedTensors out;
  visit("", false, [&](const std::string& n, const Tensor& t) { out.emplace_back(n, t); });
  return out;
}
NamedTensors Module::state_dict() const {
  NamedTensors out;
  auto add = [&](const std::string& n, const Tensor& t) { out.emplace_back(n, t.detach()); };
  visit("", true, add);
  visit("", false, add);
  return out;
}
int64_t Module::num_parameters() const {
  int64_t n = 0;
  visit("", true, [&](const std::string&, const Tensor& t) { n += t.numel(); });
  return n;
}

void Module::load_state_dict(const NamedTensors& state, bool strict) {
  std::vector<std::pair<std::string, Tensor>> mine = named_parameters();
  for (auto& b : named_buffers()) mine.push_back(b);
  std::set<std::string> given, seen;
  for (const auto& [name, t] : state) {
    KILN_CHECK(given.insert(name).second, "[load_state_dict] duplicate entry {}", name);
    KILN_CHECK(t.defined(), "[load_state_dict] entry {} is undefined", name);
  }
  std::vector<std::string> missing, unexpected, mismatched;
  std::vector<std::pair<Tensor, Tensor>> copies;
  for (const auto& entry : mine) {
    const std::string& name = entry.first;
    const Tensor& dst = entry.second;
    seen.insert(name);
    auto it =
        std::find_if(state.begin(), state.end(), [&](const auto& e) { return e.first == name; });
    if (it == state.end()) {
      missing.push_back(name);
      continue;
    }
    if (it->second.sizes() != dst.sizes()) {
      mismatched.push_back(fmt::format("{}: checkpoint has [{}], model has [{}]", name,
                                       fmt::join(it->second.sizes(), ", "),
                                       fmt::join(dst.sizes(), ", ")));
      continue;
    }
    copies.emplace_back(dst, it->second);
  }
  for (const auto& [name, t] : state)
    if (!seen.count(name)) unexpected.push_back(name);
  KILN_CHECK(mismatched.empty(), "[load_state_dict] size mismatch for {}",
             fmt::join(mismatched, "; "));
  KILN_CHECK(!strict || (missing.empty() && unexpected.empty()),
             "[load_state_dict] missing keys: [{}]; unexpected keys: [{}]",
             fmt::join(missing, ", "), fmt::join(unexpected, ", "));
  for (auto& [dst, src] : copies) dtensor::copy_whole_into(dst, src);  // a DTensor: its piece
}

Module::~Module() { training_->release(); }

void Module::train(bool on) {
  training_->set(on);
  for (auto& [name, child] : children_) child->train(on);
}

void Module::set_child_path(Module& child, const std::string& name) const {
  child.set_path(path_.empty() ? name : path_ + "." + name);
}
void Module::set_path(std::string path) {
  path_ = std::move(path);
  for (auto& [name, child] : children_) set_child_path(*child, name);
}

std::string Module::type_name() const {
  const char* mangled = typeid(*this).name();
  int status = 0;
  char* demangled = abi::__cxa_demangle(mangled, nullptr, nullptr, &status);
  std::string full = status == 0 && demangled ? demangled : mangled;
  std::free(demangled);
  // "kiln::nn::Dropout" -> "Dropout"; a template's arguments keep their namespaces.
  const size_t end = full.find('<');
  const size_t colons = full.rfind("::", end);
  return colons == std::string::npos ? full : full.substr(colons + 2);
}

// "module 'h.0.drop' (Dropout) training flag", or "module Dropout training flag" for a module
// registered nowhere.
std::string Module::describe_training(const void* module) {
  const Module& m = *static_cast<const Module*>(module);
  if (m.path_.empty()) return fmt::format("module {} training flag", m.type_name());
  return fmt::format("module '{}' ({}) training flag", m.path_, m.type_name());
}

void Module::apply_to_tensors(Tensor (*fn)(const Tensor&, const void*), const void* arg) {
  autograd::NoGradGuard no_grad;
  for (auto& [name, p] : params_) {
    *p = fn(*p, arg);
    p->requires_grad_();
  }
  for (auto& [name, b] : buffers_) *b = fn(*b, arg);
  for (auto& [name, child] : children_) child->apply_to_tensors(fn, arg);
}
void Module::to(Device device) {
  apply_to_tensors(
      [](const Tensor& t, const void* d) {
        return t.detach().to(*static_cast<const Device*>(d)).detach();
      },
      &device);
}
void Module::to(DType dtype) {
  apply_to_tensors(
      [](const Tensor& t, const void* d) {
        DType to = *static_cast<const DType*>(d);
        return is_floating(t.dtype()) ? t.detach().to(to).detach() : t;
      },
      &dtype);
}

void Module::zero_grad(bool set_to_none) {
  autograd::NoGradGuard no_grad;
  for (Tensor& p : parameters()) {
    if (!p.grad().defined()) continue;
    if (set_to_none)
      p.set_grad(Tensor());
    else
      const_cast<Tensor&>(p.grad()).zero_();
  }
}

std::vector<std::pair<std::string, Module*>> Module::named_modules() {
  std::vector<std::pair<std::string, Module*>> out{{"", this}};
  for (auto& [name, child] : children_)
    for (auto& [sub, m] : child->named_modules())
      out.emplace_back(sub.empty() ? name : name + "." + sub, m);
  return out;
}

std::vector<std::pair<std::string, Tensor*>> Module::named_parameter_slots() {
  std::vector<std::pair<std::string, Tensor*>> out(params_.begin(), params_.end());
  for (auto& [name, child] : children_)
    for (auto& [sub, t] : child->named_parameter_slots()) out.emplace_back(name + "." + sub, t);
  return out;
}

bool Module::on_replace_module(const std::string&, const std::shared_ptr<Module>&) { return false; }
void Module::replace_module(const std::string& name, std::shared_ptr<Module> replacement) {
  auto it = std::find_if(children_.begin(), children_.end(),
                         [&](const auto& c) { return c.first == name; });
  KILN_CHECK(it != children_.end(), "[replace_module] {} has no submodule '{}'", type_name(), name);
  KILN_CHECK(replacement != nullptr, "[replace_module] the replacement of '{}' is null", name);
  KILN_CHECK(on_replace_module(name, replacement),
             "[replace_module] {} cannot swap its submodule '{}' ({}) for a {}: its forward "
             "calls a member of its own",
             type_name(), name, it->second->type_name(), replacement->type_name());
  set_child_path(*replacement, name);
  it->second = std::move(replacement);
}

Tensor UnaryModule::call_with_hooks(const Tensor& x) {
  Tensor y = x;
  for (auto& hook : pre_hooks_) y = hook(y);
  y = forward(y);
  for (auto& hook : post_hooks_) y = hook(y);
  return y;
}

void Module::register_parameter(std::string name, Tensor* param) {
  KILN_CHECK(param->defined(), "[register_parameter] {} is undefined", name);
  param->requires_grad_();
  params_.emplace_back(std::move(name), param);
}
void Module::register_buffer(std::string name, Tensor* buffer) {
  buffers_.emplace_back(std::move(name), buffer);
}

}  // namespace kiln::nn

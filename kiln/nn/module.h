#pragma once
// Module: named parameters, buffers and submodules, train/eval, device/dtype moves and
// state dicts. Modules own their tensors as members and register pointers to them, so a
// module is neither copyable nor movable; hold submodules by shared_ptr.
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "kiln/compile/host_guard.h"
#include "kiln/core/tensor.h"

namespace kiln::nn {

// Ordered (name, tensor) pairs, as state dicts and parameter listings are.
using NamedTensors = std::vector<std::pair<std::string, Tensor>>;

class Module {
 public:
  Module() = default;
  virtual ~Module();
  Module(const Module&) = delete;
  Module& operator=(const Module&) = delete;

  // Parameters of this module and its submodules, depth first: "h.0.attn.c_attn.weight".
  NamedTensors named_parameters() const;
  TensorList parameters() const;
  NamedTensors named_buffers() const;
  // Parameters and buffers, detached (the tensors share storage with the module's).
  NamedTensors state_dict() const;
  // Copies `state` into the module's tensors in place (casting dtype, moving device). Strict:
  // missing or unexpected names and shape mismatches raise, listing them, before any copy.
  void load_state_dict(const NamedTensors& state, bool strict = true);
  int64_t num_parameters() const;

  // Sets the training flag of this module and its submodules. A compiled function that read
  // a flag is guarded by it: its next call after a change traces again (or replays an entry
  // traced in that mode). See Note [Host values steer traces] in kiln/compile/host_guard.cpp.
  void train(bool on = true);
  void eval() { train(false); }
  // The training flag; reading it while a compiled function is traced makes it a guard.
  bool is_training() const { return training_->get().as_bool(); }
  // The dotted path under which the module was registered, from the outermost module that
  // registered it ("h.0.attn"); "" for a module registered nowhere.
  const std::string& path() const { return path_; }
  // The class name without namespaces ("Dropout"), for messages.
  std::string type_name() const;
  // Moves/casts every parameter and buffer (parameters stay leaves that require grad).
  void to(Device device);
  void to(DType dtype);
  // Zeroes gradients in place (addresses stay stable for graph capture) or drops them.
  void zero_grad(bool set_to_none = false);
  // This module and its submodules, depth first, with their paths relative to this one (""
  // for this one): what plans that name submodules (tensor parallel) walk.
  std::vector<std::pair<std::string, Module*>> named_modules();
  // The registered parameter members of this module and its submodules (what parameters()
  // reads through), by path: for wrappers that swap in other tensors around a forward (FSDP
  // puts the gathered parameters there during the call and the shards back after it).
  std::vector<std::pair<std::string, Tensor*>> named_parameter_slots();
  // Swaps the direct submodule registered as `name` for `replacement`, which takes its path:
  // what convert_sync_batchnorm does. The module's forward must then call
  // the replacement, so only modules whose on_replace_module points their own member at it
  // accept (Sequential); others raise "[replace_module] ..." naming the module and the child.
  void replace_module(const std::string& name, std::shared_ptr<Module> replacement);

  // Hooks around UnaryModule::operator() (not forward): a pre-hook maps the input before
  // forward, a hook maps the output after it, each in the order registered. What the
  // tensor-parallel styles use to convert inputs and outputs (kiln/parallel).
  using ForwardPreHook = std::function<Tensor(const Tensor& input)>;
  using ForwardHook = std::function<Tensor(const Tensor& output)>;
  void register_forward_pre_hook(ForwardPreHook hook) { pre_hooks_.push_back(std::move(hook)); }
  void register_forward_hook(ForwardHook hook) { post_hooks_.push_back(std::move(hook)); }

 protected:
  // Registers a member tensor; parameters are made leaves that require grad.
  void register_parameter(std::string name, Tensor* param);
  void register_buffer(std::string name, Tensor* buffer);
  template <class M>
  std::shared_ptr<M> register_module(std::string name, std::shared_ptr<M> module) {
    set_child_path(*module, name);
    children_.emplace_back(std::move(name), module);
    return module;
  }
  // replace_module's hook, called before the swap: a module that holds child `name` in a
  // member of its own points that member at `replacement` and returns true. The default
  // returns false (the module cannot swap its children).
  virtual bool on_replace_module(const std::string& name,
                                 const std::shared_ptr<Module>& replacement);

 private:
  template <class F>
  void visit(const std::string& prefix, bool params, F&& f) const;
  void apply_to_tensors(Tensor (*fn)(const Tensor&, const void*), const void* arg);
  void set_child_path(Module& child, const std::string& name) const;
  void set_path(std::string path);
  static std::string describe_training(const void* module);

  std::vector<std::pair<std::string, Tensor*>> params_;
  std::vector<std::pair<std::string, Tensor*>> buffers_;
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> children_;
  // Shared with the guards of compiled functions that read it (Note [Host values steer
  // traces]); released when the module is destroyed.
  std::shared_ptr<compiler::HostCell> training_ =
      compiler::HostCell::make(true, this, &Module::describe_training);
  std::string path_;

 protected:
  std::vector<ForwardPreHook> pre_hooks_;
  std::vector<ForwardHook> post_hooks_;
};

// A module with one tensor in and one out (what Sequential chains).
class UnaryModule : public Module {
 public:
  virtual Tensor forward(const Tensor& x) = 0;
  // forward(x) between the module's hooks; modules call their submodules this way.
  Tensor operator()(const Tensor& x) {
    return pre_hooks_.empty() && post_hooks_.empty() ? forward(x) : call_with_hooks(x);
  }

 private:
  Tensor call_with_hooks(const Tensor& x);
};

}  // namespace kiln::nn

#pragma once
// Module: named parameters, buffers and submodules, train/eval, device/dtype moves and
// state dicts. Modules own their tensors as members and register pointers to them, so a
// module is neither copyable nor movable; hold submodules by shared_ptr.
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "kiln/core/tensor.h"

namespace kiln::nn {

// Ordered (name, tensor) pairs, as state dicts and parameter listings are.
using NamedTensors = std::vector<std::pair<std::string, Tensor>>;

class Module {
 public:
  Module() = default;
  virtual ~Module() = default;
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

  void train(bool on = true);
  void eval() { train(false); }
  bool is_training() const { return training_; }
  // Moves/casts every parameter and buffer (parameters stay leaves that require grad).
  void to(Device device);
  void to(DType dtype);
  // Zeroes gradients in place (addresses stay stable for graph capture) or drops them.
  void zero_grad(bool set_to_none = false);

 protected:
  // Registers a member tensor; parameters are made leaves that require grad.
  void register_parameter(std::string name, Tensor* param);
  void register_buffer(std::string name, Tensor* buffer);
  template <class M>
  std::shared_ptr<M> register_module(std::string name, std::shared_ptr<M> module) {
    children_.emplace_back(std::move(name), module);
    return module;
  }

 private:
  template <class F>
  void visit(const std::string& prefix, bool params, F&& f) const;
  void apply_to_tensors(Tensor (*fn)(const Tensor&, const void*), const void* arg);

  std::vector<std::pair<std::string, Tensor*>> params_;
  std::vector<std::pair<std::string, Tensor*>> buffers_;
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> children_;
  bool training_ = true;
};

// A module with one tensor in and one out (what Sequential chains).
class UnaryModule : public Module {
 public:
  virtual Tensor forward(const Tensor& x) = 0;
  Tensor operator()(const Tensor& x) { return forward(x); }
};

}  // namespace kiln::nn

#include "kiln/nn/checkpoint.h"

#include <fmt/format.h>

#include "kiln/autograd/engine.h"
#include "kiln/autograd/grad_mode.h"
#include "kiln/autograd/node.h"
#include "kiln/core/error.h"
#include "kiln/core/tensor_impl.h"

namespace kiln::nn {

// Note [Checkpoint replays]
// checkpoint() runs `fn` with grad mode off, so nothing inside is saved for backward, and makes
// its results outputs of one node (CheckpointBackward) whose edges lead to the inputs. That node
// keeps the inputs (detached) and, for each generator to replay, its (seed, offset) before the
// forward. Its apply() sets those states, runs `fn` again with grad mode on, on fresh leaves over
// the saved inputs, puts the generators back where they were, and runs a nested backward pass
// from the recomputed results with the incoming gradients: tensors `fn` reads that require grad
// (parameters) accumulate their gradients there, and the leaves' gradients are what the node
// returns for the inputs. This is PyTorch's reentrant checkpoint. Each input's storage version is
// recorded, so an input changed in place between forward and backward is an error rather than a
// silently different recomputation. A device's own generator keeps its state on the device
// (kiln/backend/cuda/common.h) where no host (seed, offset) pair can restore it; only Generator
// objects are replayed.

namespace {

struct RngState {
  Generator* gen;
  uint64_t seed, offset;
};

std::vector<RngState> capture(const CheckpointOptions& options) {
  std::vector<RngState> out{
      {&default_generator(), default_generator().seed(), default_generator().offset()}};
  for (Generator* g : options.generators) {
    KILN_CHECK(g != nullptr, "[checkpoint] a generator to replay is null");
    if (g != &default_generator()) out.push_back({g, g->seed(), g->offset()});
  }
  return out;
}

void restore(const std::vector<RngState>& states) {
  for (const RngState& s : states) {
    s.gen->set_seed(s.seed);
    s.gen->set_offset(s.offset);
  }
}

class CheckpointBackward final : public autograd::Node {
 public:
  CheckpointBackward(std::function<TensorList(const TensorList&)> fn, TensorList inputs,
                     std::vector<bool> wants_grad, std::vector<RngState> rng)
      : fn_(std::move(fn)),
        inputs_(std::move(inputs)),
        wants_grad_(std::move(wants_grad)),
        rng_(std::move(rng)) {
    for (const Tensor& t : inputs_)
      versions_.push_back(t.defined() ? t.impl()->storage()->version() : 0);
  }
  std::string name() const override { return "CheckpointBackward"; }
  void release_saved() override { inputs_.clear(); }

  TensorList apply(TensorList&& grads) override {
    KILN_CHECK(!inputs_.empty() || wants_grad_.empty(),
               "[checkpoint] backward ran twice through a checkpoint whose saved inputs were "
               "freed (pass retain_graph=true to the first backward)");
    for (size_t i = 0; i < inputs_.size(); ++i) {
      if (!inputs_[i].defined()) continue;
      const uint64_t now = inputs_[i].impl()->storage()->version();
      KILN_CHECK(now == versions_[i],
                 "[checkpoint] input {} was changed in place after the forward (version {} -> "
                 "{}): the recomputation would differ",
                 i, versions_[i], now);
    }
    TensorList leaves;
    for (size_t i = 0; i < inputs_.size(); ++i) {
      Tensor l = inputs_[i].defined() ? inputs_[i].detach() : Tensor();
      if (wants_grad_[i]) l.requires_grad_(true);
      leaves.push_back(l);
    }
    // Replay the forward's random draws, then put the generators back where backward found them.
    std::vector<RngState> after;
    for (const RngState& s : rng_) after.push_back({s.gen, s.gen->seed(), s.gen->offset()});
    TensorList outs;
    restore(rng_);
    try {
      autograd::EnableGradGuard enable;
      outs = fn_(leaves);
    } catch (...) {
      restore(after);
      throw;
    }
    restore(after);
    KILN_CHECK(outs.size() == grads.size(),
               "[checkpoint] the recomputation returned {} tensors, the forward {}", outs.size(),
               grads.size());
    TensorList from, seed;
    for (size_t i = 0; i < outs.size(); ++i) {
      if (!grads[i].defined() || !outs[i].defined() || !outs[i].requires_grad()) continue;
      from.push_back(outs[i]);
      seed.push_back(grads[i]);
    }
    if (!from.empty()) autograd::backward(from, seed);
    TensorList result(inputs_.size());
    for (size_t i = 0; i < leaves.size(); ++i)
      if (wants_grad_[i]) result[i] = leaves[i].grad();
    return result;
  }

 private:
  std::function<TensorList(const TensorList&)> fn_;
  TensorList inputs_;
  std::vector<bool> wants_grad_;
  std::vector<RngState> rng_;
  std::vector<uint64_t> versions_;
};

}  // namespace

TensorList checkpoint(const std::function<TensorList(const TensorList&)>& fn,
                      const TensorList& inputs, const CheckpointOptions& options) {
  KILN_CHECK(static_cast<bool>(fn), "[checkpoint] the function is empty");
  if (!autograd::is_grad_enabled()) return fn(inputs);
  std::vector<RngState> rng = capture(options);
  TensorList saved;
  std::vector<bool> wants_grad;
  for (const Tensor& t : inputs) {
    saved.push_back(t.defined() ? t.detach() : Tensor());
    wants_grad.push_back(t.defined() && t.requires_grad());
  }
  TensorList outs;
  {
    autograd::NoGradGuard no_grad;
    outs = fn(saved);
  }
  auto node = make_ref<CheckpointBackward>(fn, std::move(saved), wants_grad, std::move(rng));
  for (const Tensor& t : inputs)
    node->next_edges.push_back(t.defined() ? autograd::gradient_edge(t) : autograd::Edge{});
  node->num_outputs = static_cast<uint32_t>(outs.size());
  for (size_t i = 0; i < outs.size(); ++i) {
    KILN_CHECK(outs[i].defined(), "[checkpoint] result {} of the function is undefined", i);
    outs[i] = outs[i].detach();  // an impl of its own (fn may return an input it was given)
    if (is_floating(outs[i].dtype()))
      autograd::set_history(outs[i], node, static_cast<uint32_t>(i));
  }
  return outs;
}

Tensor checkpoint(const std::function<Tensor(const Tensor&)>& fn, const Tensor& input,
                  const CheckpointOptions& options) {
  KILN_CHECK(static_cast<bool>(fn), "[checkpoint] the function is empty");
  return checkpoint([fn](const TensorList& x) { return TensorList{fn(x[0])}; }, {input},
                    options)[0];
}

}  // namespace kiln::nn

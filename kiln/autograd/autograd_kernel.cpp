// The Autograd layer: one boxed fallback records every op. See Note [Autograd recording].
#include "kiln/autograd/grad_mode.h"
#include "kiln/autograd/op_node.h"
#include "kiln/ops/op_list.h"
#include "kiln/ops/ops.h"

namespace kiln::autograd {

namespace {

// Pointers to the call's tensor arguments, one per slot (undefined tensors included).
using Slots = SmallVector<const Tensor*, 8>;
Slots collect_slots(const Stack& stack) {
  Slots slots;
  for (const IValue& v : stack) {
    if (auto* t = std::get_if<Tensor>(&v))
      slots.push_back(t);
    else if (auto* l = std::get_if<TensorList>(&v))
      for (const Tensor& x : *l) slots.push_back(&x);
  }
  return slots;
}

bool is_leaf_requiring_grad(const Tensor& t) {
  AutogradMeta* m = meta_of(t);
  return t.requires_grad() && !(m && m->grad_fn) && !(m && m->view_base.defined());
}

// The gradient of an in-place op's self can only flow somewhere if self is a tracked tensor or
// covers its whole storage; a partial view of an untracked tensor would lose it.
bool covers_storage(const Tensor& t) {
  return t.is_contiguous() && t.storage_offset() == 0 &&
         t.nbytes() == t.impl()->storage()->nbytes();
}

void check_inplace(const OpDef& op, const Tensor& self, bool others_need_grad) {
  KILN_CHECK(!is_leaf_requiring_grad(self),
             "[{}] a leaf tensor that requires grad ([{}] {}) is being used in an in-place op; "
             "do the update under NoGradGuard or on a clone",
             op.name(), fmt::join(self.sizes(), ", "), name(self.dtype()));
  AutogradMeta* m = meta_of(self);
  if (m && m->view_base.defined()) {
    KILN_CHECK(!is_leaf_requiring_grad(m->view_base),
               "[{}] a view of a leaf tensor that requires grad is being used in an in-place op; "
               "do the update under NoGradGuard or on a clone",
               op.name());
  } else if (!self.requires_grad() && others_need_grad && !covers_storage(self)) {
    KILN_THROW(NotImplemented,
               "[{}] writes values that require grad into a view of a tensor that does not track "
               "gradients; call requires_grad_() on the base before taking the view, or write "
               "into a whole tensor",
               op.name());
  }
}

Tensor untracked_clone(const Tensor& t) {
  ExcludeKeyGuard guard(DispatchKey::Autograd);
  return clone(t);
}

// Runs the op below Autograd; `stack` ends up holding its results.
void redispatch(const OpDef& op, Stack& stack) {
  ExcludeKeyGuard guard(DispatchKey::Autograd);
  op.call_boxed(stack);
}

void autograd_fallback(const OpDef& op, DispatchKey, Stack& stack) {
  const Derivative& d = derivative_of(op);
  Slots slots = collect_slots(stack);
  bool any_requires = false;
  for (const Tensor* t : slots) any_requires = any_requires || (t->defined() && t->requires_grad());
  if (!any_requires || d.kind == Differentiability::None) return redispatch(op, stack);
  if (d.kind == Differentiability::Unsupported) {
    KILN_THROW(NotImplemented,
               "[{}] does not support automatic differentiation, and an argument requires grad; "
               "call it under NoGradGuard or on detached tensors",
               op.name());
  }

  const bool inplace = op.kind() == OpKind::InPlace;
  auto node = make_ref<OpNode>(op, d);
  node->geometry.reserve(slots.size());
  node->inputs.resize(slots.size());
  node->needs.resize(slots.size());
  bool others_need = false;
  for (size_t k = 0; k < slots.size(); ++k) {
    const Tensor& t = *slots[k];
    node->needs[k] = t.defined() && t.requires_grad();
    if (k > 0) others_need = others_need || node->needs[k];
    node->geometry.push_back(t.defined() ? TensorGeometry::of(t) : TensorGeometry{});
  }
  const Tensor self = inplace ? *slots[0] : Tensor();
  if (inplace) check_inplace(op, self, others_need);

  // Save what the formula needs. In-place ops overwrite self, so a saved self is a clone.
  for (size_t k = 0; k < slots.size() && k < 32; ++k) {
    const Tensor& t = *slots[k];
    if (!t.defined() || !(d.save_inputs >> k & 1)) continue;
    KILN_CHECK(!t.impl()->is_inference(),
               "[{}] argument {} is an inference tensor (made under InferenceModeGuard) and "
               "cannot be saved for backward; clone it outside inference mode",
               op.name(), k);
    node->inputs[k] = SavedTensor(inplace && k == 0 ? untracked_clone(t) : t, false);
  }
  node->args.reserve(stack.size());
  for (const IValue& v : stack) {
    bool tensor = std::holds_alternative<Tensor>(v) || std::holds_alternative<TensorList>(v);
    node->args.push_back(tensor ? IValue{} : v);
  }
  // Edges are taken before the call: an in-place op replaces self's history.
  for (size_t k = 0; k < slots.size(); ++k)
    node->next_edges.push_back(node->needs[k] ? gradient_edge(*slots[k]) : Edge{});

  AutogradMeta* self_meta = inplace ? meta_of(self) : nullptr;
  const bool on_view = self_meta && self_meta->view_base.defined();
  Tensor base = on_view ? self_meta->view_base : Tensor();
  ViewGeometry view_geom = on_view ? ViewGeometry::of(self) : ViewGeometry{};

  // The call replaces the stack (and so what `slots` points to) with its results.
  const Tensor input0 = *slots[0];
  slots.clear();
  redispatch(op, stack);

  TensorList outputs;
  if (inplace) {
    outputs.push_back(self);
  } else {
    for (IValue& v : stack) {
      if (auto* t = std::get_if<Tensor>(&v)) outputs.push_back(*t);
    }
  }
  node->num_outputs = static_cast<uint32_t>(outputs.size());
  node->outputs.resize(outputs.size());
  for (size_t i = 0; i < outputs.size() && i < 32; ++i)
    if (d.save_outputs >> i & 1) node->outputs[i] = SavedTensor(outputs[i], true);

  if (on_view) {
    // See Note [In-place ops on views].
    auto copy = make_ref<CopySlices>(ViewGeometry::of(base), view_geom, node);
    copy->next_edges.push_back(gradient_edge(base));
    for (size_t k = 1; k < node->next_edges.size(); ++k)
      copy->next_edges.push_back(node->next_edges[k]);
    node->next_edges[0] = Edge{};
    set_history(base, copy, 0);
    auto view_fn = make_ref<ViewBackward>(ViewGeometry::of(base), view_geom);
    view_fn->next_edges.push_back({copy, 0});
    set_history(self, view_fn, 0);
    self_meta->view_version = self.version();
    return;
  }
  for (size_t i = 0; i < outputs.size(); ++i) {
    const Tensor& out = outputs[i];
    if (!is_floating(out.dtype())) continue;
    set_history(out, node, static_cast<uint32_t>(i));
    if (op.kind() == OpKind::View) {
      AutogradMeta& m = *meta_of(out);
      AutogradMeta* in = meta_of(input0);
      m.view_base = in && in->view_base.defined() ? in->view_base : input0;
      m.view_version = out.version();
    }
  }
}

const bool registered = [] {
  register_fallback(DispatchKey::Autograd, &autograd_fallback);
  return true;
}();

}  // namespace
}  // namespace kiln::autograd

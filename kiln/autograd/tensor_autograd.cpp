// The autograd methods of Tensor (declared in kiln/core/tensor.h).
#include "kiln/autograd/engine.h"
#include "kiln/autograd/node.h"
#include "kiln/core/error.h"

namespace kiln {

using autograd::ensure_meta;
using autograd::meta_of;

const Tensor& Tensor::requires_grad_(bool on) const {
  KILN_CHECK(defined(), "[requires_grad_] undefined tensor");
  autograd::AutogradMeta* m = meta_of(*this);
  KILN_CHECK(!m || !m->grad_fn,
             "[requires_grad_] only a leaf can change requires_grad; this tensor was made by {} "
             "(use detach() for a leaf copy)",
             m ? m->grad_fn->name() : "");
  if (!on) {
    impl()->remove_key(DispatchKey::Autograd);
    return *this;
  }
  KILN_CHECK_TYPE(is_floating(dtype()),
                  "[requires_grad_] only floating-point tensors can require grad, got {}",
                  name(dtype()));
  ensure_meta(*this);
  impl()->add_key(DispatchKey::Autograd);
  return *this;
}

const Tensor& Tensor::grad() const {
  static const Tensor undefined;
  autograd::AutogradMeta* m = meta_of(*this);
  if (!m) return undefined;
  if (m->grad_fn && m->hooks && m->hooks->retain) return m->hooks->retained;
  return m->grad;
}

void Tensor::retain_grad() const {
  KILN_CHECK(defined() && requires_grad(),
             "[retain_grad] the tensor does not require grad, so no gradient will reach it");
  autograd::AutogradMeta& m = ensure_meta(*this);
  if (!m.grad_fn) return;  // leaves keep their gradient anyway
  if (!m.hooks) {
    m.hooks = std::make_shared<autograd::GradHooks>();
    m.grad_fn->pre_hooks.emplace_back(m.output_nr, m.hooks);
  }
  m.hooks->retain = true;
}

void Tensor::set_grad(const Tensor& grad) const {
  KILN_CHECK(defined(), "[set_grad] undefined tensor");
  if (grad.defined()) {
    KILN_CHECK(grad.sizes() == sizes() && grad.dtype() == dtype() && grad.device() == device(),
               "[set_grad] gradient [{}] {} on {} does not match the tensor [{}] {} on {}",
               fmt::join(grad.sizes(), ", "), name(grad.dtype()), grad.device(),
               fmt::join(sizes(), ", "), name(dtype()), device());
    KILN_CHECK(!grad.requires_grad(), "[set_grad] the gradient must not require grad");
  }
  ensure_meta(*this).grad = grad;
}

bool Tensor::is_leaf() const {
  autograd::AutogradMeta* m = meta_of(*this);
  return !m || !m->grad_fn;
}

std::string Tensor::grad_fn_name() const {
  autograd::AutogradMeta* m = meta_of(*this);
  return m && m->grad_fn ? m->grad_fn->name() : std::string();
}

void Tensor::backward(const Tensor& grad, bool retain_graph) const {
  autograd::backward({*this}, {grad}, retain_graph);
}

}  // namespace kiln
